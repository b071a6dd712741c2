"""The HTTP APIs' request bodies as sinkd reads them (OpenAI's Chat Completions, Ollama's /api/chat),
and their translation into the runtime's typed request. A field sinkd does not implement is refused
naming it (HttpError 400), never silently ignored."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from sinkd.daemon.http.error_bodies import HttpError
from sinkd.daemon.runtime.api import (
    GenerationOptions,
    OutputFormat,
    SamplingRequest,
    Tool,
    ToolCall,
    ToolUse,
    Turn,
)
from sinkd.daemon.runtime.conversations.chats import Continuation, StatelessChatRequest
from sinkd.daemon.runtime.conversations.completions import CompletionRequest

# fields a client may send that change nothing sinkd does (metadata, defaults it already has)
SESSION_HEADER = "x-sinkd-session"  # a client may name its session; every answer names it
# the conversation stays out of its tenant's memory across conversations (docs/recall.md)
PRIVATE_HEADER = "x-sinkd-private"


def private_of(value: str | None) -> bool:
    """The private header's value: 1/true/yes/on, or 0/false/no/off (absent: not private)."""
    if value is None:
        return False
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise HttpError(400, f"{PRIVATE_HEADER}: {value[:16]!r} is not true or false")


def headers_of(c: Continuation) -> dict[str, str]:
    """Which session answered and how it was found, for both APIs' answers."""
    return {
        SESSION_HEADER: c.handle.session_id,
        "x-sinkd-generation": c.handle.generation,
        "x-sinkd-continuation": c.how,
        "x-sinkd-why": c.why,
        **({"x-sinkd-tools": c.tools.note} if c.tools is not None else {}),
        **({"x-sinkd-output": c.output} if c.output else {}),
    }


HARMLESS = frozenset({"user", "metadata", "store", "service_tier"})
# (field, whether the value asks nothing sinkd lacks, what sinkd serves instead)
Unsupported = tuple[tuple[str, Callable[[Any], bool], str], ...]


def _off(v: Any) -> bool:
    return not v


def _one(v: Any) -> bool:
    return v in (None, 1)


def _no_tools(v: Any) -> bool:
    return v in (None, "none")


def _text(v: Any) -> bool:
    return v in (None, {"type": "text"}, ["text"])


def _unset(v: Any) -> bool:
    return v is None


# (field, whether the value asks nothing sinkd lacks, what sinkd serves instead)
UNSUPPORTED: Unsupported = (
    ("n", _one, "one choice per request (n = 1)"),
    ("functions", _off, "tools (the deprecated functions are not read)"),
    ("function_call", _no_tools, "tool_choice (the deprecated function_call is not read)"),
    ("logprobs", _off, "no logprobs"),
    ("top_logprobs", _off, "no logprobs"),
    ("logit_bias", _off, "no logit bias"),
    ("presence_penalty", _off, "no presence penalty"),
    ("frequency_penalty", _off, "no frequency penalty"),
    ("audio", _off, "text only"),
    ("modalities", _text, "text only"),
    ("prediction", _off, "no predicted outputs"),
    ("reasoning_effort", _unset, "no reasoning effort"),
)
MAX_STOPS = 16


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatCompletionBody(BaseModel):
    model_config = ConfigDict(extra="allow")  # checked against UNSUPPORTED and HARMLESS below

    model: str
    messages: list[dict[str, Any]]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


class CompletionBody(BaseModel):
    model_config = ConfigDict(extra="allow")  # checked against COMPLETION_UNSUPPORTED below

    model: str
    prompt: str | list[str]
    suffix: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    echo: bool = False


COMPLETION_MAX_TOKENS = 16  # OpenAI's default for a legacy completion
COMPLETION_UNSUPPORTED: Unsupported = (
    ("n", _one, "one choice per request (n = 1)"),
    ("best_of", _one, "one choice per request (best_of = 1)"),
    ("logprobs", lambda v: v in (None, 0), "no logprobs"),
    ("logit_bias", _off, "no logit bias"),
    ("presence_penalty", _off, "no presence penalty"),
    ("frequency_penalty", _off, "no frequency penalty"),
)


def completion_request(body: CompletionBody) -> CompletionRequest:
    """A legacy completion: one prompt (a string, or a list of one) continued as raw text."""
    check_supported(body, COMPLETION_UNSUPPORTED, HARMLESS)
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if len(prompts) != 1:
        raise HttpError(400, f"prompt: one prompt per request, not {len(prompts)}", param="prompt")
    limit = max_tokens_of(("max_tokens", body.max_tokens))
    return CompletionRequest(
        prompts[0],
        GenerationOptions(
            COMPLETION_MAX_TOKENS if limit is None else limit,
            stops_of(body.stop),
            sampling_of(body.temperature, body.top_p, body.seed),
        ),
        body.suffix,
    )


