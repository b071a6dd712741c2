"""The turn operations and the scheduler's admission against the fake engine: appends past n_batch
cut to fit, the window's evictions carried out on the cells as the policy planned them, generation
bounds and stops, cancels, stale handles, the session limit. Logic only: what the real model
computes is tests/test_daemon.py's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sinkd.daemon.runtime.api import (
    CancelToken,
    ChatRequest,
    Done,
    GenerationOptions,
    PolicyRequest,
    SamplingRequest,
    TokenEvent,
)
from sinkd.daemon.runtime.loop.jobs import loops
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import Cancelled, InvalidInput, SessionLimit, StaleGeneration
from tests.support import fake_engine
from tests.support.fake_engine import BYTE0, IM_START, N_VOCAB
from tests.support.services import fake_engine_of, fake_service

pytestmark = pytest.mark.unit
ALICE, BOB = Principal("alice"), Principal("bob")
WINDOW = PolicyRequest(name="sink", sinks=4, window=60, evict_chunk=8)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[SinkdService]:
    s = fake_service(tmp_path, n_batch=64, step_tokens=32)
    yield s
    s.stop()


def events(stream: Iterator[TokenEvent | Done]) -> tuple[list[TokenEvent], Done]:
    tokens, done = [], None
    for event in stream:
        if isinstance(event, TokenEvent):
            tokens.append(event)
        else:
            done = event
    assert done is not None
    return tokens, done


def test_a_long_append_is_cut_below_n_batch_and_the_window_holds(service: SinkdService) -> None:
    """1,000 tokens through a 64-token batch (the fake refuses a larger one, as llama.cpp would
    abort): each eviction the policy planned is carried out on the cells, which end as its
    account says (the auditor checks each step against the cells too)."""
    h = service.create(ALICE, WINDOW).handle
    result = service.append(ALICE, h, "word " * 200)
    receipt = result.receipt
    assert receipt.n_seen == 1 + 1000  # BOS, then one token per byte
    assert receipt.retained <= 4 + 60
    session = service.registry.get(h.session_id)
    assert session is not None
    held = sorted(fake_engine_of(service).cells.seqs[session.seq_id])
    spans = (receipt.anchors_cache, receipt.recent_cache)
    assert held == [p for start, end in spans for p in range(start, end)]  # the policy's account
    assert receipt.evictions > 0 and receipt.evicted_tokens == receipt.n_seen - receipt.retained


def test_generation_is_bounded_seeded_and_stops_where_asked(service: SinkdService) -> None:
    h = service.create(ALICE, WINDOW).handle
    service.append(ALICE, h, "Once upon a time")
    tokens, done = events(service.generate(ALICE, h, GenerationOptions(5)))
    assert len(tokens) <= 5 and done.reason in ("max_tokens", "eog")
    sampled = GenerationOptions(20, sampling=SamplingRequest(temperature=1.0, seed=7))
    forks = [service.fork(ALICE, h).handle for _ in range(2)]
    a, b = (events(service.generate(ALICE, f, sampled))[0] for f in forks)
    assert [t.id for t in a] == [t.id for t in b]  # the same seed, the same stream, the same draws
    text = "".join(t.text for t in a)
    if len(text) > 2:  # stop at what the reply says: it ends before the stop string
        stop = text[2]
        f = service.fork(ALICE, h).handle
        cut, done = events(
            service.generate(ALICE, f, GenerationOptions(20, (stop,), sampled.sampling))
        )
        assert done.reason == "stop" and stop not in "".join(t.text for t in cut)


@pytest.mark.parametrize("max_tokens", [0, 4097])
def test_a_generation_bound_out_of_range_is_refused(service: SinkdService, max_tokens: int) -> None:
    h = service.create(ALICE, WINDOW).handle
    service.append(ALICE, h, "Hello")
    with pytest.raises(InvalidInput, match="max_tokens"):
        list(service.generate(ALICE, h, GenerationOptions(max_tokens)))


def test_a_cancelled_token_cancels_the_turn_before_it_decodes(service: SinkdService) -> None:
    h = service.create(ALICE, WINDOW).handle
    service.append(ALICE, h, "Hello")
    token = CancelToken()
    token.cancel()  # the client went away before its turn was queued
    with pytest.raises(Cancelled):
        list(service.chat(ALICE, h, ChatRequest("Are you there?"), cancel=token))
    receipt = service.receipt(service.access.owned(ALICE, h))
    assert receipt.n_seen == 1 + len("Hello")  # nothing of the cancelled turn went in


def test_a_reset_stales_the_handle(service: SinkdService) -> None:
    h = service.create(ALICE, WINDOW).handle
    service.append(ALICE, h, "Hello")
    fresh, _ = service.reset(ALICE, h)
    assert fresh.generation != h.generation and fresh.n_seen == 0
    with pytest.raises(StaleGeneration):
        service.append(ALICE, h, "more")


def test_past_the_session_limit_create_is_refused_until_one_closes(service: SinkdService) -> None:
    """The limit of open sessions is the resident ones and the parked ones beyond them (each
    tenant holding what the other's reserve leaves it: tests/test_tenant_shares.py)."""
    capacity = service.admission.capacity(service.engine)
    assert capacity == service.max_sessions() + service.settings.max_parked_sessions
    reserve = capacity // 4  # half the pool, split between alice and bob
    handles = [service.create(ALICE, WINDOW).handle for _ in range(capacity - reserve)]
    for _ in range(reserve):
        service.create(BOB, WINDOW)
    with pytest.raises(SessionLimit, match="session limit reached"):
        service.create(ALICE, WINDOW)
    service.close(ALICE, handles[0])
    assert service.create(ALICE, WINDOW).handle.session_id != handles[0].session_id


def test_a_chat_turn_is_framed_for_where_the_session_stands_when_it_starts(
    service: SinkdService,
) -> None:
    """Two turns queued on one session before either starts: the second follows the first's
    reply, so it opens on a new line, as any turn after a reply does. The caller cannot know
    that when it asks; the job decides on the engine thread as it starts."""
    h = service.create(ALICE, PolicyRequest(name="sink", sinks=4, window=200)).handle
    session = service.registry.get(h.session_id)
    assert session is not None
    held, go = threading.Event(), threading.Event()

    def hold(engine: object) -> None:
        held.set()
        assert go.wait(30)

    holder = threading.Thread(target=service.scheduler.call, args=(hold,))
    holder.start()
    assert held.wait(30)  # the engine thread is busy: both turns wait in its inbox
    options = GenerationOptions(6, sampling=SamplingRequest(temperature=0.0))
    first = service.chat(ALICE, h, ChatRequest("First?", options))
    second = service.chat(ALICE, h, ChatRequest("Second?", options))
    go.set()
    holder.join(30)
    events(first)
    events(second)
    stream = service.scheduler.call(lambda e: list(session.retained.all()))
    opened = [i for i, t in enumerate(stream) if t == IM_START]
    assert len(opened) == 2 * 2  # each user turn and its reply's header (no system prompt)
    newline = fake_engine_of(service).vocab.tokenize("\n")
    assert all(stream[i - 1 : i] == newline for i in opened[1:]), stream


def test_an_empty_append_changes_nothing_or_decodes_what_a_reset_left_pending(
    service: SinkdService,
) -> None:
    h = service.create(ALICE, WINDOW, system_prompt="Be brief.").handle
    before = service.append(ALICE, h, "Hello").receipt.n_seen
    empty = service.append(ALICE, h, "")
    assert (empty.appended, empty.receipt.n_seen) == (0, before)
    fresh, _ = service.reset(ALICE, h)
    assert fresh.n_seen == 0  # the system prompt waits to go in with the next append
    h = fresh.handle
    session = service.access.owned(ALICE, h)
    after = service.append(ALICE, h, "")
    assert after.appended == 0 and after.receipt.n_seen == len(session.system_tokens)
    listed = {r.session_id: r.n_seen for r in service.reads.list_sessions(ALICE)}
    assert listed == {h.session_id: len(session.system_tokens)}


@pytest.mark.parametrize(
    ("ids", "looping"),
    [
        ([7] * 64, True),  # one token over and over
        ([1, 2, 3] * 22, True),  # a short block past the span
        (list(range(40)) * 4, True),  # a 40-token block four times
        ([1, 2, 3] * 10, False),  # too short a span to call a loop
        (list(range(200)), False),  # no repeat
        (list(range(40)) * 3 + list(range(39)), False),  # three times and a bit: not yet
    ],
)
def test_the_repetition_guard_sees_a_loop_and_nothing_else(ids: list[int], looping: bool) -> None:
    assert loops(ids) is looping


def test_an_unbounded_reply_that_loops_is_cut_and_a_bounded_one_is_not(
    service: SinkdService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client names no max tokens: the reply runs to its turn's end, a loop cut by the guard
    (reason "repetition") long before the cap. A client that names max tokens gets them all."""

    def abc_forever(cells: dict[int, int]) -> np.ndarray:
        row = np.zeros(N_VOCAB, np.float32)
        row[BYTE0 + ord("abc"[len(cells) % 3])] = 1.0
        return row

    monkeypatch.setattr(fake_engine, "next_token_logits", abc_forever)
    h = service.create(ALICE, WINDOW).handle
    service.append(ALICE, h, "Say abc.")
    tokens, done = events(service.generate(ALICE, h, GenerationOptions()))
    assert done.reason == "repetition" and 64 <= len(tokens) < 256
    tokens, done = events(service.generate(ALICE, h, GenerationOptions(100)))
    assert done.reason == "max_tokens" and len(tokens) == 100
