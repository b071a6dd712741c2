"""sinkd's generic tool format without a model: the reply schema each tool_choice allows (and its
grammar), the turns a tool round trip becomes, and the streamed reader giving the same calls and
text however the reply's text is cut into pieces."""

from __future__ import annotations

import json

import pytest

from sinkd.daemon.runtime import requests
from sinkd.daemon.runtime.api import OutputFormat, Tool, ToolCall, ToolUse, Turn
from sinkd.daemon.runtime.conversations import tool_format
from sinkd.daemon.runtime.conversations.tool_format import ReplyReader
from sinkd.errors import InvalidInput

WEATHER = Tool(
    "get_weather",
    "The weather in a city.",
    json.dumps(
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ),
)
CLOCK = Tool("get_time", "", json.dumps({"type": "object", "properties": {}}))


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_the_reader_gives_the_same_calls_however_the_text_is_cut(size: int) -> None:
    reply = (
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Par\\"is {x}"}},'
        ' {"name": "get_time", "arguments": {}}]}'
    )
    reader = ReplyReader()
    answer, arguments, names = "", {0: "", 1: ""}, {}
    for piece in _pieces(reply, size):
        text, deltas = reader.feed(piece)
        answer += text
        for d in deltas:
            names[d.index] = d.name
            arguments[d.index] += d.arguments
    assert answer == ""
    assert names == {0: "get_weather", 1: "get_time"}
    assert json.loads(arguments[0]) == {"city": 'Par"is {x}'} and arguments[1] == "{}"
    calls = reader.calls()
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert [c.arguments for c in calls] == [arguments[0], arguments[1]]
    assert calls[0].id != calls[1].id and calls[0].id.startswith("call_")


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_the_reader_decodes_the_answer_escapes_whole(size: int) -> None:
    said = 'Hi "you"\n\u00e9 \U0001f600 \\ done'
    reply = json.dumps({"response": said})  # ascii escapes, a surrogate pair among them
    reader = ReplyReader()
    answer = ""
    for piece in _pieces(reply, size):
        text, deltas = reader.feed(piece)
        assert not deltas
        answer += text
    assert answer == said and reader.calls() == ()


def test_a_call_cut_short_is_not_a_call() -> None:
    reader = ReplyReader()
    _, deltas = reader.feed('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa')
    assert deltas and deltas[0].name == "get_weather"
    assert reader.calls() == ()


def test_the_reply_schema_follows_tool_choice_and_becomes_a_grammar() -> None:
    both = ToolUse((WEATHER, CLOCK))
    auto = tool_format.reply_schema(both, None)
    assert [list(s["properties"]) for s in auto["anyOf"]] == [["tool_calls"], ["response"]]
    required = tool_format.reply_schema(ToolUse((WEATHER, CLOCK), "required", parallel=False), None)
    assert required["properties"]["tool_calls"]["maxItems"] == 1
    named = tool_format.reply_schema(ToolUse((WEATHER, CLOCK), "get_time"), None)
    assert named["properties"]["tool_calls"]["items"]["properties"]["name"] == {"const": "get_time"}
    none = tool_format.reply_schema(ToolUse((WEATHER,), "none"), None)
    assert list(none["properties"]) == ["response"]
    shaped = tool_format.reply_schema(ToolUse((WEATHER,)), OutputFormat('{"type": "object"}'))
    assert shaped["anyOf"][1]["properties"]["response"] == {"type": "object"}
    for schema in (auto, required, named, none):
        assert requests.output_grammar(OutputFormat(json.dumps(schema)))


def test_a_tools_references_are_written_out_and_a_recursive_one_refused() -> None:
    nested = {
        "type": "object",
        "properties": {"place": {"$ref": "#/$defs/Place"}},
        "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}}},
    }
    schema = tool_format.reply_schema(ToolUse((Tool("f", "", json.dumps(nested)),), "f"), None)
    arguments = schema["properties"]["tool_calls"]["items"]["properties"]["arguments"]
    assert arguments["properties"]["place"]["properties"] == {"city": {"type": "string"}}
    assert "$defs" not in json.dumps(schema)
    looped = {"type": "object", "properties": {"next": {"$ref": "#"}}}
    with pytest.raises(InvalidInput, match="recursive"):
        tool_format.reply_schema(ToolUse((Tool("f", "", json.dumps(looped)),)), None)


def test_a_round_trip_renders_as_the_session_held_it() -> None:
    call = ToolCall("call_1", "get_weather", '{"city":  "Paris"}')
    turns = (
        Turn("user", "Weather?"),
        Turn("assistant", "", calls=(call,)),
        Turn("tool", "sunny", name="get_weather"),
        Turn("tool", "12:00", name="get_time"),
    )
    rendered = tool_format.render(turns, active=True)
    assert [t.role for t in rendered] == ["user", "assistant", "user"]
    written = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
    assert rendered[1].content == tool_format.canonical(written)
    assert json.loads(rendered[2].content) == {
        "tool_results": [
            {"name": "get_weather", "content": "sunny"},
            {"name": "get_time", "content": "12:00"},
        ]
    }
    answered = tool_format.render((Turn("user", "Hi"), Turn("assistant", "Hello")), active=True)
    assert answered[1].content == tool_format.canonical('{"response":"Hello"}')
    assert tool_format.render(answered[:1], active=False) == answered[:1]
    cut = tool_format.render((Turn("user", "Hi"), Turn("assistant", "Hel")), active=True)
    assert cut[1].content == tool_format.canonical('{"response": "Hel')  # as the client got it


def test_a_tool_list_is_checked() -> None:
    with pytest.raises(InvalidInput, match="same name"):
        tool_format.check_use(ToolUse((WEATHER, WEATHER)))
    with pytest.raises(InvalidInput, match="no tool named 'nope'"):
        tool_format.check_use(ToolUse((WEATHER,), "nope"))


@pytest.mark.parametrize("size", [1, 4, 1000])
def test_a_json_answer_streams_as_its_text(size: int) -> None:
    """With a response_format beside tools the answer is JSON: its text as it comes, to its end."""
    value = '{"a": [1, "x}\\"]"], "b": null}'
    reader = ReplyReader(answer_is_text=False)
    answer = "".join(reader.feed(p)[0] for p in _pieces('{"response": ' + value + "}", size))
    assert answer == value and json.loads(answer) == {"a": [1, 'x}"]'], "b": None}


def test_a_reply_cut_short_finishes_length_even_with_calls() -> None:
    """OpenAI's finish reason: a reply cut short mid-call is "length" (the last call's arguments
    may be cut too), a whole one that called tools "tool_calls"."""
    from sinkd.daemon.http.openai_api import finish
    from sinkd.daemon.runtime.api import ChatDone, Done
    from tests.support.receipts import receipt

    call = ToolCall("call_1", "get_weather", '{"city":')
    assert finish(ChatDone("max_tokens", 40, receipt(), calls=(call,))) == "length"
    assert finish(ChatDone("repetition", 40, receipt(), calls=(call,))) == "length"
    assert finish(ChatDone("eog", 12, receipt(), calls=(call,))) == "tool_calls"
    assert finish(Done("eog", 12, receipt())) == "stop"
    assert finish(Done("max_tokens", 12, receipt())) == "length"
