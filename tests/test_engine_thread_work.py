"""What the engine thread no longer does per step (issue 47, bench/engine_cpu.py): a statement per
journalled chunk, the step's commit (the syncer writes the chunk rows before its fsync), an fsync
per step while a purge waits out its interval, a walk of llama.cpp's cache per session per decode
step. Each cut keeps what it replaced: order, durability, detection."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from sinkd.daemon import failpoints
from sinkd.daemon.node import Daemon
from sinkd.daemon.runtime.api import GenerationOptions, PolicyRequest, TokenEvent
from sinkd.daemon.runtime.loop.audit import FULL_CHECK_EVERY
from sinkd.daemon.runtime.sessions import Principal
from sinkd.daemon.store.chunk_rows import HeldChunksConnection
from sinkd.daemon.store.journal import Journal
from sinkd.errors import JournalError
from sinkd.proto.v1 import sinkd_pb2 as pb
from tests.support.clients import Client
from tests.support.daemons import stop_without_snapshots
from tests.support.services import fake_service
from tests.support.settings import settings
from tests.support.texts import TEXT
from tests.support.tokens import ALICE


def started(tmp_path: Path) -> tuple[Daemon, Client]:
    """A durable daemon on `tmp_path`'s state, ready, and a gRPC client of it."""
    d = Daemon(settings(tmp_path))
    d.start()
    d.wait_ready(120)
    return d, Client(d.addresses[0])


