"""The page's plumbing: what every route shares (who is logged in, a form's CSRF check, a service
call under a call slot) and how its answers are made (the security headers, sinkd's errors as an
error page). The routes: routes.py (login, admin) and session_pages.py, memory_pages.py,
narrator_pages.py.

Every answer carries a Content-Security-Policy that allows no script, no inline style and nothing
from elsewhere, and is never cached; sinkd's errors become an error page with the status the
API would give (an ended login: back to the login form)."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.responses import HTMLResponse, RedirectResponse, Response

from sinkd.daemon.http.calls import Calls
from sinkd.daemon.http.error_bodies import HttpError, internal, status_of
from sinkd.daemon.http.ui.logins import Login, Logins, check_csrf
from sinkd.daemon.http.ui.markup import Html, html, link, page
from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import InvalidInput, SinkdError, Unauthenticated, message_of

log = logging.getLogger("sinkd.ui")

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self';"
        " frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class UiRoute(APIRoute):
    """A page: its security headers on every answer, sinkd's errors as an error page."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                response = await handler(request)
            except Unauthenticated:
                response = RedirectResponse("/ui/login", 303)
            except SinkdError as e:
                response = error_page(status_of(e), message_of(e))
            except HttpError as e:
                response = error_page(e.status, e.message)
            except HTTPException as e:
                response = error_page(e.status_code, str(e.detail))
            except Exception as e:  # a bug: said as one, not a dropped connection
                log.exception("a page failed")
                response = error_page(500, message_of(internal(e)))
            response.headers.update(HEADERS)
            return response

        return guarded


def error_page(status: int, message: str) -> HTMLResponse:
    body = html('<p class="error">{}</p><p>{}</p>', message, link("/ui/sessions", "Back"))
    return HTMLResponse(page(f"Error {status}", body), status)


@dataclass(frozen=True)
class Visit:
    """A logged-in request: who, and the login's CSRF token for the forms it shows."""

    login: Login
    principal: Principal

    def page(self, title: str, body: Html, status: int = 200) -> HTMLResponse:
        p = self.principal
        who = "admin" if p.admin else f"tenant {p.tenant}"
        return HTMLResponse(page(title, body, who, self.login.csrf, p.admin), status)


class Pages:
    """What every route of the page shares: the calls over the service, and the logins."""

    def __init__(self, calls: Calls, logins: Logins) -> None:
        self.calls = calls
        self.logins = logins
        self.service = calls.service

    def visit(self, request: Request) -> Visit:
        login = self.logins.find(request.cookies.get(self.logins.cookie))
        self.service.tenants.check_here(login.principal)
        return Visit(login, login.principal)

    async def form(self, request: Request) -> tuple[Visit, dict[str, str]]:
        """A state-changing form from a logged-in page: its fields, its CSRF token checked."""
        visit = self.visit(request)
        fields = await self.fields(request)
        check_csrf(visit.login, fields.get("csrf"), origin_of(request), own_origin(request))
        return visit, fields

    async def fields(self, request: Request) -> dict[str, str]:
        body = (await self.calls.body(request)).decode("utf-8", "replace")
        return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}

    async def run(self, visit: Visit, fn: Callable[[], Any]) -> Any:
        """A service call, in a worker thread under a call slot (never on the event loop)."""
        self.calls.ready()
        return await self.calls.in_slot(visit.principal, fn)


def origin_of(request: Request) -> str | None:
    origin = request.headers.get("origin")
    return None if origin in (None, "null") else origin


def own_origin(request: Request) -> str:
    forwarded = request.headers.get("x-forwarded-proto")
    scheme = forwarded or request.url.scheme
    return f"{scheme}://{request.headers.get('host', urlsplit(str(request.url)).netloc)}"


def form_time(value: str, name: str) -> float | None:
    """A browser's datetime-local (its local time) as unix seconds."""
    if not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value).astimezone().timestamp()
    except ValueError:
        raise InvalidInput(f"{name}: {value[:32]!r} is not a date and time") from None
