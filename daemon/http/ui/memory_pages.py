"""The tenant's memory across its conversations: searchable by words and time, each passage with
where it came from; forget one, a conversation's or a period's, after a confirmation that says
what will go. What a forget removed is told in counts, never text."""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import APIRouter, Request
from starlette.responses import Response

from sinkd.daemon.http.ui.markup import Html, forgotten_note, form, html, join, link, table, when
from sinkd.daemon.http.ui.pages import Pages, form_time
from sinkd.daemon.http.ui.session_pages import _from, _text
from sinkd.daemon.runtime.api import KeptSelection
from sinkd.errors import InvalidInput

LIMIT = 200
COUNTED = 10_000  # a forget's confirmation counts the passages it takes up to this many


def add(api: APIRouter, pages: Pages) -> None:
    across = pages.service.across

    @api.get("/ui/memory")
    async def memory(request: Request) -> Response:
        visit = pages.visit(request)
        p = visit.principal
        q = request.query_params
        which = selection(dict(q))
        search = q.get("search", "")
        found = await pages.run(visit, lambda: across.listing(p, which, search, LIMIT))
        period = urlencode({"since": q.get("since", ""), "until": q.get("until", "")})
        rows = [
            [x.passage_id, _text(x.text), x.speaker, _from(x.conversation, ""), x.turn,
             when(x.created_unix_time), "yes" if x.asked else "",
             join([link(f"/ui/memory/forget?passage={x.passage_id}", "forget"), html(" · "),
                   link(f"/ui/memory/forget?{urlencode({'conversation': x.conversation})}",
                        "its conversation's")])]
            for x in found
        ]  # fmt: skip
        body = join([
            html('<form method="get" action="/ui/memory" class="search">'
                 '<input type="search" name="search" value="{}" placeholder="words">'
                 ' since <input type="datetime-local" name="since" value="{}">'
                 ' until <input type="datetime-local" name="until" value="{}">'
                 " <button>Search</button></form>",
                 search, q.get("since", ""), q.get("until", "")),
            table(["passage", "text", "speaker", "from", "turn", "kept", "asked to keep", ""],
                  rows, "Nothing kept."),
            html("<p>{}</p>", link(f"/ui/memory/forget?{period}", "Forget the period searched…")
                 if which.since or which.until else ""),
        ])  # fmt: skip
        return visit.page("Memory across conversations", body)

    @api.get("/ui/memory/forget")
    async def confirm(request: Request) -> Response:
        visit = pages.visit(request)
        p = visit.principal
        fields = dict(request.query_params)
        which = selection(fields)
        if which == KeptSelection():
            raise InvalidInput("forget: name a passage, a conversation or a period")
        going = await pages.run(visit, lambda: across.listing(p, which, "", COUNTED))
        kept = {k: v for k, v in fields.items() if k in ("passage", "conversation", "since",
                                                          "until") and v}  # fmt: skip
        body = html(
            "<p>This forgets {} passage{} ({}), from every file of this node.</p>{}<p>{}</p>",
            f"{COUNTED:,} or more" if len(going) == COUNTED else len(going),
            "" if len(going) == 1 else "s", _described(kept),
            form("/ui/memory/forget", visit.login.csrf, kept, "Forget", danger=True),
            link("/ui/memory", "Cancel"),
        )  # fmt: skip
        return visit.page("Forget?", body)

    @api.post("/ui/memory/forget")
    async def forget(request: Request) -> Response:
        visit, fields = await pages.form(request)
        p = visit.principal
        which = selection(fields)
        if which == KeptSelection():
            raise InvalidInput("forget: name a passage, a conversation or a period")
        erased = await pages.run(visit, lambda: across.forget(p, which))
        body = join([forgotten_note(erased.count, erased.purge_owed, "passage"),
                     link("/ui/memory", "Back to the memory")])  # fmt: skip
        return visit.page("Forgotten", body)


def selection(fields: dict[str, str]) -> KeptSelection:
    number = fields.get("passage", "")
    if number and not number.isdigit():
        raise InvalidInput("passage: a number")
    return KeptSelection(
        passage_id=int(number) if number else None,
        conversation=fields.get("conversation") or None,
        since=form_time(fields.get("since", ""), "since"),
        until=form_time(fields.get("until", ""), "until"),
    )


def _described(fields: dict[str, str]) -> Html:
    parts = [f"{k} {v}" for k, v in fields.items()]
    return html("{}", ", ".join(parts))
