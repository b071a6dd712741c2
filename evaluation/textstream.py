"""Feed an endless text through one sequence under a policy, scoring each chunk as it goes.

Memory stays flat: text is read incrementally, each chunk's logits are reduced to per-token losses
at once, and the sequence holds at most S+W cells.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from sinkd.cachepolicy import CacheSequence, PolicyConfig
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.metrics import rss_bytes


def token_nll(logits: np.ndarray, targets: list[int]) -> np.ndarray:
    """Negative log-likelihood of targets[i] under logits row i (natural log)."""
    rows = logits.astype(np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(rows).sum(axis=1))
    nll: np.ndarray = log_z - rows[np.arange(len(targets)), targets]
    return nll


def chunk_nll(prev_last: np.ndarray | None, rows: np.ndarray, chunk: list[int]) -> np.ndarray:
    """Losses of a chunk's tokens: row i predicts token i+1, and the previous chunk's last row (if
    any) predicts the first token. The stream's very first token is never scored."""
    if prev_last is None:
        return token_nll(rows[:-1], chunk[1:]) if len(chunk) > 1 else np.zeros(0)
    return token_nll(np.vstack([prev_last[None, :], rows[:-1]]), chunk)


@dataclass(frozen=True)
class ChunkReport:
    index: int
    tokens_seen: int
    chunk_tokens: int
    retained: int
    evicted_tokens: int
    evictions: int
    nll_sum: float
    scored: int
    rss_bytes: int

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll_sum / self.scored) if self.scored else float("nan")

    def as_dict(self) -> dict[str, float | int]:
        return {
            "chunk": self.index,
            "tokens_seen": self.tokens_seen,
            "chunk_tokens": self.chunk_tokens,
            "retained": self.retained,
            "evicted_tokens": self.evicted_tokens,
            "evictions": self.evictions,
            "perplexity": round(self.perplexity, 4),
            "rss_bytes": self.rss_bytes,
        }


def token_chunks(engine: Engine, texts: Iterable[str], chunk_tokens: int) -> Iterator[list[int]]:
    """Tokenize text pieces as they arrive and regroup them into chunks of `chunk_tokens`."""
    pending: list[int] = []
    first = True
    for text in texts:
        pending.extend(engine.vocab.tokenize(text, add_bos=first))
        first = False
        while len(pending) >= chunk_tokens:
            yield pending[:chunk_tokens]
            del pending[:chunk_tokens]
    if pending:
        yield pending


def stream_text(
    engine: Engine,
    policy: PolicyConfig,
    texts: Iterable[str],
    chunk_tokens: int = 256,
    seq_id: int = 0,
) -> Iterator[tuple[ChunkReport, CacheSequence]]:
    """Append the text chunk by chunk; each report scores the chunk's tokens given what the cache kept."""
    engine.check_policy(policy)
    seq = CacheSequence(policy)
    prev_last: np.ndarray | None = None  # logits predicting the chunk's first token
    for index, chunk in enumerate(token_chunks(engine, texts, chunk_tokens)):
        rows = engine.feed(seq_id, seq, chunk, outputs="all")
        assert rows is not None
        nll = chunk_nll(prev_last, rows, chunk)
        prev_last = rows[-1].copy()
        del rows
        r = seq.receipt()
        yield (
            ChunkReport(
                index=index,
                tokens_seen=r.n_seen,
                chunk_tokens=len(chunk),
                retained=r.retained,
                evicted_tokens=r.evicted_tokens,
                evictions=r.evictions,
                nll_sum=float(nll.sum()),
                scored=len(nll),
                rss_bytes=rss_bytes(),
            ),
            seq,
        )
