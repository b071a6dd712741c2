"""Sequence state and the one function that computes every eviction.

A sequence holds the first S tokens of its stream (the sinks) and a contiguous window ending at the
newest token. Window cells sit at cache position ``logical - shift``: the shift is the total distance
the window has been moved down to close gaps left by evictions. Sinks never move, so for them the
cache position equals the logical position. The state is therefore four integers, whatever W is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sinkd.cachepolicy.config import PolicyConfig, PositionMode
from sinkd.cachepolicy.policy_errors import CacheFull, ConfigError


@dataclass(frozen=True)
class SeqState:
    """Immutable per-sequence state; every field is a count or a logical position."""

    n_seen: int = 0  # logical tokens appended so far (the next token's logical position)
    window_start: int = 0  # logical position of the oldest window cell
    shift: int = 0  # window cache position = logical position - shift
    evictions: int = 0  # eviction events so far
    evicted_tokens: int = 0
    shifts: int = 0  # position shifts (K-shifts) applied so far

    @classmethod
    def empty(cls, config: PolicyConfig) -> SeqState:
        return cls(window_start=config.sinks)

    def seen(self, n: int) -> SeqState:
        """This state after `n` more tokens are decoded (as `replace` would, without its
        introspection: a decode step plans once per token)."""
        return SeqState(
            self.n_seen + n,
            self.window_start,
            self.shift,
            self.evictions,
            self.evicted_tokens,
            self.shifts,
        )

    def sink_count(self, config: PolicyConfig) -> int:
        return min(config.sinks, self.n_seen)

    def window_count(self) -> int:
        return max(0, self.n_seen - self.window_start)

    def retained(self, config: PolicyConfig) -> int:
        return self.sink_count(config) + self.window_count()

    def next_cache_pos(self) -> int:
        return self.n_seen - self.shift

    def gap(self, config: PolicyConfig) -> int:
        """Cache positions left empty between the sinks and the window, awaiting compaction."""
        return self.window_start - self.shift - config.sinks


@dataclass(frozen=True)
class Evict:
    """``llama_memory_seq_rm(seq, p0, p1)``: remove cache positions [p0, p1)."""

    p0: int
    p1: int
    logical_start: int
    logical_end: int


@dataclass(frozen=True)
class Shift:
    """``llama_memory_seq_add(seq, p0, p1, delta)``: move cache positions [p0, p1) by delta."""

    p0: int
    p1: int
    delta: int


Op = Evict | Shift


@dataclass(frozen=True)
class SubBatch:
    """Apply `ops`, then decode tokens[offset:offset+n_tokens] at consecutive cache positions.

    `after_ops` is the state once the ops are applied and `after` once the tokens are decoded, so an
    engine that fails between the two still knows exactly what the cache holds.
    """

    ops: tuple[Op, ...]
    offset: int
    n_tokens: int
    cache_pos: int
    logical_pos: int
    after_ops: SeqState
    after: SeqState


@dataclass(frozen=True)
class AppendPlan:
    before: SeqState
    n_tokens: int
    sub_batches: tuple[SubBatch, ...]

    @property
    def after(self) -> SeqState:
        return self.sub_batches[-1].after if self.sub_batches else self.before

    @property
    def ops(self) -> tuple[Op, ...]:
        return tuple(op for sb in self.sub_batches for op in sb.ops)


def plan_append(
    config: PolicyConfig, state: SeqState, n_tokens: int, max_batch: int | None = None
) -> AppendPlan:
    """Split an append of `n_tokens` into sub-batches that never hold more than S+W cells.

    When the budget is full the oldest E window cells leave at once; in shift mode the window then
    moves down to close the gap once the gap reaches K (K=0: at every eviction). Evictions happen at
    the same stream positions however the tokens are grouped into appends, so a chunk larger than the
    budget leaves exactly what token-at-a-time appends leave.
    """
    if n_tokens < 0:
        raise ConfigError("n_tokens", f"must be >= 0, got {n_tokens}")
    if max_batch is not None and max_batch < 1:
        raise ConfigError("max_batch", f"must be >= 1, got {max_batch}")
    budget = config.budget
    retained = state.retained(config)
    if not config.evicts and retained + n_tokens > budget:
        raise CacheFull(retained, n_tokens, budget)

    before = state
    sub_batches: list[SubBatch] = []
    offset = 0
    while offset < n_tokens:
        ops: tuple[Op, ...] = ()
        free = budget - state.retained(config)
        if free == 0:
            ops, state = _evict(config, state, _evictions_ahead(config, n_tokens - offset))
            free = budget - state.retained(config)
        elif offset == 0 and (room := _room_ahead(config, state, n_tokens, free, max_batch)):
            ops, state = _evict(config, state, room)
            free = budget - state.retained(config)
        after_ops = state
        take = min(n_tokens - offset, free, max_batch or free)
        after = state.seen(take)
        sub_batches.append(
            SubBatch(ops, offset, take, state.next_cache_pos(), state.n_seen, after_ops, after)
        )
        state = after
        offset += take
    return AppendPlan(before, n_tokens, tuple(sub_batches))


def _room_ahead(
    config: PolicyConfig, state: SeqState, n_tokens: int, free: int, max_batch: int | None
) -> int:
    """E-evictions to make before a prompt-sized append (at most the ingest chunk) that does not
    fit the free cells, so that it decodes whole, in one pass, rather than as the part that fits,
    an eviction, and the rest: the same evictions token-at-a-time appends make, made first. 0 where
    that is not so (no ingest chunk, a larger append, a cap below it, or too few window cells to
    evict while one stays). Only whole: a replayed chunk plans alike."""
    if not config.evicts or not 0 < free < n_tokens <= config.ingest_chunk:
        return 0
    if max_batch is not None and max_batch < n_tokens:
        return 0
    times = -(-(n_tokens - free) // config.evict_chunk)
    # a window cell must stay: the prompt's positions continue from the newest one (llama.cpp
    # refuses a batch that does not start right after what the sequence holds)
    return times if times * config.evict_chunk < state.window_count() else 0


def _evictions_ahead(config: PolicyConfig, remaining: int) -> int:
    """How many E-evictions to make now: one, or with an ingest chunk as many as the next
    min(remaining, ingest_chunk) tokens will need (token-at-a-time appends make the same ones, each
    as the first token past a full budget arrives)."""
    e = config.evict_chunk
    if config.ingest_chunk <= e or remaining <= e:
        return 1
    # never the whole window at once: the batch continues from its newest cell (`_room_ahead`)
    return max(1, min(-(-min(remaining, config.ingest_chunk) // e), (config.window - 1) // e))


def _evict(
    config: PolicyConfig, state: SeqState, times: int = 1
) -> tuple[tuple[Op, ...], SeqState]:
    """Remove the oldest E window cells `times` over, then shift the window down if the gap reached
    K (one shift closes the gaps of all of them)."""
    ops: list[Op] = []
    for _ in range(times):
        start = state.window_start
        end = start + config.evict_chunk
        ops.append(Evict(start - state.shift, end - state.shift, start, end))
        state = replace(
            state,
            window_start=end,
            evictions=state.evictions + 1,
            evicted_tokens=state.evicted_tokens + config.evict_chunk,
        )
    gap = state.gap(config)
    if config.position_mode is PositionMode.KEEP or gap < max(config.compact_interval, 1):
        return tuple(ops), state
    shift = Shift(state.window_start - state.shift, state.n_seen - state.shift, -gap)
    return (*ops, shift), replace(state, shift=state.shift + gap, shifts=state.shifts + 1)
