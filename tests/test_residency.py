"""Sessions beyond the cache, on the fake engine: parked when another needs their sequence,
restored by their next call, who gives way first (probation, then least recent; a tenant past its
share first), what each operation does to a parked session, a new session when every resident one
is busy, damaged files, and resume with more sessions than sequences. The real model's part (the
bits a restored session computes, kill -9 while parked, the HTTP wire) is tests/test_parking.py."""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sinkd.daemon.runtime.api import (
    GenerationOptions,
    PolicyRequest,
    SamplingRequest,
    TokenEvent,
    Turn,
)
from sinkd.daemon.runtime.conversations.chats import Continuation, StatelessChatRequest
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal, Session
from sinkd.errors import ResourceExhausted, StaleGeneration
from tests.support.services import fake_engine_of, fake_service

pytestmark = pytest.mark.unit
ALICE, BOB = Principal("alice"), Principal("bob")
GREEDY = GenerationOptions(12, sampling=SamplingRequest(temperature=0.0))
POLICY = PolicyRequest(name="sink", sinks=4, window=200)


def say(
    service: SinkdService, history: list[Turn], who: Principal = ALICE
) -> tuple[Continuation, str]:
    request = StatelessChatRequest("You are terse.", tuple(history), GREEDY)
    found, events = service.chats.turn(who, request)
    return found, "".join(e.text for e in events if isinstance(e, TokenEvent))


def session_of(service: SinkdService, session_id: str) -> Session:
    session = service.registry.get(session_id)
    assert session is not None
    return session


def reply(service: SinkdService, who: Principal, handle: Any, text: str) -> tuple[str, Any]:
    """One gRPC-style turn: append, then a greedy generation; the reply and its Done (its
    receipt with the append's restore time, if the append restored the session)."""
    appended = service.append(who, handle, text, timeout=20)  # a call left waiting fails
    out, done = [], None
    for event in service.generate(who, handle, GREEDY, timeout=20):
        if isinstance(event, TokenEvent):
            out.append(event.text)
        else:
            done = event
    assert done is not None
    if appended.receipt.restored_ms:
        done = dataclasses.replace(
            done,
            receipt=dataclasses.replace(done.receipt, restored_ms=appended.receipt.restored_ms),
        )
    return "".join(out), done


def test_more_conversations_than_sequences_each_continue_round_robin(tmp_path: Path) -> None:
    """Five chats on two sequences, visited in turn for three rounds: after its first turn every
    turn continues its session (restored when parked), nothing of a history is read again, and
    every session stays open."""
    service = fake_service(tmp_path, max_sessions=2)
    try:
        chats: list[list[Turn]] = [[Turn("user", f"Chat {i} opens.")] for i in range(5)]
        ids: list[str] = []
        for chat in chats:
            found, answer = say(service, chat)
            ids.append(found.handle.session_id)
            chat.append(Turn("assistant", answer))
        for rnd in range(3):
            for i, chat in enumerate(chats):
                chat.append(Turn("user", f"Round {rnd} of chat {i}."))
                before = fake_engine_of(service).decoded
                found, answer = say(service, chat)
                assert (found.how, found.handle.session_id) == ("continued", ids[i]), found.why
                assert found.ingested_turns == 0
                # the new turn alone was decoded: its framing, its words and the reply
                assert fake_engine_of(service).decoded - before <= 40 + GREEDY.max_tokens
                chat.append(Turn("assistant", answer))
        assert len(service.registry) == 5
        assert len(service.registry.resident()) == 2 and len(service.registry.parked()) == 3
        assert service.metrics.count("restores") >= 15 and service.metrics.count("parks") >= 15
    finally:
        service.stop()


def test_a_restored_session_answers_as_the_never_parked_one(tmp_path: Path) -> None:
    """Two sessions with one history; one is parked and restored between turns: the same reply
    (the fake model is a hash of the cells, so a cell off by one changes it), and the receipt of
    the turn that restored it says so."""
    service = fake_service(tmp_path, max_sessions=2)
    try:
        kept = service.create(ALICE, POLICY).handle
        moved = service.create(ALICE, POLICY).handle
        for h in (kept, moved):
            reply(service, ALICE, h, "The same opening words.")
        service.create(ALICE, POLICY)  # a third: the least recently used one is parked
        assert session_of(service, kept.session_id).parked
        b, done_b = reply(service, ALICE, moved, "And then?")  # never parked
        a, done_a = reply(service, ALICE, kept, "And then?")  # restored first
        assert a == b and a
        assert done_a.receipt.restored_ms > 0 and done_a.receipt.restores == 1
        assert done_b.receipt.residency == "resident" and done_b.receipt.restored_ms == 0
        assert service.receipt(session_of(service, kept.session_id)).residency == "resident"
    finally:
        service.stop()


