"""The tenant's narrated streams: each one's timeline (lines and error lines per interval,
incidents marked), its open incidents, and its history of facts and checked sentences, as
`sinkd narrate history` prints it. Log text is shown as text, always."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from sinkd.daemon.http.error_bodies import HttpError
from sinkd.daemon.http.ui.drawings import timeline
from sinkd.daemon.http.ui.markup import Html, forgotten_note, form, html, join, link, table, when
from sinkd.daemon.http.ui.pages import Pages, form_time
from sinkd.daemon.runtime.api import NarratedInterval

SHOWN = 200  # the newest intervals a page shows


def add(api: APIRouter, pages: Pages) -> None:
    narrated = pages.service.narrated

    @api.get("/ui/narrations")
    async def streams(request: Request) -> Response:
        visit = pages.visit(request)
        p = visit.principal
        found = await pages.run(visit, lambda: narrated.streams(p))
        rows = [[link(f"/ui/narrations/{s.name}", s.name), s.lines, s.intervals, s.incidents,
                 when(s.created), when(s.updated)] for s in found]  # fmt: skip
        body = table(["stream", "lines", "intervals", "incidents", "since", "last"], rows,
                     "No narrated streams (`sinkd narrate --stream NAME`).")  # fmt: skip
        return visit.page("Narrator", body)

    @api.get("/ui/narrations/{name}")
    async def stream(name: str, request: Request) -> Response:
        visit = pages.visit(request)
        p = visit.principal
        kept = await pages.run(visit, lambda: narrated.history(p, name, limit=SHOWN))
        incidents = open_incidents(kept)
        muted = await pages.run(visit, lambda: narrated.muted(p, name))
        csrf = visit.login.csrf
        rows = [
            [i.number if i.last_number == i.number else f"{i.number}-{i.last_number}",
             f"{i.first_line}-{i.last_line}", f"{when(i.started)} – {when(i.ended)}",
             i.errors, i.incidents, join([html("<pre>{}</pre>", _facts(i)), _lines(i)])]
            for i in reversed(kept)
        ]  # fmt: skip
        body = join([
            timeline(kept),
            html("<h2>Open incidents</h2>"),
            table(["template", "severity", "first line", "latest line", "lines", ""],
                  [[x["template"], x["severity"], x["first_line"], x["last_line"], x["count"],
                    form(f"/ui/narrations/{name}/mute", csrf, {"template_id": x["template_id"]},
                         "Mute")]
                   for x in incidents], "None open."),
            html("<h2>Muted (listed in the facts, never paged)</h2>"),
            table(["template", ""],
                  [[text, form(f"/ui/narrations/{name}/mute", csrf,
                               {"template_id": t, "muted": "no"}, "Unmute")]
                   for t, text in muted], "None muted."),
            html("<h2>History (newest first)</h2>"),
            table(["interval", "lines", "time", "errors", "incidents", "facts"], rows),
            html('<p>{}</p>', link(f"/ui/narrations/{name}/forget", "Forget this stream…")),
        ])  # fmt: skip
        return visit.page(f"Stream {name}", body)

    @api.get("/ui/narrations/{name}/forget")
    async def confirm(name: str, request: Request) -> Response:
        """The whole stream, or (since/until picked here first) the intervals of a period."""
        visit = pages.visit(request)
        q = request.query_params
        period = {k: q[k] for k in ("since", "until") if q.get(k)}
        for k, v in period.items():
            form_time(v, k)  # refused here, before the confirmation, if it is not a time
        what = (
            html("the intervals of {} that overlap {} (the stream goes on)", name,
                 " ".join(f"{k} {v}" for k, v in period.items()))
            if period else
            html("every interval kept of {}: facts, sentences and its state", name)
        )  # fmt: skip
        pick = html(
            '<form method="get" action="/ui/narrations/{}/forget">Only a period:'
            ' since <input type="datetime-local" name="since" value="{}">'
            ' until <input type="datetime-local" name="until" value="{}">'
            " <button>Pick</button></form>",
            name, q.get("since", ""), q.get("until", ""),
        )  # fmt: skip
        body = html(
            "<p>This forgets {}.</p>{}<p>{}</p>{}",
            what, form(f"/ui/narrations/{name}/forget", visit.login.csrf, period, "Forget",
                       danger=True), link(f"/ui/narrations/{name}", "Cancel"), pick,
        )  # fmt: skip
        return visit.page(f"Forget stream {name}?", body)

    @api.post("/ui/narrations/{name}/forget")
    async def forget(name: str, request: Request) -> Response:
        visit, fields = await pages.form(request)
        p = visit.principal
        since = form_time(fields.get("since", ""), "since")
        until = form_time(fields.get("until", ""), "until")
        gone = await pages.run(visit, lambda: narrated.forget(p, name, since, until))
        back = (link(f"/ui/narrations/{name}", "Back to the stream") if since or until
                else link("/ui/narrations", "Back to the streams"))  # fmt: skip
        body = join(
            [forgotten_note(gone.intervals, gone.purge_owed, "interval"), html("<p>{}</p>", back)]
        )
        return visit.page("Forgotten", body)

    add_mute(api, pages)


def add_mute(api: APIRouter, pages: Pages) -> None:
    narrated = pages.service.narrated

    @api.post("/ui/narrations/{name}/mute")
    async def mute(name: str, request: Request) -> Response:
        visit, fields = await pages.form(request)
        p = visit.principal
        template_id = fields.get("template_id", "")
        if not template_id.isdigit():
            raise HttpError(400, f"template_id: a template's number, got {template_id[:20]!r}")
        on = fields.get("muted", "yes") != "no"
        done = await pages.run(visit, lambda: narrated.mute(p, name, int(template_id), on))
        said = (
            "Muted: it is listed in the facts, never paged." if on else "Unmuted: it pages again."
        )
        body = html(
            "<p>{}</p><pre>{}</pre><p>{}</p>",
            said, done.template, link(f"/ui/narrations/{name}", "Back to the stream"),
        )  # fmt: skip
        return visit.page(f"Template {done.template_id} of {name}", body)


def open_incidents(kept: list[NarratedInterval]) -> list[dict[str, Any]]:
    """The incidents raised and not yet over, by template, as of the newest interval."""
    opened: dict[int, dict[str, Any]] = {}
    for i in kept:
        facts = json.loads(i.record_json).get("facts", {})
        for x in facts.get("opened", []):
            opened[x["template_id"]] = x
        for x in facts.get("ended", []):
            opened.pop(x["template_id"], None)
    return list(opened.values())


def _lines(i: NarratedInterval) -> Html:
    """The raw lines the interval kept (a stream with `keep_lines`), folded away until opened."""
    record = json.loads(i.record_json)
    kept = record.get("lines")
    if not kept:
        return Html("")
    numbered = "\n".join(f"{n:>7}  {text}" for n, text in enumerate(kept, i.first_line))
    more = record.get("lines_left_out", 0)
    return html(
        "<details><summary>{} lines kept{}</summary><pre>{}</pre></details>",
        len(kept), f" ({more} more not)" if more else "", numbered,
    )  # fmt: skip


def _facts(i: NarratedInterval) -> str:
    record = json.loads(i.record_json)
    if i.last_number > i.number:
        return f"{record.get('folded', 0)} intervals folded"
    text = "".join(f"(a new pipe began at line {n})\n" for n in record.get("new_pipe_at", []))
    text += record.get("text", "")
    if record.get("sentence"):
        text += f"\nSaid: {record['sentence']}"
    return str(text)
