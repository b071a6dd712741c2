"""The page's routes: its login, logout and admin pages here, and the sessions', memory's and
narrator's from their modules, as one router for the front."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from sinkd.daemon.http.error_bodies import HttpError
from sinkd.daemon.http.ui import memory_pages, narrator_pages, session_pages
from sinkd.daemon.http.ui.markup import html, join, link, page, size, table
from sinkd.daemon.http.ui.pages import Pages, UiRoute, origin_of, own_origin
from sinkd.errors import SinkdError, Unauthenticated


def router(pages: Pages) -> APIRouter:
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
        origin = origin_of(request)
        if origin is not None and origin != own_origin(request):
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
