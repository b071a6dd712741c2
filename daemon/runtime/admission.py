"""How many sessions the daemon admits, and the one admission check every new sequence passes
(create, fork, resume): the resident sessions the context holds, and the parked ones beyond them
(`max_parked_sessions`; each parked session is its snapshot on disk). A new session (not a resumed
one) is within its tenant's shares first (runtime/tenancy.py)."""

from __future__ import annotations

from collections.abc import Collection

from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.loop.residency import NoRoom, ParkFailed, Residency
from sinkd.daemon.runtime.sessions import Registry
from sinkd.daemon.runtime.tenancy import Tenancy
from sinkd.errors import ResourceExhausted, SessionLimit, TenantLimit


class Admission:
    def __init__(
        self, registry: Registry, metrics: Metrics, residency: Residency, tenancy: Tenancy
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.residency = residency
        self.tenancy = tenancy

    def limit(self, engine: Engine) -> int:
        """Sessions resident in the context at once."""
        return self.residency.limit(engine)

    def capacity(self, engine: Engine) -> int:
        """Sessions open at once: resident, and parked beyond them."""
        return self.limit(engine) + self.residency.max_parked

    def check_new(self, engine: Engine, tenant: str) -> None:
        """Whether the tenant may add a session now: DiskFull if nothing more may be written,
        TenantLimit past its shares."""
        durability = self.tenancy.durability
        if durability is not None:
            durability.check_space("a new session")
        try:
            self.tenancy.check_new_session(self.capacity(engine), tenant)
        except TenantLimit:
            self.metrics.alloc_failures.inc()
            self.metrics.tenant_refusals.inc()
            raise

    def acquire(
        self,
        engine: Engine,
        keep: Collection[str] = (),
        tenant: str = "",
        may_wait: bool = False,
        resuming: bool = False,
    ) -> int:
        """A free, empty sequence for one more session (an idle one parked for it if need be).
        SessionLimit when no more sessions may be open; ResourceExhausted when every resident
        session is busy, or with `may_wait` -1: the new session starts parked, empty, and its
        first call waits for a sequence. Engine thread; the caller releases what it got if what
        follows fails. `keep`: sessions not to park for it (a fork's parent). `resuming`: a session
        that was open before a restart (its tenant's shares are not asked again)."""
        if not resuming:
            self.check_new(engine, tenant)
        parked = self.residency.max_parked
        if parked and len(self.registry) >= self.capacity(engine):
            self.metrics.alloc_failures.inc()
            raise SessionLimit(
                f"session limit reached: {self.limit(engine)} resident and"
                f" {parked} parked sessions (max_parked_sessions)"
            )
        try:
            return self.residency.free_sequence(engine, keep, tenant)
        except NoRoom as e:
            if may_wait and parked and not isinstance(e, ParkFailed):
                return -1
            self.metrics.alloc_failures.inc()
            raise (ResourceExhausted if parked else SessionLimit)(str(e)) from None
