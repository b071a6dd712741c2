"""Durable sessions: journal and snapshot formats, then restarts of a real daemon on SmolLM2.

A restarted daemon must give each session the same next-token logits (bit for bit) and the same
greedy continuation as a twin daemon that never stopped; damage falls back or goes stale, never to a
wrong state.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest
from typer.testing import CliRunner

from sinkd.cli.main import app
from sinkd.daemon import failpoints
from sinkd.daemon.engine.row_probe import sgemm_float_rows
from sinkd.daemon.engine.sampler import Sampler, SamplingParams
from sinkd.daemon.node import Daemon
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.durable.snapshot_writer import Write
from sinkd.daemon.store import snapshots
from sinkd.daemon.store.journal import Journal
from sinkd.errors import JournalError
from sinkd.proto.v1 import sinkd_pb2 as pb
from tests.support.clients import Client, code_of
from tests.support.daemons import stop_without_snapshots
from tests.support.services import in_one_step
from tests.support.settings import settings
from tests.support.texts import TEXT
from tests.support.tokens import ADMIN, ALICE, BOB, sha

# --- formats (no model) ---


@pytest.mark.unit
def test_snapshot_roundtrip_and_damage_is_detected(tmp_path: Path) -> None:
    logits = np.linspace(-3, 3, 1000, dtype=np.float32)
    snap = snapshots.Snapshot({"session": "s_1", "state": {"n_seen": 7}}, b"\x01\x02" * 500, logits)
    data = snapshots.encode(snap)
    back = snapshots.decode(data)
    assert back.meta["session"] == "s_1" and back.kv == snap.kv
    assert back.logits is not None and np.array_equal(back.logits, logits)
    for bad in (data[:-1], data[: len(data) // 2], b"", data[:40]):
        with pytest.raises(snapshots.CorruptSnapshot):
            snapshots.decode(bad)
    flipped = bytearray(data)
    flipped[100] ^= 0x10
    with pytest.raises(snapshots.CorruptSnapshot, match="checksum"):
        snapshots.decode(bytes(flipped))


@pytest.mark.unit
def test_disk_full_while_writing_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.snap"
    snapshots.write_atomic(path, b"old snapshot")
    real_write = os.write
    written = 0

    def full_disk(fd: int, data: Any) -> int:
        nonlocal written
        if written > 4096:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real_write(fd, bytes(data[:1024]))
        written += n
        return n

    monkeypatch.setattr(snapshots.os, "write", full_disk)
    with pytest.raises(snapshots.SnapshotError, match="No space left"):
        snapshots.write_atomic(path, b"x" * 100_000)
    assert path.read_bytes() == b"old snapshot"
    assert [p.name for p in tmp_path.iterdir()] == ["a.snap"]  # no temporary left behind


@pytest.mark.unit
def test_journal_is_wal_and_damaged_rows_are_reported(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    assert j._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    j.put_session("s_1", "alice", {"reset_count": 0})
    j.add_chunk("s_1", 0, 0, 0, [1, 2, 3], None)
    j.add_chunk("s_1", 0, 3, 3, [4], 1)
    j.commit()
    j.close()
    db = sqlite3.connect(tmp_path / "j.db")  # bit rot in one chunk and in the record
    db.execute("UPDATE chunks SET tokens=? WHERE logical_pos=3", (np.int32(5).tobytes(),))
    db.execute("UPDATE sessions SET tenant='bob'")
    db.commit()
    db.close()
    j = Journal(tmp_path / "j.db")
    first, second = j.chunks("s_1", 0)
    assert first.intact and first.tokens == (1, 2, 3) and not second.intact
    (stored,) = j.sessions()
    assert not stored.intact


@pytest.mark.unit
def test_one_daemon_per_state_directory(tmp_path: Path) -> None:
    a = Durability(tmp_path / "state")
    a.open({})
    b = Durability(tmp_path / "state")
    with pytest.raises(JournalError, match="in use by another sinkd"):
        b.open({})
    a.close()
    b.open({})  # free once the first is gone (a killed process releases its lock too)
    b.close()


@pytest.mark.unit
def test_a_file_written_beside_the_steps_never_commits_a_callers_statements(tmp_path: Path) -> None:
    """A snapshot file written off the engine thread is recorded with a commit of its own. A
    caller whose statements wait in the transaction (a move's release notes the session moved,
    then closes it, in one commit) makes it wait for the file: the file is then deleted and
    counted as a failed snapshot, and the caller's statements stay its own to commit or undo."""
    d = Durability(tmp_path / "state")
    d.open({})
    session: Any = SimpleNamespace(id="s_1", tenant="alice")
    path = tmp_path / "state" / "written-beside.snap"
    path.write_bytes(b"a sealed snapshot")
    write = Write(session, 7, "snapshots/s_1/0-7.snap", path, [], 7, True)
    write.done.set()
    d.note_moved_out(session)  # the release's first statement, its close to follow
    d.writer._pending = write  # as `start` leaves it, the thread done
    d.writer.settle()
    assert not path.exists() and isinstance(write.error, JournalError)
    assert session.snap_retry_at > time.time()
    d.rollback()  # the release refused: nothing of it was committed on the way
    assert d.moved_out() == []
    d.close()


