"""Pure policy tests: exact retained positions, exact ops, properties over random appends."""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinkd.cachepolicy import (
    CacheFull,
    CacheSequence,
    CannotRewind,
    ConfigError,
    Evict,
    PolicyConfig,
    SeqState,
    Shift,
    plan_append,
)
from tests.support.fake_memory import RecordingMemory

pytestmark = pytest.mark.unit


def retained_after(stream_len: int, policy: str, sinks: int, window: int) -> list[int]:
    seq = CacheSequence(PolicyConfig.named(policy, sinks=sinks, window=window))
    seq.append(stream_len)
    return seq.logical_positions()


# --- the nine assertions of the seed fixture (attention-sinks-for-stable-streaming-llms.txt) ---
STREAM = 8  # the fixture's stream [0..7]


def test_seed_window_only_keeps_last_four() -> None:
    assert retained_after(STREAM, "window", 0, 4) == [4, 5, 6, 7]


def test_seed_two_sinks_keep_first_two_and_last_two() -> None:
    assert retained_after(STREAM, "sink", 2, 2) == [0, 1, 6, 7]


def test_seed_sinks_include_position_zero() -> None:
    assert 0 in retained_after(STREAM, "sink", 2, 2)


def test_seed_middle_is_evicted() -> None:
    assert 5 not in retained_after(STREAM, "sink", 2, 2)


def test_seed_warm_up_keeps_everything() -> None:
    assert retained_after(2, "sink", 2, 2) == [0, 1]


def test_seed_exact_budget_keeps_the_whole_stream() -> None:
    assert retained_after(STREAM, "sink", 2, 6) == list(range(STREAM))


def test_seed_impossible_budget_is_rejected() -> None:
    # the fixture asks for budget 1 with 2 sinks: no room left for a window
    with pytest.raises(ConfigError, match="window"):
        PolicyConfig.named("sink", sinks=2, window=1 - 2)


def test_seed_no_duplicates() -> None:
    kept = retained_after(STREAM, "sink", 2, 2)
    assert len(set(kept)) == len(kept) == 4


def test_seed_deterministic() -> None:
    assert retained_after(STREAM, "sink", 2, 2) == retained_after(STREAM, "sink", 2, 2)


# --- exact ops in llama.cpp terms ---


def test_first_overflow_evicts_oldest_window_cell_and_shifts_down() -> None:
    cfg = PolicyConfig.named("sink", sinks=2, window=4)
    plan = plan_append(cfg, SeqState.empty(cfg), 7)
    assert [(sb.n_tokens, sb.cache_pos, sb.logical_pos) for sb in plan.sub_batches] == [
        (6, 0, 0),
        (1, 5, 6),
    ]
    # remove cache [2,3), then move [3,6) down by 1; the new token (logical 6) lands at cache 5
    assert plan.sub_batches[1].ops == (Evict(2, 3, 2, 3), Shift(3, 6, -1))


def test_token_position_follows_the_shift() -> None:
    cfg = PolicyConfig.named("sink", sinks=2, window=4)
    seq = CacheSequence(cfg)
    seq.append(6)
    plan = seq.plan(1)
    (sb,) = plan.sub_batches
    assert sb.ops == (Evict(2, 3, 2, 3), Shift(3, 6, -1))
    assert sb.cache_pos == 5 and sb.logical_pos == 6


def test_noshift_leaves_the_gap_and_logical_positions() -> None:
    cfg = PolicyConfig.named("sink-noshift", sinks=2, window=4)
    seq = CacheSequence(cfg)
    seq.append(9)
    assert seq.cells()[0].cache_pos == 0
    assert [(c.cache_pos, c.logical_pos) for c in seq.cells()] == [
        (0, 0),
        (1, 1),
        (5, 5),
        (6, 6),
        (7, 7),
        (8, 8),
    ]
    assert all(not isinstance(op, Shift) for op in seq.plan(3).ops)


def test_eviction_chunk_removes_e_cells_at_once() -> None:
    cfg = PolicyConfig.named("sink", sinks=1, window=8, evict_chunk=4)
    seq = CacheSequence(cfg)
    seq.append(9)
    plan = seq.append(1)
    assert plan.ops == (Evict(1, 5, 1, 5), Shift(5, 9, -4))
    assert seq.retained == 6
    assert seq.logical_positions() == [0, 5, 6, 7, 8, 9]
    assert seq.cache_positions() == list(range(6))


