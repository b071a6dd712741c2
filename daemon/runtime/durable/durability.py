"""Durable sessions: the journal, the snapshots and the state directory they live in.

A session's history is its record (created, reset, failed, closed) and its chunks: the sub-batches
the policy chose, as token ids with their positions. The journal keeps every acknowledged chunk since
the session's oldest kept snapshot; a snapshot is the sequence's cells, its policy state and its
next-token logits at one point. Resume restores the newest snapshot that verifies and replays the
chunks after it through the same policy. Engine thread only, except `open` and `close`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sinkd.cachepolicy import PolicyConfig, SeqState
from sinkd.cachepolicy.sequence import TraceEvent
from sinkd.daemon import failpoints
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.private import private_dir
from sinkd.daemon.runtime.durable.disk_space import DiskSpace
from sinkd.daemon.runtime.durable.purge import Purge
from sinkd.daemon.runtime.durable.snapshot_writer import SNAPSHOT_RETRY_S, SnapshotWriter, Write
from sinkd.daemon.runtime.sessions import Session, SessionState
from sinkd.daemon.store import generation_rows, snapshots
from sinkd.daemon.store.embedder import Embedder
from sinkd.daemon.store.journal import Chunk, ClientTables, Journal, SnapshotRow, StoredSession
from sinkd.daemon.store.memory import MemoryStore, Segmenting
from sinkd.daemon.store.narrated import NarratedTables
from sinkd.daemon.store.tenant_marks import TenantMarks
from sinkd.errors import CorruptSnapshot, JournalError, ResourceExhausted

log = logging.getLogger("sinkd.durability")

# what a session's state was computed under; any difference at resume makes it stale
GATES = (
    "model",
    "model_sha256",
    "tokenizer_sha256",
    "template_sha256",
    "kv_type",
    "llama_cpp",
    "n_ctx_seq",
    "flash_attn",  # another attention kernel sums differently (and lays V out otherwise)
    "cpu_kernels",  # another build's CPU kernels sum in another order (engine/llama.py's NOTE)
    "backend",  # a GPU backend, another device or another share of layers offloaded: other bits
)
# gates added after sessions were journalled without them: a record that lacks one was made on the
# machine whose state directory holds it, so it is not refused for the lack alone
GATED_SINCE = frozenset({"cpu_kernels"})
# gates whose value before they were recorded is known: every state was computed on the CPU then
GATE_BEFORE = {"backend": "cpu"}


def gate_value(made_under: dict[str, Any], key: str) -> Any:
    """A gate's value in a record, an archive or a prefix state (one from before the gate: its
    value then)."""
    return made_under.get(key, GATE_BEFORE.get(key))


def session_record(session: Session, config: dict[str, Any]) -> dict[str, Any]:
    """What the journal keeps of a session: enough to rebuild it, no text."""
    return {
        "policy": session.policy.as_dict(),
        "sampling": session.sampling.model_dump(),
        "system_tokens": list(session.system_tokens),
        "system_prompt_sha256": session.system_prompt_sha256,
        "pinned": session.pinned,
        "reset_count": session.reset_count,
        "generation": session.generation,
        "config": config,
        "failure": session.failure,
        "recall": session.recall.as_dict(),
    }


def policy_from(d: dict[str, Any]) -> PolicyConfig:
    return PolicyConfig.named(
        d["policy"],
        sinks=d["sinks"],
        window=d["window"],
        evict_chunk=d["evict_chunk"],
        compact_interval=d["compact_interval"],
        ingest_chunk=d.get("ingest_chunk", 0),
    )


def gate_differences(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    return [
        f"{key} was {gate_value(stored, key)!r}, the daemon runs {current.get(key)!r}"
        for key in GATES
        if gate_value(stored, key) != current.get(key)
        and not (key in GATED_SINCE and key not in stored)
    ]


def snapshot_meta(session: Session, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "session": session.id,
        "tenant": session.tenant,
        "reset_count": session.reset_count,
        "generation": session.generation,
        "config": config,
        "policy": session.policy.as_dict(),
        "state": dataclasses.asdict(session.seq.state),
        "trace": [e.as_dict() for e in session.seq.trace],
        "retained_sinks": list(session.retained.sinks),
        "retained_window": list(session.retained.window),
        "sampler_seed": session.sampling.seed,
        "sampler_draws": session.sampler.draws,
        "rewinds": session.rewinds,
        "user_turns": session.user_turns,
        "greedy": session.greedy_hint,  # llama.cpp's argmax of the logits stored beside
        "created": time.time(),
    }


def snapshot_disagrees(
    session: Session, meta: dict[str, Any], n_seen: int, config: dict[str, Any]
) -> str:
    """Why a snapshot read for `session` at `n_seen` tokens is not its own ("" if it is): another
    session, reset or generation, another configuration, another token count or sampler seed."""
    expected = {
        "session": session.id,
        "reset_count": session.reset_count,
        "generation": session.generation,
    }
    for key, value in expected.items():
        if meta.get(key) != value:
            return f"it belongs to another {key}"
    differences = gate_differences(meta.get("config", {}), config)
    if differences:
        return "made under another configuration: " + "; ".join(differences)
    if meta.get("state", {}).get("n_seen") != n_seen:
        return "its token count disagrees with the journal"
    if meta.get("sampler_seed") != session.sampling.seed:
        return "its sampler seed disagrees with the session's"
    return ""


def adopt_snapshot_meta(session: Session, meta: dict[str, Any]) -> None:
    """Set the policy state, trace, token ledger and sampler from a verified snapshot."""
    session.seq.state = SeqState(**meta["state"])
    session.seq.trace.clear()
    for e in meta["trace"]:
        session.seq.trace.append(TraceEvent.from_dict(e))
    session.retained.sinks = list(meta["retained_sinks"])
    session.retained.window = deque(meta["retained_window"])
    session.sampler.reset()
    session.sampler.advance(int(meta["sampler_draws"]))
    session.rewinds = int(meta.get("rewinds", 0))
    session.user_turns = int(meta.get("user_turns", 0))


class StateDirLock:
    """The state directory, checked private (it holds every session's token ids: the owner's
    alone), and held by one daemon: UntrustedPath, or JournalError when another sinkd holds it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def claim(self) -> None:
        if self._fd is not None:
            return
        private_dir(self.path)
        private_dir(self.path / "snapshots")
        fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise JournalError(f"{self.path} is in use by another sinkd") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Durability:
    """The state directory: one lock, one journal, one snapshot folder per session."""

    def __init__(
        self,
        state_dir: Path,
        sync: str = "full",
        sync_interval_s: float = 0.0,
        every_tokens: int = 256,
        every_s: float = 300.0,
        keep: int = 2,
        segmenting: Segmenting | None = None,
        embedder: Embedder | None = None,
        purge_interval_s: float = 0.0,
        space: DiskSpace | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.dir = state_dir
        self.space = space  # the filesystem's margin: what would write is refused below it
        self.segmenting = segmenting
        self.embedder = embedder
        self.sync = sync
        self.sync_interval_s = sync_interval_s  # the syncer's least time between two fsyncs
        self.every_tokens = every_tokens
        self.every_s = every_s
        self.keep = max(keep, 2)  # the previous snapshot is the fallback for a damaged newest
        self._journal: Journal | None = None
        self.memory: MemoryStore | None = None
        self._tenant_marks: TenantMarks | None = None
        self._narrated: NarratedTables | None = None
        self.purge = Purge(purge_interval_s, metrics)  # what deletes leave in the index and log
        self.lock = StateDirLock(state_dir)
        self.config: dict[str, Any] = {}
        self._doomed: list[str] = []  # snapshot files to delete once the journal forgets them
        self.writer = SnapshotWriter(self._record_behind, metrics, min(every_s, SNAPSHOT_RETRY_S))

    # --- lifecycle ---

    def claim(self) -> None:
        """The directory checked and locked for this daemon (`StateDirLock`)."""
        self.lock.claim()

    def open(self, config: dict[str, Any]) -> None:
        self.config = config
        self.claim()
        self._journal = Journal(self.dir / "journal.db", self.sync)
        self.memory = MemoryStore(self._journal.db, self.segmenting, self.embedder)
        self._tenant_marks = TenantMarks.opened(self._journal.db)
        self._narrated = NarratedTables.opened(self._journal.db)
        owed = self._journal.purge_owed()
        if owed is not None:  # the daemon stopped before a purge was done: every index merged
            log.info("a purge owed since %s is paid at start", time.ctime(owed))
            self.purge.request(merge=True, every=True)
            self.purge.run_due(self.memory, self._journal, at_once=True)

    def close(self) -> None:
        if self._journal is not None:
            self.writer.settle()
            self.purge.run_due(self.memory, self._journal, at_once=True)
            self._journal.close()
            self._journal = None
            self.memory = None
        self.lock.release()

    @property
    def journal(self) -> Journal:
        """The open journal: the state directory's rows, for this class alone (the others ask
        it by name, below)."""
        assert self._journal is not None, "durability is not open"
        return self._journal

    @property
    def is_open(self) -> bool:
        return self._journal is not None

    def commit(self, defer_sync: bool = False) -> bool:
        """Commit the journal, then delete the snapshot files it no longer references (never
        before: a crash in between must find every file the committed journal names).

        With sync=full the commit is fsynced here, unless `defer_sync`: then True says the caller
        owes a `sync_journal()` before it acknowledges what was committed (the reply gate does that off
        the engine thread), and a step's chunk rows alone are not even committed here: that
        `sync_journal()` writes them first (store/chunk_rows.py). A commit that deletes files, or that a purge follows now, is synced
        here first. (A purge merely pending waits out its interval: the commits meanwhile are
        synced off the engine thread; it synced every step for two seconds after any close.)"""
        if (
            defer_sync
            and self.journal.sync_mode == "full"
            and not self._doomed
            and not self.purge.due()
            and self.journal.hand_off()
        ):
            return True  # a step's chunk rows alone: the syncer writes them before its fsync
        owed = self.journal.commit()
        if owed and (not defer_sync or self.purge.due() or self._doomed):
            self.journal.sync()
            owed = False
        self.purge_due()
        doomed, self._doomed = self._doomed, []
        for p in doomed:
            with contextlib.suppress(OSError):
                (self.dir / p).unlink()
            with contextlib.suppress(OSError):
                (self.dir / p).parent.rmdir()  # a closed session's folder, once empty
        return owed

    def purge_due(self) -> None:
        """After a commit, and between steps: the purge, if one is due (`Purge`)."""
        self.purge.run_due(self.memory, self.journal)

    def owe_purge(self) -> None:
        """In a deleting transaction: the deleted content must leave the files (`Purge`); the
        debt is journalled with the delete, so a start pays what a stop left owed."""
        assert self.memory is not None
        self.journal.owe_purge(time.time())
        self.purge.request(merge=self.memory.unmerged)

    def purged(self, number: int, timeout: float) -> bool:
        """Whether the content of the deletions up to `number` (`Purge.asked` after them) has
        left the files, waiting at most `timeout` seconds (off the engine thread)."""
        return self.purge.wait(number, timeout)

    def sync_journal(self) -> None:
        """Make every commit so far durable, the handed chunk rows committed first (any thread;
        JournalError if the write or the fsync fails)."""
        self.journal.sync()

    def rollback(self) -> None:
        """Undo what was written since the last commit; the files it would have deleted stay."""
        with contextlib.suppress(sqlite3.Error):
            self.journal.rollback()
        self._doomed.clear()
        if self.memory is not None:
            self.memory.invalidate()

    def record(self, transition: Callable[..., None], *args: Any) -> None:
        """Write a transition (created, reset, failed, closed) and commit it, or roll it back and
        raise ResourceExhausted: nothing is acknowledged that the journal did not take."""
        try:
            transition(*args)
            self.commit()
        except (sqlite3.Error, JournalError) as e:
            self.rollback()
            raise ResourceExhausted(f"the journal could not record this: {e}") from None

    # --- reads, for resume ---

    def snapshots_of(self, session: Session) -> list[SnapshotRow]:
        return self.journal.snapshots(session.id, session.reset_count)

    def chunks_after(self, session: Session, logical_pos: int) -> Iterator[Chunk]:
        return self.journal.chunks(session.id, session.reset_count, logical_pos)

    def chunk_stats(self, session: Session) -> tuple[int, int]:
        return self.journal.chunk_stats(session.id, session.reset_count)

    def check_space(self, what: str) -> None:
        """DiskFull if the state directory's filesystem is below its margin (`DiskSpace`)."""
        if self.space is not None:
            self.space.check(what)

    def snapshot_bytes(self) -> dict[str, int]:
        """Per tenant: its sessions' snapshot files' bytes (a few rows a session)."""
        return self.journal.snapshot_bytes()

    # --- transitions ---

    def put(self, session: Session, live: bool | None = None) -> None:
        if live is None:
            live = session.state is not SessionState.FAILED
        record = session_record(session, self.config)
        if live:
            record["failure"] = ""
        self.journal.put_session(
            session.id,
            session.tenant,
            record,
            "live" if live else "failed",
            "" if live else session.failure,
        )

    def created(self, session: Session) -> None:
        self.put(session)
        session.snap_time = time.time()

    def reset(self, session: Session) -> None:
        """Journal a reset (call `fresh` once it is committed: a refused commit changes nothing)."""
        self.writer.settle()
        self.put(session, live=True)
        self._delete_files(self.journal.forget_generation(session.id, session.reset_count))
        self.forget_memory(session.id, session.reset_count)
        self.owe_purge()  # the old generation's chunks leave the write-ahead log too

    def failed(self, session: Session) -> None:
        """A failed session's cells were freed: it keeps its record and nothing to replay."""
        self.writer.settle()
        self.put(session)
        self._delete_files(self.journal.forget_generation(session.id, None))
        self.fresh(session)

    def closed(self, session: Session) -> None:
        self.writer.settle()
        self._delete_files(self.journal.delete_session(session.id))
        self.forget_memory(session.id, None)
        self.owe_purge()

    def forget_memory(self, session_id: str, keep_reset_count: int | None) -> None:
        """Delete the session's stored passages (all but one generation's), wiped after commit."""
        assert self.memory is not None
        if self.memory.drop(session_id, keep_reset_count):
            self.owe_purge()

    def fresh(self, session: Session) -> None:
        """The session's durable history starts again (after a committed reset or failure)."""
        session.unlogged.clear()
        session.snap_n_seen = None
        session.snap_time = time.time()
        session.logged_since_snap = 0
        session.log_chunks = session.log_tokens = 0

    def _delete_files(self, paths: list[str]) -> None:
        self._doomed.extend(paths)

    # --- chunks ---

    def log(
        self, session: Session, logical: int, cache: int, tokens: list[int], draws: int | None
    ) -> None:
        self.journal.add_chunk(session.id, session.reset_count, logical, cache, tokens, draws)
        session.log_chunks += 1
        session.log_tokens += len(tokens)
        session.logged_since_snap += len(tokens)

    def flush(self, session: Session) -> None:
        """The session's decoded prefill chunks become part of its durable history."""
        for logical, cache, tokens in session.unlogged:
            self.log(session, logical, cache, tokens, None)
        session.unlogged.clear()

    # --- snapshots ---

    def due(self, session: Session, now: float) -> bool:
        if session.logged_since_snap == 0 or session.unlogged or now < session.snap_retry_at:
            return False
        if session.logged_since_snap >= self.every_tokens:
            return True
        return session.snap_time is not None and now - session.snap_time >= self.every_s

    def snapshot(self, session: Session, kv: bytes, scrub: bool = False) -> int:
        """Write a snapshot of the session as it is now (every decoded chunk logged); prune.

        `scrub` (after a forget or a rewind): keep this snapshot alone (a rewind's newer ones go
        too) and drop every chunk, so that no file holds the history before it; the write-ahead
        log is truncated after the commit. Returns its size. On failure (disk full, ...) raises
        SnapshotError and the previous snapshots and the journal are untouched."""
        self.writer.settle()
        write = self._copy(session, kv)
        data = snapshots.sealed(write.pieces)
        snapshots.write_atomic(write.path, data, fsync=write.fsync)
        write.size = sum(map(len, data))
        self._record(write, scrub)
        return write.size

    def snapshot_behind(self, session: Session, kv: bytes) -> None:
        """`snapshot`, its file sealed and written off the engine thread (snapshot_writer.py) and
        recorded at a later `settle`; never a scrub."""
        self.writer.settle()
        self.writer.start(self._copy(session, kv))

    def _copy(self, session: Session, kv: bytes) -> Write:
        n_seen = session.seq.state.n_seen
        rel = f"snapshots/{session.id}/{session.reset_count}-{n_seen}.snap"
        path = self.dir / rel
        if not path.parent.is_dir():
            path.parent.mkdir(mode=0o700)
            if self.sync == "full":  # the new folder's entry survives a power loss too
                snapshots.fsync_dir(path.parent.parent)
        snap = snapshots.Snapshot(snapshot_meta(session, self.config), kv, session.last_logits)
        since = session.logged_since_snap
        return Write(session, n_seen, rel, path, snapshots.body(snap), since, self.sync == "full")

    def _record_behind(self, write: Write) -> None:
        """A file written off the engine thread, recorded with a commit of its own; where a
        caller's statements wait in the transaction (a release's note before its close), deleted
        instead, and taken again later: their commit is the caller's."""
        if self.journal.db.own_transaction:
            write.path.unlink(missing_ok=True)
            raise JournalError("a transaction was open; the snapshot is taken again later")
        self._record(write)

    def _record(self, write: Write, scrub: bool = False) -> None:
        """The written file's row, and the older snapshots and chunks it makes needless."""
        failpoints.hit("snapshot-before-journal")
        session, n_seen = write.session, write.n_seen
        now = time.time()
        try:
            self.journal.add_snapshot(
                SnapshotRow(session.id, session.reset_count, n_seen, write.rel, write.size, now)
            )
            kept = self.journal.snapshots(session.id, session.reset_count)
            doomed = [r for r in kept if r.n_seen != n_seen] if scrub else kept[self.keep :]
            for old in doomed:
                self.journal.drop_snapshot(old)
                self._delete_files([old.path])
            kept = [r for r in kept if r not in doomed]
            if scrub:
                self.journal.drop_chunks(session.id, session.reset_count)
                self.owe_purge()
            elif len(kept) >= self.keep:
                self.journal.drop_chunks_before(session.id, session.reset_count, kept[-1].n_seen)
            self.commit()
        except sqlite3.Error as e:  # between steps the transaction holds this snapshot alone
            self.rollback()
            write.path.unlink(missing_ok=True)
            raise JournalError(f"recording a snapshot: {e}") from e
        session.snap_n_seen = n_seen
        session.snap_time = now
        session.logged_since_snap = max(0, session.logged_since_snap - write.since)
        session.log_chunks, session.log_tokens = self.journal.chunk_stats(
            session.id, session.reset_count
        )

    def newest_snapshot(self, session: Session) -> snapshots.Snapshot:
        """The session's snapshot at its current token count, read and verified (a parked
        session's cells); CorruptSnapshot says why it cannot be had."""
        self.writer.settle()
        n_seen = session.seq.state.n_seen
        rows = self.snapshots_of(session)
        if not rows or rows[0].n_seen != n_seen:
            raise CorruptSnapshot(f"no snapshot at token {n_seen} (its newest is gone or older)")
        snap = snapshots.read(self.dir / Path(rows[0].path))
        why = snapshot_disagrees(session, snap.meta, n_seen, self.config)
        if why:
            raise CorruptSnapshot(why)
        return snap

    def sweep(self) -> int:
        """Delete what a crash left in the snapshot folder: half-written temporaries, snapshots the
        journal never recorded, folders of sessions it no longer has. Returns how many."""
        referenced = self.journal.snapshot_paths()
        removed = 0
        root = self.dir / "snapshots"
        for folder in root.iterdir():
            for f in folder.iterdir() if folder.is_dir() else [folder]:
                if f"snapshots/{folder.name}/{f.name}" not in referenced:
                    f.unlink(missing_ok=True)
                    removed += 1
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty
        return removed

    def stored(self) -> list[StoredSession]:
        return self.journal.sessions()

    def drop_snapshot(self, row: SnapshotRow) -> None:
        self.journal.drop_snapshot(row)
        self._delete_files([row.path])

    # --- what other parts keep in the state directory, asked by name ---

    def tenant_marks(self) -> TenantMarks:
        """Where each tenant stands while it moves between nodes (store/tenant_marks.py)."""
        assert self._tenant_marks is not None
        return self._tenant_marks

    def narrated_tables(self) -> NarratedTables:
        """Narrated streams' state and facts (store/narrated.py)."""
        assert self._narrated is not None, "durability is not open"
        return self._narrated

    def client_tables(self) -> ClientTables:
        """The HTTP clients' tables (where conversations stand, stored responses)."""
        return ClientTables(self.journal.db)

    def moved_out(self) -> list[tuple[str, str]]:
        """(session, tenant) of the sessions that moved to another node."""
        return self.journal.moved_out()

    def note_moved_out(self, session: Session) -> None:
        """The session moves to another node (committed with its close)."""
        self.journal.put_moved_out(session.id, session.tenant, time.time())

    def rows_of(self, session: Session) -> dict[str, Any]:
        """The session generation's rows, as an archive carries them."""
        self.writer.settle()
        return generation_rows.rows_of(self.journal.db, session.id, session.reset_count)

    def adopt_rows(
        self, stored: StoredSession, rows: dict[str, Any], snapshot: SnapshotRow | None
    ) -> None:
        """An imported session's rows and snapshot, in the transaction the caller commits."""
        if snapshot is not None:
            self.journal.add_snapshot(snapshot)
        self.journal.put_session(
            stored.id, stored.tenant, stored.record, stored.state, stored.reason
        )
        generation_rows.load_rows(self.journal.db, stored.id, stored.tenant, rows)
        self.journal.drop_moved_out(stored.id)  # it came back
