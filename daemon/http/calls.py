"""What the HTTP front's three APIs (OpenAI's Chat Completions, its Responses, Ollama's) share of
a call: who is calling, the body within its bound, whether the daemon serves, a call slot of the
limits gRPC's engine calls share, and a turn answered as a stream or whole. Each API's module
translates its wire format and talks to these; the front (front.py) puts them together, so the
imports point one way: front -> the APIs -> calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

from fastapi import Request
from starlette.background import BackgroundTask
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.responses import StreamingResponse

from sinkd.daemon.callers.auth import Authenticator
from sinkd.daemon.callers.limits import CallLimits
from sinkd.daemon.config import Settings
from sinkd.daemon.http.error_bodies import HttpError
from sinkd.daemon.http.wire import headers_of
from sinkd.daemon.runtime.api import CancelToken, ChatStream, Done, TokenEvent
from sinkd.daemon.runtime.conversations.chats import Admit, Continuation, StatelessChatRequest
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import LOCAL_TENANT, Principal
from sinkd.errors import Cancelled, Unauthenticated

T = TypeVar("T")

# a turn to start: given the call's cancel and its per-session admission
Start = Callable[[CancelToken, Admit], tuple[Continuation, ChatStream]]
# how often a call still starting (a history's ingest) asks whether its client is still there
DISCONNECT_POLL_S = 0.25


@contextlib.asynccontextmanager
async def _cancelled_if_gone(request: Request, cancel: CancelToken) -> AsyncIterator[None]:
    """While the block runs, a client that disconnects cancels the call's engine work."""

    async def watch() -> None:
        while not cancel.cancelled:
            if await request.is_disconnected():
                cancel.cancel()
                return
            await asyncio.sleep(DISCONNECT_POLL_S)

    watcher = asyncio.ensure_future(watch())
    try:
        yield
    finally:
        watcher.cancel()


def _collect(events: ChatStream) -> tuple[str, Done]:
    """The reply's text and its end (which holds its tool calls, whole)."""
    text, done = [], None
    for event in events:
        if isinstance(event, TokenEvent):
            text.append(event.text)
        elif isinstance(event, Done):
            done = event
    assert done is not None  # a stream ends with Done or raises
    return "".join(text), done


class Slot:
    """One admitted call, given back once (at the answer's end, or when it never began), with the
    sessions it turned out to touch (each under the per-session bound, as a gRPC call's)."""

    def __init__(self, limits: CallLimits, tenant: str) -> None:
        self._limits, self._tenant = limits, tenant
        self._held = [limits.admit(tenant)]
        self._held[0].__enter__()
        self._lock = threading.Lock()
        self._released = False

    def session(self, session_id: str) -> None:
        """Admit the session (ResourceExhausted past max_calls_per_session)."""
        with self._lock:
            if self._released:
                raise Cancelled("the client went away")
            held = self._limits.admit_session(self._tenant, session_id)
            held.__enter__()
            self._held.append(held)

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        for held in reversed(self._held):
            held.__exit__(None, None, None)