@pytest.mark.unit
def test_a_sampler_restored_from_its_draw_count_continues_the_same_stream() -> None:
    params = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    rng = np.random.default_rng(0)
    rows = [rng.normal(0, 2, 500).astype(np.float32) for _ in range(12)]
    live = Sampler(params)
    tokens = [live.sample_logits(r) for r in rows]
    restored = Sampler(params, draws=6)
    assert [restored.sample_logits(r) for r in rows[6:]] == tokens[6:]
    assert restored.draws == live.draws == 12
    assert len(set(tokens)) > 3  # it really samples


# --- a real daemon, restarted ---

DURABLE = {"snapshot_every_tokens": 48, "max_sessions": 4}


def logits(c: Client, h: pb.Handle, md: Any = ALICE) -> np.ndarray:
    r = c.s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=md)
    return np.frombuffer(r.logits, dtype="<f4")


def receipt(c: Client, h: pb.Handle, md: Any = ALICE) -> pb.Receipt:
    return c.inspect(h, md=md).receipt


class Run:
    """A daemon on one state directory that can be stopped and started again."""

    def __init__(self, tmp: Path, **kw: Any) -> None:
        self.tmp, self.kw = tmp, {**DURABLE, **kw}
        self.d: Daemon | None = None

    def start(self, **kw: Any) -> Client:
        self.d = Daemon(settings(self.tmp, **{**self.kw, **kw}))
        self.d.start()
        self.d.wait_ready(120)
        return Client(self.d.addresses[0])

    def stop(self) -> None:
        assert self.d is not None
        self.d.stop()

    def stop_without_snapshots(self) -> None:
        """Stop without the clean-shutdown snapshots: what the journal holds is all there is."""
        assert self.d is not None
        stop_without_snapshots(self.d)

    @property
    def state(self) -> Path:
        return self.tmp / "state"


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    r = Run(tmp_path)
    yield r
    if r.d is not None:
        r.d.stop()


def workload(c: Client, h: pb.Handle, part: int) -> list[int]:
    """Appends and greedy generations that overflow a 4+60 window several times."""
    c.append(h, TEXT[part * 300 : part * 300 + 300])
    ids, _ = c.generate(h, n=6)
    return ids


def twin(tmp: Path, parts: int, **policy: Any) -> tuple[np.ndarray, list[int]]:
    """The same workload on a daemon that never stops: final logits and the next 8 greedy tokens."""
    r = Run(tmp)
    c = r.start()
    h = c.create(system="You are a ship's log.", **policy).handle
    for part in range(parts):
        workload(c, h, part)
    out = logits(c, h), c.generate(h, n=8)[0]
    r.stop()
    return out


@pytest.mark.model
@pytest.mark.parametrize("crash", [False, True], ids=["clean-stop", "crash"])
def test_a_restarted_session_matches_one_that_never_stopped(
    run: Run, tmp_path: Path, crash: bool
) -> None:
    want_logits, want_next = twin(tmp_path / "twin", 4)
    c = run.start()
    h = c.create(system="You are a ship's log.").handle
    for part in range(4):
        workload(c, h, part)
        if part in (1, 2):  # a restart between parts: later parts build on the resumed state
            seen = receipt(c, h).n_seen
            run.stop_without_snapshots() if crash else run.stop()
            c = run.start()
            r = receipt(c, h)
            assert r.n_seen == seen and r.state == "idle"
            assert ("+ 0 chunks" in r.resume) != crash  # a clean stop snapshots everything
    assert receipt(c, h).evictions > 3
    assert np.array_equal(logits(c, h), want_logits)  # bit for bit
    assert c.generate(h, n=8)[0] == want_next


