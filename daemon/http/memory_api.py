"""The tenant's memory across its conversations, for HTTP clients (docs/recall.md, "Across
conversations"): list and search it, forget from it, give it a text to remember. sinkd's own
routes under /v1/sinkd/, bodies in OpenAI's list convention, errors in OpenAI's error body.

    GET    /v1/sinkd/memory?search=&conversation=&speaker=&since=&until=&limit=
    POST   /v1/sinkd/memory           {"text": "..."}                         -> the kept passages
    DELETE /v1/sinkd/memory/{id}                                             -> {"forgotten": n}
    POST   /v1/sinkd/memory/forget    {"conversation"?, "speaker"?, "since"?, "until"?}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from sinkd.daemon.http.calls import Calls
from sinkd.daemon.http.error_bodies import Guarded, HttpError
from sinkd.daemon.http.wire import parse_json, validated
from sinkd.daemon.runtime.api import Erased, KeptSelection, PassageView

T = TypeVar("T")


class RememberBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str


class ForgetBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conversation: str | None = None
    speaker: str | None = None
    since: float | None = Field(default=None, ge=0)
    until: float | None = Field(default=None, ge=0)


def passage_json(p: PassageView) -> dict[str, Any]:
    return {
        "object": "sinkd.memory.passage",
        "id": p.passage_id,
        "text": p.text,
        "speaker": p.speaker,
        "conversation": p.conversation,
        "turn": p.turn,
        "asked": p.asked,
        "created": p.created_unix_time,
        "tokens": p.n_tokens,
        **({"score": p.score} if p.score is not None else {}),
    }


def query_number(request: Request, name: str, cast: Callable[[str], T]) -> T | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    try:
        return cast(value)
    except ValueError:
        raise HttpError(400, f"{name}: {value[:32]!r} is not a number", param=name) from None


def forgotten(erased: Erased) -> dict[str, Any]:
    """`purge_owed`: the text may still be on disk (a reader of journal.db held the log past the
    wait); it leaves once that reader lets go."""
    return {
        "object": "sinkd.memory.forgotten",
        "forgotten": erased.count,
        "purge_owed": erased.purge_owed,
    }


def router(calls: Calls) -> APIRouter:
    api = APIRouter(route_class=Guarded)
    across = calls.service.across

    in_slot = calls.in_slot

    @api.get("/v1/sinkd/memory")
    async def listing(request: Request) -> Any:
        principal = calls.principal(request)
        calls.ready()
        q = request.query_params
        which = KeptSelection(
            conversation=q.get("conversation") or None,
            speaker=q.get("speaker") or None,
            since=query_number(request, "since", float),
            until=query_number(request, "until", float),
        )
        limit = query_number(request, "limit", int) or 100
        found = await in_slot(
            principal, lambda: across.listing(principal, which, q.get("search", ""), limit)
        )
        return {"object": "list", "data": [passage_json(p) for p in found]}

    @api.post("/v1/sinkd/memory")
    async def remember(request: Request) -> Any:
        principal = calls.principal(request)
        calls.ready()
        body = validated(RememberBody, parse_json(await calls.body(request)))
        kept = await in_slot(principal, lambda: across.remember(principal, body.text))
        return {"object": "list", "data": [passage_json(p) for p in kept]}

    @api.delete("/v1/sinkd/memory/{passage_id}")
    async def forget_one(passage_id: str, request: Request) -> Any:
        principal = calls.principal(request)
        calls.ready()
        if not passage_id.isdigit():
            raise HttpError(400, "the passage id is a number", param="passage_id")
        which = KeptSelection(passage_id=int(passage_id))
        return forgotten(await in_slot(principal, lambda: across.forget(principal, which)))

    @api.post("/v1/sinkd/memory/forget")
    async def forget(request: Request) -> Any:
        principal = calls.principal(request)
        calls.ready()
        body = validated(ForgetBody, parse_json(await calls.body(request)))
        which = KeptSelection(None, body.conversation, body.speaker, body.since, body.until)
        return forgotten(await in_slot(principal, lambda: across.forget(principal, which)))

    return api
