"""Sessions that move between nodes: one session out as an archive, an archive in as a session.

Export (between steps, the session idle): a snapshot of it as it is now, then the archive of that
snapshot, the journal after it, its HTTP clients' rows, its memory and its record, generation and
configuration. Import: the archive's checks, then the same gates as a resume (model, tokenizer,
template, KV dtype, llama.cpp, cells per sequence; the record's checksum and generation hash; the
snapshot's own checks), with its rows written in one transaction and the session restored from
them exactly as at start. Anything refused rolls back: nothing of the archive stays, and the
session keeps its id and generation, so its handle stays valid on the new node. Engine thread.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.access import Access
from sinkd.daemon.runtime.api import Handle, Receipt
from sinkd.daemon.runtime.durable.durability import GATES, Durability, gate_value
from sinkd.daemon.runtime.durable.snapshotter import Snapshotter
from sinkd.daemon.runtime.lifecycle import check_generation
from sinkd.daemon.runtime.loop.scheduler import Scheduler
from sinkd.daemon.runtime.resume import Resumer, Unrestorable
from sinkd.daemon.runtime.sessions import Principal, Registry, Session, SessionState
from sinkd.daemon.store import archive, snapshots
from sinkd.daemon.store.archive import Archive
from sinkd.daemon.store.journal import SCHEMA_VERSION, SnapshotRow, StoredSession
from sinkd.errors import CorruptArchive, FailedPrecondition, PermissionDenied, ResourceExhausted

KIND = "sinkd-session"
Close = Callable[[Session, str], None]  # close a session at a generation (engine thread)


@dataclass(frozen=True)
class Incoming:
    """A session archive checked against this daemon, nothing of it written yet."""

    stored: StoredSession
    rows: dict[str, Any]
    snap: bytes
    snapshot: SnapshotRow | None  # the row its snapshot file gets, where it has one


class ClientRows(Protocol):
    """The HTTP clients' state of a moved session: taken up once it is imported."""

    def adopt(self, session_id: str | None = None) -> None: ...
    def key_fingerprint(self) -> str: ...


class SessionMoves:
    """What the edges call: who may move which session, on the engine thread."""

    def __init__(self, access: Access, scheduler: Scheduler, registry: Registry, metrics: Metrics):
        self.access = access
        self.scheduler = scheduler
        self.registry = registry
        self.metrics = metrics
        self.mover: Mover | None = None  # set at resume, on a durable daemon

    def export(self, principal: Principal, handle: Handle) -> list[bytes]:
        """The session as an archive: its owner's or the admin's (the one content the admin may
        take: to move a session, not to read it)."""
        session = self.access.visible(principal, handle)
        return self.scheduler.call(lambda e: self._mover().export(e, session, handle.generation))

    def import_(self, principal: Principal, data: bytes) -> Receipt:
        """An archive as a session of this daemon; the admin may import any tenant's, a tenant
        its own. Its receipt, read on the engine thread as it was imported."""
        tenant = None if principal.admin and principal.tenant is None else principal.tenant

        def imported(engine: Engine) -> Receipt:
            session = self._mover().import_(engine, data, tenant)
            return session.receipt(engine.kv_bytes_per_token)

        receipt = self.scheduler.call(imported)
        self.metrics.active_sessions.set(len(self.registry))
        return receipt

    def release(self, principal: Principal, handle: Handle) -> None:
        """The session now lives on another node (its archive imported there): closed here, and
        from now on this node answers UNAVAILABLE for it, not NOT_FOUND (a proxy that still
        routes its calls here is about to route them there). The owner's or the admin's."""
        session = self.access.visible(principal, handle)
        self.scheduler.call(lambda e: self._mover().release(session, handle.generation))

    def _mover(self) -> Mover:
        if self.mover is None:
            raise FailedPrecondition("export and import need a durable daemon (durable = true)")
        return self.mover