def output_of(response_format: dict[str, Any] | None) -> OutputFormat | None:
    """OpenAI's `response_format`: text (None), `json_object`, or `json_schema` (its `schema`;
    `strict` or not, the grammar enforces it wholly, or the schema is refused naming why)."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat()
    if kind != "json_schema":
        raise HttpError(400, f"response_format.type: {kind!r} is not text, json_object or"
                        " json_schema", param="response_format.type")  # fmt: skip
    spec = (response_format or {}).get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise HttpError(400, "response_format.json_schema.schema: a JSON schema object is needed",
                        param="response_format.json_schema.schema")  # fmt: skip
    return OutputFormat(json.dumps(schema, sort_keys=True))


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise HttpError(400, "the body is not UTF-8") from None
    except json.JSONDecodeError as e:
        raise HttpError(400, f"the body is not JSON: {e.msg} at {e.pos}") from None


def validated(cls: type[BaseModel], data: Any) -> Any:
    if not isinstance(data, dict):
        raise HttpError(400, "the body must be a JSON object")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        raise HttpError(400, f"{where}: {first['msg']}", param=where) from None


def text_of(content: Any, where: str) -> str:
    """A message's content: a string, or text parts (what some clients send)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise HttpError(400, f"{where}[{i}]: {kind!r} content is not supported (text only)",
                                param=f"{where}[{i}]")  # fmt: skip
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise HttpError(400, f"{where}: content must be a string or text parts", param=where)


def history(messages: list[dict[str, Any]]) -> tuple[str, tuple[Turn, ...]]:
    """(system prompt, turns): leading system (or developer) messages join into the system
    prompt; one later is refused (it would rewrite a conversation already under way). An
    assistant's `tool_calls` and the `tool` messages answering them (named by the call they
    answer) are turns too."""
    system: list[str] = []
    turns: list[Turn] = []
    called: dict[str, str] = {}  # tool call id -> the tool's name
    unanswered: list[str] = []  # the last assistant's calls, in order (Ollama's sends no id)
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise HttpError(400, f"messages[{i}]: must be an object", param=f"messages[{i}]")
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise HttpError(
                400,
                f"messages[{i}].role: {role!r} is not supported (system, user, assistant, tool)",
                param=f"messages[{i}].role",
            )
        for field in ("function_call", "audio"):
            if m.get(field):
                raise HttpError(400, f"messages[{i}].{field} is not supported",
                                param=f"messages[{i}].{field}")  # fmt: skip
        text = text_of(m.get("content"), f"messages[{i}].content")
        if role in ("system", "developer"):
            if turns:
                raise HttpError(
                    400,
                    f"messages[{i}]: a system message after the conversation began is not"
                    " supported",
                    param=f"messages[{i}]",
                )
            system.append(text)
        elif role == "tool":
            name = called.get(str(m.get("tool_call_id"))) or m.get("tool_name") or m.get("name")
            if not name and unanswered:
                name = unanswered[0]
            if isinstance(name, str) and name in unanswered:
                unanswered.remove(name)
            if not isinstance(name, str) or not name:
                raise HttpError(400, f"messages[{i}].tool_call_id: answers no tool call made"
                                " earlier in messages", param=f"messages[{i}].tool_call_id")  # fmt: skip
            turns.append(Turn("tool", text, name=name))
        else:
            calls = tool_calls_of(m.get("tool_calls"), f"messages[{i}].tool_calls")
            called.update((c.id, c.name) for c in calls)
            unanswered = [c.name for c in calls]
            turns.append(Turn(role, text, calls=calls))
    return "\n\n".join(system), tuple(turns)


def tool_calls_of(raw: Any, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's `tool_calls`, as the client got them from sinkd."""
    if not raw:
        return ()
    if not isinstance(raw, list):
        raise HttpError(400, f"{where}: must be a list", param=where)
    calls = []
    for i, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise HttpError(400, f"{where}[{i}]: a function call with a name is needed",
                            param=f"{where}[{i}]")  # fmt: skip
        arguments = fn.get("arguments") or "{}"
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)  # Ollama's clients send an object
        try:
            json.loads(arguments)
        except json.JSONDecodeError:
            raise HttpError(400, f"{where}[{i}].function.arguments: not JSON",
                            param=f"{where}[{i}].function.arguments") from None  # fmt: skip
        calls.append(ToolCall(str(call.get("id") or f"call_{i}"), fn["name"], arguments))
    return tuple(calls)


TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def tool_use_of(
    tools: list[dict[str, Any]] | None, choice: str | dict[str, Any] | None, parallel: bool | None
) -> ToolUse | None:
    """OpenAI's `tools` (functions: name, description, parameters) and `tool_choice` ("auto",
    "none", "required" or {"type": "function", "function": {"name": ...}})."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise HttpError(400, "tool_choice: names a tool but no tools were sent",
                            param="tool_choice")  # fmt: skip
        return None
    offered = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            kind = t.get("type") if isinstance(t, dict) else type(t).__name__
            raise HttpError(400, f"tools[{i}]: {kind!r} tools are not supported (functions only)",
                            param=f"tools[{i}]")  # fmt: skip
        offered.append(_tool(fn, f"tools[{i}].function"))
    return ToolUse(tuple(offered), _choice(choice), True if parallel is None else parallel)


def _tool(fn: dict[str, Any], where: str) -> Tool:
    name = fn.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise HttpError(400, f"{where}.name: letters, digits, _ and -, at most 64",
                        param=f"{where}.name")  # fmt: skip
    parameters = fn.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise HttpError(400, f"{where}.parameters: a JSON schema object is needed",
                        param=f"{where}.parameters")  # fmt: skip
    return Tool(name, str(fn.get("description") or ""), json.dumps(parameters, sort_keys=True))


def _choice(choice: str | dict[str, Any] | None) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise HttpError(400, f"tool_choice: {choice!r} is not auto, none or required",
                            param="tool_choice")  # fmt: skip
        return choice
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else choice.get("name")
    if choice.get("type") != "function" or not isinstance(name, str):
        raise HttpError(400, "tool_choice: a function to call is named"
                        ' {"type": "function", "function": {"name": ...}}', param="tool_choice")  # fmt: skip
    return name


def check_supported(
    body: BaseModel, unsupported: Unsupported = (), harmless: frozenset[str] = frozenset()
) -> None:
    """A body's fields beyond its model: those `unsupported` names are refused unless their value
    asks nothing sinkd lacks, `harmless` ones pass, any other is refused naming it."""
    extra = body.model_extra or {}
    for field, fine, needs in unsupported:
        if field in extra and not fine(extra[field]):
            raise HttpError(400, f"{field}: not supported; sinkd serves {needs}", param=field)
    named = {f for f, _, _ in unsupported}
    for field in extra:
        if field not in harmless and field not in named:
            raise HttpError(400, f"{field}: not a field sinkd implements", param=field)


def check_model(asked: str, served: str) -> None:
    """OpenAI's 404 for a model this daemon does not serve."""
    if asked != served:
        raise HttpError(404, f"model {asked!r} is not served here ({served} is)",
                        param="model", code="model_not_found")  # fmt: skip


def stops_of(stop: str | list[str] | None) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > MAX_STOPS:
        raise HttpError(400, f"stop: at most {MAX_STOPS} strings", param="stop")
    return stops


def max_tokens_of(*given: tuple[str, int | None]) -> int | None:
    """The first limit the client set, or None (none set); below 1 refused naming the field (a
    client asking for no tokens is not given a whole reply)."""
    for field, value in given:
        if value is None:
            continue
        if value < 1:
            raise HttpError(400, f"{field}: must be at least 1, not {value}", param=field)
        return value
    return None  # the reply runs to the end of its turn (the daemon's cap and repetition guard)


def sampling_of(
    temperature: float | None, top_p: float | None, seed: int | None
) -> SamplingRequest | None:
    """None when the client set nothing: the model's recommended chat sampling applies."""
    if temperature is None and top_p is None and seed is None:
        return None
    return SamplingRequest(
        temperature=1.0 if temperature is None else temperature,  # OpenAI's default
        top_p=1.0 if top_p is None else top_p,
        seed=0 if seed is None else seed,
    )


def chat_request(
    body: ChatCompletionBody, session_id: str | None, private: bool = False
) -> StatelessChatRequest:
    check_supported(body, UNSUPPORTED, HARMLESS)
    both = body.max_tokens is not None and body.max_completion_tokens is not None
    if both and body.max_tokens != body.max_completion_tokens:
        raise HttpError(400, "max_tokens and max_completion_tokens disagree",
                        param="max_completion_tokens")  # fmt: skip
    system, turns = history(body.messages)
    return StatelessChatRequest(
        system=system,
        turns=turns,
        options=GenerationOptions(
            max_tokens_of(
                ("max_completion_tokens", body.max_completion_tokens),
                ("max_tokens", body.max_tokens),
            ),
            stops_of(body.stop),
            sampling_of(body.temperature, body.top_p, body.seed),
            output_of(body.response_format),
        ),
        session_id=session_id,
        tools=tool_use_of(body.tools, body.tool_choice, body.parallel_tool_calls),
        private=private,
    )