def test_next_take_is_what_one_sub_batch_holds() -> None:
    seq = CacheSequence(PolicyConfig.named("sink", sinks=1, window=8, evict_chunk=4))
    assert seq.next_take(0) == 0
    assert seq.next_take(20) == 9  # the free cells
    seq.append(7)
    assert seq.next_take(1) == 1
    assert seq.next_take(20) == 2
    seq.append(2)
    assert seq.next_take(20) == 4  # full: what one eviction frees
    assert seq.state.n_seen == 9  # asking changed nothing
    full = CacheSequence(PolicyConfig.named("full", sinks=1, window=8))
    full.append(9)
    assert full.next_take(3) == 3  # refused later, by the append itself, with the reason


def test_ingest_chunk_evicts_ahead_and_decodes_one_sub_batch() -> None:
    """Past the budget, 12 tokens with E=4 and an ingest chunk of 12: the three evictions
    token-at-a-time appends make, in one go, one shift, and one 12-token sub-batch."""
    seq = CacheSequence(
        PolicyConfig.named("sink", sinks=2, window=16, evict_chunk=4, ingest_chunk=12)
    )
    seq.append(18)  # full
    plan = seq.plan(12)
    assert [sb.n_tokens for sb in plan.sub_batches] == [12]
    ops = plan.sub_batches[0].ops
    assert ops == (
        Evict(2, 6, 2, 6), Evict(6, 10, 6, 10), Evict(10, 14, 10, 14), Shift(14, 18, -12)
    )  # fmt: skip
    assert [sb.n_tokens for sb in seq.plan(1).sub_batches] == [1]  # generation: E at a time
    assert seq.plan(1).sub_batches[0].ops[0] == Evict(2, 6, 2, 6)


def test_compaction_interval_defers_the_shift() -> None:
    cfg = PolicyConfig.named("sink", sinks=2, window=4, compact_interval=3)
    seq = CacheSequence(cfg)
    mem = RecordingMemory()
    mem.apply(seq.append(6))
    for _ in range(2):  # two evictions: gap 1, 2 < K, no shift yet
        plan = seq.append(1)
        mem.apply(plan)
        assert not any(isinstance(op, Shift) for op in plan.ops)
    assert seq.receipt().pending_gap == 2
    plan = seq.append(1)  # third eviction: the gap reaches K=3, the window moves down by 3
    mem.apply(plan)
    assert plan.ops[-1] == Shift(5, 8, -3)
    assert seq.cache_positions() == list(range(6))
    assert [p for p, _ in mem.sorted_cells()] == list(range(6))


def test_a_deferred_shift_closes_the_gaps_of_n_evictions_at_once() -> None:
    cfg = PolicyConfig.named("sink", sinks=2, window=8, evict_chunk=2)
    deferred = cfg.with_deferred_shift(3, position_limit=None)
    assert deferred.compact_interval == 6  # 3 x E
    seq, mem = CacheSequence(deferred), RecordingMemory()
    mem.apply(seq.append(10))
    shifts_at = []
    for i in range(12):  # six evictions of E=2: the gap reaches K=6 at the 3rd and the 6th
        plan = seq.append(1)
        mem.apply(plan)
        if any(isinstance(op, Shift) for op in plan.ops):
            shifts_at.append(i)
        assert seq.receipt().retained <= cfg.budget
        assert max(p for p, _ in mem.sorted_cells()) < deferred.budget + deferred.compact_interval
    assert shifts_at == [4, 10]
    assert seq.cache_positions() == list(range(seq.receipt().retained))


def test_a_deferred_shift_stays_within_the_models_positions_and_spares_the_controls() -> None:
    sink = PolicyConfig.named("sink", sinks=4, window=252, evict_chunk=16)
    assert sink.with_deferred_shift(3, position_limit=8192).compact_interval == 48
    assert sink.with_deferred_shift(32, position_limit=8192).compact_interval == 252  # at most W
    assert sink.with_deferred_shift(3, position_limit=280).compact_interval == 24  # 280 - 256
    assert sink.with_deferred_shift(3, position_limit=256).compact_interval == 0
    assert sink.with_deferred_shift(1, position_limit=None).compact_interval == 0
    window = PolicyConfig.named("window", window=64, evict_chunk=4)
    assert window.with_deferred_shift(3, position_limit=None).compact_interval == 12
    for name in ("sink-noshift", "full"):  # they keep positions: K stays 0 (it is refused there)
        control = PolicyConfig.named(name, sinks=4, window=60, evict_chunk=4)
        assert control.with_deferred_shift(3, position_limit=None) == control


