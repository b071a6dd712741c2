"""A tenant's sessions (its conversations), each with its cache map, what the model still sees,
what recall brought back and from where, its stored passages, its eviction trace; reset, fork and
close. A form names the generation its page showed: after a reset elsewhere it is refused as
stale, never applied to the new one."""

from __future__ import annotations

import dataclasses
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from sinkd.daemon.http.ui.drawings import cache_map, counts
from sinkd.daemon.http.ui.markup import Html, forgotten_note, form, html, join, link, table, when
from sinkd.daemon.http.ui.pages import Pages, Visit
from sinkd.daemon.runtime.api import Handle, KeptSelection, PassageView, Receipt
from sinkd.errors import InvalidInput, NotFound


def add(api: APIRouter, pages: Pages) -> None:
    service = pages.service

    async def receipt_of(visit: Visit, session_id: str) -> Receipt:
        p = visit.principal
        found: list[Receipt] = await pages.run(visit, lambda: service.reads.list_sessions(p))
        for r in found:
            if r.session_id == session_id:
                return r
        raise NotFound(f"no session {session_id!r}")

    @api.get("/ui/sessions")
    async def sessions(request: Request) -> Response:
        visit = pages.visit(request)
        p = visit.principal
        found = await pages.run(visit, lambda: service.reads.list_sessions(p))
        rows = []
        for r in sorted(found, key=lambda r: r.session_id):
            c = counts(r)
            rows.append([link(f"/ui/sessions/{r.session_id}", r.session_id), r.state,
                         r.residency, r.n_seen, f"{r.retained} / {c.cells}", r.evicted_tokens,
                         len(r.recalled), r.memory_passages])  # fmt: skip
        body = table(
            ["session", "state", "residency", "seen", "cells in use", "evicted", "recalled",
             "stored passages"],
            rows, "No sessions.",
        )  # fmt: skip
        return visit.page("Sessions", body)

    @api.get("/ui/sessions/{session_id}")
    async def session(session_id: str, request: Request) -> Response:
        visit = pages.visit(request)
        p = visit.principal
        r = await receipt_of(visit, session_id)
        h = r.handle
        seen = await pages.run(visit, lambda: service.reads.inspect(p, h, not p.admin))
        r = seen.receipt
        trace = await pages.run(visit, lambda: service.reads.trace(p, h))
        passages: list[PassageView] = []
        search = request.query_params.get("search", "")
        if not p.admin:
            passages = await pages.run(
                visit, lambda: service.memory.memory(p, h, search=search, limit=500)
            )
        csrf = visit.login.csrf
        here = f"/ui/sessions/{r.session_id}"
        gen = {"generation": r.generation}
        actions = html(
            '<div class="actions">{}{}{}</div>',
            form(f"{here}/fork", csrf, gen, "Fork"),
            link(f"{here}/reset", "Reset…"),
            link(f"{here}/close", "Close…"),
        )
        recalls = [
            [link(f"{here}/recalled/{s.passage_id}?{urlencode({'conversation': s.conversation})}",
                  "open"),
             s.passage_id, s.speaker, _from(s.conversation, r.session_id), when(s.said_at),
             f"{s.score:.2f}", when(s.at), f"{s.stream[0]}-{s.stream[1]}"]
            for s in r.recalled
        ]  # fmt: skip
        last = r.last_recall
        a1, r0 = r.anchors_logical[1], r.recent_logical[0]
        body = join([
            html('<dl><dt>generation</dt><dd>{}</dd><dt>state</dt><dd>{} ({})</dd>'
                 "<dt>policy</dt><dd>{} S={} W={} K={}</dd><dt>resume</dt><dd>{}</dd></dl>",
                 r.generation, r.state, r.residency, r.policy.policy.value, r.policy.sinks,
                 r.policy.window, r.policy.compact_interval, r.resume),
            actions,
            html("<h2>Cache map</h2>"), cache_map(r),
            html("<h2>What came back</h2>"),
            table(["", "passage", "speaker", "from", "said", "score", "recalled", "in stream"],
                  recalls, "Nothing recalled is in the window now."),
            html('<p class="note">{}</p>', f"Last recall: {last.note}" if last else ""),
            html("<h2>What the model sees now</h2><p class=\"note\">Its sinks, then its window"
                 " ({} evicted tokens between them are not shown).</p><pre>{}</pre>",
                 r0 - a1, seen.retained_text or "(not shown)"),
            html("<h2>Stored passages (evicted text)</h2>"
                 '<form method="get" action="{}"><input type="search" name="search" value="{}"'
                 ' placeholder="words"> <button>Search</button></form>', here, search),
            table(["passage", "speaker", "turn", "positions", "kept", "text", ""],
                  [[q.passage_id, q.speaker, q.turn, f"{q.logical[0]}-{q.logical[1]}",
                    when(q.created_unix_time), _text(q.text),
                    link(f"{here}/memory/forget?{urlencode({**gen, 'passage': q.passage_id})}",
                         "forget")] for q in passages],
                  "None stored."),
            html("<h2>Receipt</h2>"), _receipt(r),
            html("<h2>Eviction trace</h2>"),
            table(["at token", "kind", "logical", "cache", "shift"],
                  [[e.at_token, e.kind, _range(e.recalled_logical or e.evicted_logical),
                    _range(e.evicted_cache), e.shift_delta] for e in trace[-100:]],
                  "No evictions yet."),
        ])  # fmt: skip
        return visit.page(f"Session {r.session_id}", body)

    @api.get("/ui/sessions/{session_id}/recalled/{passage_id}")
    async def recalled(session_id: str, passage_id: int, request: Request) -> Response:
        visit = pages.visit(request)
        p = visit.principal
        r = await receipt_of(visit, session_id)
        conversation = request.query_params.get("conversation", "")
        spans = [s for s in r.recalled if s.ref == (conversation, passage_id)]
        if not spans:
            raise NotFound(f"passage {passage_id} is not among this session's recalled ones")
        s = spans[0]
        if conversation:
            which = KeptSelection(passage_id=passage_id)
            kept = await pages.run(visit, lambda: service.across.listing(p, which, "", 1))
        else:
            h = r.handle
            mine = await pages.run(visit, lambda: service.memory.memory(p, h, limit=10_000))
            kept = [q for q in mine if q.passage_id == passage_id]
        text = kept[0].text if kept else "(forgotten since)"
        turn = kept[0].turn if kept else "-"
        body = html(
            "<dl><dt>from</dt><dd>{}</dd><dt>speaker</dt><dd>{}</dd><dt>turn</dt><dd>{}</dd>"
            "<dt>said</dt><dd>{}</dd><dt>score</dt><dd>{}</dd><dt>recalled</dt><dd>{}</dd>"
            "<dt>source positions</dt><dd>{}</dd><dt>in this stream</dt><dd>{}</dd></dl>"
            "<h2>Text</h2><pre>{}</pre><p>{}</p>",
            _from(conversation, session_id), s.speaker, turn, when(s.said_at), f"{s.score:.2f}",
            when(s.at), _range(s.source), _range(s.stream), text,
            link(f"/ui/sessions/{session_id}", "Back to the session"),
        )  # fmt: skip
        return visit.page(f"Recalled passage {passage_id}", body)

    @api.get("/ui/sessions/{session_id}/{action}")
    async def confirm(session_id: str, action: str, request: Request) -> Response:
        visit = pages.visit(request)
        if action not in ("reset", "close"):
            raise NotFound(f"no page {action!r}")
        r = await receipt_of(visit, session_id)
        what = {
            "reset": "Reset starts a new generation: what the session saw and stored is"
            " deleted.",
            "close": "Close deletes the session and what is stored of it.",
        }
        body = html(
            "<p>{}</p>{}<p>{}</p>", what[action],
            form(f"/ui/sessions/{session_id}/{action}", visit.login.csrf,
                 {"generation": r.generation}, action.capitalize(), danger=True),
            link(f"/ui/sessions/{session_id}", "Cancel"),
        )  # fmt: skip
        return visit.page(f"{action.capitalize()} session {session_id}?", body)

    @api.post("/ui/sessions/{session_id}/{action}")
    async def act(session_id: str, action: str, request: Request) -> Response:
        visit, fields = await pages.form(request)
        p = visit.principal
        h = Handle(session_id, fields.get("generation", ""))
        if action == "fork":
            child = await pages.run(visit, lambda: service.fork(p, h))
            return RedirectResponse(f"/ui/sessions/{child.session_id}", 303)
        if action == "reset":
            await pages.run(visit, lambda: service.reset(p, h))
            return RedirectResponse(f"/ui/sessions/{session_id}", 303)
        if action == "close":
            erased = await pages.run(visit, lambda: service.close(p, h))
            return visit.page("Closed", forgotten_note(erased.count, erased.purge_owed, "session"))
        raise NotFound(f"no action {action!r}")

    @api.get("/ui/sessions/{session_id}/memory/forget")
    async def confirm_forget(session_id: str, request: Request) -> Response:
        visit = pages.visit(request)
        p = visit.principal
        q = request.query_params
        number, generation = q.get("passage", ""), q.get("generation", "")
        if not number.isdigit():
            raise InvalidInput("passage: a number")
        h = Handle(session_id, generation)
        mine = await pages.run(visit, lambda: service.memory.memory(p, h, limit=10_000))
        if not any(x.passage_id == int(number) for x in mine):
            raise NotFound(f"no passage {number} in session {session_id}")
        body = html(
            "<p>This forgets passage {} of session {}, from every file of this node.</p>{}<p>{}</p>",
            number, session_id,
            form(f"/ui/sessions/{session_id}/memory/forget", visit.login.csrf,
                 {"generation": generation, "passage": number}, "Forget", danger=True),
            link(f"/ui/sessions/{session_id}", "Cancel"),
        )  # fmt: skip
        return visit.page("Forget?", body)

    @api.post("/ui/sessions/{session_id}/memory/forget")
    async def forget_passage(session_id: str, request: Request) -> Response:
        visit, fields = await pages.form(request)
        p = visit.principal
        h = Handle(session_id, fields.get("generation", ""))
        number = fields.get("passage", "")
        if not number.isdigit():
            raise InvalidInput("passage: a number")
        erased = await pages.run(visit, lambda: service.memory.forget(p, h, int(number)))
        body = join([forgotten_note(erased.count, erased.purge_owed, "passage"),
                     link(f"/ui/sessions/{session_id}", "Back to the session")])  # fmt: skip
        return visit.page("Forgotten", body)


def _receipt(r: Receipt) -> Html:
    """The receipt's fields, as `sinkd sessions inspect` shows them (counts, positions, hashes)."""
    shown = {k: v for k, v in dataclasses.asdict(r).items()
             if k not in ("policy", "recall", "recalled", "last_recall")}  # fmt: skip
    return html(
        "<dl>{}</dl>", join(html("<dt>{}</dt><dd>{}</dd>", k.replace("_", " "), v)
                            for k, v in shown.items()),
    )  # fmt: skip


def _from(conversation: str, session_id: str) -> Html:
    if not conversation:
        return html("this conversation")
    if conversation == "(given)":
        return html("given to the memory")
    return html("conversation {}", link(f"/ui/sessions/{conversation}", conversation))


def _range(r: tuple[int, int] | None) -> str:
    return f"{r[0]}-{r[1]}" if r else "-"


def _text(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
