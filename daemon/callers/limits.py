"""Backpressure shared by both edges: a call that waits on the engine holds a worker (a gRPC
pool thread, an HTTP turn's thread), so no tenant, session or flood may take them all.

Engine calls (every Sessions method, every HTTP turn) are admitted against three bounds: the pool
less a reserve (health checks, admin calls and refusals always find a worker), a bound per tenant
and a bound per session. Past one, the call is refused with RESOURCE_EXHAUSTED (HTTP 429 with
Retry-After) naming the bound. One wait only: a tenant below its fair share of a full pool (the
pool over the tenants active now) waits for a slot, at most `fair_wait_s` and never past its
call's deadline (gRPC's: the client has given up by then), holding its worker (the reserve stays
free), while a tenant past its share is refused even the slot that frees: one
tenant's flood leaves another served within about one call's time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator

from sinkd.errors import DeadlineExceeded, ResourceExhausted


class CallLimits:
    """`fair_wait_s`: how long a tenant below its fair share of the pool (the pool over the
    tenants with calls in flight or waiting) may wait for a slot when all are taken; meanwhile a
    tenant at or past its share is refused even a slot that frees, so a flood of one tenant's
    calls leaves another served within about one call's time. 0: no waiting (refused at once)."""

    def __init__(
        self, total: int, per_tenant: int, per_session: int, fair_wait_s: float = 0.0
    ) -> None:
        self.total = total
        self.per_tenant = per_tenant
        self.per_session = per_session
        self.fair_wait_s = fair_wait_s
        self._cond = threading.Condition()
        self._in_flight = 0
        self._tenants: Counter[str] = Counter()
        self._waiting: Counter[str] = Counter()
        # by (tenant, session id): another tenant's calls naming your session count for them alone,
        # so a refusal tells nothing of the session's activity (admission precedes ownership)
        self._sessions: Counter[tuple[str, str]] = Counter()

    @contextlib.contextmanager
    def admit(
        self, tenant: str, session_id: str = "", time_left: float | None = None
    ) -> Iterator[None]:
        """A slot for the call. `time_left`: what the caller's deadline leaves (None: none); a
        fair wait never outlasts it (DeadlineExceeded: the client has given up by then)."""
        key = (tenant, session_id)
        with self._cond:
            self._take(tenant, key if session_id else None, time_left)
        try:
            yield
        finally:
            with self._cond:
                self._in_flight -= 1
                self._tenants[tenant] -= 1
                if not self._tenants[tenant]:
                    del self._tenants[tenant]
                if session_id:
                    self._give_session(key)
                self._cond.notify_all()

    def _take(
        self, tenant: str, key: tuple[str, str] | None, time_left: float | None = None
    ) -> None:
        """Under the lock: a slot for the tenant now, after a bounded wait below its fair share
        (at most `fair_wait_s`, and never past the caller's deadline), or ResourceExhausted naming
        the bound."""
        wait_s = self.fair_wait_s if time_left is None else min(self.fair_wait_s, time_left)
        deadline = time.monotonic() + wait_s
        waiting = False
        try:
            while True:
                if self._tenants[tenant] >= self.per_tenant:
                    raise ResourceExhausted(
                        f"this tenant has {self.per_tenant} calls in flight (max_calls_per_tenant)"
                    )
                share = self._share(tenant)
                others_wait = any(n for t, n in self._waiting.items() if t != tenant)
                yields = others_wait and self._tenants[tenant] >= share
                if self._in_flight < self.total and not yields:
                    if key is not None:
                        self._take_session(key)
                    self._in_flight += 1
                    self._tenants[tenant] += 1
                    return
                left = deadline - time.monotonic()
                if waiting and left <= 0 and wait_s < self.fair_wait_s:
                    raise DeadlineExceeded(
                        "the call's deadline passed while it waited for a slot"
                        f" ({self.total} engine calls in flight)"
                    )
                if self._tenants[tenant] >= share or left <= 0:
                    raise ResourceExhausted(
                        f"the daemon is busy: {self.total} engine calls in flight"
                        f" ({self._tenants[tenant]} of them yours, a fair share {share}); retry"
                        " later"
                    )
                if not waiting:
                    self._waiting[tenant] += 1
                    waiting = True
                    self._cond.notify_all()  # a waiter counts from now (see `await_waiting`)
                self._cond.wait(left)
        finally:
            if waiting:
                self._waiting[tenant] -= 1
                if not self._waiting[tenant]:
                    del self._waiting[tenant]
                self._cond.notify_all()

    def _share(self, tenant: str) -> int:
        """The pool over the tenants with calls in flight or waiting, this one counted."""
        active = {t for t, n in self._tenants.items() if n}
        active |= {t for t, n in self._waiting.items() if n}
        active.add(tenant)
        return max(1, self.total // len(active))

    def waiting(self) -> int:
        """Calls waiting for a slot now."""
        with self._cond:
            return sum(self._waiting.values())

    def await_waiting(self, n: int, timeout: float) -> bool:
        """Whether `n` calls wait for a slot within `timeout` (a test knows its call waits)."""
        with self._cond:
            return self._cond.wait_for(lambda: sum(self._waiting.values()) >= n, timeout)

    @contextlib.contextmanager
    def admit_session(self, tenant: str, session_id: str) -> Iterator[None]:
        """The per-session bound alone, for a call admitted already whose session became known
        later (an HTTP turn finds its session by the history it sends)."""
        key = (tenant, session_id)
        with self._cond:
            self._take_session(key)
        try:
            yield
        finally:
            with self._cond:
                self._give_session(key)
                self._cond.notify_all()

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
        with self._cond:
            return self._in_flight
