"""The typed objects survive protobuf both ways (the servicer's side and the client's)."""

from __future__ import annotations

import dataclasses

import pytest

from sinkd.cachepolicy import PolicyConfig
from sinkd.cachepolicy.recall_plan import RecallConfig, RecalledSpan, RecallMode
from sinkd.cachepolicy.sequence import TraceEvent
from sinkd.daemon.runtime.api import Done, PassageView, RecallReport, Receipt, TokenEvent
from sinkd.proto import convert

pytestmark = pytest.mark.unit

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


@pytest.mark.parametrize(
    "r",
    [
        receipt(),
        receipt(last_recall=None, recalled=(), recall=RecallConfig()),
        receipt(policy=PolicyConfig.named("window", window=252, ingest_chunk=64), state="stale"),
    ],
)
def test_a_receipt_comes_back_as_it_went(r: Receipt) -> None:
    assert convert.receipt_from_pb(convert.receipt_to_pb(r)) == r


def test_events_traces_and_passages_come_back_as_they_went() -> None:
    token = TokenEvent(42, " hello", 3, 7.25)
    done = Done("max_tokens", 4, receipt(), REPORT)
    for event in (token, done, dataclasses.replace(done, recall=None)):
        assert convert.event_from_pb(convert.event_to_pb(event)) == event
    for trace in (
        TraceEvent(100, (4, 20), (4, 20), -16, (20, 80)),
        TraceEvent(120, (20, 36), (20, 36), 0, None),
        TraceEvent(130, (0, 0), (0, 0), 0, None, "recall", 3, (10, 26), (300, 316)),
    ):
        assert convert.trace_from_pb(convert.trace_to_pb(trace)) == trace
    for passage in (
        PassageView(3, (10, 26), 16, "the owner's text", 1.5, True, 2.25),
        PassageView(4, (26, 30), 4, "", 2.5, False, None),
    ):
        assert convert.passage_from_pb(convert.passage_to_pb(passage)) == passage
