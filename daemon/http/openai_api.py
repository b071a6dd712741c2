"""OpenAI's API: `GET /v1/models`, `POST /v1/chat/completions` (streamed as server-sent events, or
not). A stateless client's history continues the caller's session that took it
(`runtime/conversations/chats.py`); each answer says which session answered and how it was found, in `x-sinkd-*` headers and in a
`sinkd` field the SDKs ignore."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from sinkd.daemon.http.calls import Calls
from sinkd.daemon.http.error_bodies import Guarded, body, internal
from sinkd.daemon.http.wire import (
    PRIVATE_HEADER,
    SESSION_HEADER,
    ChatCompletionBody,
    CompletionBody,
    chat_request,
    check_model,
    completion_request,
    headers_of,
    parse_json,
    private_of,
    validated,
)
from sinkd.daemon.runtime.api import (
    CancelToken,
    ChatStream,
    Done,
    RecallReport,
    TokenEvent,
    ToolCall,
    ToolCallDelta,
    calls_of,
    to_json,
)
from sinkd.daemon.runtime.conversations.chats import Admit, Continuation
from sinkd.errors import message_of

# a reply cut short is "length" (a loop the repetition guard cut too: OpenAI has no other word)
FINISH = {
    "max_tokens": "length",
    "cache_full": "length",
    "repetition": "length",
    "stop": "stop",
    "eog": "stop",
}


def extension(c: Continuation, done: Done | None) -> dict[str, Any]:
    """What sinkd adds to an answer: the session, how it was found, the receipt's counts, where the
    session is (resident or parked) and how long this turn's restore took (0: none), and what
    the turn's recall brought back (passage ids, where each was first seen, scores) or why not."""
    out: dict[str, Any] = {
        "session_id": c.handle.session_id,
        "generation": c.handle.generation,
        "continuation": c.how,
        "why": c.why,
        "ingested_turns": c.ingested_turns,
    }
    if c.output:
        out["output"] = c.output
    if c.tools is not None:
        t = c.tools
        out["tools"] = {"offered": t.offered, "pinned": t.pinned, "tokens": t.tokens,
                        "pin_bound": t.bound, "note": t.note}  # fmt: skip
    if done is not None:
        r = done.receipt
        out["receipt"] = {
            "n_seen": r.n_seen, "retained": r.retained, "evicted_tokens": r.evicted_tokens,
            "generation": r.generation, "residency": r.residency,
            "restored_ms": round(r.restored_ms, 3),
        }  # fmt: skip
        out["read_tokens"] = usage(c, done)["prompt_tokens"]  # what this request appended
        out["prefix_tokens"] = cached_tokens(c, done)  # ... of which from a stored prefix
        out["recall"] = _recall(done.recall)
    return out


def _recall(report: RecallReport | None) -> Any:
    if report is None:
        return None
    data = to_json(report)
    assert isinstance(data, dict)
    data.pop("query_sha256", None)  # the answer's own words need no hash of them
    return data


def usage(c: Continuation, done: Done) -> dict[str, Any]:
    """What the request added to the session's stream (its prompt: a new conversation's whole
    history, a continued one's new turn), and of it what came from a stored prefix state rather
    than being read (OpenAI's cached input tokens)."""
    prompt = max(done.receipt.n_seen - done.generated - c.n_seen_before, 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": done.generated,
        "total_tokens": prompt + done.generated,
        "prompt_tokens_details": {"cached_tokens": cached_tokens(c, done)},
    }


def cached_tokens(c: Continuation, done: Done) -> int:
    return max(done.receipt.prefix_tokens - c.prefix_before, 0)