def test_one_shot_sessions_give_way_first_then_the_least_recent(tmp_path: Path) -> None:
    service = fake_service(tmp_path, max_sessions=3)
    try:
        chat = [Turn("user", "A real conversation.")]
        first, answer = say(service, chat)
        chat += [Turn("assistant", answer), Turn("user", "Go on.")]
        say(service, chat)  # continued: out of probation
        title, _ = say(service, [Turn("user", "A title, please.")])
        tags, _ = say(service, [Turn("user", "Tags, please.")])
        say(service, [Turn("user", "Follow-ups, please.")])  # the fourth: one gives way
        assert session_of(service, title.handle.session_id).parked  # the oldest one-shot
        assert not session_of(service, first.handle.session_id).parked
        say(service, [Turn("user", "One more one-shot.")])
        assert session_of(service, tags.handle.session_id).parked
        assert not session_of(service, first.handle.session_id).parked
    finally:
        service.stop()


def test_a_tenant_past_its_share_of_residents_gives_way_first(tmp_path: Path) -> None:
    """Alice holds every sequence; Bob's new session parks one of hers, though his own older
    session is the least recently used."""
    service = fake_service(tmp_path, max_sessions=3)
    try:
        bobs = service.create(BOB, POLICY).handle
        reply(service, BOB, bobs, "Bob's chat.")
        alices = [service.create(ALICE, POLICY).handle for _ in range(2)]
        for h in alices:
            reply(service, ALICE, h, "Alice's chat.")
        service.create(BOB, POLICY)
        assert not session_of(service, bobs.session_id).parked
        assert [session_of(service, h.session_id).parked for h in alices] == [True, False]
    finally:
        service.stop()


def park(service: SinkdService, session: Session) -> None:
    """Park an idle session now, as the residency would for another's sequence."""
    assert service.scheduler.call(lambda e: service.scheduler.residency.park(e, session))
    assert session.parked and session.seq_id == -1


def test_fork_rewind_reset_and_close_of_a_parked_session(tmp_path: Path) -> None:
    service = fake_service(tmp_path, max_sessions=2)
    try:
        h = service.create(ALICE, POLICY).handle
        text, _ = reply(service, ALICE, h, "Something to keep.")
        session = session_of(service, h.session_id)
        park(service, session)
        child = service.fork(ALICE, h)  # the parent's cells come back to be copied
        assert child.n_seen == session.seq.state.n_seen and child.residency == "resident"
        assert not session.parked
        park(service, session)  # a regenerate's rewind brings them back too
        n = session.seq.state.n_seen
        service.scheduler.call(lambda e: service.lifecycle.rewind(e, session, h.generation, n - 2))
        assert session.seq.state.n_seen == n - 2 and not session.parked
        park(service, session)
        fresh, _ = service.reset(ALICE, h)  # stays parked, empty
        assert fresh.n_seen == 0 and fresh.residency == "parked"
        again, done = reply(service, ALICE, fresh.handle, "Something to keep.")
        assert again == text and done.receipt.residency == "resident"
        park(service, session)
        service.close(ALICE, fresh.handle)
        assert service.registry.get(h.session_id) is None
        assert service.registry.parked() == [] and len(service.registry.resident()) == 1
    finally:
        service.stop()


def test_a_new_session_while_every_resident_one_is_busy_waits_for_a_sequence(
    tmp_path: Path,
) -> None:
    """One sequence, its session's append queued when a second session is made (both enter one
    gap between steps): the second is made parked, not refused, and its turn is answered after
    the append, in the sequence the first gives up."""
    service = fake_service(tmp_path, max_sessions=1)
    busy = service.create(ALICE, POLICY).handle
    held, go = threading.Event(), threading.Event()

    def hold(engine: object) -> None:
        held.set()
        assert go.wait(30)

    pool = ThreadPoolExecutor(3)
    try:
        blocker = pool.submit(service.scheduler.call, hold)
        assert held.wait(30)
        appended = pool.submit(service.append, ALICE, busy, "Hold the only sequence. " * 20)
        wait_for_inbox(service, 1)
        made = pool.submit(service.create, BOB, POLICY)
        wait_for_inbox(service, 2)
        go.set()
        blocker.result(30)
        other = made.result(30)
        # the only sequence's session had work queued: made parked (its empty system prompt's
        # job, if any, waited for the sequence the append then gave up)
        assert other.residency == "parked" or other.restores == 1, other
        text, done = reply(service, BOB, other.handle, "Waiting.")
        assert appended.result(30).appended > 0
        assert text and done.receipt.restores == 1
        assert session_of(service, busy.session_id).parked
    finally:
        go.set()
        pool.shutdown(wait=True)
        service.stop()


def wait_for_inbox(service: SinkdService, n: int) -> None:
    """Until `n` messages wait in the engine thread's inbox (it is held by a call)."""
    deadline = time.monotonic() + 30
    while service.scheduler._inbox.qsize() < n:
        assert time.monotonic() < deadline, "the calls never reached the engine's inbox"
        time.sleep(0.01)


