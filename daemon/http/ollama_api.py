"""Ollama's API, enough for its clients to list the model and chat: `/api/version`, `/api/tags`,
`/api/show`, `/api/chat` (NDJSON streamed by default, as Ollama does). A chat continues the
caller's session that took the history, as on `/v1/chat/completions`."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse, Response

from sinkd.daemon.http.errors import HttpError
from sinkd.daemon.http.openai_api import FINISH, extension, usage
from sinkd.daemon.http.wire import (
    SESSION_HEADER,
    headers_of,
    history,
    parse_json,
    sampling_of,
    stops_of,
    validated,
)
from sinkd.daemon.runtime.api import Done, Stream, TokenEvent
from sinkd.daemon.runtime.stateless import Continuation, StatelessChatRequest
from sinkd.errors import SinkdError, message_of

if TYPE_CHECKING:
    from sinkd.daemon.http.front import HttpFront

VERSION = "0.12.0"  # the Ollama API version whose fields these answers carry


class Options(BaseModel):
    model_config = ConfigDict(extra="allow")

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    num_predict: int | None = None
    stop: list[str] | None = None


class ChatBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]]
    stream: bool = True
    options: Options | None = None
    keep_alive: str | int | float | None = None
    format: Any = None
    tools: Any = None
    think: Any = None


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def router(front: HttpFront) -> APIRouter:
    api = APIRouter()
    entry = front.service.entry
    name = entry.name

    def tag() -> dict[str, Any]:
        return {
            "name": name, "model": name,
            "modified_at": datetime.datetime.fromtimestamp(front.created, datetime.timezone.utc)
            .isoformat().replace("+00:00", "Z"),
            "size": entry.size,
            "digest": entry.sha256,
            "details": {"format": "gguf", "family": entry.architecture,
                        "parameter_size": "", "quantization_level": ""},
        }  # fmt: skip

    @api.get("/api/version")
    async def version() -> Any:
        return {"version": VERSION}

    @api.get("/api/tags")
    async def tags(request: Request) -> Any:
        front.principal(request)
        return {"models": [tag()]}

    @api.post("/api/show")
    async def show(request: Request) -> Any:
        front.principal(request)
        asked = parse_json(await front.body(request))
        wanted = asked.get("model") or asked.get("name") if isinstance(asked, dict) else None
        if wanted not in (name, f"{name}:latest"):
            raise HttpError(404, f"model {wanted!r} not found ({name} is served here)")
        return {"details": tag()["details"], "model_info": {}, "modified_at": tag()["modified_at"]}

    @api.post("/api/chat")
    async def chat(request: Request) -> Response:
        principal = front.principal(request)
        front.ready()
        body = validated(ChatBody, parse_json(await front.body(request)))
        if body.model not in (name, f"{name}:latest"):
            raise HttpError(404, f"model {body.model!r} not found ({name} is served here)")
        for field in ("format", "tools", "think"):
            if getattr(body, field):
                raise HttpError(400, f"{field}: not supported by sinkd", param=field)
        opts = body.options or Options()
        system, turns = history(body.messages)
        turn = StatelessChatRequest(
            system=system,
            turns=turns,
            max_tokens=opts.num_predict if opts.num_predict and opts.num_predict > 0 else 256,
            stops=stops_of(opts.stop),
            sampling=sampling_of(opts.temperature, opts.top_p, opts.seed),
            session_id=request.headers.get(SESSION_HEADER),
        )
        if body.stream:

            def pieces(c: Continuation, events: Stream) -> Iterator[bytes]:
                return _ndjson(body.model, c, events)

            return await front.streamed(principal, turn, pieces, "application/x-ndjson")
        continuation, text, done, seconds = await front.whole(principal, turn)
        return JSONResponse(
            {
                "model": body.model,
                "created_at": _now(),
                "message": {"role": "assistant", "content": text},
                **_final(continuation, done, seconds),
            },
            headers=headers_of(continuation),
        )

    return api


def _final(c: Continuation, done: Done, seconds: float) -> dict[str, Any]:
    counts = usage(c, done)
    return {
        "done": True,
        "done_reason": FINISH.get(done.reason, "stop"),
        "total_duration": int(seconds * 1e9),
        "prompt_eval_count": counts["prompt_tokens"],
        "eval_count": counts["completion_tokens"],
        "sinkd": extension(c, done),
    }


def _ndjson(model: str, c: Continuation, events: Iterator[TokenEvent | Done]) -> Iterator[bytes]:
    t0 = time.monotonic()
    try:
        for event in events:
            if isinstance(event, TokenEvent):
                line = {"model": model, "created_at": _now(),
                        "message": {"role": "assistant", "content": event.text}, "done": False}  # fmt: skip
            else:
                line = {"model": model, "created_at": _now(),
                        "message": {"role": "assistant", "content": ""},
                        **_final(c, event, time.monotonic() - t0)}  # fmt: skip
            yield (json.dumps(line) + "\n").encode()
    except SinkdError as e:
        yield (json.dumps({"error": message_of(e)}) + "\n").encode()
