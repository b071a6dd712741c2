"""One node: the service and its two edges (gRPC, HTTP) put together; graceful stop on SIGTERM,
SIGINT or the admin's Stop; a dead engine or HTTP thread stops it and says so in health.

The edges share who is calling and how much they may hold (`callers`), never each other.
"""

from __future__ import annotations

import logging
import signal
import threading

from sinkd.daemon.callers.auth import Authenticator
from sinkd.daemon.callers.limits import CallLimits
from sinkd.daemon.config import Settings
from sinkd.daemon.http.front import HttpFront
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.rpc.server import GrpcFront
from sinkd.daemon.runtime.service import SinkdService

log = logging.getLogger("sinkd.server")


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._signalled = threading.Event()  # a signal, a dead thread or the admin's Stop
        self._trapped = False
        self.metrics = Metrics()
        self.service = SinkdService(settings, self.metrics)
        self.died = threading.Event()  # the engine thread is gone: stop serving, exit non-zero
        self.service.on_engine_death(self._on_engine_death)
        authenticator = Authenticator(settings)
        self.limits = CallLimits(
            total=settings.rpc_workers - settings.rpc_reserved_workers,
            per_tenant=settings.max_calls_per_tenant,
            per_session=settings.max_calls_per_session,
            fair_wait_s=settings.fair_wait_s,
        )
        self.grpc = GrpcFront(self.service, settings, authenticator, self.limits, self.ask_stop)
        self.http = (
            HttpFront(self.service, settings, authenticator, self.limits) if settings.http else None
        )
        if self.http is not None:
            self.http.on_death = self._on_http_death
        self.addresses: list[str] = []
        self._stopped = threading.Event()

    def _on_engine_death(self, error: BaseException) -> None:
        """Engine thread: it died of a bug. Say so at once (health NOT_SERVING), then stop."""
        log.error("the engine thread died (%s): the daemon stops serving", type(error).__name__)
        self._die()

    def _on_http_death(self, error: BaseException) -> None:
        """The HTTP front's thread died: as with the engine's, health says so and the daemon stops."""
        log.error("the HTTP front died (%s): the daemon stops serving", type(error).__name__)
        self._die()

    def _die(self) -> None:
        self.grpc.set_serving(False)
        self.died.set()
        self._signalled.set()  # serve_until_signal returns, and `sinkd serve` exits non-zero

    def start(self) -> None:
        """Lock the state directory, bind, start serving, then load the model in the engine thread
        (health flips when done). A listener that cannot be had leaves nothing behind (the socket it
        made is removed, the lock let go)."""
        self.service.claim()  # the state directory's lock first: a second daemon binds nothing
        try:
            self._listen()
        except BaseException:
            self.grpc.remove_own_socket()
            if self.http is not None:
                self.http.stop(0)
            self.service.unclaim()
            raise
        self.grpc.start()
        self.service.start()

    def _listen(self) -> None:
        self.addresses += self.grpc.listen()
        if self.http is not None:
            self.http.start()
            self.addresses.append(self.http.address)
        if self.settings.metrics_port:
            self.metrics.serve(self.settings.metrics_port)

    def wait_ready(self, timeout: float | None = None) -> None:
        self.service.wait_ready(timeout)
        if self.service.alive() and not self.died.is_set():
            self.grpc.set_serving(True)

    def stop(self, grace: float = 5.0, snapshot: bool = True) -> None:
        """Stop accepting, cancel in-flight work, free the context (in its own thread), return."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.grpc.set_serving(False)
        if self.http is not None:
            self.http.stopping.set()
        event = self.grpc.stop(grace)
        if self.http is not None:
            self.http.stop(grace)
        self.service.stop(snapshot=snapshot)
        event.wait(grace + 1)
        self.grpc.remove_own_socket()  # only the one it made: another daemon's stays

    def trap_signals(self) -> None:
        """From now on SIGTERM and SIGINT ask for a graceful stop. Call it before `start`: a signal
        that comes while the model loads or sessions resume then still ends in a clean stop."""
        done = self._signalled

        def on_signal(signum: int, frame: object) -> None:
            log.info("signal %d: shutting down", signum)
            done.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self._trapped = True

    def ask_stop(self) -> None:
        """A graceful stop from within (the admin's Stop call), as SIGTERM would."""
        self._signalled.set()

    @property
    def stop_asked(self) -> bool:
        return self._signalled.is_set()

    def serve_until_signal(self) -> None:
        """Block until SIGTERM, SIGINT or the admin's Stop, then stop gracefully (the daemon is
        already started)."""
        if not self._trapped:
            self.trap_signals()
        while not self._signalled.wait(0.5):
            pass
        self.stop()
