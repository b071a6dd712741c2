"""The conversational evaluation of recall (issue 48): the same chats for every arm, balanced
between wordings and contradictions; its summary's ratios; and a small plan end to end through
`sinkd eval recall --arm conversation`, the HTTP front and the real model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sinkd.cli.main import app
from sinkd.evaluation.facts import Fact
from sinkd.evaluation.recall_conversation import (
    ChatResult,
    ConversationPlan,
    TurnResult,
    chats,
    summary,
)


@pytest.mark.unit
def test_every_arm_gets_the_same_chats_balanced_by_wording_and_contradiction() -> None:
    plan = ConversationPlan(distances=(3, 10), chats=8)
    first, again = chats(plan), chats(plan)
    assert first == again
    for d in plan.distances:
        mine = [c for c in first if c.distance == d]
        assert len(mine) == 8 and all(len(c.topics) == d for c in mine)
        assert sum(c.contradiction is not None for c in mine) == 4
        assert {c.wording for c in mine if c.contradiction} == {"lexical", "paraphrase"}
        for c in mine:
            if c.other is not None:  # the reply names another value of the same kind
                assert c.other != c.fact.value and c.contradiction is not None
                assert Fact(c.fact.kind, c.other).answered(c.contradiction)
                assert not c.fact.answered(c.contradiction)


def result(
    arm: str, index: int, right: bool, ttfts: list[float], recalled: list[int]
) -> ChatResult:
    turns = [
        TurnResult(n, t, 100 * n, r)
        for n, (t, r) in enumerate(zip(ttfts, recalled, strict=True), 1)
    ]
    return ChatResult(arm, 3, index, "dog", "lexical", False, right, False, 300, True, turns)


@pytest.mark.unit
def test_the_summary_pairs_each_turn_with_the_same_turn_recall_off() -> None:
    plan = ConversationPlan(distances=(3,), chats=2)
    results = [
        # turn 1 starts a session and is left out; turn 4 recalled
        result("recall", 0, True, [9.0, 0.12, 0.11, 0.4], [0, 0, 0, 2]),
        result("recall", 1, False, [9.0, 0.10, 0.10, 0.3], [0, 0, 0, 1]),
        result("off", 0, False, [1.0, 0.10, 0.10, 0.2], [0, 0, 0, 0]),
        result("off", 1, False, [1.0, 0.10, 0.10, 0.1], [0, 0, 0, 0]),
        result("in-window", 0, True, [1.0, 0.1, 0.1, 0.1], [0, 0, 0, 0]),
        result("in-window", 1, True, [1.0, 0.1, 0.1, 0.1], [0, 0, 0, 0]),
    ]
    [row] = summary(results, plan)
    assert (row["recall"], row["off"], row["in-window"]) == (0.5, 0.0, 1.0)
    assert row["recall_over_in_window"] == 0.5
    assert row["turns_recalling"] == round(2 / 6, 3)
    assert row["ttft_not_recalling_over_off"] == pytest.approx(1.0, abs=0.051)  # 1.2, 1.1, 1, 1
    assert row["ttft_recalling_over_off"] == 2.5  # median of 2.0 and 3.0


@pytest.mark.model
def test_a_small_plan_runs_end_to_end_through_the_http_front(tmp_path: Path) -> None:
    """Two chats, the fact asked 4 turns on, sessions of 256 cells (the fact evicted by then):
    every arm answers every turn; the recall arm's stream passed its cells; the in-window arm
    never recalls; the file is written."""
    out = CliRunner().invoke(
        app,
        ["eval", "recall", "--arm", "conversation", "--distances", "4", "--chats", "2",
         "--cells", "256", "--out", str(tmp_path), "--json"],
    )  # fmt: skip
    assert out.exit_code == 0, out.stderr
    data = json.loads(out.stdout)
    assert {(c["arm"], c["index"]) for c in data["chats"]} == {
        (a, i) for a in ("recall", "off", "in-window") for i in (0, 1)
    }
    for c in data["chats"]:
        assert len(c["turns"]) == 6  # the fact, four topics, the question
        seen = [t["n_seen"] for t in c["turns"]]
        assert seen == sorted(seen) and all(t["ttft_s"] > 0 for t in c["turns"])
        if c["arm"] == "in-window":
            assert not any(t["recalled"] for t in c["turns"])
        assert c["tokens_back"] > 256  # the fact is past the small sessions by the question
    [row] = data["cells"]
    assert row["turns_back"] == 4 and row["chats"] == 2
    assert 0 <= row["turns_recalling"] <= 1
    assert (tmp_path / f"eval-recall-conversation_{data['model']}.json").is_file()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arm", "conversation", "--distances", "10,x"], "--distances"),
        (["--arm", "conversation", "--model", "llama-70b"], "not in models.lock"),
        (["--arm", "passkey"], "--text is required"),
        (["--arm", "diary"], "--arm"),
    ],
)
def test_bad_arguments_are_refused_before_any_daemon_starts(args: list[str], message: str) -> None:
    out = CliRunner().invoke(app, ["eval", "recall", *args])
    assert out.exit_code in (2, 4) and message in out.stderr, out.stderr
