"""Ollama's API, enough for its clients to list the model and chat: `/api/version`, `/api/tags`,
`/api/show`, `/api/chat` (NDJSON streamed by default, as Ollama does). A chat continues the
caller's session that took the history, as on `/v1/chat/completions`."""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import time
from collections.abc import Collection, Iterator
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse, Response

from sinkd.daemon.http.calls import Calls
from sinkd.daemon.http.error_bodies import Guarded, HttpError, internal
from sinkd.daemon.http.openai_api import FINISH, extension, usage
from sinkd.daemon.http.wire import (
    PRIVATE_HEADER,
    SESSION_HEADER,
    headers_of,
    history,
    max_tokens_of,
    parse_json,
    private_of,
    stops_of,
    tool_use_of,
    validated,
)
from sinkd.daemon.runtime.api import (
    ChatStream,
    Done,
    GenerationOptions,
    OutputFormat,
    SamplingRequest,
    TokenEvent,
    ToolCall,
    ToolCallDelta,
    Turn,
    calls_of,
)
from sinkd.daemon.runtime.conversations.chats import Continuation, StatelessChatRequest
from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import message_of

VERSION = "0.12.0"  # the Ollama API version whose fields these answers carry


class Options(BaseModel):
    """Ollama's options: the sampling ones are honoured; any other is refused naming it
    (`check_options`), never dropped."""

    model_config = ConfigDict(extra="allow")

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    num_predict: int | None = None
    stop: list[str] | None = None

    def checked(self) -> Options:
        for field in self.model_extra or {}:
            why = OPTIONS_REFUSED.get(field, "not an option sinkd implements")
            raise HttpError(400, f"options.{field}: {why}", param=f"options.{field}")
        return self

    def generation(self) -> GenerationOptions:
        """The options as one reply's generation options: the wire read once, here."""
        return GenerationOptions(self.max_tokens(), stops_of(self.stop), self.sampling())

    def max_tokens(self) -> int | None:
        """num_predict: -1 (Ollama's "no limit") and -2 ("fill the context") take the default."""
        n = self.num_predict
        if n is not None and n < -2:
            raise HttpError(400, f"options.num_predict: -1, -2 or at least 1, not {n}",
                            param="options.num_predict")  # fmt: skip
        return max_tokens_of(("options.num_predict", None if n in (None, -1, -2) else n))

    def sampling(self) -> SamplingRequest | None:
        """None when no sampling option is set (the model's chat sampling); else the options
        given, Ollama's defaults for the rest."""
        given = {k: v for k, v in self.model_dump(include=set(OLLAMA_SAMPLING)).items()
                 if v is not None}  # fmt: skip
        if not given:
            return None
        return SamplingRequest(**{**OLLAMA_SAMPLING, **given})


# Ollama's defaults for the sampling options a request leaves unset (its documented values)
OLLAMA_SAMPLING: dict[str, Any] = {
    "temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "seed": 0,
    "repeat_penalty": 1.1, "repeat_last_n": 64,
}  # fmt: skip
_SERVER = "a setting of the daemon, not of a request (sinkd serve's settings)"
OPTIONS_REFUSED = {
    "num_ctx": "sinkd's sessions stream at a fixed budget of cells (S+W, the daemon's n_ctx_seq);"
    " drop num_ctx",
    "num_keep": "the sinks are the session's policy (S), not a request's",
    "num_batch": _SERVER,
    "num_gpu": _SERVER,
    "main_gpu": _SERVER,
    "num_thread": _SERVER,
    "use_mmap": _SERVER,
    "use_mlock": _SERVER,
    "low_vram": _SERVER,
    "numa": _SERVER,
    "presence_penalty": "no presence penalty",
    "frequency_penalty": "no frequency penalty",
    "typical_p": "no typical sampling",
    "tfs_z": "no tail-free sampling",
    "mirostat": "no mirostat",
    "mirostat_tau": "no mirostat",
    "mirostat_eta": "no mirostat",
    "penalize_newline": "the repetition penalty applies to every token",
}


class ChatBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]]
    stream: bool = True
    options: Options | None = None
    keep_alive: str | int | float | None = None
    format: Any = None
    tools: list[dict[str, Any]] | None = None
    think: Any = None


class GenerateBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    prompt: str = ""
    system: str | None = None
    stream: bool = True
    options: Options | None = None
    keep_alive: str | int | float | None = None


