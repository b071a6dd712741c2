"""Structured output over the HTTP front, on the real model, through the openai SDK and the ollama
client: `.parse()`
with a pydantic model returns a parsed object every time (a llama.cpp grammar from the schema
masks every token), `json_object` returns a JSON object, and a schema keyword the grammar cannot
enforce is refused with 400 naming it and where, before any session is made."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import ollama
import openai
import pytest
from pydantic import BaseModel, Field

from sinkd.daemon.node import Daemon
from tests.support.settings import settings

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
# parses in the suite (constrained decoding checks a 49k vocabulary against the grammar whenever
# the free choice is refused: seconds a reply here); SINKD_STRUCTURED_RUNS=20 for the count
RUNS = int(os.environ.get("SINKD_STRUCTURED_RUNS", "4"))


class City(BaseModel):
    name: str = Field(max_length=16)
    coastal: bool
    size: Literal["village", "town", "city"]
    # every string bounded: a grammar admits an endless string, and a small model may write one
    rivers: list[Annotated[str, Field(max_length=24)]] = Field(max_length=2)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(settings(tmp_path_factory.mktemp("structured"), http="127.0.0.1:0"))
    d.start()
    d.wait_ready(120)
    assert d.http is not None
    yield d
    d.stop()


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> openai.OpenAI:
    assert daemon.http is not None
    return openai.OpenAI(base_url=f"{daemon.http.address}/v1", api_key="alice-token", max_retries=0)


def test_ollamas_format_and_the_responses_text_format_decode_under_the_grammar(
    daemon: Daemon, client: openai.OpenAI
) -> None:
    assert daemon.http is not None
    ollama_client = ollama.Client(
        host=daemon.http.address, headers={"authorization": "Bearer alice-token"}
    )
    reply = ollama_client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a city."}],
        format=City.model_json_schema(),
        options={"num_predict": 120},
    )
    assert City.model_validate_json(reply.message.content or "")
    generated = ollama_client.generate(
        model=MODEL, prompt="A JSON object about a dog.", format="json",
        options={"num_predict": 120, "temperature": 0},
    )  # fmt: skip
    assert isinstance(json.loads(generated.response), dict)
    with pytest.raises(ollama.ResponseError) as err:
        ollama_client.chat(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi."}],
            format={"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        )
    assert err.value.status_code == 400 and "'uniqueItems' at #" in str(err.value)
    response = client.responses.create(
        model=MODEL,
        input="Describe a city.",
        text={
            "format": {"type": "json_schema", "name": "city", "schema": City.model_json_schema()}
        },  # fmt: skip
        max_output_tokens=120,
    )
    assert City.model_validate_json(response.output_text)


def test_parse_with_a_pydantic_model_returns_an_object_every_time(client: openai.OpenAI) -> None:
    parsed = []
    for i in range(RUNS):
        completion = client.beta.chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": f"Describe city number {i} you know."}],
            response_format=City,
            max_tokens=120,
        )
        city = completion.choices[0].message.parsed
        assert isinstance(city, City), completion.choices[0].message.content
        parsed.append(city)
    assert len(parsed) == RUNS


def test_json_object_returns_a_json_object(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "A JSON object with two keys: a cat's name and its age."}
        ],
        response_format={"type": "json_object"},
        max_tokens=200,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


def test_a_keyword_the_grammar_cannot_enforce_is_refused_by_name(
    client: openai.OpenAI, tmp_path: Path
) -> None:
    class Person(BaseModel):
        lucky: set[int]  # "uniqueItems": outside OpenAI's subset, not enforced by the grammar

    with pytest.raises(openai.BadRequestError) as err:
        client.beta.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": "Hi."}], response_format=Person
        )
    assert "'uniqueItems' at #/properties/lucky" in str(err.value)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi."}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "format": "uri"}},
            },  # fmt: skip
        )
    assert "format 'uri'" in str(err.value)
