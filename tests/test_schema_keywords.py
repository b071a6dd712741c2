"""Schemas as pydantic writes them, through the openai SDK's `.parse()` and LangChain's
`with_structured_output`, on both pinned models: every keyword of OpenAI's structured-outputs
subset (integer and float bounds, the formats, item counts, patterns, `multipleOf`) is held by the
grammar, or checked after generation, where a reply that breaks it is answered 422 naming the
keyword; never returned as valid."""

from __future__ import annotations

import datetime
import ipaddress
import json
import uuid
from collections.abc import Iterator
from typing import Annotated, Any

import openai
import pytest
from pydantic import BaseModel, Field

from sinkd.daemon.node import Daemon
from tests.support.daemons import http_daemon, openai_client

pytestmark = pytest.mark.model
MODELS = ["smollm2-135m-instruct", "gemma3-270m"]
Short = Annotated[str, Field(max_length=24)]


class Person(BaseModel):
    age: int = Field(ge=0, le=150)
    height_m: float = Field(gt=0, lt=3)
    id: uuid.UUID
    born: datetime.date


class Visit(BaseModel):
    at: datetime.datetime
    wakes: datetime.time
    stay: datetime.timedelta  # format "duration"
    guests: int = Field(multiple_of=2, ge=0, le=20)
    rating: float = Field(ge=0, le=5, multiple_of=0.5)


class Server(BaseModel):
    host: Short = Field(json_schema_extra={"format": "hostname"})
    admin: Short = Field(json_schema_extra={"format": "email"})
    v4: ipaddress.IPv4Address
    v6: ipaddress.IPv6Address


class Ticket(BaseModel):
    code: str = Field(pattern=r"^[A-Z]{3}-[0-9]{4}$")
    tags: list[Short] = Field(min_length=1, max_length=3)
    score: float = Field(gt=0, lt=1)
    priority: int = Field(gt=0, lt=6)