@pytest.mark.model
def test_the_journal_holds_acknowledged_chunks_as_the_policy_cut_them_and_no_text(
    run: Run,
) -> None:
    c = run.start(snapshot_every_tokens=10_000)
    h = c.create(window=60, ingest_chunk=0).handle
    assert run.d is not None
    sentinel = "Quetzalcoatl-journal-sentinel"
    ids = run.d.service.engine.vocab.tokenize(f"{sentinel} {TEXT}")[:150]
    c.s.Append(pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=ids)), metadata=ALICE)
    generated, _ = c.generate(h, n=5)
    c.append(h, sentinel)
    j = Journal(run.state / "journal.db")  # a second reader beside the daemon (WAL)
    chunks = list(j.chunks(h.session_id, 0))
    # prefill_chunk is 64 (the step's size here), then eviction at 64 cells (E=16, no ingest
    # chunk) cuts where the policy needs room; each generated token is its own sub-batch
    assert [len(ch.tokens) for ch in chunks[:5]] == [64, 16, 16, 16, 16]
    assert [t for ch in chunks for t in ch.tokens][: len(ids)] == ids
    assert [ch.tokens[0] for ch in chunks if len(ch.tokens) == 1][:5] == generated
    positions = [ch.logical_pos for ch in chunks]
    assert positions == sorted(positions) and positions[0] == 0
    assert all(ch.intact for ch in chunks)
    j.close()
    run.stop()
    stored = b"".join(p.read_bytes() for p in run.state.rglob("*") if p.is_file())
    assert sentinel.encode() not in stored  # token ids, never text


@pytest.mark.model
def test_what_is_stored_stays_bounded_however_long_the_stream(run: Run) -> None:
    c = run.start(snapshot_every_tokens=64)
    h = c.create().handle
    assert run.d is not None
    pool = run.d.service.engine.vocab.tokenize(TEXT * 8)
    for i in range(0, 1500, 50):
        ids = pool[i % (len(pool) - 50) :][:50]
        c.s.Append(pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=ids)), metadata=ALICE)
    r = receipt(c, h)
    assert r.n_seen >= 1500 and r.evicted_tokens > 1300
    assert r.journal_tokens <= 3 * 64 + 50  # back to the older of the two kept snapshots
    run.stop_without_snapshots()  # a snapshot may be being written right now: count once the engine has stopped
    assert len(list((run.state / "snapshots" / h.session_id).glob("*.snap"))) == 2


@pytest.mark.model
def test_snapshots_fall_due_by_time_as_well_as_by_tokens(run: Run) -> None:
    c = run.start(snapshot_every_tokens=10_000, snapshot_every_s=0.5)
    h = c.create().handle
    c.append(h, "A few tokens, far below the token interval.")
    seen = receipt(c, h).n_seen
    deadline = time.monotonic() + 10
    while receipt(c, h).snapshot_n_seen != seen and time.monotonic() < deadline:
        time.sleep(0.1)
    assert receipt(c, h).snapshot_n_seen == seen  # an idle session with new tokens: snapshotted


