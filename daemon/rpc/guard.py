"""The calls that need no tenant: health and server reflection. Each streaming one holds a worker
for as long as its client keeps it open, so they get a small bound of their own, below the workers
kept in reserve: a flood of them is refused at once (RESOURCE_EXHAUSTED) and health's `Check` and
every tenant's call still find a worker. Reflection also needs a token wherever tokens exist.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from sinkd.daemon.callers.auth import Authenticator
from sinkd.errors import SinkdError

HEALTH = "/grpc.health.v1.Health/"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/"


class OpenStreams:
    """How many streaming health and reflection calls are open, at most `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self._open >= self.limit:
                return False
            self._open += 1
            return True

    def give(self) -> None:
        with self._lock:
            self._open -= 1

    def count(self) -> int:
        with self._lock:
            return self._open


class TenantlessCalls(grpc.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, streams: OpenStreams, authenticator: Authenticator | None) -> None:
        """`authenticator`: reflection answers only callers it accepts; None: anyone."""
        self.streams = streams
        self.authenticator = authenticator

    def intercept_service(
        self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails
    ) -> Any:
        handler = continuation(details)
        method: str = details.method
        if handler is None or not method.startswith((HEALTH, REFLECTION)):
            return handler
        needs_token = method.startswith(REFLECTION) and self.authenticator is not None
        if handler.stream_stream is not None:
            return handler._replace(
                stream_stream=self._guard(handler.stream_stream, needs_token, stream=True)
            )
        if handler.unary_stream is not None:
            return handler._replace(
                unary_stream=self._guard(handler.unary_stream, needs_token, stream=True)
            )
        if handler.unary_unary is not None and needs_token:
            return handler._replace(
                unary_unary=self._guard(handler.unary_unary, needs_token, stream=False)
            )
        return handler

    def _guard(self, behavior: Callable[..., Any], needs_token: bool, stream: bool) -> Any:
        def admitted(context: grpc.ServicerContext) -> None:
            if not needs_token:
                return
            assert self.authenticator is not None
            try:
                self.authenticator.authenticate(context.invocation_metadata())
            except SinkdError as e:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, str(e))

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            admitted(context)
            return behavior(request, context)

        def bounded(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            admitted(context)
            if not self.streams.take():
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{self.streams.limit} health/reflection streams are open"
                    " (max_tenantless_streams); retry later, or use Health.Check",
                )
            once = threading.Lock()

            def release() -> None:  # once: at the stream's end, or when its call terminates
                if once.acquire(blocking=False):
                    self.streams.give()

            context.add_callback(release)
            try:
                yield from behavior(request, context)
            finally:
                release()

        return bounded if stream else unary
