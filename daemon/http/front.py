"""The HTTP front: OpenAI's and Ollama's APIs in the daemon's process, over the same service as
gRPC (no hop), on uvicorn in a thread of its own.

The trust rules are gRPC's over TCP: tenants' bearer tokens (the openai SDK sends its api key so), TLS
off loopback. A daemon without tenants still needs a token here (anyone on the machine can reach a
loopback port): a local token made at first start, mode 0600 beside the socket, printed by `sinkd
serve`. A turn holds a slot of the same call limits as gRPC's engine calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from starlette.background import BackgroundTask
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.responses import JSONResponse, Response, StreamingResponse

from sinkd.daemon.callers.auth import Authenticator
from sinkd.daemon.callers.limits import CallLimits
from sinkd.daemon.config import Settings
from sinkd.daemon.http.error_bodies import HttpError, from_http, from_sinkd, is_ollama
from sinkd.daemon.http.wire import headers_of
from sinkd.daemon.private import secret
from sinkd.daemon.runtime.api import CancelToken, ChatStream, Done, TokenEvent
from sinkd.daemon.runtime.conversations.chats import Admit, Continuation, StatelessChatRequest
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import LOCAL_TENANT, Principal
from sinkd.errors import Cancelled, ListenError, SinkdError, Unauthenticated

log = logging.getLogger("sinkd.http")
# a turn to start: given the call's cancel and its per-session admission
Start = Callable[[CancelToken, Admit], tuple[Continuation, ChatStream]]
# how often a call still starting (a history's ingest) asks whether its client is still there
DISCONNECT_POLL_S = 0.25
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def local_token(folder: Path) -> str:
    """The token of a daemon without tenants: made once, 0600, in the private runtime folder."""
    return secret(folder / "http-token").decode().strip()


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


class HttpFront:
    def __init__(
        self,
        service: SinkdService,
        settings: Settings,
        authenticator: Authenticator,
        limits: CallLimits,
    ) -> None:
        self.service = service
        self.settings = settings
        self.authenticator = authenticator
        self.limits = limits
        self.local_sha256: str | None = None
        self.created = int(time.time())
        self.chats = service.chats
        self.app = self._app()
        self.address = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.died = threading.Event()
        self.stopping = threading.Event()
        self.on_death: Callable[[BaseException], None] = lambda e: None

    # --- who is calling ---

    def principal(self, request: Request) -> Principal:
        header = request.headers.get("authorization", "")
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

    # --- the app ---

    def _app(self) -> FastAPI:
        from sinkd.daemon.http import ollama_api, openai_api, responses_api

        app = FastAPI(title="sinkd", docs_url=None, redoc_url=None, openapi_url=None)

        ollama = is_ollama

        @app.exception_handler(SinkdError)
        async def sinkd_error(request: Request, e: SinkdError) -> Response:
            return from_sinkd(e, ollama(request))

        @app.exception_handler(HttpError)
        async def http_error(request: Request, e: HttpError) -> Response:
            return from_http(e, ollama(request))

        @app.exception_handler(404)
        async def not_found(request: Request, e: Exception) -> Response:
            return from_http(HttpError(404, f"no route {request.url.path}"), ollama(request))

        @app.exception_handler(405)
        async def not_allowed(request: Request, e: Exception) -> Response:
            error = HttpError(405, f"{request.method} is not allowed on this route")
            return from_http(error, ollama(request))

        @app.get("/health")
        async def health() -> Response:
            """For load balancers and scripts, no token (as gRPC's health service): 200 once
            the model is loaded and the engine runs, else 503."""
            node = {"node": self.settings.node} if self.settings.node else {}
            if self.serving():
                return JSONResponse({"status": "ok", **node})
            return JSONResponse(
                {"status": "unavailable", **node}, 503, headers={"Retry-After": "1"}
            )

        app.include_router(openai_api.router(self))
        app.include_router(responses_api.router(self))
        app.include_router(ollama_api.router(self))
        return app

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

    def serving(self) -> bool:
        """The model is loaded, the engine runs, and the daemon is not stopping (a proxy's
        health check sends no new work to a node on its way down)."""
        return self.service.serving() and not self.stopping.is_set()

    def ready(self) -> None:
        """503 while the model loads (the clients retry on Retry-After)."""
        if not self.serving():
            raise HttpError(503, "the model is loading (or the engine stopped)")

    def slot(self, principal: Principal) -> Slot:
        """A call slot of the limits gRPC's engine calls share (ResourceExhausted: 429), taken in
        a worker thread: below its fair share of a full pool, a call waits for one there, never on
        the event loop."""
        return Slot(self.limits, principal.tenant or "(admin)")

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

    # --- lifecycle ---

    def start(self) -> None:
        s = self.settings
        assert s.http
        host, _, port = s.http.rpartition(":")
        host = host.strip("[]")
        if self.authenticator.open:
            token = local_token(s.socket.parent)
            self.local_sha256 = hashlib.sha256(token.encode()).hexdigest()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP named: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say TCP;
        # with proto 0 every answer after a connection's first waited ~40 ms for a delayed ACK
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        # a restart (after a crash too) may bind while the old connections sit in TIME_WAIT; on
        # Linux this lets no second listener share the port (that is SO_REUSEPORT, never set)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, int(port)))
            sock.listen(128)
        except OSError as e:
            sock.close()
            raise ListenError(f"could not listen on http {s.http}: {e.strerror or e}") from None
        bound = sock.getsockname()[1]
        tls = bool(s.tls_cert and s.tls_key)
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,  # paths and bodies are nobody's business; counts go to metrics
            ssl_certfile=str(s.tls_cert) if tls else None,
            ssl_keyfile=str(s.tls_key) if tls else None,
            timeout_keep_alive=int(s.max_connection_idle_s),
            limit_concurrency=s.rpc_workers * 4,
        )
        self._server = uvicorn.Server(config)
        self.address = f"{'https' if tls else 'http'}://{host}:{bound}"

        def run() -> None:
            assert self._server is not None
            try:
                self._server.run(sockets=[sock])
            except BaseException as e:  # the daemon must not say SERVING without its front
                log.exception("the HTTP front died")
                self.died.set()
                self.on_death(e)
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name="sinkd-http", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self.died.is_set()

    def stop(self, grace: float = 5.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(grace)
        with contextlib.suppress(Exception):
            self._server = None