@pytest.mark.model
def test_a_session_still_to_give_its_first_token_is_snapshotted_a_step_later(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn's time to first token never waits for a snapshot, its session's or another's: due
    then, it is taken at the next gap once the first token is out."""
    c = run.start(snapshot_every_tokens=10_000, snapshot_every_s=3600)
    h = c.create().handle
    c.append(h, "A few tokens, far below the token interval.")
    assert run.d is not None
    service = run.d.service
    snapshotter, durability = service.scheduler.snapshotter, service.durability
    assert snapshotter is not None and durability is not None
    session = service.registry.get(h.session_id)
    assert session is not None
    forced = threading.local()  # due only within this test's own calls, not the loop's
    real = durability.due
    monkeypatch.setattr(
        durability, "due", lambda s, now: getattr(forced, "on", False) or real(s, now)
    )

    def due(answering: set[str]) -> int | None:
        forced.on = True
        try:
            snapshotter.due(False, answering)
        finally:
            forced.on = False
        return session.snap_n_seen

    before = session.snap_n_seen
    assert service.scheduler.call(lambda e: due({session.id})) == before
    assert service.scheduler.call(lambda e: due({"s_another"})) == before  # another's turn
    assert service.scheduler.call(lambda e: due(set())) == session.seq.state.n_seen != before


@pytest.mark.model
@pytest.mark.parametrize("crash", [True, False], ids=["crash-journal-only", "clean-stop-snapshot"])
def test_a_sampling_session_draws_the_same_tokens_after_a_restart(
    run: Run, tmp_path: Path, crash: bool
) -> None:
    sampling = pb.Sampling(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=99)
    request = pb.CreateSessionRequest(
        policy=pb.Policy(name="sink", sinks=4, window=60), sampling=sampling
    )

    def session(c: Client) -> pb.Handle:
        h = c.s.Create(request, metadata=ALICE).handle
        c.append(h, TEXT[:300])
        c.generate(h, n=20)  # the sampler has drawn 20 times
        return h

    twin = Run(tmp_path / "twin", snapshot_every_tokens=10_000)
    c = twin.start()
    h = session(c)
    want = c.generate(h, n=12)[0]
    twin.stop()
    c = run.start(snapshot_every_tokens=10_000)
    h = session(c)
    run.stop_without_snapshots() if crash else run.stop()
    c = run.start(snapshot_every_tokens=10_000)
    assert ("from the journal" in receipt(c, h).resume) == crash  # else the snapshot alone
    assert c.generate(h, n=12)[0] == want
    assert len(set(want)) > 3  # it really samples


@pytest.mark.model
def test_damaged_snapshots_fall_back_then_go_stale_never_wrong(run: Run, tmp_path: Path) -> None:
    want_logits, _ = twin(tmp_path / "twin", 3)
    c = run.start()
    h = c.create(system="You are a ship's log.").handle
    for part in range(3):
        workload(c, h, part)
    r = receipt(c, h)
    assert r.snapshot_n_seen > 0 and r.journal_chunks > 0
    run.stop_without_snapshots()
    snaps = sorted((run.state / "snapshots" / h.session_id).iterdir(), key=os.path.getmtime)
    assert len(snaps) == 2  # the newest and the previous are kept
    newest = snaps[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated
    c = run.start()
    r = receipt(c, h)
    assert "unusable" in r.resume and "checksum" in r.resume  # reported
    assert np.array_equal(logits(c, h), want_logits)  # the previous one plus a longer replay
    run.stop_without_snapshots()
    for snap in (run.state / "snapshots" / h.session_id).iterdir():
        data = bytearray(snap.read_bytes())
        data[len(data) // 3] ^= 0xFF  # bit rot in every snapshot: the journal was pruned below them
        snap.write_bytes(bytes(data))
    c = run.start()
    err = code_of(lambda: c.inspect(h))
    assert err == grpc.StatusCode.FAILED_PRECONDITION
    (listed,) = c.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions
    assert listed.state == "stale" and "pruned" in listed.stale_reason
    c.s.Close(pb.HandleRequest(handle=h), metadata=ALICE)  # the owner can delete it
    assert not c.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions
    assert not (run.state / "snapshots" / h.session_id).exists()


@pytest.mark.model
def test_a_damaged_journal_chunk_makes_the_session_stale(run: Run) -> None:
    c = run.start(snapshot_every_tokens=10_000)
    h = c.create().handle
    workload(c, h, 0)
    run.stop_without_snapshots()
    db = sqlite3.connect(run.state / "journal.db")
    db.execute("UPDATE chunks SET cache_pos = cache_pos + 1 WHERE n = (SELECT MAX(n) FROM chunks)")
    db.commit()
    db.close()
    c = run.start()
    (listed,) = c.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions
    assert listed.state == "stale" and "damaged" in listed.stale_reason
    assert code_of(lambda: c.append(h, "more")) == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.model
def test_a_damaged_journal_page_makes_its_session_stale_and_the_others_resume(run: Run) -> None:
    """SQLite answers "malformed" for one session's rows: that session goes stale, with the reason;
    the daemon starts and every other session resumes."""
    import struct

    run.state.mkdir(mode=0o700)
    small_pages = sqlite3.connect(run.state / "journal.db")  # one session's rows span many pages
    small_pages.execute("PRAGMA page_size=512")
    small_pages.execute("VACUUM")
    small_pages.close()
    c = run.start(snapshot_every_tokens=10_000)
    other = c.create(name="window").handle  # controls keep no memory: chunks alone hold tokens
    c.append(other, "A short session of its own.")
    h = c.create(name="window").handle
    appended = c.append_tokens(h, list(range(1000, 1600)))  # one chunk run no other row holds
    assert appended.appended == 600
    run.stop_without_snapshots()
    data = bytearray((run.state / "journal.db").read_bytes())
    page = int(sqlite3.connect(run.state / "journal.db").execute("PRAGMA page_size").fetchone()[0])
    needle = struct.pack("<4i", 1500, 1501, 1502, 1503)
    at = data.find(needle)
    assert at > 0, "the chunk must be in the database file"
    start = at - at % page
    data[start : start + 8] = b"\xff" * 8  # the b-tree page header: not a page SQLite can read
    (run.state / "journal.db").write_bytes(bytes(data))
    c = run.start()
    listed = {r.session_id: r for r in c.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions}
    assert listed[h.session_id].state == "stale"
    assert "damaged" in listed[h.session_id].stale_reason
    assert listed[other.session_id].state == "idle" and listed[other.session_id].n_seen > 0
    assert len(c.generate(other, n=3)[0]) == 3


@pytest.mark.model
def test_the_admin_closes_the_session_of_a_tenant_no_longer_configured(run: Run) -> None:
    c = run.start()
    h = c.create().handle
    c.append(h, "A session whose tenant is about to be removed.")
    run.stop()
    bob_only = [{"name": "bob", "token_sha256": sha("bob-token")}]
    c = run.start(tenants=bob_only)
    listed = c.admin.ListAllSessions(pb.ListSessionsRequest(), metadata=ADMIN).sessions
    assert [r.session_id for r in listed] == [h.session_id]
    stale = pb.Handle(session_id=h.session_id, generation="0" * 64)
    assert code_of(lambda: c.s.Close(pb.HandleRequest(handle=stale), metadata=ADMIN)) == (
        grpc.StatusCode.FAILED_PRECONDITION  # the admin names the generation it means
    )
    c.s.Close(pb.HandleRequest(handle=h), metadata=ADMIN)
    assert not c.admin.ListAllSessions(pb.ListSessionsRequest(), metadata=ADMIN).sessions
    assert code_of(lambda: c.inspect(h, md=BOB)) == grpc.StatusCode.NOT_FOUND
    run.stop()
    c = run.start()  # and it stays closed
    assert not c.admin.ListAllSessions(pb.ListSessionsRequest(), metadata=ADMIN).sessions


@pytest.mark.model
def test_a_new_snapshot_folder_is_made_durable_in_its_parent(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    fsync = os.fsync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    c = run.start()
    monkeypatch.setattr(os, "fsync", recording)
    h = c.create().handle
    workload(c, h, 0)  # past snapshot_every_tokens: the session's first snapshot, in a new folder
    assert (run.state / "snapshots" / h.session_id).is_dir()
    assert str(run.state / "snapshots") in synced


@pytest.mark.model
def test_another_configuration_makes_old_handles_stale_not_garbage(run: Run) -> None:
    c = run.start()
    h = c.create().handle
    workload(c, h, 0)
    seen = receipt(c, h).n_seen
    run.stop()
    for change, words in (
        ({"model": "gemma3-270m"}, "model_sha256 was"),
        ({"n_ctx_seq": 512, "idle_timeout_s": 0.2}, "n_ctx_seq was 256"),  # stale: no expiry
    ):
        c = run.start(**change)
        assert run.d is not None
        scheduler = run.d.service.scheduler  # an expiry pass an hour from now: it stays
        scheduler.call(lambda e, s=scheduler: s.expire_idle(time.monotonic() + 3600))
        calls = (lambda: c.inspect(h), lambda: c.append(h, "x"), lambda: c.generate(h, 2))  # noqa: B023
        for call in calls:
            assert code_of(call) == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError) as err:
            c.inspect(h)
        assert words in err.value.details()
        (listed,) = c.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions
        assert listed.state == "stale" and words in listed.stale_reason
        assert not c.s.List(pb.ListSessionsRequest(), metadata=BOB).sessions  # owner only
        assert run.d is not None
        shown = CliRunner().invoke(
            app,
            ["sessions", "list", "--connect", run.d.addresses[0], "--token", "alice-token"],
            env={"COLUMNS": "400"},
        )
        assert f"{h.session_id} is stale: made under another configuration" in shown.stdout
        assert words in shown.stdout
        stats = c.admin.Stats(pb.StatsRequest(), metadata=[("authorization", "Bearer admin-token")])
        assert stats.sessions == 0 and stats.stale_sessions == 1  # it holds no sequence
        run.stop()
    c = run.start()  # back on the configuration it was made under: it resumes
    assert receipt(c, h).n_seen == seen and receipt(c, h).state == "idle"


@pytest.mark.model
def test_a_session_made_under_the_other_attention_kernel_goes_stale(run: Run) -> None:
    """At 256 cells `flash_attn = "exact"` runs flash attention (exact there, see the engine's
    NOTE; the default before 2026-12-07). The default ("auto": the plain kernel on sinkd's build)
    keeps it while the state directory holds sessions made under it, so an upgrade resumes them.
    Under the other kernel (`flash_attn = "off"`) such a session is stale: its V rows are laid
    out for the other kernel and its sums were made by it. It says why, and resumes, bit for bit,
    once the daemon runs the kernel it was made under; a record with no such gate at all stays
    stale."""
    if not sgemm_float_rows():
        pytest.skip("the default is flash attention on a build without sinkd's patch")
    c = run.start(flash_attn="exact")
    h = c.create().handle
    workload(c, h, 0)
    seen, before = receipt(c, h).n_seen, logits(c, h)
    run.stop()
    j = Journal(run.state / "journal.db")
    assert j.sessions()[0].record["config"]["flash_attn"] is True
    j.close()
    c = run.start()  # the default, after an upgrade: the stored session keeps its kernel
    assert run.d is not None and run.d.service.engine.flash_attn
    assert receipt(c, h).n_seen == seen and receipt(c, h).state == "idle"
    assert np.array_equal(logits(c, h), before)
    run.stop()
    c = run.start(flash_attn="off")
    (listed,) = c.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions
    assert listed.state == "stale"
    assert "flash_attn was True, the daemon runs False" in listed.stale_reason
    run.stop()
    c = run.start(flash_attn="exact")
    assert receipt(c, h).n_seen == seen and receipt(c, h).state == "idle"
    assert np.array_equal(logits(c, h), before)
    run.stop()
    j = Journal(run.state / "journal.db")
    (stored,) = j.sessions()
    config = {k: v for k, v in stored.record["config"].items() if k != "flash_attn"}
    j.put_session(stored.id, stored.tenant, dict(stored.record, config=config))
    j.commit()
    j.close()
    c = run.start(flash_attn="exact")
    (listed,) = c.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions
    assert listed.state == "stale"
    assert "flash_attn was None, the daemon runs True" in listed.stale_reason
    run.stop()
    run.start()  # no live session made under flash attention is left: the default's kernel
    assert run.d is not None and not run.d.service.engine.flash_attn
    run.stop()


@pytest.mark.model
def test_a_session_journalled_under_other_cpu_kernels_goes_stale(run: Run) -> None:
    """llama.cpp's build picks its CPU kernels (GGML_NATIVE: the machine it was built on), and
    another build sums in another order: a state directory carried to a machine whose build
    differs would replay other bits. The record names its kernels; another value is stale, with
    why; a record from before the gate (no value) resumes, bit for bit."""
    c = run.start()
    h = c.create().handle
    workload(c, h, 0)
    seen, before = receipt(c, h).n_seen, logits(c, h)
    run.stop()

    from sinkd.daemon.engine.llama import cpu_kernels

    other = "AVX512F AVX512BW LLAMAFILE; weights unrepacked, tiled off"

    def restamp(kernels: str | None) -> None:
        j = Journal(run.state / "journal.db")
        (stored,) = j.sessions()
        config = dict(stored.record["config"])
        assert config["cpu_kernels"] in (cpu_kernels(), other)
        config.pop("cpu_kernels")
        if kernels is not None:
            config["cpu_kernels"] = kernels
        j.put_session(stored.id, stored.tenant, dict(stored.record, config=config))
        j.commit()
        j.close()

    restamp(other)
    c = run.start()
    (listed,) = c.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions
    assert listed.state == "stale" and "cpu_kernels was 'AVX512F" in listed.stale_reason
    run.stop()
    restamp(None)
    c = run.start()
    assert receipt(c, h).n_seen == seen and receipt(c, h).state == "idle"
    assert np.array_equal(logits(c, h), before)
    run.stop()


@pytest.mark.model
def test_a_stored_policy_that_changed_goes_stale(run: Run) -> None:
    c = run.start()
    h = c.create().handle
    workload(c, h, 0)
    run.stop()
    j = Journal(run.state / "journal.db")  # a well-formed record (valid checksum), other policy
    (stored,) = j.sessions()
    record = dict(stored.record, policy=dict(stored.record["policy"], window=61))
    j.put_session(stored.id, stored.tenant, record)
    j.commit()
    j.close()
    c = run.start()
    with pytest.raises(grpc.RpcError) as err:
        c.inspect(h)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "generation hash does not recompute" in err.value.details()


@pytest.mark.model
def test_disk_full_during_a_snapshot_keeps_the_previous_one_usable(
    run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want_logits, want_next = twin(tmp_path / "twin", 3)
    c = run.start()
    h = c.create(system="You are a ship's log.").handle
    workload(c, h, 0)
    workload(c, h, 1)
    before = receipt(c, h).snapshot_n_seen
    assert before > 0

    def no_space(*_: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(snapshots.os, "write", no_space)
    workload(c, h, 2)  # snapshots fall due and fail; appends and generations go on
    assert run.d is not None and run.d.service.metrics.count("snapshot_failures") > 0
    assert receipt(c, h).snapshot_n_seen == before
    run.stop_without_snapshots()
    assert not [p for p in (run.state / "snapshots").rglob("*") if p.name.endswith(".tmp")]
    monkeypatch.undo()
    c = run.start()
    assert f"snapshot at token {before}" in receipt(c, h).resume
    assert np.array_equal(logits(c, h), want_logits)
    assert c.generate(h, n=8)[0] == want_next


@pytest.mark.model
def test_a_failed_journal_commit_acknowledges_nothing(run: Run) -> None:
    c = run.start()
    h = c.create().handle
    workload(c, h, 0)
    assert run.d is not None
    durability = run.d.service.scheduler.durability
    assert durability is not None
    real_commit = durability.commit

    def failing(defer_sync: bool = False) -> bool:
        durability.commit = real_commit  # type: ignore[method-assign]
        raise sqlite3.OperationalError("disk I/O error")

    durability.commit = failing  # type: ignore[method-assign]
    with pytest.raises(grpc.RpcError) as err:
        c.append(h, "this append cannot be recorded")
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "journal could not record" in err.value.details()
    assert receipt(c, h).state == "failed"  # it is ahead of its journal: only reset or close
    fresh = c.s.Reset(pb.HandleRequest(handle=h), metadata=ALICE).handle
    workload(c, fresh, 1)
    run.stop_without_snapshots()
    c = run.start()
    assert receipt(c, fresh).state == "idle" and receipt(c, fresh).n_seen > 0


def _stream(c: Client, h: pb.Handle, n: int, into: list[Any]) -> None:
    for ev in c.s.Generate(pb.GenerateRequest(handle=h, max_tokens=n), metadata=ALICE):
        into.append(ev)


@pytest.mark.model
def test_replies_wait_for_the_journals_fsync_and_the_engine_does_not(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = run.start()
    h = c.create().handle
    c.append(h, TEXT[:200])
    assert run.d is not None
    metrics = run.d.service.metrics
    real_fsync, synced = os.fsync, list[tuple[str, int]]()

    def recording_fsync(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), len(events)))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    held, go = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        assert go.wait(60)

    events: list[Any] = []
    t = threading.Thread(target=_stream, args=(c, h, 6, events))
    with failpoints.armed("before-sync", hold):
        try:
            steps0 = metrics.steps._value.get()
            t.start()
            assert held.wait(60)  # the first token's reply waits for its fsync
            deadline = time.monotonic() + 60
            while metrics.steps._value.get() < steps0 + 6 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert metrics.steps._value.get() >= steps0 + 6  # all six decoded meanwhile
            assert events == []  # and not one acknowledged
        finally:
            go.set()
            t.join(60)
    tokens = [ev.token.index for ev in events if ev.HasField("token")]
    assert tokens == list(range(6)) and events[-1].HasField("done")
    assert ("journal.db-wal", 0) in [(p.rsplit("/", 1)[1], n) for p, n in synced]


@pytest.mark.model
def test_with_an_fsync_interval_a_stream_is_acknowledged_after_fewer_fsyncs(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sync_interval_ms=1000: the syncer starts at most one fsync a second (its consecutive
    fsyncs of the log at least 1 s apart, however fast the machine decodes; one per token
    without the interval); every token still arrives, in order, and a crash right after resumes them all
    from the journal."""
    c = run.start(sync_interval_ms=1000, snapshot_every_tokens=10_000)  # the journal alone
    h = c.create().handle
    c.append(h, TEXT[:200])
    real_fsync, wal_syncs = os.fsync, list[float]()

    def counting_fsync(fd: int) -> None:  # the syncer's, not a snapshot's own commit
        is_wal = os.readlink(f"/proc/self/fd/{fd}").endswith("journal.db-wal")
        if is_wal and threading.current_thread().name == "sinkd-sync":
            wal_syncs.append(time.monotonic())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    events: list[Any] = []
    _stream(c, h, 24, events)
    assert [ev.token.index for ev in events if ev.HasField("token")] == list(range(24))
    assert wal_syncs, "the stream's tokens were made durable"
    gaps = [b - a for a, b in itertools.pairwise(wal_syncs)]
    assert all(gap >= 0.99 for gap in gaps), gaps
    seen = receipt(c, h).n_seen
    run.stop_without_snapshots()  # what a crash leaves: the journal alone
    c = run.start()
    r = receipt(c, h)
    assert r.n_seen == seen and "+ 0 chunks" not in r.resume  # replayed from the journal


@pytest.mark.model
def test_a_reset_while_replies_wait_for_the_fsync_ends_the_stream_and_keeps_nothing(
    run: Run,
) -> None:
    c = run.start()
    h = c.create().handle
    c.append(h, TEXT[:200])
    held, go = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        assert go.wait(60)

    errors: list[BaseException] = []

    def stream() -> None:
        try:
            _stream(c, h, 64, [])
        except BaseException as e:  # re-raised below unless it is the reset's status
            errors.append(e)

    t = threading.Thread(target=stream)
    with failpoints.armed("before-sync", hold):
        try:
            t.start()
            assert held.wait(60)  # tokens decoded, their replies waiting for the fsync
            # the reset does not wait for the held fsync (a deadline fails the test if it does)
            fresh = c.s.Reset(pb.HandleRequest(handle=h), metadata=ALICE, timeout=30)
        finally:
            go.set()
            t.join(60)
    assert not t.is_alive()  # the stream ended: no wait outlives the reset
    for e in errors:
        if not isinstance(e, grpc.RpcError):
            raise e
    assert fresh.receipt.retained == 0 and receipt(c, fresh.handle).n_seen == 0
    assert code_of(lambda: c.generate(h, 1)) == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.model
def test_a_failed_fsync_fails_the_waiting_replies_and_stops_the_daemon(run: Run) -> None:
    c = run.start()
    h = c.create().handle
    c.append(h, TEXT[:200])
    assert run.d is not None

    def eio() -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with failpoints.armed("before-sync", eio), pytest.raises(grpc.RpcError) as err:
        c.generate(h, n=4)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "could not be made durable" in err.value.details()
    assert not run.d.service.scheduler.alive()  # no zombie: nothing more is acknowledged
    assert run.d.died.wait(30)
    assert code_of(lambda: c.append(h, "more")) != grpc.StatusCode.OK


@pytest.mark.model
def test_a_failed_session_is_still_failed_after_a_restart(run: Run) -> None:
    c = run.start()
    h = c.create().handle
    workload(c, h, 0)
    assert run.d is not None
    scheduler = run.d.service.scheduler
    session = run.d.service.registry.lookup("alice", h.session_id, h.generation)
    scheduler.call(
        lambda e: scheduler.auditor.fail_session(session, "a planted invariant violation")
    )
    run.stop_without_snapshots()
    c = run.start()
    r = receipt(c, h)
    assert r.state == "failed" and r.retained == 0
    assert code_of(lambda: c.generate(h, 2)) == grpc.StatusCode.FAILED_PRECONDITION
    fresh = c.s.Reset(pb.HandleRequest(handle=h), metadata=ALICE).handle
    workload(c, fresh, 1)
    assert receipt(c, fresh).state == "idle"


@pytest.mark.model
def test_reset_fork_and_close_are_durable(run: Run) -> None:
    c = run.start()
    parent = c.create().handle
    workload(c, parent, 0)
    child = c.s.Fork(pb.HandleRequest(handle=parent), metadata=ALICE).handle
    child_logits = logits(c, child)
    c.append(child, "A short line.")  # below the snapshot interval: resume needs the fork's
    child_after = logits(c, child)
    reset = c.s.Reset(pb.HandleRequest(handle=parent), metadata=ALICE).handle
    gone = c.create().handle
    c.s.Close(pb.HandleRequest(handle=gone), metadata=ALICE)
    run.stop_without_snapshots()
    c = run.start()
    assert not np.array_equal(child_logits, child_after)
    assert np.array_equal(logits(c, child), child_after)
    assert receipt(c, reset).n_seen == 0
    assert code_of(lambda: c.inspect(parent)) == grpc.StatusCode.FAILED_PRECONDITION  # old handle
    assert code_of(lambda: c.inspect(gone)) == grpc.StatusCode.NOT_FOUND
    assert not (run.state / "snapshots" / gone.session_id).exists()


@pytest.mark.model
def test_sessions_falling_due_together_are_snapshotted_one_per_step_while_busy(run: Run) -> None:
    """Four sessions generating side by side pass their snapshot threshold in the same step (mid
    turn: four intervals behind). While jobs wait, the engine snapshots one of them per gap
    between steps, never all four at once (a stall of every session's next token), its file
    written off the engine thread; idle, it takes every due one at once."""
    # a token a step: drafts (speculative decoding) would end the replies in fewer steps, some
    # before another falls due, and the claim is about steps, not about how fast replies end
    c = run.start(snapshot_every_tokens=8, speculative="off")
    d = run.d
    assert d is not None and d.service.scheduler.snapshotter is not None
    snapshotter, scheduler = d.service.scheduler.snapshotter, d.service.scheduler
    taken: list[tuple[int, bool, bool]] = []  # (steps so far, jobs waiting, written beside)
    take, take_behind = snapshotter.take, snapshotter.take_behind

    def recording(session: Any, scrub: bool = False) -> bool:
        taken.append((int(d.service.metrics.steps._value.get()), bool(scheduler.queues), False))
        return take(session, scrub)

    def recording_behind(session: Any) -> None:
        taken.append((int(d.service.metrics.steps._value.get()), bool(scheduler.queues), True))
        take_behind(session)

    snapshotter.take = recording  # type: ignore[method-assign]
    snapshotter.take_behind = recording_behind  # type: ignore[method-assign]
    handles = [c.create().handle for _ in range(4)]
    for h in handles:
        c.append(h, TEXT[:60])  # each short of the threshold: they fall due while generating
    taken.clear()
    # all four jobs enter the same step, whatever the machine's speed
    for done in in_one_step(d.service, [functools.partial(c.generate, h, 40) for h in handles]):
        done.result(300)
    busy = [steps for steps, waiting, _ in taken if waiting]
    assert len(busy) >= 4  # every session's threshold was crossed while the others generated
    assert len(busy) == len(set(busy)), taken  # one per gap between steps
    assert all(beside for _, waiting, beside in taken if waiting), taken  # files off the thread
