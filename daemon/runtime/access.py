"""Who may touch which session: an owner's handle checked against the registry, the admin's
content-free view of any session, and the engine as the callers may use it now."""

from __future__ import annotations

from sinkd.daemon import failpoints
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.api import Handle
from sinkd.daemon.runtime.loop.scheduler import Scheduler
from sinkd.daemon.runtime.sessions import Principal, Registry, Session
from sinkd.errors import (
    Loading,
    NotFound,
    PermissionDenied,
    ShuttingDown,
    StaleGeneration,
    echo,
)


class Access:
    def __init__(self, registry: Registry, scheduler: Scheduler, metrics: Metrics) -> None:
        self.registry = registry
        self.scheduler = scheduler
        self.metrics = metrics

    def check_serving(self) -> Engine:
        """The loaded engine; Loading (try again) before it loaded, ShuttingDown once it stopped."""
        engine = self.scheduler.engine
        if not self.scheduler.ready.is_set():
            raise Loading("the model is loading; try again in a moment")
        if engine is None or not self.scheduler.alive():
            raise ShuttingDown("the engine has stopped: the daemon is shutting down")
        return engine

    @property
    def engine(self) -> Engine:
        return self.check_serving()

    def owned(self, principal: Principal, handle: Handle, allow_stale: bool = False) -> Session:
        """The caller's own session at the handle's generation (StaleGeneration otherwise)."""
        if principal.tenant is None:
            raise NotFound(f"no session {echo(handle.session_id)}")  # the admin owns none
        try:
            session = self.registry.lookup(
                principal.tenant, handle.session_id, handle.generation, allow_stale
            )
        except StaleGeneration:
            self.metrics.stale_handles.inc()
            raise
        failpoints.hit("handle-checked")
        return session

    def visible(self, principal: Principal, handle: Handle) -> Session:
        """The owner's session; for the admin, any session (content-free reads only)."""
        if principal.admin and principal.tenant is None:
            session = self.registry.get(handle.session_id)
            if session is None:
                raise self.registry.missing(None, handle.session_id)
            return session
        return self.owned(principal, handle)


def admin_only(principal: Principal, what: str) -> None:
    if not principal.admin:
        raise PermissionDenied(f"{what} needs the admin token")