CASES: list[tuple[type[BaseModel], str]] = [
    (Person, "A person: their age, height in metres, an id and birth date."),
    (Visit, "A hotel visit: when, when the guest wakes, how long, guests, rating."),
    (Server, "A server: its host name, admin email and addresses."),
    (Ticket, "A support ticket with a code, tags, a score and a priority."),
]
KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def test_the_models_ask_every_keyword_of_the_subset() -> None:
    """What this file claims to cover, read off the schemas pydantic writes."""
    seen: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            seen.update(k for k in node if k in (*KEYWORDS, "pattern", "minItems", "maxItems"))
            if "format" in node:
                seen.add(f"format:{node['format']}")
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for model, _ in CASES:
        walk(model.model_json_schema())
    formats = {"date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
    assert seen >= set(KEYWORDS) | {"pattern", "minItems", "maxItems"}
    assert {f"format:{f}" for f in formats} <= seen


@pytest.fixture(scope="module", params=MODELS)
def daemon(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    d = http_daemon(tmp_path_factory.mktemp("keywords"), model=request.param, n_ctx_seq=1024)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> openai.OpenAI:
    sdk: openai.OpenAI = openai_client(daemon)
    return sdk


def parsed_or_named(call: Any, model: type[BaseModel]) -> BaseModel | str:
    """The object, validated by pydantic; or the 422's message, which must name a keyword."""
    try:
        value = call()
    except openai.UnprocessableEntityError as e:
        message = str(e)
        assert "breaks its schema" in message and any(k in message for k in KEYWORDS), message
        return message
    assert isinstance(value, model), value
    return value


@pytest.mark.parametrize(("model", "prompt"), CASES, ids=[m.__name__ for m, _ in CASES])
def test_parse_returns_a_valid_object_or_names_the_keyword(
    client: openai.OpenAI, daemon: Daemon, model: type[BaseModel], prompt: str
) -> None:
    name = daemon.service.settings.model

    def parse() -> Any:
        completion = client.beta.chat.completions.parse(
            model=name, messages=[{"role": "user", "content": prompt}],
            response_format=model, max_tokens=160, temperature=0,
        )  # fmt: skip
        assert completion.choices[0].finish_reason == "stop"
        return completion.choices[0].message.parsed

    outcome = parsed_or_named(parse, model)
    print(model.__name__, name, outcome)


def test_langchain_with_structured_output(daemon: Daemon) -> None:
    from langchain_openai import ChatOpenAI

    assert daemon.http is not None
    chat = ChatOpenAI(
        model=daemon.service.settings.model, base_url=f"{daemon.http.address}/v1",
        api_key="alice-token", max_retries=0, temperature=0, max_tokens=160,  # type: ignore[arg-type]
    )  # fmt: skip
    for model, prompt in CASES[:2]:
        structured = chat.with_structured_output(model, method="json_schema")
        outcome = parsed_or_named(lambda: structured.invoke(prompt), model)  # noqa: B023
        print(model.__name__, outcome)


def test_a_broken_bound_is_answered_422_naming_it(client: openai.OpenAI, daemon: Daemon) -> None:
    """A bound that is not a whole number: the grammar keeps the whole part (0.xxx), the check
    after generation the rest; the model, told x is 0.1, writes it, and is answered 422."""

    class Narrow(BaseModel):
        x: float = Field(gt=0.5, lt=0.7)

    with pytest.raises(openai.UnprocessableEntityError) as err:
        client.beta.chat.completions.parse(
            model=daemon.service.settings.model,
            messages=[{"role": "user", "content": "x is 0.1. Give x."}],
            response_format=Narrow, max_tokens=40, temperature=0,
        )  # fmt: skip
    assert err.value.status_code == 422
    assert "breaks its schema: $.x: " in str(err.value)
    assert "breaks exclusiveMinimum 0.5" in str(err.value)
    stream = client.chat.completions.create(
        model=daemon.service.settings.model,
        messages=[{"role": "user", "content": "x is 0.1. Give x."}],
        response_format={
            "type": "json_schema", "json_schema": {"name": "n", "schema": Narrow.model_json_schema()}
        },
        max_tokens=40, temperature=0, stream=True,
    )  # fmt: skip
    with pytest.raises(openai.APIError, match="breaks exclusiveMinimum 0.5"):  # after the text
        for chunk in stream:
            assert not chunk.choices or chunk.choices[0].finish_reason is None  # never "stop"


class Volume(BaseModel):
    level: int = Field(ge=0, le=10)
    fade_s: float = Field(gt=0, lt=5)


VOLUME = {  # as a client writes a tool's parameters: what pydantic writes, less its titles
    "type": "object",
    "properties": {
        "level": {"type": "integer", "minimum": 0, "maximum": 10},
        "fade_s": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 5},
    },
    "required": ["level", "fade_s"],
}


def test_a_tools_parameters_and_ollamas_format_hold_the_same_keywords(
    client: openai.OpenAI, daemon: Daemon
) -> None:
    import ollama

    name = daemon.service.settings.model
    reply = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Set the volume in the kitchen to 7."}],
        tools=[{"type": "function", "function": {
            "name": "set_volume", "parameters": {  # short: a session here pins 128 tokens
                "type": "object", "properties": {"level": VOLUME["properties"]["level"]},
                "required": ["level"]}}}],
        tool_choice="required", parallel_tool_calls=False, max_tokens=120, temperature=0,
    )  # fmt: skip
    calls = reply.choices[0].message.tool_calls or []
    assert calls and reply.choices[0].finish_reason == "tool_calls"
    for call in calls:
        level = json.loads(call.function.arguments)["level"]  # type: ignore[union-attr]
        assert isinstance(level, int) and 0 <= level <= 10, level
    assert daemon.http is not None
    answer = ollama.Client(
        host=daemon.http.address, headers={"authorization": "Bearer alice-token"}
    ).chat(
        model=name, messages=[{"role": "user", "content": "The kitchen, level 7, a slow fade."}],
        format=VOLUME, options={"num_predict": 120, "temperature": 0},
    )  # fmt: skip
    Volume.model_validate_json(answer.message.content or "")
