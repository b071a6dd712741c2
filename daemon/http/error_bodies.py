"""Typed errors as the HTTP APIs say them: OpenAI's error body with its status, here and nowhere
else (the runtime raises sinkd errors; the edges translate)."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request
from fastapi.routing import APIRoute
from starlette.responses import JSONResponse, Response

from sinkd.errors import SinkdError, message_of

log = logging.getLogger("sinkd.http")

# the gRPC status a sinkd error carries -> (HTTP status, OpenAI error type)
_BY_STATUS = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "UNAUTHENTICATED": (401, "authentication_error"),
    "PERMISSION_DENIED": (403, "permission_error"),
    "NOT_FOUND": (404, "not_found_error"),
    "FAILED_PRECONDITION": (409, "invalid_request_error"),  # a stale or failed session
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error"),
    "UNAVAILABLE": (503, "service_unavailable"),
    "DEADLINE_EXCEEDED": (504, "timeout"),
    "CANCELLED": (499, "cancelled"),
    "ABORTED": (422, "invalid_response_error"),  # a reply broke its schema (never returned)
}
RETRY_AFTER_S = "1"


class HttpError(Exception):
    """A refusal of the edge's own (a field it does not take, a body too large)."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class InternalError(SinkdError):
    """An error that is not sinkd's own reached the edge (a bug): the client is told that much,
    the daemon's log has where (the frames, never the message: it could quote a request)."""


def internal(error: BaseException) -> SinkdError:
    if isinstance(error, SinkdError):
        return error
    frames = "".join(traceback.format_tb(error.__traceback__))
    log.error("internal error (%s) answering a request:\n%s", type(error).__name__, frames)
    return InternalError(f"internal error ({type(error).__name__}); the daemon's log says where")


def is_ollama(request: Request) -> bool:
    """Ollama's routes answer in Ollama's convention."""
    return request.url.path.startswith("/api/")


class Guarded(APIRoute):
    """A route whose unexpected error is answered in the API's error body (500), not Starlette's
    plain text; sinkd's own errors and refusals go to the app's handlers as before."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except (SinkdError, HttpError, HTTPException):
                raise
            except Exception as e:
                return from_sinkd(internal(e), is_ollama(request))

        return guarded


def body(message: str, kind: str, param: str | None = None, code: str | None = None) -> Any:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def status_of(error: SinkdError) -> int:
    """The HTTP status of a sinkd error."""
    return _BY_STATUS.get(error.status, (500, "server_error"))[0]


def from_sinkd(error: SinkdError, ollama: bool = False) -> JSONResponse:
    status, kind = _BY_STATUS.get(error.status, (500, "server_error"))
    code, param = type(error).__name__, getattr(error, "field", None)
    return _answer(message_of(error), status, kind, param, code, ollama)


def from_http(error: HttpError, ollama: bool = False) -> JSONResponse:
    kind = "invalid_request_error" if error.status < 500 else "server_error"
    if error.status == 401:
        kind = "authentication_error"
    return _answer(error.message, error.status, kind, error.param, error.code, ollama)


def _answer(
    message: str, status: int, kind: str, param: str | None, code: str | None, ollama: bool
) -> JSONResponse:
    """OpenAI's error body; Ollama's (`{"error": message}`) on Ollama's routes."""
    headers = {"Retry-After": RETRY_AFTER_S} if status in (429, 503) else None
    content = {"error": message} if ollama else body(message, kind, param, code)
    return JSONResponse(content, status, headers=headers)