def format_of(value: Any) -> OutputFormat | None:
    """Ollama's `format`: "json" (any JSON object) or a JSON schema, decoded under a grammar."""
    if value in (None, ""):
        return None
    if value == "json":
        return OutputFormat()
    if isinstance(value, dict):
        return OutputFormat(json.dumps(value, sort_keys=True))
    raise HttpError(400, 'format: "json" or a JSON schema object', param="format")


# /api/generate's fields sinkd refuses: each would let text choose the framing, or asks for what
# sinkd does not do (the conversation's state is kept server-side, not in `context`)
GENERATE_REFUSED = {
    "raw": "the chat template always frames the prompt (text never becomes control tokens)",
    "template": "the model's own chat template frames the prompt",
    "context": "sinkd keeps conversations server-side: use /api/chat and resend the messages",
    "suffix": "no fill-in-the-middle",
    "images": "text only",
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


LOADED_UNTIL = "2262-04-11T23:47:16Z"  # Ollama's "forever": its latest time (keep_alive < 0)


def refuse_unknown(body: BaseModel, handled: Collection[str] = ()) -> None:
    """A field Ollama's API does not have, or sinkd does not take, is refused naming it (a null
    is unset; `handled`: checked already); nothing is dropped silently."""
    for field, value in (body.model_extra or {}).items():
        if value is not None and field not in handled:
            raise HttpError(400, f"{field}: not a field sinkd implements", param=field)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def router(calls: Calls) -> APIRouter:
    api = APIRouter(route_class=Guarded)
    entry = calls.service.entry
    name = entry.name

    def tag() -> dict[str, Any]:
        return {
            "name": name, "model": name,
            "modified_at": datetime.datetime.fromtimestamp(calls.created, datetime.timezone.utc)
            .isoformat().replace("+00:00", "Z"),
            "size": entry.size,
            "digest": entry.sha256,
            "details": {"format": "gguf", "family": entry.architecture,
                        "parameter_size": "", "quantization_level": ""},
        }  # fmt: skip

    @api.get("/api/version")
    async def version() -> Any:
        return {"version": VERSION}

    embeddings = calls.service.embeddings

    def embedder_tag() -> dict[str, Any]:
        return {**tag(), "name": embeddings.name, "model": embeddings.name,
                "size": embeddings.size, "digest": embeddings.sha256,
                "details": {"format": "safetensors", "family": "bert",
                            "parameter_size": "", "quantization_level": ""}}  # fmt: skip

    @api.get("/api/ps")
    async def ps(request: Request) -> Any:
        """What is loaded, as `ollama ps` and Open WebUI read it: the model and the embedder,
        loaded while the daemon runs (Ollama's "forever"), a session's context, on the CPU unless
        layers are offloaded."""
        calls.principal(request)
        offloaded = calls.settings.n_gpu_layers > 0
        loaded = [tag()] + ([embedder_tag()] if embeddings.name else [])
        return {
            "models": [
                {**t, "expires_at": LOADED_UNTIL, "size_vram": t["size"] if offloaded else 0,
                 "context_length": calls.settings.n_ctx_seq}
                for t in loaded
            ]
        }  # fmt: skip

    @api.get("/api/tags")
    async def tags(request: Request) -> Any:
        calls.principal(request)
        return {"models": [tag()] + ([embedder_tag()] if embeddings.name else [])}

    @api.post("/api/show")
    async def show(request: Request) -> Any:
        calls.principal(request)
        asked = parse_json(await calls.body(request))
        wanted = asked.get("model") or asked.get("name") if isinstance(asked, dict) else None
        if embeddings.name and wanted in (embeddings.name, f"{embeddings.name}:latest"):
            return {
                "details": embedder_tag()["details"],
                "model_info": {"general.architecture": "bert",
                               "bert.embedding_length": embeddings.dimensions,
                               "bert.context_length": embeddings.max_tokens},
                "capabilities": ["embedding"],
                "modified_at": tag()["modified_at"],
            }  # fmt: skip
        if wanted not in (name, f"{name}:latest"):
            raise HttpError(404, f"model {wanted!r} not found ({name} is served here)")
        arch = entry.architecture
        return {
            "details": tag()["details"],
            # the trained context: what clients size their trimming by. sinkd reads only a
            # conversation's new turn however long it is; a history no session took is read whole,
            # and the trained context bounds that (docs/http.md, "/api/show")
            "model_info": {
                "general.architecture": arch,
                f"{arch}.context_length": entry.n_ctx_train,
            },
            # tools in sinkd's generic format; no vision or embeddings (refused by name)
            "capabilities": ["completion", "tools"],
            "modified_at": tag()["modified_at"],
        }

    @api.post("/api/chat")
    async def chat(request: Request) -> Response:
        principal = calls.principal(request)
        calls.ready()
        body = validated(ChatBody, parse_json(await calls.body(request)))
        if body.model not in (name, f"{name}:latest"):
            raise HttpError(404, f"model {body.model!r} not found ({name} is served here)")
        if body.think:
            raise HttpError(400, "think: not supported by sinkd", param="think")
        refuse_unknown(body)
        opts = (body.options or Options()).checked()
        system, turns = history(body.messages)
        turn = StatelessChatRequest(
            system=system,
            turns=turns,
            options=dataclasses.replace(opts.generation(), output=format_of(body.format)),
            session_id=request.headers.get(SESSION_HEADER),
            keep_alive_s=keep_alive_seconds(body.keep_alive),
            tools=tool_use_of(body.tools, None, None),
            private=private_of(request.headers.get(PRIVATE_HEADER)),
        )
        return await answer(principal, request, turn, body.model, body.stream, "message")

    @api.post("/api/generate")
    async def generate(request: Request) -> Response:
        """One prompt, framed by the chat template as a user turn under `system`: a conversation
        of one turn (the same prompt again is a conversation of its own)."""
        principal = calls.principal(request)
        calls.ready()
        body = validated(GenerateBody, parse_json(await calls.body(request)))
        if body.model not in (name, f"{name}:latest"):
            raise HttpError(404, f"model {body.model!r} not found ({name} is served here)")
        for field, why in GENERATE_REFUSED.items():
            if (body.model_extra or {}).get(field):
                raise HttpError(400, f"{field}: not supported by sinkd ({why})", param=field)
        refuse_unknown(body, {*GENERATE_REFUSED, "format"})
        if not body.prompt.strip():  # Ollama loads the model on an empty prompt: nothing to do
            return JSONResponse({"model": body.model, "created_at": _now(), "response": "",
                                 "done": True, "done_reason": "load"})  # fmt: skip
        opts = (body.options or Options()).checked()
        turn = StatelessChatRequest(
            system=body.system or "",
            turns=(Turn("user", body.prompt),),
            options=dataclasses.replace(
                opts.generation(), output=format_of((body.model_extra or {}).get("format"))
            ),
            keep_alive_s=keep_alive_seconds(body.keep_alive),
            private=True,  # a prompt, not a conversation: nothing of it is kept across
        )
        return await answer(principal, request, turn, body.model, body.stream, "response")

    async def answer(
        principal: Principal,
        request: Request,
        turn: StatelessChatRequest,
        model: str,
        stream: bool,
        field: str,
    ) -> Response:
        """A turn in Ollama's framing: NDJSON lines, or one object; the text under `field`
        ("message" for /api/chat, "response" for /api/generate)."""
        start = calls.chat(principal, turn)
        if stream:

            def pieces(c: Continuation, events: ChatStream) -> Iterator[bytes]:
                return _ndjson(model, c, events, field)

            return await calls.streamed(principal, request, start, pieces, "application/x-ndjson")
        continuation, text, done, seconds = await calls.whole(principal, request, start)
        return JSONResponse(
            {"model": model, "created_at": _now(), **_text(field, text, calls_of(done)),
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


def _text(field: str, text: str, calls: tuple[ToolCall, ...] = ()) -> dict[str, Any]:
    """The reply's text under `field`; a chat's tool calls as Ollama gives them (the arguments
    an object, no id)."""
    if field != "message":
        return {"response": text}
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"function": {"name": c.name, "arguments": json.loads(c.arguments)}} for c in calls
        ]
    return {"message": message}


def _ndjson(model: str, c: Continuation, events: ChatStream, field: str) -> Iterator[bytes]:
    """Text as it comes; tool calls (Ollama streams each whole) on a line before the last."""
    t0 = time.monotonic()
    try:
        for event in events:
            if isinstance(event, ToolCallDelta):
                continue
            if isinstance(event, TokenEvent):
                line = {"model": model, "created_at": _now(), **_text(field, event.text),
                        "done": False}  # fmt: skip
            else:
                if calls_of(event):
                    calls = {"model": model, "created_at": _now(),
                             **_text(field, "", calls_of(event)), "done": False}  # fmt: skip
                    yield (json.dumps(calls) + "\n").encode()
                line = {"model": model, "created_at": _now(), **_text(field, ""),
                        **_final(c, event, time.monotonic() - t0)}  # fmt: skip
            yield (json.dumps(line) + "\n").encode()
    except Exception as e:  # headers are sent: the error goes in the stream
        yield (json.dumps({"error": message_of(internal(e))}) + "\n").encode()
