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
        reader = ReplyReader()  # calls made whole
        answer, _ = reader.feed(reply)
        whole = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in reader.calls()]
        data = {"tool_calls": whole} if whole else {"response": answer}
    return json.dumps(data, ensure_ascii=False)


# --- the reply, as it streams ---------------------------------------------------------------


@dataclass
class _Call:
    id: str
    name: str
    arguments: str = ""
    whole: bool = False
    sent: int = -1  # argument characters streamed (-1: not even its name yet)


@dataclass
class _Value:
    """A JSON value's text read as it comes, each character once: where it starts, how far it is
    read, and whether it is whole."""

    start: int
    at: int
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    whole: bool = False

    def read(self, text: str) -> None:
        i = self.at
        while i < len(text) and not self.whole:
            c = text[i]
            i += 1
            if self.escaped:
                self.escaped = False
            elif self.in_string:
                if c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
                    self.whole = self.depth == 0  # a string alone
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]" and self.depth > 0:
                self.depth -= 1
                self.whole = self.depth == 0
            elif self.depth == 0 and c in ",}]":  # a number or literal alone ends before this
                i -= 1
                self.whole = True
        self.at = i


class ReplyReader:
    """Reads a reply in the generic format as its text grows, each character once: `feed` gives
    the new answer text (the `response` string, decoded) and the new pieces of calls; `calls` the
    calls made whole. The grammar keeps the reply to the format, so reading waits where the text
    stops."""

    def __init__(self, answer_is_text: bool = True) -> None:
        self.answer_is_text = answer_is_text
        self.text = ""
        # "" until the reply's key is read, then "response" or "tool_calls"; "done" once whole
        self._kind = ""
        self._stage = "name"  # of the call being read: "name", "arguments", "value", "next"
        self._at = 0  # where reading resumes
        self._value: _Value | None = None  # a JSON answer's, or the current call's arguments
        self._calls: list[_Call] = []

    def feed(self, piece: str) -> tuple[str, list[ToolCallDelta]]:
        self.text += piece
        if not self._kind:
            self._open()
        if self._kind == "response":
            return self._answer(), []
        if self._kind == "tool_calls":
            self._read_calls()
            return "", self._deltas()
        return "", []

    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(ToolCall(c.id, c.name, c.arguments) for c in self._calls if c.whole)

    def _open(self) -> None:
        """`{"response": ` (and the string's quote) or `{"tool_calls": [`, once all here."""
        r = _Reader(self.text)
        if not (r.take("{") and r.take('"')):
            return
        key = r.string()
        if key is None or not r.take(":"):
            return
        if key == "response" and self.answer_is_text and r.take('"'):
            self._kind, self._at = key, r.at
        elif key == "response" and not self.answer_is_text and r.started():
            self._kind, self._at, self._value = key, r.at, _Value(r.at, r.at)
        elif key == "tool_calls" and r.take("["):
            self._kind, self._at = key, r.at

    def _answer(self) -> str:
        """The answer's new text: a string's characters decoded as each escape is whole, or a
        JSON answer's text as it comes."""
        text, start = self.text, self._at
        if self._value is not None:
            self._value.read(text)
            self._at = self._value.at
            if self._value.whole:
                self._kind = "done"
            return text[start : self._at]
        i, safe = start, start
        while i < len(text):
            c = text[i]
            if c == '"':
                self._kind = "done"
                break
            width = 1
            if c == "\\":
                width = 6 if text.startswith("u", i + 1) else 2
                if width == 6 and text[i + 2 : i + 4].lower() in ("d8", "d9", "da", "db"):
                    width = 12  # a surrogate pair is read whole
                if i + width > len(text):
                    break
            i += width
            safe = i
        self._at = safe
        return str(json.loads('"' + text[start:safe] + '"'))

    def _read_calls(self) -> None:
        while self._kind == "tool_calls":
            r = _Reader(self.text)
            r.at = self._at
            if self._stage == "name":  # `{"name": "..."`
                if not (r.take("{") and r.take('"') and r.string() == "name" and r.take(":")):
                    return
                name = r.string() if r.take('"') else None
                if name is None:
                    return
                self._calls.append(_Call(f"call_{uuid.uuid4().hex[:24]}", name))
                self._stage, self._at = "arguments", r.at
            elif self._stage == "arguments":  # `, "arguments": `
                if not (r.take(",") and r.take('"') and r.string() == "arguments"):
                    return
                if not (r.take(":") and r.started()):
                    return
                self._value = _Value(r.at, r.at)
                self._stage, self._at = "value", r.at
            elif self._stage == "value":  # the arguments, then the call's `}`
                value = self._value
                assert value is not None
                value.read(self.text)
                self._calls[-1].arguments = self.text[value.start : value.at]
                r.at = value.at
                if not (value.whole and r.take("}")):
                    return
                self._calls[-1].whole = True
                self._value = None
                self._stage, self._at = "next", r.at
            elif r.take(","):  # another call
                self._stage, self._at = "name", r.at
            elif r.take("]"):
                self._kind = "done"
            else:
                return

    def _deltas(self) -> list[ToolCallDelta]:
        """Each named call's new argument text (its first piece: "" when none came yet)."""
        deltas = []
        for i, call in enumerate(self._calls):
            if call.sent < 0 or len(call.arguments) > call.sent:
                piece = call.arguments[max(call.sent, 0) :]
                deltas.append(ToolCallDelta(i, call.id, call.name, piece))
                call.sent = len(call.arguments)
        return deltas


class _Reader:
    """The format's fixed parts (braces, keys, names), read from `at`."""

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

    def started(self) -> bool:
        """Whether a value begins here (past any space)."""
        self.space()
        return self.at < len(self.text)

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