def test_full_policy_raises_cache_full_and_changes_nothing() -> None:
    seq = CacheSequence(PolicyConfig.named("full", sinks=0, window=8))
    seq.append(6)
    before = seq.state
    with pytest.raises(CacheFull) as err:
        seq.append(3)
    assert err.value.capacity == 8 and err.value.retained == 6 and err.value.incoming == 3
    assert seq.state == before
    seq.append(2)
    assert seq.retained == 8


def test_max_batch_splits_without_evicting() -> None:
    cfg = PolicyConfig.named("sink", sinks=4, window=60)
    plan = plan_append(cfg, SeqState.empty(cfg), 50, max_batch=16)
    assert [sb.n_tokens for sb in plan.sub_batches] == [16, 16, 16, 2]
    assert plan.ops == ()


def test_receipt_reports_logical_and_cache_ranges() -> None:
    seq = CacheSequence(PolicyConfig.named("sink", sinks=4, window=8, evict_chunk=2))
    seq.append(20)
    r = seq.receipt()
    assert r.anchors_logical == (0, 4)
    assert r.recent_logical == (12, 20)
    assert r.recent_cache == (4, 12)
    assert r.retained == 12
    assert r.evictions == 4 and r.evicted_tokens == 8
    assert [e.evicted_logical for e in seq.trace] == [(4, 6), (6, 8), (8, 10), (10, 12)]
    assert all(e.shift_delta == -2 for e in seq.trace)


def test_trace_is_a_bounded_ring() -> None:
    seq = CacheSequence(PolicyConfig.named("window", window=4), trace_capacity=3)
    seq.append(20)
    assert len(seq.trace) == 3
    assert seq.trace[-1].evicted_logical == (15, 16)
    assert seq.receipt().evictions == 16


