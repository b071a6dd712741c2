"""Pure recall planning: selection within the budget, the recalled spans' positions, and the
policy's invariants (retained set, dense positions, no duplicates, budget) with recalls in the
stream. The recording fake backs no engine claim; tests/test_recall.py runs the real model."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinkd.cachepolicy import CacheSequence, ConfigError, PolicyConfig
from sinkd.cachepolicy.recall_plan import (
    Candidate,
    RecallConfig,
    RecallMode,
    check_recallable,
    held,
    in_any,
    plan_recall,
    select,
)
from tests.support.fake_memory import RecordingMemory

pytestmark = pytest.mark.unit


def cand(pid: int, start: int, n: int, score: float, dense: float = 0.0) -> Candidate:
    """A BM25-only find unless `dense` is given (then its rank fuses the two)."""
    return Candidate(pid, (start, start + n), n, score, lexical=score, dense=dense)


def test_select_takes_the_best_within_budget_then_orders_by_transcript() -> None:
    found = [cand(1, 100, 20, 2.0), cand(2, 10, 20, 5.0), cand(3, 50, 20, 4.0)]
    config = RecallConfig(budget=46, passages=3, threshold=1.0)
    # frame of 2 per passage: 22 each; 46 holds two (best two: ids 2 and 3), read in order
    assert [c.passage_id for c in select(found, config, 2)] == [2, 3]


def test_select_respects_threshold_and_passage_count() -> None:
    found = [cand(1, 0, 5, 0.5), cand(2, 10, 5, 3.0), cand(3, 20, 5, 2.0)]
    assert select(found, RecallConfig(budget=50, passages=3, threshold=1.0), 0) == [
        found[1],
        found[2],
    ]
    assert select(found, RecallConfig(budget=50, passages=1, threshold=1.0), 0) == [found[1]]
    assert select(found, RecallConfig(budget=50, passages=3, threshold=9.0), 0) == []


def test_select_skips_a_passage_too_large_for_the_budget_and_takes_a_smaller_one() -> None:
    found = [cand(1, 0, 60, 9.0), cand(2, 100, 10, 1.5)]
    assert select(found, RecallConfig(budget=20, passages=2, threshold=1.0), 1) == [found[1]]


def test_select_takes_a_paraphrase_on_its_dense_score_alone() -> None:
    # no word shared (BM25 0), but a sentence vector close enough: strong; a far one is not
    near = Candidate(1, (0, 5), 5, score=0.6, lexical=0.0, dense=0.6)
    far = Candidate(2, (10, 15), 5, score=0.2, lexical=0.0, dense=0.2)
    config = RecallConfig(budget=50, passages=3, threshold=1.0, dense_threshold=0.35)
    assert select([near, far], config, 0) == [near]
    assert (
        select(
            [near, far], RecallConfig(budget=50, passages=3, threshold=1.0, dense_threshold=0.7), 0
        )
        == []
    )


def test_plan_lays_spans_after_the_stream_and_prefix_with_frames() -> None:
    policy = PolicyConfig.named("sink", sinks=4, window=32, evict_chunk=4)
    seq = CacheSequence(policy)
    seq.append(100)
    chosen = [cand(7, 10, 5, 3.0), cand(9, 40, 3, 2.0)]
    plan = plan_recall(policy, seq.state, chosen, 1, 2, at=123.0, n_before=6)
    # 6 tokens of prefix first, then [1 frame, 5 tokens, 2 frame][1, 3, 2]
    assert plan.n_tokens == 14
    assert [s.stream for s in plan.spans] == [(107, 112), (115, 118)]
    assert [s.offset for s in plan.spans] == [1, 9]
    assert plan.append.n_tokens == 6 + 14
    assert [s.source for s in plan.spans] == [(10, 15), (40, 43)]


def test_full_policy_cannot_recall() -> None:
    policy = PolicyConfig.named("full", sinks=4, window=32)
    with pytest.raises(ConfigError, match="never evicts"):
        check_recallable(policy)
    with pytest.raises(ConfigError):
        plan_recall(policy, CacheSequence(policy).state, [cand(1, 0, 3, 2.0)], 0, 0, 0.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"budget": 0}, "recall.budget"),
        ({"passages": 0}, "recall.passages"),
        ({"threshold": -1.0}, "recall.threshold"),
    ],
)
def test_invalid_recall_config_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        RecallConfig(**kwargs)  # type: ignore[arg-type]
    assert e.value.field == field


def test_budget_above_half_the_window_is_refused() -> None:
    policy = PolicyConfig.named("sink", sinks=4, window=100)
    RecallConfig(budget=50).check(policy)
    with pytest.raises(ConfigError, match="half the window"):
        RecallConfig(budget=51).check(policy)


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown mode"):
        RecallConfig.named("sometimes")


def test_held_cuts_spans_the_stream_has_partly_evicted_and_drops_gone_ones() -> None:
    policy = PolicyConfig.named("sink", sinks=2, window=10)
    seq = CacheSequence(policy)
    seq.append(20)
    plan = plan_recall(policy, seq.state, [cand(1, 3, 4, 2.0), cand(2, 8, 4, 2.0)], 0, 0, 0.0)
    for sb in plan.append.sub_batches:
        seq.adopt_ops(sb)
        seq.adopt_tokens(sb)
    spans = list(plan.spans)
    assert [s.stream for s in held(spans, seq.state.window_start, seq.state.n_seen)] == [
        (20, 24),
        (24, 28),
    ]
    seq.append(5)  # the window (10) now starts at 23: the first copy is cut, the second whole
    now = held(spans, seq.state.window_start, seq.state.n_seen)
    assert [s.stream for s in now] == [(23, 24), (24, 28)]
    assert now[0].source == (3, 7)  # it still names the whole passage it came from
    seq.append(10)
    assert held(spans, seq.state.window_start, seq.state.n_seen) == []


@settings(max_examples=150, deadline=None)
@given(
    sinks=st.integers(0, 4),
    window=st.integers(8, 40),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(1, 30)),
            st.tuples(st.just("recall"), st.lists(st.integers(1, 6), min_size=1, max_size=3)),
        ),
        min_size=1,
        max_size=12,
    ),
    chunk_frac=st.floats(0.0, 1.0),
)
def test_invariants_hold_with_recalls_in_the_stream(
    sinks: int,
    window: int,
    steps: list[tuple[str, object]],
    chunk_frac: float,
) -> None:
    chunk = 1 + int(chunk_frac * (window - 1))
    policy = PolicyConfig.named("sink", sinks=sinks, window=window, evict_chunk=chunk)
    config = RecallConfig(budget=window // 2, passages=3, threshold=0.0)
    seq = CacheSequence(policy)
    mem = RecordingMemory()
    spans = []
    for kind, arg in steps:
        if kind == "append":
            plan = seq.plan(arg)  # type: ignore[arg-type]
            n_recalled = 0
        else:
            n = seq.state.n_seen
            found = [cand(i, max(0, n - 5 * (i + 1)), size, 1.0 + i) for i, size in enumerate(arg)]  # type: ignore[arg-type]
            chosen = select(found, config, 1)
            rp = plan_recall(policy, seq.state, chosen, 0, 1, 0.0)
            assert rp.n_tokens <= config.budget  # never above the recall budget
            spans += rp.spans
            plan = rp.append
            n_recalled = rp.n_tokens
        for sb in plan.sub_batches:
            seq.adopt_ops(sb)
            seq.adopt_tokens(sb)
        mem.apply(plan)
        kept = seq.logical_positions()
        assert len(kept) == len(set(kept)) <= policy.budget  # no duplicates, the budget
        assert seq.cache_positions() == list(range(seq.retained))  # dense (K=0)
        assert sorted(mem.cells.values()) == sorted(kept)  # the ops give what the policy says
        assert n_recalled == 0 or plan.n_tokens == n_recalled
        s = seq.state
        for span in held(spans, max(s.window_start, sinks), s.n_seen):
            # every held copy is inside the retained window
            assert all(p in kept for p in range(*span.stream))
            assert in_any(span.stream[0], spans)
    assert mem.max_cells <= policy.budget


def test_the_models_own_words_are_taken_after_everyone_elses_and_laid_out_after_them() -> None:
    config = RecallConfig(mode=RecallMode.AUTO, budget=40, passages=2, threshold=1.0)
    own = dataclasses.replace(cand(1, 0, 10, 9.0), speaker="assistant")  # the best match
    theirs = [dataclasses.replace(cand(i, 20 * i, 10, 2.0), speaker="user") for i in (2, 3)]
    chosen = select([own, *theirs], config, 0, second=lambda c: c.speaker == "assistant")
    assert [c.passage_id for c in chosen] == [2, 3]  # the user's two fill the passages
    roomy = dataclasses.replace(config, passages=3)
    chosen = select([own, *theirs], roomy, 0, second=lambda c: c.speaker == "assistant")
    assert [c.passage_id for c in chosen] == [2, 3, 1]  # then the model's, after them
