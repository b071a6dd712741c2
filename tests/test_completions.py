"""The legacy completions endpoint with the real clients (the openai SDK, LangChain's `OpenAI`
class): raw text continued, streamed or whole; a growing prompt continues its session (only the new
text is read); fill-in-the-middle refused by name on both pinned models (neither has FIM tokens);
what sinkd does not serve refused by name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from sinkd.daemon.node import Daemon
from tests.support.daemons import http_daemon, openai_client

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
PROMPT = "The three primary colours are red, yellow and"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = http_daemon(tmp_path_factory.mktemp("completions"))
    yield d
    d.stop()


def test_a_prompt_is_continued_whole_and_streamed_alike(daemon: Daemon) -> None:
    client: openai.OpenAI = openai_client(daemon)
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 12
    streamed = client.completions.create(
        model=MODEL, prompt=[PROMPT], max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(streamed)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text and text.strip()
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    echoed = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True, stop=["\n"]
    )
    assert echoed.choices[0].text.startswith(PROMPT)


def test_a_growing_prompt_continues_its_session(daemon: Daemon) -> None:
    """An editor's autocomplete, or a loop: each prompt is the last prompt, its completion and
    more. The session that holds the beginning answers; only the rest is read."""
    client: openai.OpenAI = openai_client(daemon)
    first = client.completions.with_raw_response.create(
        model=MODEL, prompt="def add(a, b):\n", max_tokens=10, temperature=0
    )
    one = first.parse()
    assert first.headers["x-sinkd-continuation"] == "new"
    grown = "def add(a, b):\n" + one.choices[0].text + "\n\ndef sub(a, b):\n"
    second = client.completions.with_raw_response.create(
        model=MODEL, prompt=grown, max_tokens=10, temperature=0
    )
    two = second.parse()
    assert second.headers["x-sinkd-continuation"] == "continued"
    assert second.headers["x-sinkd-session"] == first.headers["x-sinkd-session"]
    fresh = client.completions.create(
        model=MODEL, prompt="# another file\n" + grown, max_tokens=10, temperature=0
    )  # read whole: no session holds its beginning
    assert two.usage is not None and fresh.usage is not None
    assert two.usage.prompt_tokens < fresh.usage.prompt_tokens / 2, (two.usage, fresh.usage)


def test_langchain_openai_completions_class(daemon: Daemon) -> None:
    from langchain_openai import OpenAI

    assert daemon.http is not None
    llm = OpenAI(
        model=MODEL, base_url=f"{daemon.http.address}/v1", api_key="alice-token",  # type: ignore[arg-type]
        max_tokens=12, temperature=0, max_retries=0,
    )  # fmt: skip
    said = llm.invoke(PROMPT)
    assert said.strip()
    assert "".join(llm.stream(PROMPT)) == said


def test_what_completions_do_not_serve_is_refused_by_name(daemon: Daemon) -> None:
    client: openai.OpenAI = openai_client(daemon)
    for kwargs, named in [
        ({"suffix": "\n    return x"}, "suffix: fill-in-the-middle needs the model's FIM tokens"),
        ({"logprobs": 2}, "logprobs"),
        ({"n": 2}, "n: not supported"),
        ({"prompt": ["a", "b"]}, "prompt: one prompt per request"),
        ({"prompt": ""}, "prompt: empty"),
    ]:
        with pytest.raises(openai.BadRequestError, match=named):
            client.completions.create(**{"model": MODEL, "prompt": "x", **kwargs})  # type: ignore[call-overload]


def test_fill_in_the_middle_is_refused_on_gemma_too(tmp_path: Path) -> None:
    d = http_daemon(tmp_path, model="gemma3-270m")
    try:
        with pytest.raises(openai.BadRequestError, match="suffix: fill-in-the-middle needs"):
            openai_client(d).completions.create(model="gemma3-270m", prompt="def f(", suffix=")")
    finally:
        d.stop()
