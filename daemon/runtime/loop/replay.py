"""Resume's decoding: journalled chunks of different sessions decoded together, each exactly as
its live step did (the same plan, the same ops, the same sub-batch, whole)."""

from __future__ import annotations

from sinkd.cachepolicy import SubBatch
from sinkd.daemon.engine.decoding import BatchItem, by_length
from sinkd.daemon.runtime.loop.executor import Executor
from sinkd.daemon.runtime.sessions import Session
from sinkd.errors import EngineError


def replay(
    executor: Executor, chunks: list[tuple[Session, list[int], int]]
) -> list[tuple[Session, str]]:
    """One decode per chunk length (`by_length`: per-sequence streams and whole items make the
    batch's other members irrelevant to each one's bits). Returns the sessions whose chunk the
    policy would not place where the journal says, with why."""
    refused: list[tuple[Session, str]] = []
    items: list[tuple[Session, list[int], SubBatch]] = []
    for session, tokens, cache_pos in chunks:
        sb = session.seq.plan(len(tokens), max_batch=len(tokens)).sub_batches[0]
        if sb.n_tokens != len(tokens) or sb.cache_pos != cache_pos:
            refused.append(
                (
                    session,
                    f"the policy places it at cache {sb.cache_pos} ({sb.n_tokens} tokens),"
                    f" the journal says {cache_pos} ({len(tokens)} tokens)",
                )
            )
            continue
        try:
            executor.apply(session, sb)
        except EngineError as e:
            refused.append((session, str(e)))
            continue
        items.append((session, tokens, sb))
    for group in by_length(items, lambda item: len(item[1])):
        rows = executor.engine.decode_next(
            [BatchItem(s.seq_id, t, sb.cache_pos) for s, t, sb in group]
        )
        for (session, tokens, sb), row in zip(group, rows, strict=True):
            executor.absorb(session, sb, tokens, row)
    return refused