def test_a_parked_session_whose_snapshot_is_damaged_is_stale_never_served(
    tmp_path: Path,
) -> None:
    service = fake_service(tmp_path, max_sessions=1, durable=True)
    try:
        h = service.create(ALICE, POLICY).handle
        reply(service, ALICE, h, "Keep this.")
        reply(service, ALICE, service.create(ALICE, POLICY).handle, "Park the first.")
        session = session_of(service, h.session_id)
        assert session.parked and service.durability is not None
        snap = service.durability.snapshots_of(session)[0]
        path = service.durability.dir / snap.path
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        with pytest.raises(StaleGeneration, match="cannot be restored"):
            reply(service, ALICE, h, "Answer from what?")
        receipt = service.receipt(session)
        assert receipt.state == "stale" and "cannot be restored" in receipt.stale_reason
        assert service.metrics.count("restore_failures") == 1
        service.close(ALICE, h)  # a stale session can be closed
    finally:
        service.stop()


def test_resume_with_more_sessions_than_sequences_parks_the_rest(tmp_path: Path) -> None:
    service = fake_service(tmp_path, max_sessions=2, durable=True)
    texts = {}
    try:
        for i in range(5):
            h = service.create(ALICE, POLICY).handle
            reply(service, ALICE, h, f"Session {i}.")
            texts[h] = i
    finally:
        service.stop(snapshot=False)  # as a kill -9 leaves it: journal chunks after snapshots
    again = fake_service(tmp_path, max_sessions=2, durable=True)
    try:
        assert len(again.registry) == 5
        assert len(again.registry.resident()) == 2 and len(again.registry.parked()) == 3
        for h in texts:
            session = session_of(again, h.session_id)
            assert session.state.value == "idle", session.failure
            text, done = reply(again, ALICE, h, "Still there?")
            assert text and done.receipt.n_seen > 0
    finally:
        again.stop()


def test_forgetting_text_of_a_parked_session_rewrites_its_files_and_it_still_restores(
    tmp_path: Path,
) -> None:
    """A forget scrubs the files between steps: for a parked session, its one snapshot is
    rewritten from its own cells and every journal chunk goes; it stays parked, and restores."""
    service = fake_service(tmp_path, max_sessions=1, durable=True)
    try:
        h = service.create(ALICE, PolicyRequest(name="sink", sinks=4, window=40)).handle
        for i in range(4):  # past the window: evicted text goes to memory
            reply(service, ALICE, h, f"Remember item {i}: the {i}th thing said in passing.")
        session = session_of(service, h.session_id)
        park(service, session)
        passages = service.memory.memory(ALICE, h)
        assert passages
        service.memory.forget(ALICE, h, logical=(0, session.seq.state.n_seen))
        service.scheduler.call(lambda e: service.scheduler.snapshotter.due())  # type: ignore[union-attr]
        assert session.parked and not session.scrub_due
        durability = service.durability
        assert durability is not None
        assert len(durability.snapshots_of(session)) == 1
        assert durability.chunk_stats(session) == (0, 0)
        text, done = reply(service, ALICE, h, "Still there?")
        assert text and done.receipt.restores == 1
    finally:
        service.stop()


def test_a_parked_session_comes_back_when_as_many_wait_parked_as_may(tmp_path: Path) -> None:
    """Restoring one parks another: the count of parked sessions does not change, so a full
    parking lot never keeps a parked session from its next call."""
    service = fake_service(tmp_path, max_sessions=1, max_parked_sessions=1)
    try:
        a = service.create(ALICE, POLICY).handle
        reply(service, ALICE, a, "First.")
        b = service.create(ALICE, POLICY).handle
        assert session_of(service, a.session_id).parked
        text, done = reply(service, ALICE, a, "Back again.")
        assert text and done.receipt.restores == 1
        assert session_of(service, b.session_id).parked
    finally:
        service.stop()


def test_when_no_snapshot_can_be_written_nothing_waits_for_a_sequence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk: no idle session can be parked, so a new session is refused at once, and a
    parked session's call is told so, rather than either waiting for a sequence that cannot come."""
    service = fake_service(tmp_path, max_sessions=1, durable=True)
    try:
        parked = service.create(ALICE, POLICY).handle
        reply(service, ALICE, parked, "Parked soon.")
        resident = service.create(ALICE, POLICY).handle
        reply(service, ALICE, resident, "Holds the sequence.")
        assert service.durability is not None

        def full(*args: Any, **kw: Any) -> int:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(service.durability, "snapshot", full)
        with pytest.raises(ResourceExhausted, match="snapshots could not be written"):
            service.create(BOB, POLICY)
        with pytest.raises(ResourceExhausted, match="is parked and no session could be parked"):
            service.append(ALICE, parked, "Let me in.", timeout=20)
        assert service.metrics.count("snapshot_failures") >= 2
    finally:
        service.stop()
