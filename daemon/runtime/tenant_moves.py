"""A tenant moved whole between the nodes of a deployment, or backed up and restored: everything it
owns on a node in one archive (its sessions, its memory across conversations, its prefix states),
imported all or nothing, and deleted where it was only once the node it went to holds it.

A move, and what a kill -9 of either node at any point of it leaves (docs/deployment.md):
1. the source marks the tenant `leaving` (journalled): from then on it answers none of its calls;
2. the source exports it (each session snapshotted at its token count);
3. the destination imports it in one transaction: every session's rows and snapshot, the memory's
   rows, the move's id as arrived, the tenant's mark cleared; its sessions come up parked;
4. the source releases it: every session closed as moved, the memory forgotten, the prefix states
   dropped, and purged as a forget is; the mark turns `gone`.
Killed before 3 commits: the destination holds nothing, the source all of it, still `leaving`.
Killed after: the destination holds it, the source too until 4 is done. Either way one node
answers the tenant (the source never does while marked), and `sinkd nodes rebalance` finishes
(4, where the destination says the move arrived) or makes the move again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from sinkd.daemon import failpoints
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.runtime.access import Access, admin_only
from sinkd.daemon.runtime.api import Erased, TenantHeld, TenantImported
from sinkd.daemon.runtime.durable.durability import GATES, Durability, gate_value
from sinkd.daemon.runtime.erasure import Erasure
from sinkd.daemon.runtime.loop.prefixes import PrefixStates
from sinkd.daemon.runtime.loop.scheduler import Scheduler
from sinkd.daemon.runtime.migration import Incoming, Mover, SessionMoves
from sinkd.daemon.runtime.recall.layer import Recall
from sinkd.daemon.runtime.sessions import Principal, Registry, SessionState
from sinkd.daemon.store import archive, generation_rows, narrated, snapshots
from sinkd.daemon.store.archive import Archive
from sinkd.daemon.store.journal import SCHEMA_VERSION
from sinkd.daemon.store.tenant_marks import STATES, TenantMark
from sinkd.daemon.store.tenant_memory import Selection, key_of
from sinkd.errors import (
    CorruptArchive,
    FailedPrecondition,
    InvalidInput,
    SessionElsewhere,
    SessionLimit,
)

log = logging.getLogger("sinkd.tenants")

KIND = "sinkd-tenant"


class TenantMoves:
    """The admin's calls (and the edges' check of each tenant's calls), run on the engine thread."""

    def __init__(
        self,
        access: Access,
        scheduler: Scheduler,
        registry: Registry,
        durability: Durability | None,
        recall: Recall,
        prefixes: PrefixStates,
        sessions: SessionMoves,
        erasure: Erasure,
        node: str | None,
    ) -> None:
        self.access = access
        self.scheduler = scheduler
        self.registry = registry
        self.durability = durability
        self.recall = recall
        self.prefixes = prefixes
        self.sessions = sessions
        self.erasure = erasure
        self.node = node or ""
        self._lock = threading.Lock()
        self._marks: dict[str, TenantMark] = {}  # read by the edges' threads
        # told a released tenant (engine thread): what else holds its state in memory lets go
        self.on_released: Callable[[str], object] = lambda tenant: None

    # --- at start, and the edges ---

    def load(self) -> None:
        """The journalled marks (engine thread, before the daemon serves)."""
        if self.durability is not None:
            with self._lock:
                self._marks = {m.tenant: m for m in self.durability.tenant_marks().all()}

    def check_here(self, principal: Principal) -> None:
        """SessionElsewhere (UNAVAILABLE: retry) for a call of a tenant this node does not serve
        now: leaving, gone, or arriving (`TenantMark`)."""
        if principal.tenant is not None:
            self.check_tenant(principal.tenant)

    def check_tenant(self, tenant: str) -> None:
        """`check_here` for a tenant by name. On the engine thread, where marks are set, it is
        exact: a write that passes it lands before any export of the tenant."""
        with self._lock:
            mark = self._marks.get(tenant)
        if mark is not None:
            raise SessionElsewhere(
                f"tenant {tenant} is {mark.state} on node {self.node or '(this node)'}"
                + (f" ({mark.peer})" if mark.peer else "")
                + ": the proxy sends its calls where it is served once the move is done; retry"
            )

    # --- the admin's calls ---

    def held(self, principal: Principal, arrived: str = "") -> tuple[list[TenantHeld], str]:
        """Every tenant this node holds something of or has a mark for; and the tenant that move
        `arrived` (an id) brought here ("" none)."""
        admin_only(principal, "listing the tenants held")
        return self.scheduler.call(lambda e: self._held(arrived))

    def mark(self, principal: Principal, tenant: str, state: str, move_id: str, peer: str) -> None:
        """Mark the tenant (`state` "": clear its mark); journalled before the reply."""
        admin_only(principal, "marking a tenant")
        if state and state not in STATES:
            raise InvalidInput(f"state: one of {', '.join(STATES)} or empty, got {state[:16]!r}")
        if not tenant:
            raise InvalidInput("tenant: a name")
        self.scheduler.call(lambda e: self._mark(tenant, state, move_id, peer))

    def export(self, principal: Principal, tenant: str, move_id: str = "") -> list[bytes]:
        """The tenant's archive. For a move (`move_id`) the tenant must be marked leaving by that
        move (none of its calls then change it meanwhile); a backup takes it as it is."""
        admin_only(principal, "exporting a tenant")
        self._durable()
        return self.scheduler.call(lambda e: self._export(e, tenant, move_id))

    def import_(self, principal: Principal, data: bytes) -> TenantImported:
        admin_only(principal, "importing a tenant")
        self._durable()
        return self.scheduler.call(lambda e: self._import(e, data))

    def release(self, principal: Principal, tenant: str, move_id: str) -> Erased:
        """Delete everything of a tenant that move `move_id` took to another node (it must be
        marked leaving by it, or gone): its sessions closed as moved, its memory forgotten, its
        prefix states dropped, purged as a forget is; then marked gone. Idempotent."""
        admin_only(principal, "releasing a tenant")
        self._durable()
        n, owed = self.erasure.run(lambda e: self._release(tenant, move_id))
        return Erased(n, owed)

    # --- engine thread ---

    def _durable(self) -> None:
        if self.durability is None or self.sessions.mover is None:
            raise FailedPrecondition("moving a tenant needs a durable daemon (a state directory)")

    def _mover(self) -> Mover:
        assert self.sessions.mover is not None
        return self.sessions.mover

    def _held(self, arrived: str) -> tuple[list[TenantHeld], str]:
        assert self.durability is not None or not arrived
        counts: dict[str, list[int]] = {}
        for s in self.registry.all():
            counts.setdefault(s.tenant, [0, 0, 0])[0] += 1
        store = self.recall.store
        for tenant in store.across.tenants():
            counts.setdefault(tenant, [0, 0, 0])[1] = store.across.count(tenant)
        for tenant, n in self.prefixes.count_by_owner().items():
            counts.setdefault(tenant, [0, 0, 0])[2] = n
        with self._lock:
            marks = dict(self._marks)
        for tenant in marks:
            counts.setdefault(tenant, [0, 0, 0])
        out = []
        for t, (sessions, passages, prefixes) in sorted(counts.items()):
            mark = marks.get(t)
            out.append(
                TenantHeld(t, sessions, passages, prefixes, mark.state, mark.move_id, mark.peer)
                if mark
                else TenantHeld(t, sessions, passages, prefixes)
            )
        came = ""
        if arrived and self.durability is not None:
            came = self.durability.tenant_marks().has_arrived(arrived) or ""
        return out, came

    def _mark(self, tenant: str, state: str, move_id: str, peer: str) -> None:
        assert self.durability is not None
        marks = self.durability.tenant_marks()
        mark = TenantMark(tenant, state, move_id, peer, time.time()) if state else None
        self.durability.record(lambda: marks.put(mark) if mark else marks.drop(tenant))
        with self._lock:
            if mark is None:
                self._marks.pop(tenant, None)
            else:
                self._marks[tenant] = mark
        log.info("tenant %s: %s", tenant, state or "served here")
        if state == "leaving":
            failpoints.hit("tenant-leaving")

    def _export(self, engine: Engine, tenant: str, move_id: str) -> list[bytes]:
        assert self.durability is not None
        with self._lock:
            mark = self._marks.get(tenant)
        if move_id and (mark is None or mark.state != "leaving" or mark.move_id != move_id):
            raise FailedPrecondition(f"tenant {tenant} is not marked leaving by move {move_id}")
        mover, members = self._mover(), {}
        for s in self.registry.of_tenant(tenant):
            if s.state is SessionState.STALE:
                members[f"stale/{s.id}"] = mover.export_stored(s)
            else:  # FailedPrecondition while a turn runs: between turns (the caller retries)
                members[f"session/{s.id}"] = b"".join(mover.export(engine, s, s.generation))
        d = self.durability
        key = key_of(tenant)
        memory = generation_rows.rows_of(d.journal.db, key.session_id, key.reset_count)
        members["memory"] = json.dumps(memory).encode()
        members["narrated"] = json.dumps(narrated.rows_of(d.journal.db, tenant)).encode()
        for i, p in enumerate(self.prefixes.of_tenant(tenant)):
            meta = {"tokens": p["tokens"], "starts": p["starts"], "holders": p["holders"]}
            members[f"prefix/{i}"] = snapshots.encode(
                snapshots.Snapshot(meta, p["kv"], p["logits"])
            )
        manifest = {
            "kind": KIND, "schema": SCHEMA_VERSION, "tenant": tenant, "move_id": move_id,
            "source": self.node, "config": d.config, "exported_unix_time": time.time(),
        }  # fmt: skip
        packed = archive.pack(Archive(manifest, members))
        failpoints.hit("tenant-exported")
        return packed

    def _import(self, engine: Engine, data: bytes) -> TenantImported:
        assert self.durability is not None
        d, mover = self.durability, self._mover()
        a = archive.unpack(data)
        m = a.manifest
        if m.get("kind") != KIND or m.get("schema") != SCHEMA_VERSION:
            raise CorruptArchive(f"not a schema-{SCHEMA_VERSION} sinkd tenant archive")
        try:
            tenant, move_id = str(m["tenant"]), str(m.get("move_id", ""))
            memory = json.loads(a.members["memory"])
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptArchive(f"manifest incomplete: {type(e).__name__}") from None
        differences = [
            f"{k} was {gate_value(m.get('config', {}), k)!r}, this daemon runs {d.config.get(k)!r}"
            for k in GATES
            if gate_value(m.get("config", {}), k) != d.config.get(k)
        ]
        if differences:
            raise FailedPrecondition(
                "refused: made under another configuration: " + "; ".join(differences)
            )
        incoming: list[Incoming] = []
        stale: list[Incoming] = []
        for name, member in a.members.items():
            if name.startswith("session/"):
                incoming.append(mover.check(engine, member, tenant, shares=False))
            elif name.startswith("stale/"):
                stale.append(mover.check_stored(member, tenant))
        room = self.sessions_room(engine)
        if len(incoming) + len(stale) > room:
            raise SessionLimit(
                f"tenant {tenant} has {len(incoming) + len(stale)} sessions; this node has room"
                f" for {room} more"
            )
        d.commit()  # the steps' writes before this are not the import's to roll back
        written = []
        try:
            for inc in incoming + stale:
                written.append(mover.write_snapshot(inc))
                d.adopt_rows(inc.stored, inc.rows, inc.snapshot)
            key, across = key_of(tenant), self.recall.store.across
            carried_passages = len(memory.get("passages", {}).get("rows", []))
            if across.count(tenant):  # served here too (its node was down): one memory of both
                memory = across.following(tenant, memory)
            else:
                self.recall.store.drop(key.session_id)  # an empty memory's numbering: the archive's
            generation_rows.load_rows(d.journal.db, key.session_id, tenant, memory)
            streams = json.loads(a.members.get("narrated", b"{}"))
            narrated.load_rows(d.journal.db, tenant, streams)
            marks = d.tenant_marks()
            marks.drop(tenant)
            if move_id:
                marks.arrived(move_id, tenant, str(m.get("source", "")), time.time())
            failpoints.hit("tenant-import-written")
            d.commit()
        except (ValueError, KeyError, TypeError) as e:
            mover.undo(written)
            raise CorruptArchive(f"its rows do not load here: {e}") from None
        except BaseException:
            mover.undo(written)
            raise
        with self._lock:
            self._marks.pop(tenant, None)
        for inc in incoming:  # committed: each comes up parked (or stale, with the reason)
            mover.resumer.adopt_parked(engine, inc.stored)
            mover.arrived(inc.stored.id)
        for inc in stale:
            mover.resumer.register_stale(inc.stored, f"moved while stale: {inc.stored.reason}")
            mover.arrived(inc.stored.id)
        self.recall.indexer.noted()  # vectors a carried passage lacks are made off this thread
        carried = []
        for name, member in a.members.items():
            if name.startswith("prefix/"):
                snap = snapshots.decode(member)
                carried.append({**snap.meta, "kv": snap.kv, "logits": snap.logits})
        prefixes = self.prefixes.adopt(tenant, carried)
        passages = carried_passages
        failpoints.hit("tenant-imported")
        log.info("tenant %s imported: %d sessions, %d passages, %d prefix states",
                 tenant, len(incoming) + len(stale), passages, prefixes)  # fmt: skip
        return TenantImported(tenant, len(incoming) + len(stale), passages, prefixes, move_id)

    def sessions_room(self, engine: Engine) -> int:
        """Sessions this node may still open: resident and parked."""
        admission = self._mover().resumer.admission
        return max(0, admission.capacity(engine) - len(self.registry))

    def _release(self, tenant: str, move_id: str) -> int:
        assert self.durability is not None
        with self._lock:
            mark = self._marks.get(tenant)
        if mark is None or mark.state not in ("leaving", "gone") or mark.move_id != move_id:
            raise FailedPrecondition(
                f"tenant {tenant} is not marked leaving by move {move_id}: nothing released"
            )
        mover, n = self._mover(), 0
        for s in self.registry.of_tenant(tenant):
            mover.release(s, s.generation)
            n += 1
        failpoints.hit("tenant-released-sessions")
        n += self.recall.forget_across(tenant, Selection(), [])
        self.recall.store.drop(key_of(tenant).session_id)  # its numbering went with it
        self.prefixes.forget_tenant(tenant)
        narrated.drop_tenant(self.durability.journal.db, tenant)
        self.on_released(tenant)  # what the tenant's streams held in memory goes too
        self.durability.record(self.durability.owe_purge)
        failpoints.hit("tenant-released")
        self._mark(tenant, "gone", move_id, mark.peer)
        return n