class Calls:
    """A call's shared parts, over the service: built once by the front."""

    def __init__(
        self,
        service: SinkdService,
        settings: Settings,
        authenticator: Authenticator,
        limits: CallLimits,
        serving: Callable[[], bool],
    ) -> None:
        self.service = service
        self.settings = settings
        self.authenticator = authenticator
        self.limits = limits
        self.serving = serving  # the front's: the model loaded and the daemon not stopping
        self.local_sha256: str | None = None  # a daemon without tenants: its local token's
        self.created = int(time.time())
        self.chats = service.chats

    # --- who is calling ---

    def principal(self, request: Request) -> Principal:
        """Who calls, and a tenant this node serves now (SessionElsewhere, 503: a tenant moving
        between nodes)."""
        principal = self._authenticated(request)
        self.service.tenants.check_here(principal)
        return principal

    def _authenticated(self, request: Request) -> Principal:
        return self.of_header(request.headers.get("authorization", ""))

    def of_header(self, header: str) -> Principal:
        """Who an `Authorization` header names (Unauthenticated: nobody)."""
        if self.authenticator.open:
            scheme, _, token = header.partition(" ")
            digest = hashlib.sha256(token.strip().encode()).hexdigest()
            known = self.local_sha256
            if scheme.lower() == "bearer" and known and hmac.compare_digest(digest, known):
                return Principal(LOCAL_TENANT, admin=False)
            raise Unauthenticated(
                "missing or wrong api key: this daemon's local token is in its runtime folder"
                " (`sinkd serve` prints where)"
            )
        return self.authenticator.authenticate([("authorization", header)] if header else [])

    async def body(self, request: Request) -> bytes:
        """The request body, at most `max_message_bytes` (413 past it, whatever the client says
        its length is)."""
        limit = self.settings.max_message_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HttpError(413, f"the body is larger than max_message_bytes ({limit})")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"the body is larger than max_message_bytes ({limit})")
            chunks.append(chunk)
        return b"".join(chunks)

    def ready(self) -> None:
        """503 while the model loads (the clients retry on Retry-After)."""
        if not self.serving():
            raise HttpError(503, "the model is loading (or the engine stopped)")

    def slot(self, principal: Principal) -> Slot:
        """A call slot of the limits gRPC's engine calls share (ResourceExhausted: 429), taken in
        a worker thread: below its fair share of a full pool, a call waits for one there, never on
        the event loop."""
        return Slot(self.limits, principal.tenant or "(admin)")

    async def in_slot(self, principal: Principal, fn: Callable[[], T]) -> T:
        """`fn` (a call that waits: the engine, a purge) in a worker thread, under a call slot:
        never on the event loop."""
        slot = await run_in_threadpool(self.slot, principal)
        try:
            return await run_in_threadpool(fn)
        finally:
            slot.release()

    def stream(
        self, slot: Slot, cancel: CancelToken, pieces: Iterator[bytes], media_type: str,
        headers: dict[str, str],
    ) -> StreamingResponse:  # fmt: skip
        """A streamed answer: holds its slot while it runs; a client that goes away cancels the
        generation (within one scheduler step)."""

        def release() -> None:
            cancel.cancel()  # a no-op for work that ended
            slot.release()

        async def body() -> AsyncIterator[bytes]:
            try:
                async for piece in iterate_in_threadpool(pieces):
                    yield piece
            finally:
                release()

        return StreamingResponse(  # the background task runs should the body never start
            body(), media_type=media_type, headers=headers, background=BackgroundTask(release)
        )

    async def streamed(
        self,
        principal: Principal,
        request: Request,
        start: Start,
        pieces_of: Callable[[Continuation, ChatStream], Iterator[bytes]],
        media_type: str,
    ) -> StreamingResponse:
        """A turn (`start`: a chat turn or a response) answered as a stream in the API's own
        framing (`pieces_of`). A client gone while the turn starts (a long history's ingest)
        cancels it."""
        cancel, slot = CancelToken(), await run_in_threadpool(self.slot, principal)
        try:
            async with _cancelled_if_gone(request, cancel):
                c, events = await run_in_threadpool(start, cancel, slot.session)
        except BaseException:
            cancel.cancel()
            slot.release()
            raise
        return self.stream(slot, cancel, pieces_of(c, events), media_type, headers_of(c))

    async def whole(
        self, principal: Principal, request: Request, start: Start
    ) -> tuple[Continuation, str, Done, float]:
        """A turn answered whole: its text, its end, and the seconds it generated for; a client
        gone meanwhile cancels it."""
        cancel, slot = CancelToken(), await run_in_threadpool(self.slot, principal)
        try:
            async with _cancelled_if_gone(request, cancel):
                c, events = await run_in_threadpool(start, cancel, slot.session)
                t0 = time.monotonic()
                text, done = await run_in_threadpool(_collect, events)
            return c, text, done, time.monotonic() - t0
        finally:
            cancel.cancel()
            slot.release()

    def chat(self, principal: Principal, turn: StatelessChatRequest) -> Start:
        """A stateless client's chat turn, to start."""
        return lambda cancel, admit: self.chats.turn(principal, turn, cancel, None, admit)
