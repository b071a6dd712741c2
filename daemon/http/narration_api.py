"""A tenant's narrated streams, for HTTP clients (docs/narrate.md): send lines, read the kept
timeline, ask about it, list and forget. sinkd's own routes under /v1/sinkd/, bodies in OpenAI's
list convention, errors in OpenAI's error body.

    POST   /v1/sinkd/narrations/{stream}/lines    {"lines": [...], "close"?, "keep_lines"?, "new_pipe"?}
    GET    /v1/sinkd/narrations/{stream}?since=&until=&severity=&template=&limit=
    POST   /v1/sinkd/narrations/{stream}/ask      {"question": "...", "max_tokens"?: n}
    GET    /v1/sinkd/narrations
    DELETE /v1/sinkd/narrations/{stream}?since=&until=   (a period: only its intervals)
    POST   /v1/sinkd/narrations/{stream}/muted    {"template_id": n, "muted"?: true}
    GET    /v1/sinkd/narrations/{stream}/muted
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from sinkd.daemon.http.calls import Calls
from sinkd.daemon.http.error_bodies import Guarded
from sinkd.daemon.http.memory_api import query_number
from sinkd.daemon.http.wire import parse_json, validated
from sinkd.daemon.runtime.api import NarratedInterval


class LinesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lines: list[str] = Field(max_length=4096)
    close: bool = False
    keep_lines: bool | None = None  # keep each interval's raw lines from now on (None: as it was)
    new_pipe: bool = False  # these lines begin a new pipe (another file): said in the history


class AskBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str
    max_tokens: int = Field(default=48, ge=1, le=256)


class MuteBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    template_id: int = Field(ge=1)  # as an incident names it (its alert's label template_id)
    muted: bool = True  # false: paged again


def interval_json(i: NarratedInterval) -> dict[str, Any]:
    out = {k: v for k, v in dataclasses.asdict(i).items() if k not in ("record_json", "support")}
    return {"object": "sinkd.narration.interval", **out, "record": json.loads(i.record_json)}


def router(calls: Calls) -> APIRouter:
    api = APIRouter(route_class=Guarded)
    narrated = calls.service.narrated
    questions = calls.service.questions
    in_slot = calls.in_slot

    @api.post("/v1/sinkd/narrations/{stream}/lines")
    async def lines(stream: str, request: Request) -> Any:
        principal = calls.principal(request)
        calls.ready()
        body = validated(LinesBody, parse_json(await calls.body(request)))
        fed = await in_slot(
            principal,
            lambda: narrated.feed(
                principal,
                stream,
                body.lines,
                body.close,
                keep_lines=body.keep_lines,
                new_pipe=body.new_pipe,
            ),
        )
        return {
            "object": "sinkd.narration.fed",
            "lines": fed.lines,
            "pending": fed.pending,
            "closed": [interval_json(i) for i in fed.closed],
        }

    @api.get("/v1/sinkd/narrations/{stream}")
    async def history(stream: str, request: Request) -> Any:
        principal = calls.principal(request)
        calls.ready()
        q = request.query_params
        since = query_number(request, "since", float) or 0.0
        until = query_number(request, "until", float) or 0.0
        limit = query_number(request, "limit", int) or 0
        found = await in_slot(
            principal,
            lambda: narrated.history(
                principal, stream, since, until, q.get("severity", ""), q.get("template", ""), limit
            ),
        )
        return {"object": "list", "data": [interval_json(i) for i in found]}

    @api.post("/v1/sinkd/narrations/{stream}/ask")
    async def ask(stream: str, request: Request) -> Any:
        principal = calls.principal(request)
        calls.ready()
        body = validated(AskBody, parse_json(await calls.body(request)))
        answer = await in_slot(
            principal, lambda: questions.ask(principal, stream, body.question, body.max_tokens)
        )
        return {
            "object": "sinkd.narration.answer",
            "stream": answer.stream,
            "held": answer.held,
            "text": answer.text,
            "dropped": list(answer.dropped),
            "facts": answer.facts_text,
            "cites": [interval_json(i) for i in answer.cites],
        }

    @api.get("/v1/sinkd/narrations")
    async def listing(request: Request) -> Any:
        principal = calls.principal(request)
        calls.ready()
        found = await in_slot(principal, lambda: narrated.streams(principal))
        return {
            "object": "list",
            "data": [{"object": "sinkd.narration", **dataclasses.asdict(s)} for s in found],
        }

    @api.delete("/v1/sinkd/narrations/{stream}")
    async def forget(stream: str, request: Request) -> Any:
        principal = calls.principal(request)
        calls.ready()
        since = query_number(request, "since", float)
        until = query_number(request, "until", float)
        gone = await in_slot(principal, lambda: narrated.forget(principal, stream, since, until))
        return {
            "object": "sinkd.narration.forgotten",
            "stream": stream,
            "intervals": gone.intervals,
            "purge_owed": gone.purge_owed,
        }

    @api.get("/v1/sinkd/narrations/{stream}/muted")
    async def muted(stream: str, request: Request) -> Any:
        principal = calls.principal(request)
        calls.ready()
        held = await in_slot(principal, lambda: narrated.muted(principal, stream))
        return {
            "object": "list",
            "data": [
                {"object": "sinkd.narration.muted_template", "template_id": t, "template": text}
                for t, text in held
            ],
        }

    @api.post("/v1/sinkd/narrations/{stream}/muted")
    async def mute(stream: str, request: Request) -> Any:
        principal = calls.principal(request)
        calls.ready()
        body = validated(MuteBody, parse_json(await calls.body(request)))
        done = await in_slot(
            principal, lambda: narrated.mute(principal, stream, body.template_id, body.muted)
        )
        return {
            "object": "sinkd.narration.muted",
            "stream": stream,
            "template_id": done.template_id,
            "template": done.template,
            "muted": list(done.muted),
        }

    return api
