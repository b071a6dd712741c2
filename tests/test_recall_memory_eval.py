"""The memory arm's timeline (`sinkd eval recall --arm memory`, issue 62): every question comes
after what it asks for, in a conversation of its own, the stated distance later; corrections come
after what they correct; the private and the forgotten conversations are asked for later."""

from __future__ import annotations

import pytest

from sinkd.evaluation.recall_memory import CORRECTION, MemoryPlan, timeline

pytestmark = pytest.mark.unit


def test_each_question_follows_its_statement_by_its_distance() -> None:
    plan = MemoryPlan()
    said, questions = timeline(plan)
    assert [s.index for s in said] == list(range(len(said)))
    facts = [q for q in questions if q.fact is not None]
    assert len(facts) == plan.facts * len(plan.distances)
    for q in facts:
        stated = next(s for s in said if s.fact == q.fact)
        assert q.after == stated.index + q.distance < len(said)
        if q.original is None:
            assert q.source == stated.index and q.value in said[q.source].turns[0]
        else:  # corrected: the correction's conversation, after the statement, before the question
            assert q.original == stated.index < q.source <= q.after
            fix = [t for t in said[q.source].turns if t.startswith(CORRECTION)]
            assert len(fix) == 1 and q.value in fix[0]
    assert sum(q.original is not None for q in facts) == len(plan.distances) * 5
    private = next(s for s in said if s.private)
    forgotten = next(s for s in said if s.forget)
    leaks = [q for q in questions if q.fact is None]
    assert sorted(q.source for q in leaks) == sorted([private.index, forgotten.index])
    assert all(q.after > q.source and q.after < len(said) for q in leaks)
