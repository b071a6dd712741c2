"""A chat UI's side tasks (Open WebUI's title, tags and follow-ups: its own default prompts, which
ask for a JSON object and send no format) answered in that form through the openai SDK on the real
model, and said so on the answer; the setting off, or any other message, untouched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sinkd.daemon.node import Daemon
from sinkd.daemon.runtime.api import Turn
from sinkd.daemon.runtime.conversations import ui_tasks
from tests.support import open_webui_tasks as owui
from tests.support.daemons import http_daemon, openai_client

MODEL = "smollm2-135m-instruct"
CHAT = [
    ("user", "How do I keep basil alive on a windowsill?"),
    ("assistant", "Give it sun, water when the soil is dry, and pinch off flower buds."),
]
KEYS = {"TITLE": "title", "TAGS": "tags", "FOLLOW_UP": "follow_ups"}


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(KEYS))
def test_open_webuis_default_prompts_are_recognised_and_little_else(name: str) -> None:
    text = owui.rendered(getattr(owui, name), CHAT)
    found = ui_tasks.recognized((Turn("user", text),))
    assert found is not None and found.output.schema_json is not None
    assert KEYS[name] in json.loads(found.output.schema_json)["required"]
    assert ui_tasks.recognized((Turn("user", "### Task:\nWrite me a poem."),)) is None
    assert ui_tasks.recognized((Turn("user", text[:60]),)) is None  # its output line cut
    assert ui_tasks.recognized((Turn("assistant", "x"), Turn("user", text))) is None  # a chat


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = http_daemon(tmp_path_factory.mktemp("ui-tasks"))
    yield d
    d.stop()


@pytest.mark.model
@pytest.mark.parametrize("name", sorted(KEYS))
def test_open_webuis_tasks_come_back_as_the_object_they_ask_for(daemon: Daemon, name: str) -> None:
    """As Open WebUI sends them: one user message, not streamed, no response_format."""
    raw = openai_client(daemon).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": owui.rendered(getattr(owui, name), CHAT)}],
        max_tokens=400,
    )
    reply = raw.parse()
    assert reply.choices[0].finish_reason == "stop"
    answer = json.loads(reply.choices[0].message.content or "")
    value = answer[KEYS[name]]
    assert isinstance(value, str if name == "TITLE" else list) and value
    assert raw.headers["x-sinkd-output"].startswith("open-webui ")
    assert "ui_task_grammar" in raw.headers["x-sinkd-output"]


@pytest.mark.model
def test_with_the_setting_off_the_prompt_is_answered_as_it_came(tmp_path: Path) -> None:
    d = http_daemon(tmp_path, ui_task_grammar=False)
    try:
        raw = openai_client(d).chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": owui.rendered(owui.TITLE, CHAT)}],
            max_tokens=24,
        )
        assert "x-sinkd-output" not in raw.headers
    finally:
        d.stop()


@pytest.mark.model
@pytest.mark.parametrize(
    ("task", "written", "then", "allowed"),
    [
        (0, '{"title": "Your concis', "e", False),  # the placeholder's stem: no way in
        (0, '{"title": "your concis', "e", False),
        (0, '{"title": "Your conci', "l", True),  # "Your conciliation"
        (0, '{"title": "Stock Trends', '"', False),  # an example answer: it may not end there
        (0, '{"title": "Stock Trends,', '"', False),
        (0, '{"title": "Stock Trends in May', '"', True),
        (1, '{"tags": ["Gardening", "tag', "4", False),
        (1, '{"tags": ["Gardening", "tag', "s", True),
        (2, '{"follow_ups": [" SUGGESTE', "D", False),
        (2, '{"follow_ups": ["Suggeste', "d", False),
        (2, '{"follow_ups": ["Suggest', "i", True),  # "Suggestions for bread?"
    ],
)
def test_no_value_may_be_a_copy_of_the_prompt_s_placeholders(
    make_engine: object, task: int, written: str, then: str, allowed: bool
) -> None:
    """The grammar llama.cpp runs, fed an answer a character at a time: a value may not begin
    as a placeholder does ("Suggested next message 12"), nor end as an example answer."""
    from sinkd.daemon.runtime.api import OutputFormat
    from sinkd.daemon.runtime.requests import output_grammar

    engine = make_engine()  # type: ignore[operator]
    vocab = engine.vocab
    mask = vocab.constrain(output_grammar(OutputFormat(ui_tasks.TASKS[task].schema_json)))
    try:
        for ch in written:
            (token,) = vocab.tokenize(ch)
            assert mask.allows(token), f"{ch!r} refused after {written!r}"
            mask.accept(token)
        (next_token,) = vocab.tokenize(then)
        assert mask.allows(next_token) is allowed
    finally:
        mask.close()
