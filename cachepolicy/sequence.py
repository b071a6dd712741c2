"""A sequence under a policy: its state, its eviction trace and its receipt.

`plan` is pure; an engine applies a sub-batch's ops to the real cache and then calls `adopt_ops` and
`adopt_tokens`, so this object always describes what the cache holds. `append` does both at once for
simulation and tests.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from sinkd.cachepolicy.config import PolicyConfig
from sinkd.cachepolicy.plan import AppendPlan, Evict, SeqState, Shift, SubBatch, plan_append
from sinkd.cachepolicy.policy_errors import CacheFull, CannotRewind
from sinkd.cachepolicy.recall_plan import RecalledSpan

DEFAULT_TRACE_CAPACITY = 256


@dataclass(frozen=True)
class Cell:
    cache_pos: int
    logical_pos: int


@dataclass(frozen=True)
class TraceEvent:
    """One eviction: what left (logical and cache ranges) and how the window moved, if it did; or
    one recall (kind "recall"): which stored passage came back, from where and to where."""

    at_token: int  # tokens seen when the eviction (or the recall) happened
    evicted_logical: tuple[int, int]
    evicted_cache: tuple[int, int]
    shift_delta: int  # 0 when the shift was deferred (K) or the mode keeps positions
    shifted_cache: tuple[int, int] | None
    kind: str = "evict"
    passage_id: int = 0
    recalled_source: tuple[int, int] | None = None  # where the text was first seen
    recalled_logical: tuple[int, int] | None = None  # where its copy goes in the stream

    def as_dict(self) -> dict[str, Any]:
        return {
            "at_token": self.at_token,
            "evicted_logical": list(self.evicted_logical),
            "evicted_cache": list(self.evicted_cache),
            "shift_delta": self.shift_delta,
            "shifted_cache": list(self.shifted_cache) if self.shifted_cache else None,
            "kind": self.kind,
            "passage_id": self.passage_id,
            "recalled_source": list(self.recalled_source) if self.recalled_source else None,
            "recalled_logical": list(self.recalled_logical) if self.recalled_logical else None,
        }

    @classmethod
    def from_dict(cls, e: dict[str, Any]) -> TraceEvent:
        def rng(v: Any) -> tuple[int, int] | None:
            return (int(v[0]), int(v[1])) if v else None

        return cls(
            at_token=e["at_token"],
            evicted_logical=rng(e["evicted_logical"]) or (0, 0),
            evicted_cache=rng(e["evicted_cache"]) or (0, 0),
            shift_delta=e["shift_delta"],
            shifted_cache=rng(e["shifted_cache"]),
            kind=e.get("kind", "evict"),
            passage_id=int(e.get("passage_id", 0)),
            recalled_source=rng(e.get("recalled_source")),
            recalled_logical=rng(e.get("recalled_logical")),
        )


@dataclass(frozen=True)
class Receipt:
    """Content-free account of what a sequence retains: positions and counts only."""

    config: PolicyConfig
    n_seen: int
    retained: int
    anchors_logical: tuple[int, int]  # [start, end)
    recent_logical: tuple[int, int]
    anchors_cache: tuple[int, int]
    recent_cache: tuple[int, int]
    pending_gap: int
    evictions: int
    evicted_tokens: int
    shifts: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.config.as_dict(),
            "n_seen": self.n_seen,
            "retained": self.retained,
            "anchors_logical": list(self.anchors_logical),
            "recent_logical": list(self.recent_logical),
            "anchors_cache": list(self.anchors_cache),
            "recent_cache": list(self.recent_cache),
            "pending_gap": self.pending_gap,
            "evictions": self.evictions,
            "evicted_tokens": self.evicted_tokens,
            "shifts": self.shifts,
        }


class CacheSequence:
    def __init__(self, config: PolicyConfig, trace_capacity: int = DEFAULT_TRACE_CAPACITY) -> None:
        self.config = config
        self.state = SeqState.empty(config)
        self.trace: deque[TraceEvent] = deque(maxlen=trace_capacity)

    def plan(self, n_tokens: int, max_batch: int | None = None) -> AppendPlan:
        return plan_append(self.config, self.state, n_tokens, max_batch)

    def next_take(self, n_tokens: int) -> int:
        """How many of the next `n_tokens` fit in one sub-batch (the rest waits for an eviction).

        A scheduler sizes a session's share of a step with this: once the budget is full that is E
        tokens, and reserving more would leave the rest of the step empty."""
        if n_tokens <= 0:
            return 0
        try:
            return self.plan(n_tokens, max_batch=n_tokens).sub_batches[0].n_tokens
        except CacheFull:
            return n_tokens  # the executor refuses it with the reason

    def adopt_ops(self, sub_batch: SubBatch) -> None:
        """Record that `sub_batch.ops` were applied to the cache."""
        if sub_batch.ops:
            self.trace.extend(_events(self.state, sub_batch))
        self.state = sub_batch.after_ops

    def adopt_tokens(self, sub_batch: SubBatch) -> None:
        """Record that the sub-batch's tokens were decoded into the cache."""
        self.state = sub_batch.after

    def append(self, n_tokens: int, max_batch: int | None = None) -> AppendPlan:
        plan = self.plan(n_tokens, max_batch)
        for sub_batch in plan.sub_batches:
            self.adopt_ops(sub_batch)
            self.adopt_tokens(sub_batch)
        return plan

    def note_recall(self, span: RecalledSpan) -> None:
        """Record a recall in the trace (the append that decodes it records its own evictions)."""
        self.trace.append(
            TraceEvent(
                at_token=self.state.n_seen,
                evicted_logical=(0, 0),
                evicted_cache=(0, 0),
                shift_delta=0,
                shifted_cache=None,
                kind="recall",
                passage_id=span.passage_id,
                recalled_source=span.source,
                recalled_logical=span.stream,
            )
        )

    def rewind(self, to_n_seen: int) -> tuple[int, int] | None:
        """Drop the newest cells back to logical position `to_n_seen` (a regenerated turn); the
        cache range [p0, p1) to remove, or None when nothing goes. Only cells still retained can
        go back: below the window's start the stream has evicted what came before, so a rewind
        there would leave a hole (CannotRewind)."""
        s = self.state
        if not 0 <= to_n_seen <= s.n_seen:
            raise CannotRewind(f"cannot rewind to token {to_n_seen}: the stream holds {s.n_seen}")
        if s.evictions and to_n_seen < s.window_start:
            raise CannotRewind(
                f"cannot rewind to token {to_n_seen}: the window starts at {s.window_start}"
                " (what came after it has been evicted)"
            )
        if to_n_seen == s.n_seen:
            return None
        # window cells sit at logical - shift (the sinks too: with no eviction the shift is 0)
        removed = (to_n_seen - s.shift, s.next_cache_pos())
        self.trace.append(
            TraceEvent(
                at_token=s.n_seen,
                evicted_logical=(to_n_seen, s.n_seen),
                evicted_cache=removed,
                shift_delta=0,
                shifted_cache=None,
                kind="rewind",
            )
        )
        self.state = SeqState(
            to_n_seen, s.window_start, s.shift, s.evictions, s.evicted_tokens, s.shifts
        )
        return removed

    def fork(self) -> CacheSequence:
        """An independent copy: the state is immutable and the trace is copied."""
        child = CacheSequence(self.config, self.trace.maxlen or DEFAULT_TRACE_CAPACITY)
        child.state = self.state
        child.trace.extend(self.trace)
        return child

    def reset(self) -> None:
        self.state = SeqState.empty(self.config)
        self.trace.clear()

    @property
    def retained(self) -> int:
        return self.state.retained(self.config)

    def cells(self) -> list[Cell]:
        """Every retained cell in cache order (sinks, then the window)."""
        s = self.state
        sinks = [Cell(i, i) for i in range(s.sink_count(self.config))]
        start = max(s.window_start, s.sink_count(self.config))
        return sinks + [Cell(lp - s.shift, lp) for lp in range(start, s.n_seen)]

    def logical_positions(self) -> list[int]:
        return [c.logical_pos for c in self.cells()]

    def cache_positions(self) -> list[int]:
        return [c.cache_pos for c in self.cells()]

    def cache_span(self) -> tuple[int, int]:
        """The first and last cache position the retained cells hold; (-1, -1) when none (what
        llama.cpp's seq_pos_min/max report). Cheap: an audit asks after every step."""
        s, sinks = self.state, self.config.sinks
        n_sinks = sinks if s.n_seen > sinks else s.n_seen
        start = s.window_start if s.window_start > n_sinks else n_sinks
        if s.n_seen > start:  # the window holds cells
            return (0 if n_sinks else start - s.shift), s.n_seen - s.shift - 1
        return (0, n_sinks - 1) if n_sinks else (-1, -1)

    def receipt(self) -> Receipt:
        s = self.state
        n_sinks = s.sink_count(self.config)
        start = max(s.window_start, n_sinks)
        return Receipt(
            config=self.config,
            n_seen=s.n_seen,
            retained=s.retained(self.config),
            anchors_logical=(0, n_sinks),
            recent_logical=(start, s.n_seen),
            anchors_cache=(0, n_sinks),
            recent_cache=(start - s.shift, s.n_seen - s.shift),
            pending_gap=s.gap(self.config) if s.window_count() else 0,
            evictions=s.evictions,
            evicted_tokens=s.evicted_tokens,
            shifts=s.shifts,
        )


def _events(before: SeqState, sub_batch: SubBatch) -> list[TraceEvent]:
    """One event per eviction; the sub-batch's shift, if any, is reported with its last one."""
    evicts = [op for op in sub_batch.ops if isinstance(op, Evict)]
    shift = next((op for op in sub_batch.ops if isinstance(op, Shift)), None)
    return [
        TraceEvent(
            at_token=before.n_seen,
            evicted_logical=(evict.logical_start, evict.logical_end),
            evicted_cache=(evict.p0, evict.p1),
            shift_delta=shift.delta if shift and last else 0,
            shifted_cache=(shift.p0, shift.p1) if shift and last else None,
        )
        for last, evict in ((i == len(evicts) - 1, e) for i, e in enumerate(evicts))
    ]
