"""Backpressure shared by both edges: a call that waits on the engine holds a worker (a gRPC
pool thread, an HTTP turn's thread), so no tenant, session or flood may take them all.

Engine calls (every Sessions method, every HTTP turn) are admitted against three bounds: the pool
less a reserve (health checks, admin calls and refusals always find a worker), a bound per tenant
and a bound per session. Past one, the call is refused at once with RESOURCE_EXHAUSTED naming the bound: it never
queues behind a worker it cannot get.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator

from sinkd.errors import ResourceExhausted


class CallLimits:
    def __init__(self, total: int, per_tenant: int, per_session: int) -> None:
        self.total = total
        self.per_tenant = per_tenant
        self.per_session = per_session
        self._lock = threading.Lock()
        self._in_flight = 0
        self._tenants: Counter[str] = Counter()
        # by (tenant, session id): another tenant's calls naming your session count for them alone,
        # so a refusal tells nothing of the session's activity (admission precedes ownership)
        self._sessions: Counter[tuple[str, str]] = Counter()

    @contextlib.contextmanager
    def admit(self, tenant: str, session_id: str = "") -> Iterator[None]:
        key = (tenant, session_id)
        with self._lock:
            if self._in_flight >= self.total:
                raise ResourceExhausted(
                    f"the daemon is busy: {self.total} engine calls in flight; retry later"
                )
            if self._tenants[tenant] >= self.per_tenant:
                raise ResourceExhausted(
                    f"this tenant has {self.per_tenant} calls in flight (max_calls_per_tenant)"
                )
            if session_id:
                self._take_session(key)
            self._in_flight += 1
            self._tenants[tenant] += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                self._tenants[tenant] -= 1
                if not self._tenants[tenant]:
                    del self._tenants[tenant]
                if session_id:
                    self._give_session(key)

    @contextlib.contextmanager
    def admit_session(self, tenant: str, session_id: str) -> Iterator[None]:
        """The per-session bound alone, for a call admitted already whose session became known
        later (an HTTP turn finds its session by the history it sends)."""
        key = (tenant, session_id)
        with self._lock:
            self._take_session(key)
        try:
            yield
        finally:
            with self._lock:
                self._give_session(key)

    def _take_session(self, key: tuple[str, str]) -> None:
        if self._sessions[key] >= self.per_session:
            raise ResourceExhausted(
                f"this session has {self.per_session} calls in flight (max_calls_per_session)"
            )
        self._sessions[key] += 1

    def _give_session(self, key: tuple[str, str]) -> None:
        self._sessions[key] -= 1
        if not self._sessions[key]:
            del self._sessions[key]

    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight
