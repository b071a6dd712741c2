"""OpenAI's Responses API, stateful: `POST /v1/responses` (streamed as typed server-sent events, or
not), `GET` and `DELETE /v1/responses/{id}`. Each stored conversation is one sinkd session
(`runtime/responses.py`); a conversation id is a session id. Translation only."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse, Response

from sinkd.daemon.http.calls import Calls
from sinkd.daemon.http.error_bodies import Guarded, HttpError, internal
from sinkd.daemon.http.openai_api import cached_tokens, extension
from sinkd.daemon.http.wire import (
    Unsupported,
    check_model,
    check_supported,
    headers_of,
    max_tokens_of,
    parse_json,
    sampling_of,
    text_of,
    tool_calls_of,
    tool_use_of,
    validated,
)
from sinkd.daemon.runtime.api import (
    CancelToken,
    ChatStream,
    Done,
    GenerationOptions,
    OutputFormat,
    TokenEvent,
    ToolCall,
    ToolCallDelta,
    ToolUse,
    Turn,
    calls_of,
)
from sinkd.daemon.runtime.conversations.chats import Admit, Continuation
from sinkd.daemon.runtime.conversations.responses import (
    ResponseRequest,
    StoredResponse,
    new_response_id,
)
from sinkd.errors import message_of

INCOMPLETE = {
    "max_tokens": "max_output_tokens",
    "cache_full": "max_output_tokens",
    "repetition": "max_output_tokens",
}


def _unset(v: Any) -> bool:
    return v in (None, [], {}, False, "none", "auto")


UNSUPPORTED: Unsupported = (
    ("reasoning", _unset, "no reasoning settings"),
    ("include", _unset, "no extra output items"),
    ("background", _unset, "answers in the foreground"),
    ("top_logprobs", _unset, "no logprobs"),
    ("prompt", _unset, "no prompt templates"),
    ("max_tool_calls", _unset, "no bound on tool calls (parallel_tool_calls: false makes one)"),
)
HARMLESS = frozenset({"user", "service_tier", "safety_identifier",
                      "prompt_cache_key", "stream_options"})  # fmt: skip


class ResponsesBody(BaseModel):
    model_config = ConfigDict(extra="allow")  # checked against UNSUPPORTED and HARMLESS

    model: str
    input: str | list[Any]
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    metadata: dict[str, str] | None = None
    truncation: str | None = None
    text: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


def _output_of(fmt: Any) -> OutputFormat | None:
    """The Responses API's `text.format`: text, `json_object`, or `json_schema` (its `schema`
    beside its `name`), the last two decoded under a grammar (docs/http.md)."""
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat()
    if kind == "json_schema" and isinstance(fmt.get("schema"), dict):
        return OutputFormat(json.dumps(fmt["schema"], sort_keys=True))
    raise HttpError(400, "text.format: text, json_object, or json_schema with a schema",
                    param="text.format")  # fmt: skip


def request_of(body: ResponsesBody) -> ResponseRequest:
    check_supported(body, UNSUPPORTED, HARMLESS)
    output = _output_of((body.text or {}).get("format") or {"type": "text"})
    if body.truncation not in (None, "disabled", "auto"):
        raise HttpError(400, "truncation: 'disabled' or 'auto'", param="truncation")
    instructions, items = _items(body.input, body.instructions)
    conversation = body.conversation
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
        if not isinstance(conversation, str):
            raise HttpError(400, "conversation.id: a string", param="conversation")
    limit = max_tokens_of(("max_output_tokens", body.max_output_tokens))
    return ResponseRequest(
        instructions=instructions,
        items=items,
        previous_id=body.previous_response_id,
        conversation=conversation,
        store=body.store,
        options=GenerationOptions(
            limit, (), sampling_of(body.temperature, body.top_p, None), output
        ),
        tools=_tools_of(body),
    )


def _items(given: str | list[Any], instructions: str | None) -> tuple[str | None, tuple[Turn, ...]]:
    """The input as turns; leading system (developer) messages join the instructions. A
    `function_call` (the client resending a call) joins the assistant turn before it; a
    `function_call_output` is a tool turn, named by its `call_id`."""
    if isinstance(given, str):
        return instructions, (Turn("user", given),)
    system: list[str] = [] if instructions is None else [instructions]
    turns: list[Turn] = []
    for i, item in enumerate(given):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else type(item).__name__
        if kind == "function_call":
            call = tool_calls_of([{"id": item.get("call_id"), "function": item}], where)
            if (
                turns
                and turns[-1].role == "assistant"
                and (turns[-1].calls or not turns[-1].content)
            ):
                turns[-1] = replace(turns[-1], calls=turns[-1].calls + call)
            else:
                turns.append(Turn("assistant", "", calls=call))
            continue
        if kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str) or not isinstance(item.get("call_id"), str):
                raise HttpError(400, f"{where}: a call_id and an output string are needed",
                                param=where)  # fmt: skip
            turns.append(Turn("tool", output, call_id=item["call_id"]))
            continue
        if kind != "message":
            raise HttpError(400, f"{where}: {kind!r} items are not supported (messages, function"
                            " calls and their outputs)", param=where)  # fmt: skip
        role = item.get("role")
        text = text_of(item.get("content"), f"{where}.content")
        if role in ("system", "developer") and not turns:
            system.append(text)
        elif role in ("user", "assistant"):
            turns.append(Turn(role, text))
        else:
            raise HttpError(400, f"{where}.role: {role!r} is not supported here",
                            param=f"{where}.role")  # fmt: skip
    return ("\n\n".join(system) if system else None), tuple(turns)


def _tools_of(body: ResponsesBody) -> ToolUse | None:
    """The Responses API's function tools (flat: name, description, parameters beside `type`)
    as Chat Completions' are read."""
    nested = None
    if body.tools:
        nested = [
            {"type": t.get("type"), "function": t} if isinstance(t, dict) else t for t in body.tools
        ]
    return tool_use_of(nested, body.tool_choice, body.parallel_tool_calls)


def response_object(
    model: str, stored: StoredResponse, c: Continuation | None, done: Done | None
) -> dict[str, Any]:
    incomplete = INCOMPLETE.get(stored.reason)
    return {
        "id": stored.id,
        "object": "response",
        "created_at": stored.created,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "error": None,
        "model": model,
        "instructions": stored.instructions or None,
        "previous_response_id": stored.previous_id,
        "output": _output(stored),
        "parallel_tool_calls": False,
        "tool_choice": "none",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "store": stored.stored,
        "metadata": {},
        "conversation": {"id": stored.session_id},
        "usage": {
            "input_tokens": stored.input_tokens,
            # from a stored prefix state rather than read: known as the turn is answered (a
            # response read back later says 0: sinkd does not keep it with the response)
            "input_tokens_details": {
                "cached_tokens": cached_tokens(c, done) if c is not None and done is not None else 0
            },
            "output_tokens": stored.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": stored.input_tokens + stored.output_tokens,
        },
        **({"sinkd": extension(c, done)} if c is not None else {}),
    }


def _message(response_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"type": "message", "id": _item_id(response_id), "status": status,
            "role": "assistant", "content": content if text or status == "completed" else []}  # fmt: skip


def _output(stored: StoredResponse) -> list[dict[str, Any]]:
    """The answer's message (when it said something, or made no call), then its calls."""
    items = [_call_item(c, "completed") for c in stored.calls]
    if stored.text or not items:
        items.insert(0, _message(stored.id, stored.text, "completed"))
    return items


def _call_item(call: ToolCall, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": _call_item_id(call.id), "call_id": call.id,
            "name": call.name, "arguments": call.arguments, "status": status}  # fmt: skip


def _call_item_id(call_id: str) -> str:
    return "fc_" + call_id.removeprefix("call_")


def _item_id(response_id: str) -> str:
    return "msg_" + response_id.removeprefix("resp_")


def router(calls: Calls) -> APIRouter:
    api = APIRouter(route_class=Guarded)
    model_name = calls.service.entry.name
    responses = calls.service.responses

    @api.post("/v1/responses")
    async def create(request: Request) -> Response:
        principal = calls.principal(request)
        calls.ready()
        body = validated(ResponsesBody, parse_json(await calls.body(request)))
        check_model(body.model, model_name)
        ask = request_of(body)
        response_id = new_response_id(calls.settings.node)

        def start(cancel: CancelToken, admit: Admit) -> tuple[Continuation, ChatStream]:
            return responses.respond(principal, ask, response_id, cancel, admit)

        instructions = ask.instructions or ""
        if body.stream:

            def pieces(c: Continuation, events: ChatStream) -> Iterator[bytes]:
                return _events(model_name, response_id, c, events, ask, instructions)

            return await calls.streamed(principal, request, start, pieces, "text/event-stream")
        c, text, done, _ = await calls.whole(principal, request, start)
        stored = StoredResponse.of(response_id, c, text, done, ask)
        return JSONResponse(response_object(model_name, stored, c, done), headers=headers_of(c))

    @api.get("/v1/responses/{response_id}")
    async def get(response_id: str, request: Request) -> Any:
        principal = calls.principal(request)
        return response_object(model_name, responses.get(principal, response_id), None, None)

    @api.delete("/v1/responses/{response_id}")
    async def delete(response_id: str, request: Request) -> Any:
        principal = calls.principal(request)
        erased = await calls.in_slot(principal, lambda: responses.delete(principal, response_id))
        return {
            "id": response_id,
            "object": "response.deleted",
            "deleted": True,
            "sinkd": {"purge_owed": erased.purge_owed},  # the text may still be on disk
        }

    return api


def _events(
    model: str,
    response_id: str,
    c: Continuation,
    events: ChatStream,
    ask: ResponseRequest,
    instructions: str,
) -> Iterator[bytes]:
    """The Responses API's typed events, each numbered, around the text's deltas and the calls'
    argument deltas. Without tools the message item opens at once; with them each item opens as
    its first piece comes (a reply is an answer or calls, which the grammar decides as it goes)."""
    n = 0
    item = _item_id(response_id)
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    opened: dict[str, int] = {}  # item id -> its output index

    def event(kind: str, **data: Any) -> bytes:
        nonlocal n
        n += 1
        payload = {"type": kind, "sequence_number": n - 1, **data}
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()

    def open_message() -> Iterator[bytes]:
        opened[item] = len(opened)
        yield event("response.output_item.added", output_index=opened[item],
                    item=_message(response_id, "", "in_progress"))  # fmt: skip
        yield event("response.content_part.added", item_id=item, output_index=opened[item],
                    content_index=0, part=part)  # fmt: skip

    shell = {"id": response_id, "object": "response", "created_at": int(time.time()),
             "status": "in_progress", "model": model, "output": [], "error": None,
             "previous_response_id": ask.previous_id, "instructions": instructions or None,
             "tools": [], "tool_choice": "none", "parallel_tool_calls": False}  # fmt: skip
    yield event("response.created", response=shell)
    yield event("response.in_progress", response=shell)
    if ask.tools is None:
        yield from open_message()
    text: list[str] = []
    try:
        for e in events:
            if isinstance(e, TokenEvent):
                if e.text:
                    if item not in opened:
                        yield from open_message()
                    text.append(e.text)
                    yield event("response.output_text.delta", item_id=item,
                                output_index=opened[item], content_index=0, delta=e.text,
                                logprobs=[])  # fmt: skip
                continue
            if isinstance(e, ToolCallDelta):
                fc = _call_item_id(e.id)
                if fc not in opened:
                    opened[fc] = len(opened)
                    call = ToolCall(e.id, e.name, "")
                    yield event("response.output_item.added", output_index=opened[fc],
                                item=_call_item(call, "in_progress"))  # fmt: skip
                if e.arguments:
                    yield event("response.function_call_arguments.delta", item_id=fc,
                                output_index=opened[fc], delta=e.arguments)  # fmt: skip
                continue
            whole = "".join(text)
            if item not in opened and not calls_of(e):
                yield from open_message()
            if item in opened:
                at = opened[item]
                yield event("response.output_text.done", item_id=item, output_index=at,
                            content_index=0, text=whole, logprobs=[])  # fmt: skip
                yield event("response.content_part.done", item_id=item, output_index=at,
                            content_index=0, part={**part, "text": whole})  # fmt: skip
                yield event("response.output_item.done", output_index=at,
                            item=_message(response_id, whole, "completed"))  # fmt: skip
            for call in calls_of(e):
                fc = _call_item_id(call.id)
                yield event("response.function_call_arguments.done", item_id=fc,
                            output_index=opened[fc], arguments=call.arguments)  # fmt: skip
                yield event("response.output_item.done", output_index=opened[fc],
                            item=_call_item(call, "completed"))  # fmt: skip
            stored = StoredResponse.of(response_id, c, whole, e, ask)
            obj = response_object(model, stored, c, e)
            kind = "response.incomplete" if obj["status"] == "incomplete" else "response.completed"
            yield event(kind, response=obj)
    except Exception as error:  # headers are sent: the error goes in the stream
        err = internal(error)
        yield event("error", code=type(err).__name__, message=message_of(err), param=None)
