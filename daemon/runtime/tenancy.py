"""What each tenant holds, and its shares of what the tenants pool (runtime/shares.py): open
sessions (resident and parked) and the state directory's bytes (its sessions' snapshots, journalled
tokens and memory). Checked when a tenant adds a session (create, fork, import), never when one
resumes; its stored responses are counted where they are kept (conversations/responses.py).
Prefix states are a cache (prefix_disk_mb, the owner holding most giving way first): shown, not
counted against a share. Engine thread (the journal's rows are read there).
"""

from __future__ import annotations

import logging
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from sinkd.daemon.config import Settings
from sinkd.daemon.runtime.api import TenantUsage
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.sessions import Registry
from sinkd.daemon.runtime.shares import Pool, in_bytes, shares_of
from sinkd.errors import TenantLimit

log = logging.getLogger("sinkd.tenancy")

MB = 2**20


def state_dir_bytes(settings: Settings) -> int:
    """The state directory's pool: `max_state_mb`, or its filesystem's size."""
    if settings.max_state_mb is not None:
        return int(settings.max_state_mb * MB)
    where = Path(settings.state_dir)
    while not where.exists() and where != where.parent:
        where = where.parent
    return shutil.disk_usage(where).total


class Tenancy:
    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        durability: Durability | None,
        prefix_bytes: Callable[[], dict[str, int]],
        responses: Callable[[], Counter[str]],
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.durability = durability
        self.prefix_bytes = prefix_bytes
        self.responses = responses
        self._state_bytes: int | None = None

    # --- the pools ---

    def sessions(self, capacity: int) -> Pool:
        """Open sessions: the resident ones and the parked ones beyond them."""
        overrides = {
            t.name: (t.reserved_sessions, t.max_open_sessions) for t in self.settings.tenants
        }
        return Pool(
            "open sessions", capacity, shares_of(capacity, overrides),
            "max_open_sessions", "reserved_sessions",
        )  # fmt: skip

    def stored(self) -> Pool | None:
        """The state directory's bytes; None without one."""
        if self.durability is None:
            return None
        if self._state_bytes is None:
            self._state_bytes = state_dir_bytes(self.settings)
        overrides = {
            t.name: (_bytes(t.reserved_stored_mb), _bytes(t.max_stored_mb))
            for t in self.settings.tenants
        }
        return Pool(
            "stored", self._state_bytes, shares_of(self._state_bytes, overrides),
            "max_stored_mb", "reserved_stored_mb", in_bytes,
        )  # fmt: skip

    def max_responses(self, tenant: str) -> int:
        for t in self.settings.tenants:
            if t.name == tenant and t.max_stored_responses is not None:
                return t.max_stored_responses
        return self.settings.max_stored_responses

    # --- holdings ---

    def open_sessions(self) -> Counter[str]:
        return Counter(s.tenant for s in self.registry.all())

    def stored_bytes(self) -> dict[str, tuple[int, int, int]]:
        """Per tenant: (snapshot, journal, memory) bytes in the state directory. The snapshots'
        from their rows (a few a session); the journalled tokens and the memory from the counts
        each session keeps, so that a new session's check reads no chunk or passage."""
        if self.durability is None or not self.durability.is_open:
            return {}
        snapshots = self.durability.snapshot_bytes()
        journal: Counter[str] = Counter()
        memory: Counter[str] = Counter()
        for session in self.registry.all():
            journal[session.tenant] += 4 * session.log_tokens  # int32 token ids
            memory[session.tenant] += session.memory_stats[2]
        return {
            t: (snapshots.get(t, 0), journal[t], memory[t]) for t in {*snapshots, *journal, *memory}
        }

    # --- the check ---

    def check_new_session(self, capacity: int, tenant: str) -> None:
        """TenantLimit if `tenant` may not add a session now: its share of the open sessions, or
        of the stored bytes (it holds its limit already)."""
        why = self.sessions(capacity).refusal(self.open_sessions(), tenant)
        pool = self.stored()
        if why is None and pool is not None:
            held = {t: sum(v) for t, v in self.stored_bytes().items()}
            if pool.room(held, tenant) == 0:
                why = pool.refusal(held, tenant) or (
                    f"tenant {tenant} stores {in_bytes(held.get(tenant, 0))}: the state"
                    f" directory's {in_bytes(pool.total)} are taken (max_state_mb)"
                )
        if why is not None:
            log.info("tenant share refused a new session (%s)", why.split(":")[0])
            raise TenantLimit(f"{why}; close some of its sessions to make room")

    # --- the admin's view ---

    def usage(self, capacity: int) -> list[TenantUsage]:
        """Every tenant configured or holding something, content-free."""
        sessions, open_ = self.sessions(capacity), self.open_sessions()
        parked = Counter(s.tenant for s in self.registry.all() if s.parked)
        stored, pool = self.stored_bytes(), self.stored()
        held_bytes = {t: sum(v) for t, v in stored.items()}
        prefixes, responses = self.prefix_bytes(), self.responses()
        names = [t.name for t in self.settings.tenants]
        names += sorted({*open_, *stored, *responses} - set(names) - {""})
        out = []
        for name in names:
            snap, chunks, memory = stored.get(name, (0, 0, 0))
            out.append(
                TenantUsage(
                    tenant=name,
                    sessions=open_[name],
                    parked=parked[name],
                    max_sessions=sessions.limit(open_, name),
                    reserved_sessions=sessions.share(name).reserved,
                    snapshot_bytes=snap,
                    journal_bytes=chunks,
                    memory_bytes=memory,
                    max_stored_bytes=(0 if pool is None else pool.limit(held_bytes, name)),
                    reserved_stored_bytes=0 if pool is None else pool.share(name).reserved,
                    prefix_bytes=prefixes.get(name, 0),
                    responses=responses[name],
                    max_responses=self.max_responses(name),
                )
            )
        return out


def _bytes(mb: float | None) -> int | None:
    return None if mb is None else int(mb * MB)
