"""How many sessions the context admits, and the one admission check every new sequence passes
(create, fork, resume)."""

from __future__ import annotations

from sinkd.daemon import failpoints
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.sessions import Registry
from sinkd.errors import ResourceExhausted, Unsupported


def admitted_sessions(
    sequences: int, cells_per_session: int, bytes_per_token: float, max_kv_bytes: int | None
) -> int:
    """The context's sequences, and with a memory budget as many sessions as it holds at their
    tensor-shape size."""
    if not max_kv_bytes:
        return sequences
    return min(sequences, int(max_kv_bytes // (cells_per_session * bytes_per_token)))


class Admission:
    def __init__(self, registry: Registry, metrics: Metrics, max_kv_bytes: int | None) -> None:
        self.registry = registry
        self.metrics = metrics
        self.max_kv_bytes = max_kv_bytes

    def limit(self, engine: Engine) -> int:
        return admitted_sessions(
            engine.config.n_seq_max, engine.n_ctx_seq, engine.kv_bytes_per_token, self.max_kv_bytes
        )

    def acquire(self, engine: Engine) -> int:
        """A free, empty sequence for one more session, or ResourceExhausted naming the limit.
        Engine thread; the caller releases it if what follows fails."""
        limit = self.limit(engine)
        if len(self.registry) >= limit:
            self.metrics.alloc_failures.inc()
            raise ResourceExhausted(
                f"session limit reached: {limit} sessions of {engine.n_ctx_seq} cells x"
                f" {engine.kv_bytes_per_token:.0f} bytes"
            )
        try:
            seq_id = engine.cells.acquire_seq()
        except Unsupported as e:
            self.metrics.alloc_failures.inc()
            raise ResourceExhausted(str(e)) from None
        try:
            failpoints.hit("sequence-acquired")
            engine.cells.clear(seq_id)
        except BaseException:
            engine.cells.release_seq(seq_id)
            raise
        return seq_id
