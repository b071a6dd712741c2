"""The typed objects survive protobuf both ways (the servicer's side and the client's)."""

from __future__ import annotations

import dataclasses

import pytest

from sinkd.cachepolicy import PolicyConfig
from sinkd.cachepolicy.recall_plan import RecallConfig
from sinkd.cachepolicy.sequence import TraceEvent
from sinkd.daemon.runtime.api import Done, PassageView, Receipt, TokenEvent
from sinkd.proto import convert
from tests.support.receipts import REPORT, receipt

pytestmark = pytest.mark.unit


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
