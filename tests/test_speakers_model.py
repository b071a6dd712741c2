"""The locker case on the real model, through the openai SDK (issue 48): the user says a fact, the
model contradicts it, twenty turns push both out of the window, and the user asks. Recall brings
back the user's sentence first and the model's invention only after it, marked as its own. What the model answers is the evaluation's business
(`SINKD_LOCKER_TRIALS`), not this test's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sinkd.daemon.node import Daemon
from sinkd.daemon.runtime.api import Handle
from sinkd.daemon.runtime.recall.layer import OWN_WORDS
from sinkd.daemon.runtime.sessions import Principal
from tests.support.daemons import http_daemon, openai_client
from tests.support.texts import TEXT

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
FACT = "Please remember this: my locker code is 4417."
INVENTION = "Your locker codes are 32569 (Silk) and 408A (Mint)."
QUESTION = "What is my locker code?"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = http_daemon(tmp_path_factory.mktemp("locker"))
    yield d
    d.stop()


def conversation(fillers: int = 20) -> list[dict[str, str]]:
    words = TEXT.split()
    messages = [{"role": "user", "content": FACT}, {"role": "assistant", "content": INVENTION}]
    for i in range(fillers):
        piece = " ".join(words[(i * 40) % len(words) :][:40])
        messages += [
            {"role": "user", "content": f"Here is a passage, part {i}: {piece}"},
            {"role": "assistant", "content": "Noted, thank you for the passage."},
        ]
    return [*messages, {"role": "user", "content": QUESTION}]


def answer(daemon: Daemon, messages: list[dict[str, str]]) -> Any:
    """The openai SDK's completion, greedy, from the daemon's HTTP front."""
    return openai_client(daemon).chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=24,
        temperature=0,  # type: ignore[arg-type]
    )


def ask(daemon: Daemon, messages: list[dict[str, str]]) -> Any:
    return answer(daemon, messages).model_extra["sinkd"]


def test_recall_brings_back_the_users_fact_first_and_the_models_invention_marked(
    daemon: Daemon,
) -> None:
    ext = ask(daemon, conversation())
    recalled = ext["recall"]["recalled"]
    assert recalled, ext["recall"]["note"]
    speakers = [r["speaker"] for r in recalled]
    assert speakers[0] == "user"  # the user's sentence first
    assert speakers == sorted(speakers, key=lambda s: s == "assistant")  # the model's after
    if "assistant" in speakers:  # and marked as its own, in the stream the model reads
        text = daemon.service.reads.inspect(
            Principal("alice"), Handle(ext["session_id"], ext["generation"]), include_text=True
        ).retained_text
        assert OWN_WORDS + "Your locker codes" in text
    handle = Handle(ext["session_id"], ext["generation"])
    alice = Principal("alice")
    found = daemon.service.memory.memory(alice, handle, search="locker code", limit=50)
    said = {p.speaker for p in found if "4417" in p.text or "32569" in p.text}
    assert said == {"user", "assistant"}  # both were stored, each as its speaker's


@pytest.mark.skipif(
    not os.environ.get("SINKD_LOCKER_TRIALS"),
    reason="the answer-level trials: SINKD_LOCKER_TRIALS=20",
)
def test_the_answer_has_the_users_value_as_often_as_in_the_window(
    daemon: Daemon, tmp_path: Path
) -> None:
    """N chats (20 + t filler turns), each asked of this daemon (the fact and the invention
    evicted: recalled) and of one whose sessions hold 4,096 cells (the same chat in the window)."""
    trials = int(os.environ["SINKD_LOCKER_TRIALS"])
    roomy = http_daemon(tmp_path, n_ctx_seq=4096)
    try:
        recalled = sum(right(daemon, conversation(20 + t)) for t in range(trials))
        in_window = sum(right(roomy, conversation(20 + t)) for t in range(trials))
    finally:
        roomy.stop()
    print(
        f"locker: recalled {recalled}/{trials}, the same chats in the window {in_window}/{trials}"
    )
    assert recalled >= in_window


def right(daemon: Daemon, messages: list[dict[str, str]]) -> bool:
    return "4417" in (answer(daemon, messages).choices[0].message.content or "")
