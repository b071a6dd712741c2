"""The HTTP front: OpenAI's and Ollama's APIs in the daemon's process, over the same service as
gRPC (no hop), on uvicorn in a thread of its own.

The trust rules are gRPC's over TCP: tenants' bearer tokens (the openai SDK sends its api key so), TLS
off loopback. A daemon without tenants still needs a token here (anyone on the machine can reach a
loopback port): a local token made at first start, mode 0600 beside the socket, printed by `sinkd
serve`. A turn holds a slot of the same call limits as gRPC's engine calls.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from sinkd.daemon.callers.auth import Authenticator
from sinkd.daemon.callers.limits import CallLimits
from sinkd.daemon.config import Settings
from sinkd.daemon.http import (
    embeddings_api,
    memory_api,
    narration_api,
    ollama_api,
    openai_api,
    responses_api,
)
from sinkd.daemon.http.calls import Calls
from sinkd.daemon.http.error_bodies import HttpError, from_http, from_sinkd, is_ollama
from sinkd.daemon.http.ui import pages as ui_pages
from sinkd.daemon.http.ui import routes as ui_routes
from sinkd.daemon.http.ui.logins import Logins
from sinkd.daemon.private import secret
from sinkd.daemon.runtime.service import SinkdService
from sinkd.errors import ListenError, SinkdError

log = logging.getLogger("sinkd.http")


def local_token(folder: Path) -> str:
    """The token of a daemon without tenants: made once, 0600, in the private runtime folder."""
    return secret(folder / "http-token").decode().strip()


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
        self.calls = Calls(service, settings, authenticator, limits, self.serving)
        self.logins = Logins(tls=bool(settings.tls_cert and settings.tls_key))
        self.app = self._app()
        self.address = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.died = threading.Event()
        self.stopping = threading.Event()
        self.on_death: Callable[[BaseException], None] = lambda e: None

    # --- the app ---

    @property
    def local_sha256(self) -> str | None:
        """The local token's sha256, for a daemon without tenants (set at start)."""
        return self.calls.local_sha256

    def _app(self) -> FastAPI:
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

        app.include_router(openai_api.router(self.calls))
        app.include_router(responses_api.router(self.calls))
        app.include_router(ollama_api.router(self.calls))
        app.include_router(embeddings_api.router(self.calls))
        app.include_router(memory_api.router(self.calls))
        app.include_router(narration_api.router(self.calls))
        if self.settings.ui:
            app.include_router(ui_routes.router(ui_pages.Pages(self.calls, self.logins)))
        return app

    def serving(self) -> bool:
        """The model is loaded, the engine runs, and the daemon is not stopping (a proxy's
        health check sends no new work to a node on its way down)."""
        return self.service.serving() and not self.stopping.is_set()

    # --- lifecycle ---

    def start(self) -> None:
        s = self.settings
        assert s.http
        host, _, port = s.http.rpartition(":")
        host = host.strip("[]")
        if self.authenticator.open:
            token = local_token(s.socket.parent)
            self.calls.local_sha256 = hashlib.sha256(token.encode()).hexdigest()
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
