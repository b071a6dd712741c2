"""Which chat turns recall by meaning (the query embedded) and which by words alone (issue 48):
every question and every turn that speaks of its user or of what was said, by meaning; a plain
request, by words."""

from __future__ import annotations

import pytest

from sinkd.daemon.runtime.recall.past import may_need_the_past
from sinkd.evaluation.facts import KINDS

pytestmark = pytest.mark.unit


def test_every_question_of_the_evaluations_is_searched_by_meaning() -> None:
    questions = [q for k in KINDS for q in (k.lexical, k.paraphrase)]
    assert all(may_need_the_past(q) for q in questions)
    assert all(may_need_the_past(q.rstrip("?")) for q in questions)  # no mark: its first word


@pytest.mark.parametrize(
    "message",
    [
        "What is my name, and in which city do I keep bees?",
        "what did you say about tides",
        "Remind me what the code was.",
        "Summarize what we discussed.",
        "As I mentioned, the meeting moved.",
        "Which figure brings me fortune",
        "That is what I\u2019d like.",
        "Go back to the recipe from earlier.",
    ],
)
def test_a_turn_that_asks_or_speaks_of_the_past_is_searched_by_meaning(message: str) -> None:
    assert may_need_the_past(message)


@pytest.mark.parametrize(
    "message",
    [
        "Tell me about how bees make honey.",
        "Explain how glass is made.",
        "Give me a recipe for bread.",
        "Tell us a story.",
        "Let me know about the rain.",
        "Continue the story.",  # the documented miss: needs the past, says nothing of it
        "",
    ],
)
def test_a_plain_request_is_searched_by_words_alone(message: str) -> None:
    assert not may_need_the_past(message)
