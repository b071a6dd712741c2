"""The page's plumbing and its login and admin routes; the sessions', memory's and narrator's
routes live beside it (session_pages.py, memory_pages.py, narrator_pages.py).

Every answer carries a Content-Security-Policy that allows no script, no inline style and nothing
from elsewhere, and is never cached; sinkd's errors become an error page with the status the
API would give (an ended login: back to the login form)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Request
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.responses import HTMLResponse, RedirectResponse, Response

from sinkd.daemon.http.calls import Calls
from sinkd.daemon.http.error_bodies import HttpError, internal, status_of
from sinkd.daemon.http.ui.logins import Login, Logins, check_csrf
from sinkd.daemon.http.ui.markup import Html, html, join, link, page, size, table, when
from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import SinkdError, Unauthenticated, message_of

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
        check_csrf(visit.login, fields.get("csrf"), _origin(request), _own_origin(request))
        return visit, fields

    async def fields(self, request: Request) -> dict[str, str]:
        body = (await self.calls.body(request)).decode("utf-8", "replace")
        return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}

    async def run(self, visit: Visit, fn: Callable[[], Any]) -> Any:
        """A service call, in a worker thread under a call slot (never on the event loop)."""
        self.calls.ready()
        return await self.calls.in_slot(visit.principal, fn)


def _origin(request: Request) -> str | None:
    origin = request.headers.get("origin")
    return None if origin in (None, "null") else origin


def _own_origin(request: Request) -> str:
    forwarded = request.headers.get("x-forwarded-proto")
    scheme = forwarded or request.url.scheme
    return f"{scheme}://{request.headers.get('host', urlsplit(str(request.url)).netloc)}"


def router(pages: Pages) -> APIRouter:
    from sinkd.daemon.http.ui import memory_pages, narrator_pages, session_pages

    api = APIRouter(route_class=UiRoute)
    logins = pages.logins

    @api.get("/ui")
    async def home(request: Request) -> Response:
        try:
            visit = pages.visit(request)
        except Unauthenticated:
            return RedirectResponse("/ui/login", 303)
        return RedirectResponse("/ui/admin" if visit.principal.admin else "/ui/sessions", 303)

    @api.get("/ui/static/ui.css")
    async def stylesheet() -> Response:
        css = resources.files("sinkd.daemon.http.ui").joinpath("static/ui.css").read_text()
        return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=3600"})

    @api.get("/ui/login")
    async def login_form() -> Response:
        body = html(
            '<form method="post" action="/ui/login" class="login">'
            '<p><label>Token <input type="password" name="token" autocomplete="current-password"'
            " required autofocus></label></p><p><button>Log in</button></p></form>"
            "<p class=\"note\">A tenant's token (or the admin's). It is sent once, in this"
            " form's body, and never kept in the page.</p>"
        )
        return HTMLResponse(page("Log in", body))

    @api.post("/ui/login")
    async def log_in(request: Request) -> Response:
        origin = _origin(request)
        if origin is not None and origin != _own_origin(request):
            raise HttpError(403, "this login did not come from sinkd's own page")
        token = (await pages.fields(request)).get("token", "").strip()
        try:
            principal = pages.calls.of_header(f"Bearer {token}")
        except SinkdError:
            body = html('<p class="error">{}</p>{}', "Wrong token.", link("/ui/login", "Again"))
            return HTMLResponse(page("Log in", body), 401)
        pages.service.tenants.check_here(principal)
        value, _ = logins.open(principal)
        to = "/ui/admin" if principal.admin else "/ui/sessions"
        return RedirectResponse(to, 303, headers={"Set-Cookie": logins.cookie_header(value)})

    @api.post("/ui/logout")
    async def log_out(request: Request) -> Response:
        await pages.form(request)
        logins.close(request.cookies.get(logins.cookie))
        cleared = logins.cookie_header("", max_age=0)
        return RedirectResponse("/ui/login", 303, headers={"Set-Cookie": cleared})

    @api.get("/ui/admin")
    async def admin(request: Request) -> Response:
        visit = pages.visit(request)
        p = visit.principal
        service = pages.service
        stats = await pages.run(visit, lambda: service.reads.stats(p))
        prefixes = await pages.run(visit, lambda: service.list_prefixes(p))
        held, _ = await pages.run(visit, lambda: service.tenants.held(p))
        node = pages.calls.settings.node or "(this node, unnamed)"
        body = join([
            html("<h2>This node</h2><dl><dt>node</dt><dd>{}</dd><dt>model</dt><dd>{}</dd>"
                 "<dt>sessions</dt><dd>{} of {}</dd><dt>cells in use</dt><dd>{}</dd>"
                 "<dt>parked</dt><dd>{} of {}</dd></dl>",
                 node, stats.model, stats.sessions, stats.max_sessions, stats.cells_in_use,
                 stats.parked_sessions, stats.max_parked_sessions),
            html("<h2>Tenants and their shares</h2>"),
            table(["tenant", "sessions", "parked", "max sessions", "reserved", "stored",
                   "max stored", "prefixes", "responses"],
                  [[u.tenant, u.sessions, u.parked, u.max_sessions, u.reserved_sessions,
                    size(u.stored_bytes), size(u.max_stored_bytes) if u.max_stored_bytes else "-",
                    size(u.prefix_bytes), u.responses]
                   for u in stats.tenants]),
            html("<h2>Held here</h2>"),
            table(["tenant", "sessions", "passages", "prefixes", "mark", "move", "peer"],
                  [[h.tenant, h.sessions, h.passages, h.prefixes, h.state or "-",
                    h.move_id or "-", h.peer or "-"] for h in held]),
            html("<h2>Prefix states</h2>"),
            table(["key", "tenant", "shared", "tokens", "RAM", "disk", "hits",
                   "idle s"],
                  [[x.key[:16], x.tenant, x.shared, x.tokens, size(x.ram_bytes),
                    size(x.disk_bytes), x.hits,
                    f"{x.idle_s:.0f}"] for x in prefixes]),
        ])  # fmt: skip
        return visit.page("Admin", body)

    session_pages.add(api, pages)
    memory_pages.add(api, pages)
    narrator_pages.add(api, pages)
    return api


__all__ = ["Pages", "Visit", "router", "when"]
