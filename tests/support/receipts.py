"""A receipt with every field set (recall's span and report too), for tests of what carries one."""

from __future__ import annotations

import dataclasses

from sinkd.cachepolicy import PolicyConfig
from sinkd.cachepolicy.recall_plan import RecallConfig, RecalledSpan, RecallMode
from sinkd.daemon.runtime.api import RecallReport, Receipt

SPAN = RecalledSpan(3, (10, 26), (300, 316), 0, 4.5, 1_700_000_000.25)
REPORT = RecallReport("ab" * 32, 3, 7, 4.5, 1.0, "recalled 1 passage(s), 22 tokens", (SPAN,))


def receipt(**changes: object) -> Receipt:
    r = Receipt(
        session_id="s_0123456789abcdef",
        generation="f" * 64,
        reset_count=2,
        state="idle",
        tenant="alice",
        policy=PolicyConfig.named("sink", sinks=4, window=60, evict_chunk=8, compact_interval=24),
        n_seen=1234,
        retained=64,
        anchors_logical=(0, 4),
        recent_logical=(1174, 1234),
        anchors_cache=(0, 4),
        recent_cache=(20, 80),
        pending_gap=16,
        evictions=146,
        evicted_tokens=1170,
        shifts=6,
        kv_payload_bytes=64 * 23040,
        model="smollm2-135m-instruct",
        model_sha256="b1" * 32,
        system_prompt_tokens=0,
        system_prompt_tokens_pinned=0,
        system_prompt_sha256="e3" * 32,
        resume="new",
        stale_reason="",
        snapshot_n_seen=-1,
        snapshot_unix_time=0.0,
        journal_chunks=12,
        journal_tokens=1234,
        recall=RecallConfig(RecallMode.AUTO, 30, 2, 1.0),
        recalled=(SPAN,),
        memory_passages=40,
        memory_tokens=1170,
        memory_bytes=9000,
        last_recall=REPORT,
    )
    return dataclasses.replace(r, **changes)  # type: ignore[arg-type]