@pytest.mark.unit
def test_held_chunk_rows_keep_their_place_among_the_statements(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    j.put_session("s_1", "alice", {"reset_count": 0})
    j.add_chunk("s_1", 0, 0, 0, [1, 2], None)
    assert j._db.in_transaction  # a held row is a write not yet committed
    assert [c.tokens for c in j.chunks("s_1", 0)] == [(1, 2)]  # a read sees it
    j.add_chunk("s_1", 0, 2, 2, [3], 1)
    j.forget_generation("s_1", None)  # a delete after it takes it (it is not written later)
    j.commit()
    assert list(j.chunks("s_1", 0)) == []
    j.add_chunk("s_1", 1, 0, 0, [4], None)
    j.add_chunk("s_1", 1, 1, 1, [5], 1)
    j.rollback()  # a refused step: its held rows go with it
    j.add_chunk("s_1", 1, 0, 0, [6], None)
    assert j.commit()
    j.close()
    db = sqlite3.connect(tmp_path / "j.db")
    rows = db.execute("SELECT reset_count, logical_pos FROM chunks ORDER BY n").fetchall()
    assert rows == [(1, 0)]


def _stored(path: Path) -> list[tuple[int, int]]:
    """(reset_count, logical_pos) of the committed chunks, in journal order (a second reader)."""
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT reset_count, logical_pos FROM chunks ORDER BY n").fetchall()
    finally:
        db.close()


@pytest.mark.unit
def test_handed_rows_are_committed_by_the_sync_or_before_the_next_statement(
    tmp_path: Path,
) -> None:
    j = Journal(tmp_path / "j.db")
    j.put_session("s_1", "alice", {"reset_count": 0})
    assert j.commit()
    assert not j.hand_off()  # nothing held
    j.add_chunk("s_1", 0, 0, 0, [1], None)
    assert j.hand_off() and not j._db.in_transaction  # no commit owed on this connection
    assert _stored(tmp_path / "j.db") == []  # not yet written
    j.sync()  # the syncer's: written, committed, then fsynced
    assert _stored(tmp_path / "j.db") == [(0, 0)]
    j.add_chunk("s_1", 0, 1, 1, [2], 1)
    assert j.hand_off()
    j.add_chunk("s_1", 0, 2, 2, [3], 2)  # the next step's, held
    j.forget_generation("s_1", None)  # a statement: the handed row first, then the held one
    assert j.commit()
    assert _stored(tmp_path / "j.db") == []  # all three deleted, none written after the delete
    j.put_session("s_1", "alice", {"reset_count": 1})
    j.add_chunk("s_1", 1, 0, 0, [4], None)
    assert not j.hand_off()  # another statement waits in the transaction: commit here, together
    assert j.commit()
    assert _stored(tmp_path / "j.db") == [(1, 0)]
    j.close()


@pytest.mark.unit
def test_a_failed_handed_write_refuses_everything_after_it(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    j.put_session("s_1", "alice", {"reset_count": 0})
    j.commit()
    j.add_chunk("s_1", 0, 0, 0, [1], None)
    assert j.hand_off()

    def disk_error() -> None:
        raise sqlite3.OperationalError("disk I/O error")

    with failpoints.armed("chunk-write", disk_error), pytest.raises(JournalError):
        j.sync()
    j.add_chunk("s_1", 0, 1, 1, [2], 1)
    with pytest.raises(JournalError, match="earlier chunk write failed"):
        j.hand_off()
    with pytest.raises(JournalError, match="earlier chunk write failed"):
        j.commit()  # no row after the gap, by any path
    with pytest.raises(JournalError):
        j.sync()
    j._db.rollback()
    j.close()
    assert _stored(tmp_path / "j.db") == []


@pytest.mark.model
def test_a_generating_step_commits_nothing_on_the_engine_thread(tmp_path: Path) -> None:
    """With sync=full the step's chunk rows are written and committed by the syncer before its
    fsync; after a stop that writes nothing more (what a kill -9 leaves) what was acknowledged is
    all there. (A step that evicts commits here: the memory's rows of the evicted text go with
    it; once per evicted chunk, not per token. This session's window does not fill.)"""
    d, client = started(tmp_path)
    engine_thread = d.service.scheduler._thread.ident
    commits: list[bool] = []
    real_commit = HeldChunksConnection.commit

    def commit(self: HeldChunksConnection) -> None:
        commits.append(threading.get_ident() == engine_thread)
        real_commit(self)

    try:
        h = client.create(sinks=4, window=240).handle
        client.append(h, TEXT[:200])
        HeldChunksConnection.commit = commit  # type: ignore[method-assign]
        ids, done = client.generate(h, n=24)
        HeldChunksConnection.commit = real_commit  # type: ignore[method-assign]
        assert len(ids) == 24
        assert not any(commits), "a step committed on the engine thread"
        n_seen = done.receipt.n_seen
    finally:
        HeldChunksConnection.commit = real_commit  # type: ignore[method-assign]
        client.close()
        stop_without_snapshots(d)
    d, client = started(tmp_path)
    try:
        r = client.inspect(h).receipt
        assert r.n_seen == n_seen and r.state == "idle"
    finally:
        client.close()
        d.stop()


@pytest.mark.model
def test_a_failed_chunk_write_fails_the_waiting_replies_and_stops_the_daemon(
    tmp_path: Path,
) -> None:
    """As a failed fsync does: the journal would have a gap, so nothing more is acknowledged; a
    restart resumes what was."""
    d, client = started(tmp_path)
    h = client.create().handle
    client.append(h, TEXT[:200])
    n_seen = client.inspect(h).receipt.n_seen

    def disk_error() -> None:
        raise sqlite3.OperationalError("disk I/O error")

    try:
        with failpoints.armed("chunk-write", disk_error), pytest.raises(grpc.RpcError) as err:
            client.generate(h, n=4)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert not d.service.scheduler.alive()
        assert d.died.wait(30)
    finally:
        client.close()
        d.stop()
    d, client = started(tmp_path)
    try:
        r = client.inspect(h).receipt
        assert r.n_seen == n_seen and r.state == "idle"
        assert len(client.generate(h, n=3)[0]) == 3
    finally:
        client.close()
        d.stop()


@pytest.mark.model
def test_a_pending_purge_leaves_the_fsyncs_off_the_engine_thread(tmp_path: Path) -> None:
    """A close of a session with a memory asks for a purge, whose index merge waits out
    `purge_interval_s`; every commit meanwhile was fsynced on the engine thread (each step of
    every session, for two seconds by default). Its reply does not wait here (`purge_wait_s`)."""
    d = Daemon(settings(tmp_path, purge_interval_s=60, purge_wait_s=0))
    d.start()
    d.wait_ready(120)
    client = Client(d.addresses[0])
    durability = d.service.durability
    assert durability is not None and durability.sync == "full"
    engine_thread = d.service.scheduler._thread.ident
    syncs: list[bool] = []
    journal = durability.journal
    real_sync = journal.sync

    def sync() -> None:
        syncs.append(threading.get_ident() == engine_thread)
        real_sync()

    journal.sync = sync  # type: ignore[method-assign]
    try:
        owed = []
        for _ in range(2):  # the first purge runs at once, the second waits for the interval
            h = client.create().handle
            client.append(h, TEXT[:400])  # evicted into its memory: its close merges an index
            assert client.inspect(h).receipt.memory_passages > 0
            owed.append(client.s.Close(pb.HandleRequest(handle=h), metadata=ALICE).purge_owed)
        assert owed == [False, True]
        assert durability.purge.pending and not durability.purge.due()
        h = client.create().handle
        client.append(h, TEXT[:200])
        syncs.clear()
        ids, _ = client.generate(h, n=12)
        assert len(ids) == 12
        assert syncs and not any(syncs), "an fsync ran on the engine thread"
    finally:
        client.close()
        d.stop()


@pytest.mark.model
def test_a_cache_changed_behind_the_policy_is_caught_within_the_full_check_interval(
    tmp_path: Path,
) -> None:
    """Decode steps compare a session's cells with llama.cpp every FULL_CHECK_EVERY steps: a
    cell removed behind its policy (the decode itself goes on) fails the session that soon."""
    d = Daemon(settings(tmp_path, durable=False))
    d.start()
    d.wait_ready(120)
    client = Client(d.addresses[0])
    try:
        h = client.create(sinks=4, window=240).handle  # no eviction: no check at one
        client.append(h, TEXT[:200])
        s = d.service.registry.lookup("alice", h.session_id, h.generation)
        d.service.scheduler.call(lambda e: e.cells.remove(s.seq_id, 0, 1))  # a sink cell goes
        steps = d.service.metrics.steps
        before = steps._value.get()
        got = []
        with pytest.raises(grpc.RpcError) as err:
            for ev in client.s.Generate(
                pb.GenerateRequest(handle=h, max_tokens=8 * FULL_CHECK_EVERY), metadata=ALICE
            ):
                got.append(ev)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "cells" in err.value.details()
        # steps, not tokens: a step that verifies drafts may give several (how many depends on
        # what this machine's kernels make the model say)
        assert steps._value.get() - before <= FULL_CHECK_EVERY
        assert len(got) < 8 * FULL_CHECK_EVERY
    finally:
        client.close()
        d.stop()


@pytest.mark.unit
def test_a_lent_logits_row_outlives_other_sessions_decodes(tmp_path: Path) -> None:
    """A decode lends each session its row of llama.cpp's buffer (no copy per step); the next
    decode overwrites that buffer (the fake's as llama.cpp's), so a session that is not decoding
    keeps a copy made just before: its next-token logits and its reply are those it has alone."""
    alice, policy = Principal("alice"), PolicyRequest(name="sink", sinks=4, window=60)

    def reply(svc: Any, h: Any) -> list[int]:
        events = svc.generate(alice, h, GenerationOptions(6))
        return [e.id for e in events if isinstance(e, TokenEvent)]

    alone = fake_service(tmp_path / "alone")
    busy = fake_service(tmp_path / "busy")
    try:
        a_alone = alone.create(alice, policy).handle
        alone.append(alice, a_alone, "Hello there")
        expected = alone.reads.inspect(
            alice, a_alone, include_text=False, include_logits=True
        ).logits
        a, b = busy.create(alice, policy).handle, busy.create(alice, policy).handle
        busy.append(alice, a, "Hello there")  # a's row is lent ...
        busy.append(alice, b, "Something else entirely")
        reply(busy, b)  # ... and b's decodes overwrite the buffer it lay in
        got = busy.reads.inspect(alice, a, include_text=False, include_logits=True).logits
        assert expected is not None and got is not None
        assert np.array_equal(got, expected)
        assert reply(busy, a) == reply(alone, a_alone)
    finally:
        alone.stop()
        busy.stop()