def router(calls: Calls) -> APIRouter:
    api = APIRouter(route_class=Guarded)
    model_name = calls.service.entry.name

    served = [n for n in (model_name, calls.service.embeddings.name) if n]  # chat, embeddings

    def listed(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": calls.created, "owned_by": "sinkd"}

    @api.get("/v1/models")
    async def models(request: Request) -> Any:
        calls.principal(request)
        return {"object": "list", "data": [listed(n) for n in served]}

    @api.get("/v1/models/{name}")
    async def model(name: str, request: Request) -> Any:
        calls.principal(request)
        if name not in served:
            check_model(name, model_name)
        return listed(name)

    @api.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        principal = calls.principal(request)
        calls.ready()
        parsed = validated(ChatCompletionBody, parse_json(await calls.body(request)))
        check_model(parsed.model, model_name)
        turn = chat_request(
            parsed,
            request.headers.get(SESSION_HEADER),
            private_of(request.headers.get(PRIVATE_HEADER)),
        )
        if parsed.stream:
            include_usage = bool(parsed.stream_options and parsed.stream_options.include_usage)

            def pieces(c: Continuation, events: ChatStream) -> Iterator[bytes]:
                return _sse(model_name, c, events, include_usage)

            return await calls.streamed(
                principal, request, calls.chat(principal, turn), pieces, "text/event-stream"
            )
        continuation, text, done, _ = await calls.whole(
            principal, request, calls.chat(principal, turn)
        )
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [
                    {"index": 0, "message": _message(text, done), "finish_reason": finish(done)}
                ],
                "usage": usage(continuation, done),
                "sinkd": extension(continuation, done),
            },
            headers=headers_of(continuation),
        )

    @api.post("/v1/completions")
    async def completions(request: Request) -> Response:
        principal = calls.principal(request)
        calls.ready()
        parsed = validated(CompletionBody, parse_json(await calls.body(request)))
        check_model(parsed.model, model_name)
        asked = completion_request(parsed)
        echo = asked.prompt if parsed.echo else ""

        def start(cancel: CancelToken, admit: Admit) -> tuple[Continuation, ChatStream]:
            return calls.service.completions.complete(principal, asked, cancel, admit)

        if parsed.stream:
            include_usage = bool(parsed.stream_options and parsed.stream_options.include_usage)

            def pieces(c: Continuation, events: ChatStream) -> Iterator[bytes]:
                return _completion_sse(model_name, c, events, include_usage, echo)

            return await calls.streamed(principal, request, start, pieces, "text/event-stream")
        continuation, text, done, _ = await calls.whole(principal, request, start)
        return JSONResponse(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [
                    {
                        "index": 0,
                        "text": echo + text,
                        "logprobs": None,
                        "finish_reason": finish(done),
                    }
                ],  # fmt: skip
                "usage": usage(continuation, done),
                "sinkd": extension(continuation, done),
            },
            headers=headers_of(continuation),
        )

    return api


def _completion_sse(
    model: str, c: Continuation, events: ChatStream, include_usage: bool, echo: str
) -> Iterator[bytes]:
    ident, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(text: str, reason: str | None, choices: bool = True, **extra: Any) -> bytes:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        data = {"id": ident, "object": "text_completion", "created": created, "model": model,
                "choices": [choice] if choices else [], **extra}  # fmt: skip
        return f"data: {json.dumps(data)}\n\n".encode()

    if echo:
        yield chunk(echo, None)
    try:
        for event in events:
            if isinstance(event, TokenEvent):
                if event.text:
                    yield chunk(event.text, None)
            elif isinstance(event, Done):
                yield chunk("", finish(event), sinkd=extension(c, event))
                if include_usage:
                    yield chunk("", None, choices=False, usage=usage(c, event))
    except Exception as error:  # headers are sent: the error goes in the stream, as OpenAI's does
        e = internal(error)
        yield f"data: {json.dumps(body(message_of(e), 'server_error', code=type(e).__name__))}\n\n".encode()
    yield b"data: [DONE]\n\n"


def finish(done: Done) -> str:
    """OpenAI's finish reason: "length" for a reply cut short, calls or not (as OpenAI's: the
    last call's arguments may be cut too), else "tool_calls" when the reply called tools."""
    reason = FINISH.get(done.reason, "stop")
    return "tool_calls" if reason != "length" and calls_of(done) else reason


def _message(text: str, done: Done) -> dict[str, Any]:
    if not calls_of(done):
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text or None, "tool_calls": _calls(calls_of(done))}


def _calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]


def _delta(d: ToolCallDelta, first: bool) -> dict[str, Any]:
    """A call's piece: its index always; its id, type and name with its first piece."""
    if first:
        return {"index": d.index, "id": d.id, "type": "function",
                "function": {"name": d.name, "arguments": d.arguments}}  # fmt: skip
    return {"index": d.index, "function": {"arguments": d.arguments}}


def _sse(model: str, c: Continuation, events: ChatStream, include_usage: bool) -> Iterator[bytes]:
    ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(choices: list[Any], **extra: Any) -> bytes:
        data = {"id": ident, "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": choices, **extra}  # fmt: skip
        return f"data: {json.dumps(data)}\n\n".encode()

    yield chunk(
        [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
    )
    begun: set[int] = set()  # the calls whose first piece went
    try:
        for event in events:
            if isinstance(event, TokenEvent):
                if event.text:
                    delta: dict[str, Any] = {"content": event.text}
                    yield chunk([{"index": 0, "delta": delta, "finish_reason": None}])
                continue
            if isinstance(event, ToolCallDelta):
                delta = {"tool_calls": [_delta(event, event.index not in begun)]}
                begun.add(event.index)
                yield chunk([{"index": 0, "delta": delta, "finish_reason": None}])
                continue
            yield chunk(
                [{"index": 0, "delta": {}, "finish_reason": finish(event)}],
                sinkd=extension(c, event),
            )
            if include_usage:
                yield chunk([], usage=usage(c, event))
    except Exception as error:  # headers are sent: the error goes in the stream, as OpenAI's does
        e = internal(error)
        yield f"data: {json.dumps(body(message_of(e), 'server_error', code=type(e).__name__))}\n\n".encode()
    yield b"data: [DONE]\n\n"
