"""sinkd's generic tool format, for chat templates that know no tools (both pinned models').

The tools are described after the system prompt (as text: a description is data, never a control
token), and the whole reply is one JSON object a grammar enforces:
`{"tool_calls": [{"name": ..., "arguments": {...}}]}` or `{"response": "..."}`, each call's
arguments valid for its tool's schema. Tool results go back as a user turn
`{"tool_results": [{"name": ..., "content": ...}]}`. The same shape as llama.cpp's own generic
format (`common/chat.cpp`), so a model that was shown one has seen the other.

Pure: no engine. `ReplyReader` turns the reply's text, as it streams, into content and call pieces.
"""

from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass
from typing import Any

from sinkd.daemon.runtime.api import OutputFormat, Tool, ToolCall, ToolCallDelta, ToolUse, Turn
from sinkd.errors import InvalidInput

INSTRUCTIONS = (
    "You can call tools. To call tools, reply with only this JSON:"
    ' {"tool_calls": [{"name": <the tool\'s name>, "arguments": <an object of its parameters>}]}.'
    ' To answer the user, reply with only: {"response": <your answer>}.'
    ' Tool results come back as {"tool_results": [...]}.'
    "\nThe tools:"
)
MAX_TOOLS = 128
MAX_REF_DEPTH = 16


def tools_prompt(system: str, tools: tuple[Tool, ...]) -> str:
    """The system prompt with the tools described after it: what a session pins."""
    lines = [
        json.dumps(
            {
                "name": t.name,
                "description": t.description,
                "parameters": json.loads(t.parameters_json),
            },
            ensure_ascii=False,
        )  # fmt: skip
        for t in tools
    ]
    block = "\n".join([INSTRUCTIONS, *lines])
    return f"{system}\n\n{block}" if system else block


