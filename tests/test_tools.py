"""Tools over the HTTP front on the real model, with the real clients (the openai SDK, LangChain,
the ollama client): a call is valid JSON for its tool's schema (a grammar decodes it), streamed as
OpenAI's deltas; a round trip (call, `tool` message, answer) continues one session reading only
the new messages, across a kill -9 between the call and the answer too; tools that do not fit what
a session pins are said (auto) or refused naming `tools` (required). The small model chooses tools
poorly: these assert the protocol, never the model's judgement."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
from pydantic import BaseModel, Field

from sinkd.daemon.node import Daemon
from tests.support.daemons import (
    http_daemon,
    http_serve_env,
    openai_client,
    serve_subprocess,
    stop_without_snapshots,
)
from tests.support.tools import WEATHER

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = http_daemon(tmp_path_factory.mktemp("tools"), n_ctx_seq=1024)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> openai.OpenAI:
    return openai_client(daemon)  # type: ignore[no-any-return]


def _called(client: openai.OpenAI, messages: list[Any], **kw: Any) -> tuple[Any, dict[str, Any]]:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=[WEATHER], max_tokens=60, **kw
    )
    reply = raw.parse()
    return reply, {**raw.headers, "sinkd": reply.model_extra["sinkd"]}


def test_a_tool_round_trip_continues_one_session_reading_only_the_new_messages(
    client: openai.OpenAI,
) -> None:
    reply, first = _called(client, ASK, tool_choice="required", parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    assert first["sinkd"]["tools"]["pinned"] is True
    history = [*ASK, choice.message.model_dump(exclude_none=True)]
    history.append({"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C."})
    stream = client.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER], max_tokens=40, stream=True
    )
    chunks = list(stream)
    sinkd = chunks[-1].model_extra["sinkd"]
    assert sinkd["session_id"] == first["x-sinkd-session"]
    assert sinkd["continuation"] == "continued", sinkd["why"]
    # the tool's result and the turn's framing only: the definitions and the call are not read
    assert 0 < sinkd["read_tokens"] < 40, sinkd
    answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    assert finish in ("stop", "tool_calls", "length")
    if finish == "stop":  # an answer: sent back as plain content, the session still continues
        history += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Thanks!"},
        ]
        _, third = _called(client, history, tool_choice="none")
        assert third["x-sinkd-continuation"] == "continued", third["x-sinkd-why"]
        assert third["x-sinkd-session"] == first["x-sinkd-session"]
    other = json.loads(json.dumps(WEATHER))
    other["function"]["description"] = "The weather tomorrow."
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=history, tools=[other], max_tokens=4
    )  # another tool list is another system prompt: another conversation
    assert raw.headers["x-sinkd-continuation"] == "new"


def test_a_named_tool_streams_as_openai_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Oslo and Rome?"}],
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=240, stream=True, temperature=0,  # room for several calls, each ~20 tokens
    )  # fmt: skip
    calls: dict[int, dict[str, str]] = {}
    finishes = []
    for chunk in stream:
        if not chunk.choices:
            continue
        finishes.append(chunk.choices[0].finish_reason)
        for d in chunk.choices[0].delta.tool_calls or []:
            if d.index not in calls:  # a call's first piece names it
                assert d.id and d.type == "function" and d.function and d.function.name
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            else:
                assert d.id is None
            assert d.function is not None
            calls[d.index]["arguments"] += d.function.arguments or ""
    assert finishes[-1] in ("tool_calls", "length") and calls  # the model may go on calling
    whole = list(calls.values())
    if finishes[-1] == "length":  # cut short: the last call's arguments may be cut too
        whole = whole[:-1]
    assert whole, calls
    for call in calls.values():
        assert call["name"] == "get_weather"
    for call in whole:
        assert isinstance(json.loads(call["arguments"])["city"], str)


def test_tools_that_do_not_fit_are_said_and_refused_when_required(
    daemon: Daemon, client: openai.OpenAI
) -> None:
    many = [
        {"type": "function", "function": {
            "name": f"tool_{i}", "description": f"Does thing number {i} for the user, carefully.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        }}
        for i in range(36)
    ]  # fmt: skip
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi!"}], tools=many, max_tokens=8
    )
    reply = raw.parse()
    assert "36 tools not offered" in raw.headers["x-sinkd-tools"]
    report = reply.model_extra["sinkd"]["tools"]
    assert report["pinned"] is False and report["tokens"] > report["pin_bound"] == 512
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].message.content
    sessions = len(daemon.service.registry.of_tenant("alice"))
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi!"}], tools=many,
            tool_choice="required",
        )  # fmt: skip
    assert "tools: the 36 tools' descriptions" in str(err.value) and "512" in str(err.value)
    bad = json.loads(json.dumps(WEATHER))
    bad["function"]["parameters"]["properties"]["days"] = {
        "type": "array",
        "items": {"type": "integer"},
        "uniqueItems": True,
    }  # outside OpenAI's structured-outputs subset
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[bad])
    assert "tools[0] (get_weather)" in str(err.value) and "'uniqueItems'" in str(err.value)
    assert len(daemon.service.registry.of_tenant("alice")) == sessions  # nothing was made


def test_round_trips_resume_after_kill_9_between_the_call_and_the_answer(
    tmp_path: Path,
) -> None:
    env, port = http_serve_env(tmp_path, n_ctx_seq="1024", max_sessions="2")
    sock = tmp_path / "sinkd.sock"
    proc = serve_subprocess(sock, env)
    try:
        key = (tmp_path / "http-token").read_text().strip()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
        reply, first = _called(client, ASK, tool_choice="required", parallel_tool_calls=False)
        (call,) = reply.choices[0].message.tool_calls
        tools: Any = [{"type": "function", **WEATHER["function"]}]
        made = client.responses.create(
            model=MODEL, input="Weather in Oslo?", tools=tools, tool_choice="required",
            parallel_tool_calls=False, max_output_tokens=60,
        )  # fmt: skip
        (asked,) = [o for o in made.output if o.type == "function_call"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proc = serve_subprocess(sock, env)
        history = [*ASK, reply.choices[0].message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "Rain."}]  # fmt: skip
        _, after = _called(client, history)
        assert after["x-sinkd-continuation"] == "continued", after["x-sinkd-why"]
        assert after["x-sinkd-session"] == first["x-sinkd-session"]
        answered = client.responses.with_raw_response.create(
            model=MODEL, previous_response_id=made.id, tools=tools, max_output_tokens=20,
            input=[{"type": "function_call_output", "call_id": asked.call_id, "output": "Snow."}],
        )  # fmt: skip
        assert answered.headers["x-sinkd-continuation"] == "continued"
    finally:
        proc.kill()
        proc.wait(30)


class City(BaseModel):
    name: str = Field(max_length=16)
    coastal: bool


def test_langchain_binds_tools_in_an_agent_loop_and_structures_output(daemon: Daemon) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return f"Sunny in {city}."

    assert daemon.http is not None
    llm = ChatOpenAI(
        model=MODEL, base_url=f"{daemon.http.address}/v1", api_key="alice-token",  # type: ignore[arg-type]
        max_tokens=60, temperature=0, max_retries=0,
    )  # fmt: skip
    agent = llm.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False)
    messages: list[Any] = [HumanMessage("What is the weather in Lima?")]
    step = agent.invoke(messages)
    (call,) = step.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    messages += [step, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    answer = llm.bind_tools([get_weather], tool_choice="none").invoke(messages)
    assert isinstance(answer.content, str) and answer.content and not answer.tool_calls
    city = llm.with_structured_output(City).invoke("Describe a city by the sea.")
    assert isinstance(city, City)


def test_the_ollama_client_calls_tools_and_answers_their_results(daemon: Daemon) -> None:
    assert daemon.http is not None
    client = ollama.Client(
        host=daemon.http.address, headers={"authorization": "Bearer alice-token"}
    )
    sessions = len(daemon.service.registry.of_tenant("alice"))
    messages: list[Any] = [{"role": "user", "content": "Call get_weather for Paris."}]
    reply = client.chat(model=MODEL, messages=messages, tools=[WEATHER],
                        options={"temperature": 0, "num_predict": 60})  # fmt: skip
    calls = reply.message.tool_calls or []
    # no tool_choice in Ollama's API: the model may answer instead; either is a valid reply
    assert calls or reply.message.content
    for call in calls:
        assert call.function.name == "get_weather" and isinstance(
            call.function.arguments["city"], str
        )
    messages.append(reply.message)
    if calls:
        messages.append({"role": "tool", "content": "Sunny.", "tool_name": "get_weather"})
    else:
        messages.append({"role": "user", "content": "And in Rome?"})
    streamed = list(client.chat(model=MODEL, messages=messages, tools=[WEATHER], stream=True,
                                options={"temperature": 0, "num_predict": 40}))  # fmt: skip
    assert streamed[-1].done
    # the round trip continued the first turn's session: no other was made for it
    assert len(daemon.service.registry.of_tenant("alice")) == sessions + 1
    shown = httpx.post(f"{daemon.http.address}/api/show", json={"model": MODEL},
                       headers={"authorization": "Bearer alice-token"}).json()  # fmt: skip
    assert "tools" in shown["capabilities"]


def test_on_gemma_3_parse_and_a_tool_round_trip_hold_too(tmp_path: Path) -> None:
    """The other pinned model (its template knows no tools either: the generic format)."""
    runs = int(os.environ.get("SINKD_STRUCTURED_RUNS", "4"))
    d = http_daemon(tmp_path, model="gemma3-270m", n_ctx_seq=1024)
    try:
        client = openai_client(d)
        for i in range(runs):
            parsed = client.beta.chat.completions.parse(
                model="gemma3-270m", response_format=City, max_tokens=80,
                messages=[{"role": "user", "content": f"Describe city number {i} you know."}],
            )  # fmt: skip
            assert isinstance(parsed.choices[0].message.parsed, City)
        raw = client.chat.completions.with_raw_response.create(
            model="gemma3-270m", messages=ASK, tools=[WEATHER], tool_choice="required",
            parallel_tool_calls=False, max_tokens=60,
        )  # fmt: skip
        (call,) = raw.parse().choices[0].message.tool_calls or []
        assert isinstance(json.loads(call.function.arguments)["city"], str)
        history = [*ASK, raw.parse().choices[0].message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "Rain."}]  # fmt: skip
        after = client.chat.completions.with_raw_response.create(
            model="gemma3-270m", messages=history, tools=[WEATHER], max_tokens=40
        )
        assert after.headers["x-sinkd-continuation"] == "continued", after.headers["x-sinkd-why"]
        assert after.headers["x-sinkd-session"] == raw.headers["x-sinkd-session"]
    finally:
        d.stop()


def test_a_responses_round_trip_continues_from_the_call(client: openai.OpenAI) -> None:
    """The Responses API's function tools: a call item, its `function_call_output` continuing
    from the response that made it (only the output read), streamed as typed events too."""
    tools: Any = [{"type": "function", **WEATHER["function"]}]
    first = client.responses.with_raw_response.create(
        model=MODEL, input="What is the weather in Paris?", tools=tools, tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=60,
    )  # fmt: skip
    made = first.parse()
    (call,) = [o for o in made.output if o.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    answered = client.responses.with_raw_response.create(
        model=MODEL, previous_response_id=made.id, tools=tools, max_output_tokens=30,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny."}],
    )  # fmt: skip
    assert answered.headers["x-sinkd-continuation"] == "continued"
    assert answered.headers["x-sinkd-session"] == first.headers["x-sinkd-session"]
    assert 0 < answered.parse().model_extra["sinkd"]["read_tokens"] < 40
    events = list(client.responses.create(
        model=MODEL, input="Weather in Oslo?", tools=tools, tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=60, stream=True,
    ))  # fmt: skip
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (streamed,) = [o for o in events[-1].response.output if o.type == "function_call"]
    assert streamed.arguments == pieces and json.loads(pieces)["city"]
    with pytest.raises(openai.BadRequestError) as err:  # another tool list: another conversation
        client.responses.create(
            model=MODEL, previous_response_id=made.id, input="And Rome?", max_output_tokens=8,
            tools=[{"type": "function", "name": "get_time", "parameters": {"type": "object"}}],
        )  # fmt: skip
    assert "tools" in str(err.value)


def test_a_constrained_turn_regenerates_and_resumes_to_the_same_bits(tmp_path: Path) -> None:
    """The grammar's state is the turn's: a regenerate takes the turn back and decodes it again
    from the grammar's start, to the same call with the same seed; after what a kill -9 leaves,
    the resumed session does too."""

    def started() -> tuple[Daemon, openai.OpenAI]:
        d = http_daemon(tmp_path, n_ctx_seq=1024)
        return d, openai_client(d)

    history: list[Any] = [{"role": "user", "content": "Hello!"}]

    def call(client: openai.OpenAI) -> tuple[tuple[str, str], Any]:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[*history, *ASK], tools=[WEATHER], tool_choice="required",
            parallel_tool_calls=False, max_tokens=60, temperature=1.0, seed=7,
        )  # fmt: skip
        (made,) = raw.parse().choices[0].message.tool_calls or []
        return (made.function.name, made.function.arguments), raw.headers

    d, client = started()
    try:  # a conversation's second turn (a first resent is a conversation of its own)
        hello = client.chat.completions.create(
            model=MODEL, messages=history, tools=[WEATHER], tool_choice="none", max_tokens=20
        )
        history.append({"role": "assistant", "content": hello.choices[0].message.content})
        first, headers = call(
            client
        )  # the answer, cut at 20 tokens, continues as the client got it
        assert headers["x-sinkd-continuation"] == "continued", headers["x-sinkd-why"]
        again, regenerated = call(client)
        assert regenerated["x-sinkd-continuation"] == "regenerated", regenerated["x-sinkd-why"]
        assert regenerated["x-sinkd-session"] == headers["x-sinkd-session"]
        assert again == first
        stop_without_snapshots(d)
        d, client = started()
        resumed, after = call(client)
        assert after["x-sinkd-continuation"] == "regenerated", after["x-sinkd-why"]
        assert after["x-sinkd-session"] == headers["x-sinkd-session"] and resumed == first
    finally:
        d.stop()


def test_a_responses_conversation_with_instructions_and_tools_continues_without_resending_them(
    client: openai.OpenAI,
) -> None:
    """Instructions are not resent with `previous_response_id`: each response keeps its
    conversation's, so the third turn's tools go after the same instructions as the first's."""
    tools: Any = [{"type": "function", **WEATHER["function"]}]
    first = client.responses.create(
        model=MODEL, instructions="Be brief.", input="What is the weather in Paris?", tools=tools,
        tool_choice="required", parallel_tool_calls=False, max_output_tokens=60,
    )  # fmt: skip
    (call,) = [o for o in first.output if o.type == "function_call"]
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=tools, max_output_tokens=20,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny."}],
    )  # fmt: skip
    third = client.responses.with_raw_response.create(
        model=MODEL, previous_response_id=second.id, tools=tools, max_output_tokens=8,
        input="And tomorrow?",
    )  # fmt: skip
    assert third.headers["x-sinkd-continuation"] == "continued", third.headers["x-sinkd-why"]
    assert client.responses.retrieve(second.id).instructions == "Be brief."