def test_fork_is_independent_and_reset_empties() -> None:
    parent = CacheSequence(PolicyConfig.named("sink", sinks=2, window=4))
    parent.append(10)
    child = parent.fork()
    child.append(5)
    assert parent.logical_positions() == [0, 1, 6, 7, 8, 9]
    assert child.logical_positions() == [0, 1, 11, 12, 13, 14]
    assert len(parent.trace) == 4 and len(child.trace) == 9
    child.reset()
    assert child.cells() == [] and child.receipt().evictions == 0 and not child.trace
    assert parent.retained == 6


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"policy": "lru"}, "policy"),
        ({"policy": "sink", "sinks": -1}, "sinks"),
        ({"policy": "sink", "window": 0}, "window"),
        ({"policy": "sink", "window": 4, "evict_chunk": 5}, "evict_chunk"),
        ({"policy": "sink", "evict_chunk": 0}, "evict_chunk"),
        ({"policy": "sink", "compact_interval": -1}, "compact_interval"),
        ({"policy": "sink-noshift", "compact_interval": 8}, "compact_interval"),
        ({"policy": "sink", "window": 16, "ingest_chunk": 17}, "ingest_chunk"),
        ({"policy": "sink", "ingest_chunk": -1}, "ingest_chunk"),
    ],
)
def test_invalid_config_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        PolicyConfig.named(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field
    assert str(err.value).startswith(field)


def test_window_policy_with_sinks_is_invalid() -> None:
    with pytest.raises(ConfigError, match="sinks"):
        PolicyConfig(PolicyConfig.named("window").policy, 2, 4)


def test_budget_above_engine_context_is_refused() -> None:
    cfg = PolicyConfig.named("sink", sinks=4, window=508)
    cfg.check_context(512)
    with pytest.raises(ConfigError, match="exceeds the 256 cells"):
        cfg.check_context(256)


def test_policy_imports_neither_llama_cpp_nor_grpc() -> None:
    for path in pathlib.Path("cachepolicy").glob("**/*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                root = name.split(".")[0]
                assert root not in {"llama_cpp", "grpc", "daemon", "cli"}, f"{path} imports {name}"


# --- properties ---

appends = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=25)


@settings(max_examples=300, deadline=None)
@given(
    sinks=st.integers(0, 6),
    window=st.integers(1, 12),
    sizes=appends,
    shift=st.booleans(),
)
def test_e1_retains_first_s_and_last_w(
    sinks: int, window: int, sizes: list[int], shift: bool
) -> None:
    seq = CacheSequence(
        PolicyConfig.named("sink" if shift else "sink-noshift", sinks=sinks, window=window)
    )
    n = 0
    for size in sizes:
        seq.append(size)
        n += size
        expected = sorted(set(range(min(sinks, n))) | set(range(max(0, n - window), n)))
        assert seq.logical_positions() == expected


@settings(max_examples=300, deadline=None)
@given(
    sinks=st.integers(0, 6),
    window=st.integers(1, 16),
    chunk_frac=st.floats(0.0, 1.0),
    compact=st.integers(0, 20),
    policy=st.sampled_from(["sink", "sink-noshift"]),
    sizes=appends,
    max_batch=st.one_of(st.none(), st.integers(1, 9)),
    ingest_frac=st.one_of(st.just(0.0), st.floats(0.0, 1.0)),
)
def test_invariants_for_any_chunk(
    sinks: int,
    window: int,
    chunk_frac: float,
    compact: int,
    policy: str,
    sizes: list[int],
    max_batch: int | None,
    ingest_frac: float,
) -> None:
    """Whatever the appends' sizes, E, K, the batch limit and the ingest chunk: the cache holds what
    the policy says, and the same cells and evictions as appending one token at a time."""
    chunk = 1 + int(chunk_frac * (window - 1))
    ingest = int(ingest_frac * window)
    cfg = PolicyConfig.named(
        policy,
        sinks=sinks,
        window=window,
        evict_chunk=chunk,
        compact_interval=compact if policy == "sink" else 0,
        ingest_chunk=ingest,
    )
    seq = CacheSequence(cfg, trace_capacity=10_000)
    token_at_a_time = CacheSequence(
        PolicyConfig.named(
            policy, sinks=sinks, window=window, evict_chunk=chunk,
            compact_interval=compact if policy == "sink" else 0,
        ),
        trace_capacity=10_000,
    )  # fmt: skip
    mem = RecordingMemory()
    n = 0
    for size in sizes:
        plan = seq.plan(size, max_batch)

        def check(sb: Any) -> None:
            # a sub-batch continues right after the newest cell the sequence holds, if it holds
            # any (llama.cpp refuses a batch that does not: Y = X + 1)
            before = [pos for pos, _ in mem.sorted_cells() if pos < sb.cache_pos]
            if chunk < window:  # E = W empties the window, and noshift keeps the gap it leaves
                assert not before or sb.cache_pos == max(before) + 1, (sb, before[-3:])
            # the fake applied exactly what the policy says the cache now holds
            seq.adopt_tokens(sb)
            assert mem.sorted_cells() == [(c.cache_pos, c.logical_pos) for c in seq.cells()]
            # the audit's cheap span is llama.cpp's seq_pos_min/max of those cells
            held = [pos for pos, _ in mem.sorted_cells()]
            assert seq.cache_span() == ((held[0], held[-1]) if held else (-1, -1))

        for sb in plan.sub_batches:
            seq.adopt_ops(sb)
        # replay from the pre-plan state through the fake, checking after each sub-batch
        seq.state = plan.before
        mem.apply(plan, on_sub_batch=check)
        for _ in range(size):
            token_at_a_time.append(1)
        n += size

        kept = seq.logical_positions()
        assert kept == token_at_a_time.logical_positions()
        assert [e.evicted_logical for e in seq.trace] == [
            e.evicted_logical for e in token_at_a_time.trace
        ]
        if ingest > chunk:  # a sub-batch past the budget holds up to the ingest chunk
            assert all(sb.n_tokens < ingest + chunk for sb in plan.sub_batches if sb.ops)
        assert len(kept) == len(set(kept)) <= cfg.budget
        assert kept[: min(sinks, n)] == list(range(min(sinks, n)))  # sinks stay
        tail = kept[min(sinks, n) :]
        if n:
            assert not tail or tail == list(range(tail[0], n))  # contiguous suffix, newest last
        if policy == "sink":
            assert max(seq.cache_positions(), default=-1) < cfg.budget + compact
    assert mem.max_cells <= cfg.budget


@settings(max_examples=200, deadline=None)
@given(
    sinks=st.integers(0, 4),
    window=st.integers(1, 10),
    chunk_frac=st.floats(0.0, 1.0),
    sizes=appends,
)
def test_shift_mode_positions_are_dense_after_each_compaction(
    sinks: int, window: int, chunk_frac: float, sizes: list[int]
) -> None:
    chunk = 1 + int(chunk_frac * (window - 1))
    seq = CacheSequence(PolicyConfig.named("sink", sinks=sinks, window=window, evict_chunk=chunk))
    for size in sizes:
        for sb in seq.plan(size).sub_batches:
            seq.adopt_ops(sb)
            if any(isinstance(op, Shift) for op in sb.ops):
                assert seq.cache_positions() == list(range(seq.retained))
            seq.adopt_tokens(sb)
        assert seq.cache_positions() == list(range(seq.retained))  # K=0: always dense


# --- rewind: a regenerated turn takes the newest cells back out ---


@pytest.mark.parametrize("policy", ["sink", "window", "sink-noshift", "full"])
def test_a_rewind_removes_the_newest_cells_and_the_next_append_lands_where_they_were(
    policy: str,
) -> None:
    """After a rewind the sequence is where one that never took those tokens would be, but for
    what the stream evicted meanwhile (evicted is gone for good)."""
    cfg = (
        PolicyConfig.named(policy, sinks=2, window=6)
        if policy != "full"
        else (PolicyConfig.named("full", window=16))
    )
    seq = CacheSequence(cfg)
    seq.append(7 if policy == "full" else 12)
    before_cells = seq.cells()
    n = seq.state.n_seen
    removed = seq.rewind(n - 3)
    assert removed == (before_cells[-3].cache_pos, before_cells[-1].cache_pos + 1)
    assert seq.cells() == before_cells[:-3]
    assert seq.trace[-1].kind == "rewind" and seq.trace[-1].evicted_logical == (n - 3, n)
    (sb,) = seq.plan(1).sub_batches
    assert sb.logical_pos == n - 3 and sb.cache_pos == before_cells[-3].cache_pos
    assert seq.rewind(seq.state.n_seen) is None  # nothing to take back


def test_a_rewind_past_what_the_window_still_holds_is_refused_unchanged() -> None:
    seq = CacheSequence(PolicyConfig.named("sink", sinks=2, window=4))
    seq.append(10)  # logical 6..9 in the window, 2..5 evicted
    state = seq.state
    with pytest.raises(CannotRewind, match="window starts at 6"):
        seq.rewind(5)
    with pytest.raises(CannotRewind):
        seq.rewind(11)
    assert seq.state == state
    seq.rewind(6)
    assert seq.logical_positions() == [0, 1]
    fresh = CacheSequence(PolicyConfig.named("sink", sinks=2, window=4))
    fresh.append(3)
    fresh.rewind(1)  # nothing evicted yet: into the sinks too
    assert fresh.logical_positions() == [0]


def test_a_prompt_that_does_not_fit_the_free_cells_evicts_first_and_decodes_whole() -> None:
    """A chat turn meeting a nearly full window: without the ingest chunk it is cut around the
    eviction (what fits, evict, what fits again: three passes here); with it the same evictions come first and
    the prompt decodes in one pass, leaving exactly what token-at-a-time appends leave."""
    cut = CacheSequence(PolicyConfig.named("sink", sinks=2, window=16, evict_chunk=4))
    whole = CacheSequence(
        PolicyConfig.named("sink", sinks=2, window=16, evict_chunk=4, ingest_chunk=12)
    )
    one_by_one = CacheSequence(PolicyConfig.named("sink", sinks=2, window=16, evict_chunk=4))
    for seq in (cut, whole, one_by_one):
        seq.append(15)  # 3 cells free
    assert [sb.n_tokens for sb in cut.plan(8).sub_batches] == [3, 4, 1]
    plan = whole.plan(8)
    assert [sb.n_tokens for sb in plan.sub_batches] == [8]
    assert [op for op in plan.ops if isinstance(op, Evict)] == [
        Evict(2, 6, 2, 6),
        Evict(6, 10, 6, 10),
    ]
    assert whole.next_take(8) == 8
    whole.append(8)
    for _ in range(8):
        one_by_one.append(1)
    assert whole.logical_positions() == one_by_one.logical_positions()
    assert whole.cache_positions() == one_by_one.cache_positions()
    assert [sb.n_tokens for sb in whole.plan(13).sub_batches] != [13]  # above the ingest chunk


def test_a_prompt_never_evicts_the_whole_window_ahead() -> None:
    """Its positions continue from the newest window cell: with none left (and the shift
    deferred) they would not, and llama.cpp refuses the batch. Then it is cut as before."""
    seq = CacheSequence(
        PolicyConfig.named("sink", sinks=2, window=16, evict_chunk=4, ingest_chunk=16)
    )
    seq.append(6)  # 2 sinks, 4 window cells, 12 free
    plan = seq.plan(13)  # one eviction ahead would take all 4
    assert [sb.n_tokens for sb in plan.sub_batches] == [12, 1]
    assert not plan.sub_batches[0].ops
