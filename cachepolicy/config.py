"""Policy configuration: which cells a sequence keeps, and how their positions move.

Named policies fix the position mode so that a control cannot be misconfigured into the method:

- ``full``: no eviction; capacity is S+W cells and appending past it raises ``CacheFull``.
- ``window``: S=0, the oldest cells leave and the rest shift down (the sliding-window control).
- ``sink``: S sinks plus a window of W, shifted (StreamingLLM).
- ``sink-noshift``: as ``sink`` but positions keep their logical values, gaps left (the control
  that shows why the method re-assigns positions by location in the cache).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, replace
from typing import Any

from sinkd.cachepolicy.policy_errors import ConfigError


class PositionMode(str, enum.Enum):
    SHIFT = "shift"
    KEEP = "keep"


class PolicyName(str, enum.Enum):
    FULL = "full"
    WINDOW = "window"
    SINK = "sink"
    SINK_NOSHIFT = "sink-noshift"


_MODE_OF = {
    PolicyName.FULL: PositionMode.KEEP,
    PolicyName.WINDOW: PositionMode.SHIFT,
    PolicyName.SINK: PositionMode.SHIFT,
    PolicyName.SINK_NOSHIFT: PositionMode.KEEP,
}


@dataclass(frozen=True)
class PolicyConfig:
    """S sinks, a window of W, eviction chunk E and compaction interval K.

    NOTE: in shift mode cache positions stay below S+W+K; in keep mode they equal logical positions
    and grow without bound (that is the point of the ``sink-noshift`` control).
    """

    policy: PolicyName
    sinks: int
    window: int
    evict_chunk: int = 1
    compact_interval: int = 0
    # past the budget, an append of many tokens evicts ahead and decodes up to this many at once
    # (rounded up to E); 0: E at a time. The same evictions, bigger sub-batches: faster, but the
    # first tokens of a sub-batch see a shorter window (bench/ingest.py measures the cost)
    ingest_chunk: int = 0

    def __post_init__(self) -> None:
        for field in ("sinks", "window", "evict_chunk", "compact_interval", "ingest_chunk"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(field, f"must be an integer, got {value!r}")
        if self.sinks < 0:
            raise ConfigError("sinks", f"must be >= 0, got {self.sinks}")
        if self.window < 1:
            raise ConfigError("window", f"must be >= 1, got {self.window}")
        if not 1 <= self.evict_chunk <= self.window:
            raise ConfigError(
                "evict_chunk", f"must be in 1..window ({self.window}), got {self.evict_chunk}"
            )
        if not 0 <= self.ingest_chunk <= self.window:
            raise ConfigError(
                "ingest_chunk", f"must be in 0..window ({self.window}), got {self.ingest_chunk}"
            )
        if self.compact_interval < 0:
            raise ConfigError("compact_interval", f"must be >= 0, got {self.compact_interval}")
        if self.policy is PolicyName.WINDOW and self.sinks != 0:
            raise ConfigError("sinks", f"the window policy keeps no sinks, got {self.sinks}")
        if self.position_mode is PositionMode.KEEP and self.compact_interval != 0:
            raise ConfigError(
                "compact_interval", f"only a shifting policy compacts, {self.policy.value} does not"
            )

    @classmethod
    def named(
        cls,
        policy: str | PolicyName,
        *,
        sinks: int = 4,
        window: int = 252,
        evict_chunk: int = 1,
        compact_interval: int = 0,
        ingest_chunk: int = 0,
    ) -> PolicyConfig:
        """Build a config by policy name; the window policy ignores `sinks` (it has none)."""
        try:
            name = PolicyName(policy)
        except ValueError:
            known = ", ".join(p.value for p in PolicyName)
            shown = str(policy) if len(str(policy)) <= 64 else f"{str(policy)[:64]}..."
            raise ConfigError("policy", f"unknown policy {shown!r} (known: {known})") from None
        if name is PolicyName.WINDOW:
            sinks = 0
        if name is PolicyName.FULL:
            ingest_chunk = 0  # it never evicts
        return cls(name, sinks, window, evict_chunk, compact_interval, ingest_chunk)

    @classmethod
    def resolve(
        cls,
        policy: str | PolicyName,
        *,
        sinks: int | None,
        window: int | None,
        evict_chunk: int | None,
        compact_interval: int = 0,
        ingest_chunk: int | None = None,
        default_sinks: int,
        default_window: int,
        default_evict_chunk: int,
        default_ingest_chunk: int = 0,
    ) -> PolicyConfig:
        """The one place defaults fill what a caller left unset: S and W from the model's entry,
        E and the ingest chunk from the daemon's defaults (never above W). K's default depends on
        the final budget (a pinned system prompt grows S): `with_deferred_shift`, after."""
        w = default_window if window is None else window
        return cls.named(
            policy,
            sinks=default_sinks if sinks is None else sinks,
            window=w,
            evict_chunk=evict_chunk or min(default_evict_chunk, max(w, 1)),
            compact_interval=compact_interval,
            ingest_chunk=min(default_ingest_chunk, max(w, 0))
            if ingest_chunk is None
            else ingest_chunk,
        )

    @property
    def position_mode(self) -> PositionMode:
        return _MODE_OF[self.policy]

    @property
    def budget(self) -> int:
        """The most cells the sequence ever holds."""
        return self.sinks + self.window

    @property
    def evicts(self) -> bool:
        return self.policy is not PolicyName.FULL

    def max_cache_position(self) -> int | None:
        """Exclusive bound on cache positions, or None where they follow the transcript."""
        if self.position_mode is PositionMode.SHIFT:
            return self.budget + self.compact_interval
        if self.policy is PolicyName.FULL:
            return self.budget
        return None

    def with_deferred_shift(
        self, evictions_per_shift: int, position_limit: int | None
    ) -> PolicyConfig:
        """This policy with K set to close the gaps of `evictions_per_shift` evictions at once.

        llama.cpp re-rotates every cell of the context at each shift, whichever sequence moved, so
        a shift costs in proportion to the whole context (bench/README.md, "eviction.py"): fewer shifts buy
        throughput. K is at most W, so cache positions stay below twice the budget (a gap up to W
        measured within 0.4% of K=0 in perplexity, bench/README.md), and never past
        `position_limit`; a policy that keeps its positions is returned as it is.
        """
        if self.position_mode is not PositionMode.SHIFT or evictions_per_shift <= 1:
            return self
        # the gap reaches K at the n-th eviction
        k = min(evictions_per_shift * self.evict_chunk, self.window)
        if position_limit is not None:
            k = min(k, max(0, position_limit - self.budget))
        return replace(self, compact_interval=k)

    def check_context(self, n_ctx_seq: int) -> None:
        """Raise unless a sequence given `n_ctx_seq` cells by the engine can hold this budget."""
        if self.budget > n_ctx_seq:
            raise ConfigError(
                "window",
                f"sinks + window = {self.budget} exceeds the {n_ctx_seq} cells the engine gives"
                " a sequence",
            )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.ingest_chunk:  # absent means 0: sessions made before it existed hash the same
            del d["ingest_chunk"]
        d["policy"] = self.policy.value
        d["position_mode"] = self.position_mode.value
        return d