class Mover:
    def __init__(
        self,
        durability: Durability,
        snapshotter: Snapshotter,
        resumer: Resumer,
        registry: Registry,
        close: Close,
        clients: ClientRows,
    ) -> None:
        self.durability = durability
        self.snapshotter = snapshotter
        self.resumer = resumer
        self.registry = registry
        self.close = close
        self.clients = clients

    def export(self, engine: Engine, session: Session, generation: str) -> list[bytes]:
        check_generation(session, generation)
        if session.state is not SessionState.IDLE or session.unlogged:
            raise FailedPrecondition(
                f"session {session.id} is {session.state.value}: export it between turns"
            )
        d = self.durability
        if session.has_history and session.logged_since_snap and not self.snapshotter.take(session):
            raise FailedPrecondition(f"session {session.id}: its snapshot could not be written")
        stored = next(s for s in d.stored() if s.id == session.id)
        rows = d.snapshots_of(session)
        snap = (d.dir / rows[0].path).read_bytes() if rows else b""
        after = rows[0].n_seen if rows else 0
        data = d.rows_of(session)
        chunks = data["chunks"]
        at = chunks["columns"].index("logical_pos")
        chunks["rows"] = [r for r in chunks["rows"] if r[at] >= after]
        manifest = self._manifest(session, stored, rows, stored.reason)
        members = {"snapshot": snap, "rows": json.dumps(data).encode()}
        return archive.pack(Archive(manifest, members))

    def export_stored(self, session: Session) -> bytes:
        """A stale session (made under another configuration) as its rows stand, for a tenant's
        move: it arrives stale too, listed with its reason for its owner to close."""
        d = self.durability
        stored = next(s for s in d.stored() if s.id == session.id)
        rows = d.snapshots_of(session)
        snap = (d.dir / rows[0].path).read_bytes() if rows else b""
        manifest = self._manifest(session, stored, rows, session.failure or stored.reason)
        members = {"snapshot": snap, "rows": json.dumps(d.rows_of(session)).encode()}
        return b"".join(archive.pack(Archive(manifest, members)))

    def _manifest(
        self, session: Session, stored: StoredSession, rows: list[SnapshotRow], reason: str
    ) -> dict[str, Any]:
        """A session archive's manifest: who, which generation, its record and state, the
        configuration it was made under (the gates), its newest snapshot's place."""
        return {
            "kind": KIND, "schema": SCHEMA_VERSION, "session": session.id,
            "tenant": stored.tenant, "generation": session.generation,
            "reset_count": session.reset_count, "record": stored.record,
            "state": stored.state, "reason": reason, "config": self.durability.config,
            "snapshot_n_seen": rows[0].n_seen if rows else None, "n_seen": session.seq.state.n_seen,
            "exported_unix_time": time.time(), "conversations_key": self.clients.key_fingerprint(),
        }  # fmt: skip

    def import_(self, engine: Engine, data: bytes, tenant: str | None) -> Session:
        """`tenant`: the caller's (None: the admin, who may import any tenant's session)."""
        incoming = self.check(engine, data, tenant)
        d = self.durability
        d.commit()  # the steps' writes before this are not the import's to roll back
        path = None
        try:
            path = self.write_snapshot(incoming)
            d.adopt_rows(incoming.stored, incoming.rows, incoming.snapshot)
            session = self.resumer.adopt(engine, incoming.stored)
            d.commit()
        except Unrestorable as e:
            self.undo([path])
            raise FailedPrecondition(f"refused: {e}") from None
        except (ValueError, KeyError, TypeError) as e:
            self.undo([path])
            raise CorruptArchive(f"its rows do not load here: {e}") from None
        except BaseException:  # a disk that fills, a journal that fails: nothing stays either
            self.undo([path])
            raise
        self.arrived(incoming.stored.id)
        return session

    def check(
        self, engine: Engine, data: bytes, tenant: str | None, shares: bool = True
    ) -> Incoming:
        """An archive unpacked and checked against this daemon (its owner, the gates of a resume,
        the conversations key; `shares`: the owner's room for one more session): nothing
        written yet. CorruptArchive, PermissionDenied or FailedPrecondition with the reason."""
        a = archive.unpack(data)
        incoming = self._unpacked(a, tenant)
        if shares:  # a new session here, as a create
            self.resumer.admission.check_new(engine, incoming.stored.tenant)
        d = self.durability
        made_under = a.manifest.get("config", {})
        differences = [  # every gate: an archive's lack of one is not excused (GATED_SINCE)
            f"{k} was {gate_value(made_under, k)!r}, this daemon runs {d.config.get(k)!r}"
            for k in GATES
            if gate_value(made_under, k) != d.config.get(k)
        ]
        if differences:
            raise FailedPrecondition(
                "refused: made under another configuration: " + "; ".join(differences)
            )
        if incoming.rows.get("conversations", {}).get("rows") and (
            a.manifest.get("conversations_key") != self.clients.key_fingerprint()
        ):
            raise FailedPrecondition(
                "refused: its HTTP conversation was hashed under another conversations key; give"
                " the nodes one conversations_key_file (docs/deployment.md)"
            )
        return incoming

    def _unpacked(self, a: Archive, tenant: str | None) -> Incoming:
        """A session archive's manifest and members read, its owner and id checked."""
        m = a.manifest
        if m.get("kind") != KIND or m.get("schema") != SCHEMA_VERSION:
            raise CorruptArchive(f"not a schema-{SCHEMA_VERSION} sinkd session archive")
        try:
            session_id, owner, reset_count = (
                str(m["session"]),
                str(m["tenant"]),
                int(m["reset_count"]),
            )
            record, state, reason = dict(m["record"]), str(m["state"]), str(m["reason"])
            rows = json.loads(a.members["rows"])
            snap = a.members["snapshot"]
            n_seen = int(m["snapshot_n_seen"]) if snap else 0
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptArchive(f"manifest incomplete: {type(e).__name__}") from None
        if tenant is not None and owner != tenant:
            raise PermissionDenied("this archive holds another tenant's session")
        if self.registry.get(session_id) is not None:
            raise FailedPrecondition(f"session {session_id} is already on this node")
        stored = StoredSession(session_id, owner, record, state, reason, True)
        row = None
        if snap:
            rel = f"snapshots/{session_id}/{reset_count}-{n_seen}.snap"
            row = SnapshotRow(session_id, reset_count, n_seen, rel, len(snap), time.time())
        return Incoming(stored, rows, snap, row)

    def check_stored(self, data: bytes, tenant: str) -> Incoming:
        """A stale session's archive (`export_stored`): its owner and id checked, not its gates
        (it is stale here too)."""
        return self._unpacked(archive.unpack(data), tenant)

    def write_snapshot(self, incoming: Incoming) -> Path | None:
        """The archive's snapshot file, written whole (before the rows that name it)."""
        if incoming.snapshot is None:
            return None
        d = self.durability
        path = d.dir / incoming.snapshot.path
        path.parent.mkdir(mode=0o700, exist_ok=True)
        snapshots.write_atomic(path, incoming.snap, fsync=d.sync == "full")
        return path

    def arrived(self, session_id: str) -> None:
        """A session's import committed: this node holds it, its HTTP clients' rows taken up."""
        self.registry.moved_out(session_id, None)
        self.clients.adopt(session_id)

    def release(self, session: Session, generation: str) -> None:
        """Close the session here with a note that it moved (one commit: the close's)."""
        check_generation(session, generation)
        self.durability.note_moved_out(session)
        try:
            self.close(session, generation)
        except BaseException:
            self.durability.rollback()
            raise
        self.registry.moved_out(session.id, session.tenant)

    def undo(self, paths: list[Path | None]) -> None:
        """What an import that failed wrote: rolled back, its files removed."""
        self.durability.rollback()
        # a large import's pages may have reached the write-ahead log before it was refused
        with contextlib.suppress(ResourceExhausted):  # then owed in memory alone, paid the same
            self.durability.record(self.durability.owe_purge)
        for path in paths:
            if path is not None:
                path.unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    path.parent.rmdir()  # only if empty