def reply_schema(use: ToolUse, output: OutputFormat | None) -> dict[str, Any]:
    """The JSON schema every reply is decoded under, as `choice` allows: calls, an answer, or
    either. With a response format too, the answer is that JSON (llama.cpp's choice as well)."""
    answer: dict[str, Any] = {"type": "string"}
    if output is not None:
        answer = (
            {"type": "object"} if output.schema_json is None else json.loads(output.schema_json)
        )
    response = _object({"response": answer})
    if use.choice == "none":
        return response
    offered = [t for t in use.tools if use.choice in ("auto", "required", t.name)]
    schemas = [
        _object({"name": {"const": t.name}, "arguments": _inline(json.loads(t.parameters_json))})
        for t in offered
    ]
    items: dict[str, Any] = {"type": "array", "minItems": 1}
    items["items"] = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if not use.parallel:
        items["maxItems"] = 1
    calls = _object({"tool_calls": items})
    return calls if use.choice != "auto" else {"anyOf": [calls, response]}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _inline(schema: Any, root: Any = None, depth: int = 0) -> Any:
    """A tool's schema with its own `#/$defs/...` references written out in place (in the reply's
    schema they would point at the wrong root); a recursive one is refused."""
    root = schema if root is None else root
    if depth > MAX_REF_DEPTH:
        raise InvalidInput("a tool's schema refers to itself too deeply (recursive $ref)")
    if isinstance(schema, list):
        return [_inline(s, root, depth) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        target: Any = root
        path = str(schema["$ref"]).removeprefix("#").strip("/")
        for part in path.split("/") if path else []:
            target = target.get(part) if isinstance(target, dict) else None
        if target is None:
            raise InvalidInput(f"a tool's schema: $ref {schema['$ref']!r} points at nothing")
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return _inline({**copy.deepcopy(target), **rest}, root, depth + 1)
    return {
        k: _inline(v, root, depth) for k, v in schema.items() if k not in ("$defs", "definitions")
    }


def check_use(use: ToolUse) -> None:
    """What a tool list can be: named functions, at most MAX_TOOLS, names unique, a named choice
    one of them."""
    if not use.tools:
        raise InvalidInput("tools: at least one tool, or none sent")
    if len(use.tools) > MAX_TOOLS:
        raise InvalidInput(f"tools: {len(use.tools)} tools; at most {MAX_TOOLS}")
    names = [t.name for t in use.tools]
    if len(set(names)) != len(names):
        raise InvalidInput("tools: two tools have the same name")
    if use.choice not in ("auto", "none", "required") and use.choice not in names:
        raise InvalidInput(f"tool_choice: no tool named {use.choice!r} among tools")


# --- turns, as the session holds them -------------------------------------------------------


def render(turns: tuple[Turn, ...], active: bool) -> tuple[Turn, ...]:
    """A history with tool calls and results as the text turns the session holds: an assistant's
    calls as the JSON it wrote them in, results (and a user message after them) as one user turn,
    and, while the tools are in use, a plain answer as `{"response": ...}`."""
    out: list[Turn] = []
    results: list[dict[str, str]] = []
    for t in turns:
        if t.role == "tool":
            results.append({"name": t.name, "content": t.content})
            continue
        if results:
            text = json.dumps({"tool_results": results}, ensure_ascii=False)
            if t.role == "user":
                out.append(Turn("user", f"{text}\n\n{t.content}"))
                results = []
                continue
            out.append(Turn("user", text))
            results = []
        if t.role == "assistant" and t.calls:
            out.append(Turn("assistant", _calls_text(t.calls)))
        elif t.role == "assistant" and active:
            out.append(Turn("assistant", json.dumps({"response": t.content}, ensure_ascii=False)))
        else:
            out.append(Turn(t.role, t.content))
    if results:
        out.append(Turn("user", json.dumps({"tool_results": results}, ensure_ascii=False)))
    return tuple(out)


def _calls_text(calls: tuple[ToolCall, ...]) -> str:
    listed = [{"name": c.name, "arguments": _arguments(c)} for c in calls]
    return json.dumps({"tool_calls": listed}, ensure_ascii=False)


def _arguments(call: ToolCall) -> Any:
    try:
        return json.loads(call.arguments or "{}")
    except json.JSONDecodeError:
        raise InvalidInput(f"tool call {call.id!r}: its arguments are not JSON") from None


def canonical(reply: str) -> str:
    """A reply as `render` writes the same turn when the client sends it back (a tool call's id
    is not part of it), so the conversation's hash chain continues."""
    try:
        data = json.loads(reply)
    except json.JSONDecodeError:  # cut short: as the client got it, the answer so far or the
        answer, calls = _scan(reply, True)  # calls made whole
        whole = [{"name": n, "arguments": json.loads(a)} for n, a, done in calls if done and n]
        data = {"tool_calls": whole} if whole else {"response": answer}
    return json.dumps(data, ensure_ascii=False)


# --- the reply, as it streams ---------------------------------------------------------------


@dataclass
class _Call:
    id: str
    name: str | None = None
    arguments: str = ""
    whole: bool = False


class ReplyReader:
    """Reads a reply in the generic format as its text grows: `feed` gives the new answer text
    (the `response` string, decoded) and the new pieces of calls; `calls` the calls made whole."""

    def __init__(self, answer_is_text: bool = True) -> None:
        self.answer_is_text = answer_is_text
        self.text = ""
        self._said = ""
        self._calls: list[_Call] = []
        self._sent: list[tuple[bool, int]] = []  # per call: header sent, argument chars sent

    def feed(self, piece: str) -> tuple[str, list[ToolCallDelta]]:
        self.text += piece
        answer, calls = _scan(self.text, self.answer_is_text)
        new_answer = ""
        if answer.startswith(self._said):  # always, under the grammar
            new_answer, self._said = answer[len(self._said) :], answer
        deltas: list[ToolCallDelta] = []
        for i, (name, arguments, whole) in enumerate(calls):
            if i == len(self._calls):
                self._calls.append(_Call(f"call_{uuid.uuid4().hex[:24]}"))
                self._sent.append((False, 0))
            call, (headed, sent) = self._calls[i], self._sent[i]
            call.name, call.arguments, call.whole = name, arguments, whole
            if name is None:
                continue
            if not headed or len(arguments) > sent:
                deltas.append(ToolCallDelta(i, call.id, name, arguments[sent:]))
                self._sent[i] = (True, len(arguments))
        return new_answer, deltas

    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(ToolCall(c.id, c.name, c.arguments) for c in self._calls if c.whole and c.name)


def _scan(text: str, answer_is_text: bool) -> tuple[str, list[tuple[str | None, str, bool]]]:
    """(the answer so far, [(name or None while unread, argument text so far, whole)]) of a
    reply's prefix: the grammar keeps it to the format, so reading stops where the text does."""
    r = _Reader(text)
    if not (r.take("{") and r.take('"')):
        return "", []
    key = r.string()
    if key is None or not r.take(":"):
        return "", []
    if key == "response":
        if not answer_is_text:
            r.space()
            return r.value()[0], []
        if not r.take('"'):
            return "", []
        return r.partial_string(), []
    calls: list[tuple[str | None, str, bool]] = []
    if key != "tool_calls" or not r.take("["):
        return "", calls
    while True:
        if not (r.take("{") and r.take('"') and r.string() == "name" and r.take(":")):
            return "", calls
        if not r.take('"'):
            return "", calls
        name = r.string()
        if name is None:
            calls.append((None, "", False))
            return "", calls
        if not (r.take(",") and r.take('"') and r.string() == "arguments" and r.take(":")):
            calls.append((name, "", False))
            return "", calls
        r.space()
        arguments, whole = r.value()
        calls.append((name, arguments, whole and r.take("}")))
        if not calls[-1][2] or not r.take(","):
            return "", calls


class _Reader:
    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def space(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in " \t\n\r":
            self.at += 1

    def take(self, char: str) -> bool:
        self.space()
        if self.text.startswith(char, self.at):
            self.at += len(char)
            return True
        return False

    def string(self) -> str | None:
        """A whole JSON string's value after its opening quote, or None if it is not whole yet."""
        i = self.at
        while i < len(self.text):
            if self.text[i] == "\\":
                i += 2
                continue
            if self.text[i] == '"':
                value = json.loads(self.text[self.at - 1 : i + 1])
                self.at = i + 1
                return str(value)
            i += 1
        return None

    def partial_string(self) -> str:
        """As much of a JSON string's value as is whole (an escape read only once complete)."""
        i, safe = self.at, self.at
        while i < len(self.text):
            c = self.text[i]
            if c == '"':
                safe = i
                break
            if c == "\\":
                width = 6 if self.text.startswith("u", i + 1) else 2
                if width == 6 and self.text[i + 2 : i + 4].lower() in ("d8", "d9", "da", "db"):
                    width = 12  # a surrogate pair is read whole
                if i + width > len(self.text):
                    break
                i += width
            else:
                i += 1
            safe = i
        return str(json.loads('"' + self.text[self.at : safe] + '"'))

    def value(self) -> tuple[str, bool]:
        """A JSON value's text from here, and whether it is whole (brackets closed)."""
        start, depth, in_string, i = self.at, 0, False, self.at
        while i < len(self.text):
            c = self.text[i]
            if in_string:
                if c == "\\":
                    i += 1
                elif c == '"':
                    in_string = False
            elif c == '"':
                in_string = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    self.at = i + 1
                    return self.text[start : i + 1], True
            i += 1
        self.at = len(self.text)
        return self.text[start:], False
