"""Recall, planned: which stored passages come back into the cache, and where they sit.

Recall is text retrieval, not KV reuse: a recalled passage's tokens are decoded fresh, appended to
the stream just before the query (they join the window, so they are near the question, and the
stream evicts them like any other cells). `plan_recall` is pure: it picks passages within the
budget, gives each its stream positions, and returns the ordinary append plan for them (which cells
leave, which shift follows), so the cache never holds more than S+W cells.

Each recalled span keeps two logical ranges: where its text was in the transcript (`source`) and
where the copy now sits (`stream`). Evicting the copy never stores it again: it is already stored.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sinkd.cachepolicy.config import PolicyConfig
from sinkd.cachepolicy.plan import AppendPlan, SeqState, plan_append
from sinkd.cachepolicy.policy_errors import ConfigError


class RecallMode(str, enum.Enum):
    OFF = "off"  # nothing is stored: evicted text is gone (the controls' default)
    MANUAL = "manual"  # evicted text is stored and searchable; it comes back on a Recall call
    AUTO = "auto"  # as manual, and before every chat turn with the user's message as the query

    @property
    def stores(self) -> bool:
        return self is not RecallMode.OFF


@dataclass(frozen=True)
class RecallConfig:
    """`budget`: the most tokens one recall adds to the cache (frames included); `passages`: the
    most passages; `threshold`: the lowest BM25 score that may come back; `dense_threshold`: the
    lowest cosine of sentence vectors that may (either suffices)."""

    mode: RecallMode = RecallMode.OFF
    budget: int = 96
    passages: int = 2
    threshold: float = 1.0
    dense_threshold: float = 0.35
    # the conversation takes part in its tenant's memory across conversations (the tenant opted
    # in, and the conversation was not made private): the user's words are kept for the others,
    # and a turn recalls from theirs after its own
    across: bool = False

    def __post_init__(self) -> None:
        for name in ("budget", "passages"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"recall.{name}", f"must be an integer >= 1, got {value!r}")
        if not isinstance(self.threshold, int | float) or self.threshold < 0:
            raise ConfigError("recall.threshold", f"must be >= 0, got {self.threshold!r}")
        d = self.dense_threshold
        if not isinstance(d, int | float) or isinstance(d, bool) or not -1 <= d <= 1.01:
            raise ConfigError("recall.dense_threshold", f"must be a cosine in [-1, 1], got {d!r}")

    @classmethod
    def named(cls, mode: str | RecallMode, **kwargs: Any) -> RecallConfig:
        try:
            m = RecallMode(mode)
        except ValueError:
            shown = str(mode)[:64]
            raise ConfigError(
                "recall.mode", f"unknown mode {shown!r} (known: off, manual, auto)"
            ) from None
        return cls(m, **kwargs)

    def check(self, policy: PolicyConfig) -> None:
        """Refuse a budget the window cannot hold beside the query (at most half the window)."""
        if self.budget > policy.window // 2:
            raise ConfigError(
                "recall.budget",
                f"{self.budget} tokens exceed half the window ({policy.window} cells): the recalled"
                " text would push the question's own context out",
            )

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "budget": self.budget,
            "passages": self.passages,
            "threshold": float(self.threshold),
            "dense_threshold": float(self.dense_threshold),
            "across": self.across,
        }


def check_recallable(policy: PolicyConfig) -> None:
    """The full policy never evicts: it has nothing to recall and no room to recall into."""
    if not policy.evicts:
        raise ConfigError(
            "recall",
            "the full policy never evicts, so nothing leaves the cache to be recalled",
        )


@dataclass(frozen=True)
class Candidate:
    """A stored passage a search found: its id, transcript range, size in tokens, its rank score
    (`score`: BM25 alone, or the two searches fused) and each search's own score (`lexical`:
    BM25; `dense`: cosine of the sentence vectors, 0 where no vector was compared), and who said
    it (`speaker`: the role of its turn, "text" outside any turn)."""

    passage_id: int
    source: tuple[int, int]
    n_tokens: int
    score: float
    lexical: float
    dense: float
    speaker: str = "unknown"
    # another conversation of the tenant's, where the passage was said ("": this one's own memory)
    conversation: str = ""
    said_at: float = 0.0  # unix time it was said (kept for another conversation's)

    @property
    def ref(self) -> tuple[str, int]:
        """What names the passage: its number, within its conversation's memory or the tenant's."""
        return self.conversation, self.passage_id

    def strong(self, config: RecallConfig) -> bool:
        """Worth recalling: BM25 at the threshold, or a sentence vector as close as
        `dense_threshold` (a paraphrase shares no word, so BM25 alone would drop it)."""
        return self.lexical >= config.threshold or self.dense >= config.dense_threshold


@dataclass(frozen=True)
class RecalledSpan:
    """A passage's copy in the stream: `offset` into the recall's tokens, `stream` its logical
    positions there, `source` where the text was first seen (the copy may leave out the source's
    control tokens, so the two lengths can differ)."""

    passage_id: int
    source: tuple[int, int]
    stream: tuple[int, int]
    offset: int
    score: float
    at: float  # unix time of the recall
    speaker: str = "unknown"  # who said the passage (its turn's role; "text" outside a turn)
    # from the tenant's memory across conversations: the conversation it was said in, and when
    # (`passage_id` then numbers it in the tenant's memory; `source` is its place there)
    conversation: str = ""
    said_at: float = 0.0

    @property
    def ref(self) -> tuple[str, int]:
        return self.conversation, self.passage_id

    def as_dict(self) -> dict[str, Any]:
        return {
            "passage_id": self.passage_id,
            "speaker": self.speaker,
            "conversation": self.conversation,
            "said_unix_time": self.said_at,
            "source_logical": list(self.source),
            "stream_logical": list(self.stream),
            "score": self.score,
            "recalled_unix_time": self.at,
        }


@dataclass(frozen=True)
class RecallPlan:
    spans: tuple[RecalledSpan, ...]
    n_tokens: int  # passages and frames together
    append: AppendPlan


def select(
    candidates: list[Candidate],
    config: RecallConfig,
    frame_tokens: int,
    second: Callable[[Candidate], bool] = lambda c: False,
    ranked: bool = False,
) -> list[Candidate]:
    """Best first, strong enough (`Candidate.strong`), at most `passages`, each with its frame within the budget;
    then in transcript order, so the text reads as it was first said. Candidates `second` names
    (the model's own words) are taken only after every other, and laid out after them. `ranked`:
    the candidates come ranked already (the tenant's memory: a correction first), taken in their
    order rather than by score."""
    chosen: list[Candidate] = []
    used = 0

    def order(c: Candidate) -> tuple[bool, float, tuple[int, int]]:
        return (second(c), 0.0, (0, 0)) if ranked else (second(c), -c.score, c.source)

    for c in sorted(candidates, key=order):
        if len(chosen) == config.passages:
            break
        cost = c.n_tokens + frame_tokens
        if not c.strong(config) or c.n_tokens < 1 or used + cost > config.budget:
            continue
        chosen.append(c)
        used += cost
    return sorted(chosen, key=lambda c: (second(c), c.source))


def plan_recall(
    policy: PolicyConfig,
    state: SeqState,
    chosen: list[Candidate],
    frame_before: int,
    frame_after: int,
    at: float,
    n_before: int = 0,
) -> RecallPlan:
    """Lay the chosen passages out after `n_before` tokens already queued (a pending prefix), each
    wrapped in its frame, and plan their append. Raises CacheFull on the full policy."""
    check_recallable(policy)
    spans: list[RecalledSpan] = []
    offset = 0
    base = state.n_seen + n_before
    for c in chosen:
        start = offset + frame_before
        spans.append(
            RecalledSpan(
                c.passage_id,
                c.source,
                (base + start, base + start + c.n_tokens),
                start,
                c.score,
                at,
                c.speaker,
                c.conversation,
                c.said_at,
            )
        )
        offset = start + c.n_tokens + frame_after
    return RecallPlan(tuple(spans), offset, plan_append(policy, state, n_before + offset))


def held(spans: list[RecalledSpan], window_start: int, n_seen: int) -> list[RecalledSpan]:
    """What of each recalled span the cache holds now (window [window_start, n_seen)): spans the
    stream has evicted entirely are gone, partly evicted ones are cut to what is left (`source`
    still names the whole passage the copy came from)."""
    out = []
    for s in spans:
        lo, hi = max(s.stream[0], window_start), min(s.stream[1], n_seen)
        if lo >= hi:
            continue
        out.append(replace(s, stream=(lo, hi), offset=s.offset + (lo - s.stream[0])))
    return out


def in_any(logical: int, spans: list[RecalledSpan]) -> bool:
    return any(s.stream[0] <= logical < s.stream[1] for s in spans)
