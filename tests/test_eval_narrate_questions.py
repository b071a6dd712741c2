"""The question set of `sinkd eval narrate --questions`: built from a log's labels, scored on
what an answer cites (the model's part is tested on the real model in test_narrated_ask_model)."""

from __future__ import annotations

from sinkd.daemon.runtime.api import NarratedInterval, NarrationAnswer
from sinkd.evaluation.narrate import Case, _incident
from sinkd.evaluation.narrate_questions import questions, score

HEAD = "- 1117838570 2005.06.03 R02-M1 2005-06-03-15.42.50 R02-M1 RAS KERNEL"


def bgl(lines: int, trouble: dict[int, str]) -> Case:
    text = [f"{HEAD} INFO generating core.{n}" for n in range(1, lines + 1)]
    for n, message in trouble.items():
        text[n - 1] = f"{HEAD} FATAL {message}"
    runs = [[n for n in trouble if trouble[n] == m] for m in dict.fromkeys(trouble.values())]
    return Case("bgl", "test", text, [_incident(text, run, "X") for run in runs])


def answer(*spans: tuple[int, int], said: str = "") -> NarrationAnswer:
    cites = tuple(
        NarratedInterval("s", k, k, a, b, 0.0, 0.0, 0, 0, "{}") for k, (a, b) in enumerate(spans)
    )
    return NarrationAnswer("s", bool(spans), said, (), "ERROR: 3 lines data TLB error", cites)


def test_each_labelled_incident_gives_three_questions_and_one_the_log_never_answers() -> None:
    case = bgl(400, {150: "data TLB error interrupt", 151: "data TLB error interrupt"})
    asked = questions(case)
    assert [q.kind for q in asked] == ["when", "count", "around", "absent"]
    when, count, around, _ = asked
    assert when.text == "When did data TLB error interrupt first happen?"
    assert when.about == (150, 151)
    assert count.span == (150, 249) and around.span == (150, 150)


def test_an_answer_is_right_only_where_its_citations_hold_the_lines_asked_about() -> None:
    case = bgl(400, {150: "data TLB error interrupt", 151: "data TLB error interrupt"})
    when, count, around, absent = questions(case)
    assert score(when, answer((101, 200)))["right"]
    assert not score(when, answer((1, 100), (101, 200)))["right"]  # says it began sooner
    assert not score(when, answer((201, 300)))["right"]
    assert score(count, answer((101, 200), (201, 300)))["right"]
    assert not score(count, answer((101, 200), (301, 400)))["right"]  # outside the lines named
    assert score(around, answer((101, 200)))["right"]
    assert not score(around, answer())["right"]
    assert score(absent, answer())["right"] and not score(absent, answer((1, 100)))["right"]
    said = score(when, answer((101, 200), said="According to the facts, the kubernetes pod died."))
    assert said["printed_unsupported"] == 1
