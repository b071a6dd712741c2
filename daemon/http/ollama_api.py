"""Ollama's API, enough for its clients to list the model and chat: `/api/version`, `/api/tags`,
`/api/show`, `/api/chat` (NDJSON streamed by default, as Ollama does). A chat continues the
caller's session that took the history, as on `/v1/chat/completions`."""

from __future__ import annotations

import datetime
import json
import re
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
from sinkd.daemon.runtime.conversations import Turn
from sinkd.daemon.runtime.sessions import Principal
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


class GenerateBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    prompt: str = ""
    system: str | None = None
    stream: bool = True
    options: Options | None = None
    keep_alive: str | int | float | None = None


# /api/generate's fields sinkd refuses: each would let text choose the framing, or asks for what
# sinkd does not do (the conversation's state is kept server-side, not in `context`)
GENERATE_REFUSED = {
    "raw": "the chat template always frames the prompt (text never becomes control tokens)",
    "template": "the model's own chat template frames the prompt",
    "context": "sinkd keeps conversations server-side: use /api/chat and resend the messages",
    "suffix": "no fill-in-the-middle",
    "images": "text only",
    "format": "text responses",
    "think": "no thinking mode",
}
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")


def keep_alive_seconds(value: str | int | float | None) -> float | None:
    """Ollama's keep_alive (seconds, or a Go duration such as "5m" or "1h30m") as the session's
    idle expiry: None (the daemon's) when unset or negative ("forever" is the daemon's ceiling),
    0 to close it once it has answered."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return None if value < 0 else float(value)
    text = str(value).strip()
    try:
        seconds = float(text)
    except ValueError:
        body = text.removeprefix("-")
        parts = _DURATION.findall(body)
        if not body or "".join(n + u for n, u in parts) != body:
            raise HttpError(400, f"keep_alive: {text!r} is not a duration (e.g. 300, \"5m\")",
                            param="keep_alive") from None  # fmt: skip
        seconds = sum(float(n) * _UNITS[u] for n, u in parts) * (-1 if text.startswith("-") else 1)
    return None if seconds < 0 else seconds


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
            keep_alive_s=keep_alive_seconds(body.keep_alive),
        )
        return await answer(principal, turn, body.model, body.stream, "message")

    @api.post("/api/generate")
    async def generate(request: Request) -> Response:
        """One prompt, framed by the chat template as a user turn under `system`: a conversation
        of one turn (the same prompt again is a regenerate of it)."""
        principal = front.principal(request)
        front.ready()
        body = validated(GenerateBody, parse_json(await front.body(request)))
        if body.model not in (name, f"{name}:latest"):
            raise HttpError(404, f"model {body.model!r} not found ({name} is served here)")
        for field, why in GENERATE_REFUSED.items():
            if (body.model_extra or {}).get(field):
                raise HttpError(400, f"{field}: not supported by sinkd ({why})", param=field)
        if not body.prompt.strip():  # Ollama loads the model on an empty prompt: nothing to do
            return JSONResponse({"model": body.model, "created_at": _now(), "response": "",
                                 "done": True, "done_reason": "load"})  # fmt: skip
        opts = body.options or Options()
        turn = StatelessChatRequest(
            system=body.system or "",
            turns=(Turn("user", body.prompt),),
            max_tokens=opts.num_predict if opts.num_predict and opts.num_predict > 0 else 256,
            stops=stops_of(opts.stop),
            sampling=sampling_of(opts.temperature, opts.top_p, opts.seed),
            keep_alive_s=keep_alive_seconds(body.keep_alive),
        )
        return await answer(principal, turn, body.model, body.stream, "response")

    async def answer(
        principal: Principal, turn: StatelessChatRequest, model: str, stream: bool, field: str
    ) -> Response:
        """A turn in Ollama's framing: NDJSON lines, or one object; the text under `field`
        ("message" for /api/chat, "response" for /api/generate)."""
        start = front.chat(principal, turn)
        if stream:

            def pieces(c: Continuation, events: Stream) -> Iterator[bytes]:
                return _ndjson(model, c, events, field)

            return await front.streamed(principal, start, pieces, "application/x-ndjson")
        continuation, text, done, seconds = await front.whole(principal, start)
        return JSONResponse(
            {"model": model, "created_at": _now(), **_text(field, text),
             **_final(continuation, done, seconds)},
            headers=headers_of(continuation),
        )  # fmt: skip

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


def _text(field: str, text: str) -> dict[str, Any]:
    if field == "message":
        return {"message": {"role": "assistant", "content": text}}
    return {"response": text}


def _ndjson(
    model: str, c: Continuation, events: Iterator[TokenEvent | Done], field: str
) -> Iterator[bytes]:
    t0 = time.monotonic()
    try:
        for event in events:
            if isinstance(event, TokenEvent):
                line = {"model": model, "created_at": _now(), **_text(field, event.text),
                        "done": False}  # fmt: skip
            else:
                line = {"model": model, "created_at": _now(), **_text(field, ""),
                        **_final(c, event, time.monotonic() - t0)}  # fmt: skip
            yield (json.dumps(line) + "\n").encode()
    except SinkdError as e:
        yield (json.dumps({"error": message_of(e)}) + "\n").encode()
