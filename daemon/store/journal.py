"""The write-ahead journal: SQLite in WAL mode, one file in the state directory.

It holds what a session is (its record: tenant, policy, sampling, system prompt tokens, the
configuration it was made under) and every chunk of token ids it decoded since its oldest kept
snapshot, with the cache and logical positions the policy gave that chunk. Never text here (the
memory of evicted text, `memory.py`, keeps its tables in the same file, to commit with the chunks). Every row
carries a CRC-32 of its content, so a damaged row is found at resume instead of being replayed.

Only the engine thread writes. A row is part of the durable history once `commit` returns; the
scheduler commits before it replies, so whatever a client was told is on disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sinkd.daemon.store.chunk_rows import Handoff, HeldChunksConnection
from sinkd.errors import JournalError

SCHEMA_VERSION = 1
MOVED_OUT_KEPT = 100_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    record TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL,
    crc INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    reset_count INTEGER NOT NULL,
    logical_pos INTEGER NOT NULL,
    cache_pos INTEGER NOT NULL,
    tokens BLOB NOT NULL,
    draws INTEGER,
    crc INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_by_session ON chunks (session, reset_count, n);
CREATE TABLE IF NOT EXISTS conversations (
    session TEXT PRIMARY KEY,
    reset_count INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    head TEXT NOT NULL,
    before TEXT,
    n_before INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    session TEXT NOT NULL,
    reset_count INTEGER NOT NULL,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS moved_out (
    session TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshots (
    session TEXT NOT NULL,
    reset_count INTEGER NOT NULL,
    n_seen INTEGER NOT NULL,
    path TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (session, reset_count, n_seen)
);
"""


@dataclass(frozen=True)
class Chunk:
    """One sub-batch the policy chose: decode `tokens` at `cache_pos` (logical `logical_pos`).

    `draws`: the session sampler's draw count after this chunk's token was sampled from it; None
    for prefill and for tokens drawn by a per-request sampler.
    """

    n: int
    session: str
    reset_count: int
    logical_pos: int
    cache_pos: int
    tokens: tuple[int, ...]
    draws: int | None
    intact: bool = True


@dataclass(frozen=True)
class StoredSession:
    id: str
    tenant: str
    record: dict[str, Any]
    state: str  # live | failed
    reason: str
    intact: bool


@dataclass(frozen=True)
class SnapshotRow:
    session: str
    reset_count: int
    n_seen: int
    path: str
    bytes: int
    created: float


def made_under(path: Path, gate: str) -> set[Any]:
    """The values of one configuration gate that the live sessions of the journal at `path` were
    made under (a record without it: None), read before the daemon opens the journal (at boot,
    to pick what the engine runs); empty where there is no journal yet."""
    if not path.exists():
        return set()
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT record FROM sessions WHERE state = 'live'").fetchall()
    except sqlite3.Error:  # not a journal yet, or a damaged one: the open will say so
        return set()
    finally:
        db.close()
    values: set[Any] = set()
    for (text,) in rows:
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            values.add(json.loads(text).get("config", {}).get(gate))
    return values


def _tokens_blob(tokens: tuple[int, ...] | list[int]) -> bytes:
    """Little-endian int32s (struct, not numpy: a decode step journals one token)."""
    return struct.pack(f"<{len(tokens)}i", *tokens)


def _chunk_crc(
    session: str, reset_count: int, logical: int, cache: int, blob: bytes, draws: int | None
) -> int:
    head = f"{session}|{reset_count}|{logical}|{cache}|{draws}|".encode()
    return zlib.crc32(blob, zlib.crc32(head))


def _session_crc(session_id: str, tenant: str, record: str, state: str, reason: str) -> int:
    return zlib.crc32(f"{session_id}|{tenant}|{state}|{reason}|{record}".encode())


def _owner_only(path: Path) -> None:
    """The database mode 0600 before SQLite opens it: its -wal and -shm take the database's mode,
    not the umask (journal.db holds every session's token ids and memory text)."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            if name.exists():
                os.chmod(name, 0o600)
    except OSError as e:
        raise JournalError(f"{path}: {e.strerror or e}") from e


CLIENT_TABLES = ("conversations", "responses")  # rows of a session, kept beside its own


class ClientTables:
    """The HTTP clients' tables, in the journal's database and transactions: where a stateless
    client's history stands (a keyed hash, no text) and what a stateful client's responses hold
    (their text: the owner's). Rows go with their session (`Journal.forget_generation`)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def migrate(self) -> None:
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(conversations)")}
        if "before" not in columns:  # a journal from before regenerates were kept
            self._db.execute("ALTER TABLE conversations ADD COLUMN before TEXT")
            self._db.execute(
                "ALTER TABLE conversations ADD COLUMN n_before INTEGER NOT NULL DEFAULT 0"
            )

    def put_head(
        self, session_id: str, reset_count: int, tenant: str, head: str, before: str | None,
        n_before: int,
    ) -> None:  # fmt: skip
        self._db.execute(
            "INSERT OR REPLACE INTO conversations VALUES (?, ?, ?, ?, ?, ?)",
            (session_id, reset_count, tenant, head, before, n_before),
        )

    def heads(
        self, session_id: str | None = None
    ) -> list[tuple[str, int, str, str, str | None, int]]:
        """(session, reset count, tenant, head, head before its last turn, token count then) of
        every conversation session (or of one)."""
        where, args = ("WHERE session=?", (session_id,)) if session_id else ("", ())
        rows = self._db.execute(
            f"SELECT session, reset_count, tenant, head, before, n_before FROM conversations {where}",
            args,
        )
        return [(str(s), int(r), str(t), str(h), b, int(n)) for s, r, t, h, b, n in rows]

    def put_response(
        self, response_id: str, session_id: str, reset_count: int, record: str
    ) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)",
            (response_id, session_id, reset_count, record),
        )

    def drop_response(self, response_id: str) -> None:
        self._db.execute("DELETE FROM responses WHERE id=?", (response_id,))

    def responses(self, session_id: str | None = None) -> list[str]:
        """Every stored response's record (or one session's), oldest first."""
        where, args = ("WHERE session=?", (session_id,)) if session_id else ("", ())
        rows = self._db.execute(f"SELECT record FROM responses {where} ORDER BY rowid", args)
        return [str(r[0]) for r in rows]


class Journal:
    def __init__(self, path: Path, sync: str = "full") -> None:
        if sync not in ("full", "normal"):
            raise JournalError(f"sync: must be 'full' or 'normal', got {sync!r}")
        self.path = path
        self.sync_mode = sync
        self._wal: tuple[int, int] | None = None  # (fd, inode) of the write-ahead log
        self._sync_lock = threading.Lock()  # the engine thread and the syncer both sync
        _owner_only(path)
        try:
            self._db = sqlite3.connect(
                path,
                check_same_thread=False,
                isolation_level="DEFERRED",
                factory=HeldChunksConnection,
            )
            self._db.held = []
            self._handoff = Handoff(path)
            self._db.before_statement = self._handoff.written
            self._db.execute("PRAGMA journal_mode=WAL")
            # full: every commit is fsynced (survives power loss), by `sync` below rather than by
            # SQLite, so that the fsync can run off the engine thread; normal: survives a crash
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            ClientTables(self._db).migrate()
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise JournalError(f"{path}: schema {row[0]}, this sinkd reads {SCHEMA_VERSION}")
            self._db.commit()
        except sqlite3.DatabaseError as e:
            raise JournalError(f"{path}: {e}") from e

    @property
    def db(self) -> HeldChunksConnection:
        """The connection, for the memory's tables: they commit in the same transactions."""
        return self._db

    def close(self) -> None:
        self._db.close()
        with contextlib.suppress(JournalError):  # rows whose replies never went out
            self._handoff.write()
        self._handoff.close()
        with self._sync_lock:
            if self._wal is not None:
                os.close(self._wal[0])
                self._wal = None

    def commit(self) -> bool:
        """Commit; True when something was written that `sync` must still make durable."""
        if not self._db.in_transaction:
            return False
        self._db.commit()
        return self.sync_mode == "full"

    def hand_off(self) -> bool:
        """Instead of a commit here: the held chunk rows go to the next `sync`, which writes and
        commits them before its fsync (chunk_rows.py). False: other statements wait in this
        transaction (or nothing does): `commit` it."""
        return self._handoff.take(self._db)

    def sync(self) -> None:
        """Make every commit so far survive a power loss, the handed chunk rows first written and
        committed: fsync the write-ahead log (what SQLite's synchronous=FULL does at each commit;
        in WAL mode a commit writes only to the log, and SQLite syncs the log before a checkpoint
        and the database after it). Any thread may call it. Raises JournalError."""
        self._handoff.write()
        wal = f"{self.path}-wal"
        with self._sync_lock:
            self._sync(wal)

    def _sync(self, wal: str) -> None:
        try:
            inode = os.stat(wal).st_ino
            if self._wal is None or self._wal[1] != inode:
                if self._wal is not None:
                    os.close(self._wal[0])
                    self._wal = None
                self._wal = (os.open(wal, os.O_RDONLY), inode)
                dir_fd = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)  # the log's own directory entry, once per log file
                finally:
                    os.close(dir_fd)
            os.fsync(self._wal[0])
        except OSError as e:
            raise JournalError(f"{wal}: fsync failed: {e}") from e

    def rollback(self) -> None:
        self._db.rollback()

    # --- a purge owed: deleted rows whose pages the files may still hold ---

    def owe_purge(self, since: float) -> None:
        """In the deleting transaction: a purge is owed, and found at the next start if the
        daemon stops (or dies) before it is done. The first unpaid one's time is kept."""
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('purge_owed', ?)", (repr(since),))

    def purge_owed(self) -> float | None:
        """Since when a purge is owed (unix time), or None."""
        row = self._db.execute("SELECT value FROM meta WHERE key='purge_owed'").fetchone()
        return None if row is None else float(row[0])

    def purge_paid(self) -> None:
        self._db.execute("DELETE FROM meta WHERE key='purge_owed'")

    # --- sessions ---

    def put_session(
        self,
        session_id: str,
        tenant: str,
        record: dict[str, Any],
        state: str = "live",
        reason: str = "",
    ) -> None:
        text = json.dumps(record, sort_keys=True)
        self._db.execute(
            "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?)",
            (
                session_id,
                tenant,
                text,
                state,
                reason,
                _session_crc(session_id, tenant, text, state, reason),
            ),
        )

    def forget_generation(self, session_id: str, keep_reset_count: int | None) -> list[str]:
        """Drop chunks and snapshot rows of every generation but `keep_reset_count` (None: of
        all); returns the snapshot paths to delete."""
        if keep_reset_count is None:
            for table in CLIENT_TABLES:
                self._db.execute(f"DELETE FROM {table} WHERE session=?", (session_id,))
            rows = self._db.execute("SELECT path FROM snapshots WHERE session=?", (session_id,))
            paths = [r[0] for r in rows]
            self._db.execute("DELETE FROM chunks WHERE session=?", (session_id,))
            self._db.execute("DELETE FROM snapshots WHERE session=?", (session_id,))
            return paths
        for table in CLIENT_TABLES:
            self._db.execute(
                f"DELETE FROM {table} WHERE session=? AND reset_count<>?",
                (session_id, keep_reset_count),
            )
        rows = self._db.execute(
            "SELECT path FROM snapshots WHERE session=? AND reset_count<>?",
            (session_id, keep_reset_count),
        )
        paths = [r[0] for r in rows]
        self._db.execute(
            "DELETE FROM chunks WHERE session=? AND reset_count<>?", (session_id, keep_reset_count)
        )
        self._db.execute(
            "DELETE FROM snapshots WHERE session=? AND reset_count<>?",
            (session_id, keep_reset_count),
        )
        return paths

    def delete_session(self, session_id: str) -> list[str]:
        paths = self.forget_generation(session_id, None)
        self._db.execute("DELETE FROM sessions WHERE id=?", (session_id,))
        return paths

    def put_moved_out(self, session_id: str, tenant: str, at: float) -> None:
        """The session left this node for another (ids and owners only; at most MOVED_OUT_KEPT
        rows, the oldest dropped: a node that forgets one answers NOT_FOUND for it)."""
        self._db.execute(
            "INSERT OR REPLACE INTO moved_out VALUES (?, ?, ?)", (session_id, tenant, at)
        )
        self._db.execute(
            "DELETE FROM moved_out WHERE session NOT IN"
            " (SELECT session FROM moved_out ORDER BY at DESC LIMIT ?)",
            (MOVED_OUT_KEPT,),
        )

    def drop_moved_out(self, session_id: str) -> None:
        self._db.execute("DELETE FROM moved_out WHERE session=?", (session_id,))

    def moved_out(self) -> list[tuple[str, str]]:
        """(session, tenant) of the sessions that left this node."""
        return [
            (str(s), str(t)) for s, t in self._db.execute("SELECT session, tenant FROM moved_out")
        ]

    def sessions(self) -> list[StoredSession]:
        out = []
        for sid, tenant, text, state, reason, crc in self._db.execute(
            "SELECT id, tenant, record, state, reason, crc FROM sessions ORDER BY rowid"
        ):
            intact = crc == _session_crc(sid, tenant, text, state, reason)
            try:
                record = json.loads(text) if intact else {}
            except ValueError:
                record, intact = {}, False
            out.append(StoredSession(sid, tenant, record, state, reason, intact))
        return out

    # --- chunks ---

    def add_chunk(
        self,
        session_id: str,
        reset_count: int,
        logical_pos: int,
        cache_pos: int,
        tokens: list[int],
        draws: int | None,
    ) -> None:
        """Held until the next statement or commit (HeldChunksConnection)."""
        blob = _tokens_blob(tokens)
        self._db.hold_chunk(
            (
                session_id,
                reset_count,
                logical_pos,
                cache_pos,
                blob,
                draws,
                _chunk_crc(session_id, reset_count, logical_pos, cache_pos, blob, draws),
            )
        )

    def chunks(self, session_id: str, reset_count: int, from_logical: int = 0) -> Iterator[Chunk]:
        """The session's chunks of this generation whose first token is at or after `from_logical`."""
        rows = self._db.execute(
            "SELECT n, logical_pos, cache_pos, tokens, draws, crc FROM chunks"
            " WHERE session=? AND reset_count=? AND logical_pos>=? ORDER BY n",
            (session_id, reset_count, from_logical),
        )
        for n, logical, cache, blob, draws, crc in rows:
            intact = isinstance(blob, bytes) and crc == _chunk_crc(
                session_id, reset_count, logical, cache, blob, draws
            )
            tokens = tuple(int(t) for t in np.frombuffer(blob, dtype="<i4")) if intact else ()
            yield Chunk(n, session_id, reset_count, logical, cache, tokens, draws, intact)

    def chunk_stats(self, session_id: str, reset_count: int) -> tuple[int, int]:
        """(chunks, tokens) the journal holds for this generation."""
        n, size = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(tokens)), 0) FROM chunks"
            " WHERE session=? AND reset_count=?",
            (session_id, reset_count),
        ).fetchone()
        return int(n), int(size) // 4

    def snapshot_bytes(self) -> dict[str, int]:
        """Per tenant: the bytes of its sessions' snapshot files."""
        return {
            str(tenant): int(size or 0)
            for tenant, size in self._db.execute(
                "SELECT s.tenant, SUM(x.bytes) FROM snapshots x JOIN sessions s"
                " ON s.id = x.session GROUP BY s.tenant"
            )
        }

    def drop_chunks_before(self, session_id: str, reset_count: int, logical_pos: int) -> None:
        """Chunks wholly before `logical_pos` are covered by every kept snapshot: not needed."""
        self._db.execute(
            "DELETE FROM chunks WHERE session=? AND reset_count=? AND logical_pos<?",
            (session_id, reset_count, logical_pos),
        )

    def drop_chunks(self, session_id: str, reset_count: int) -> None:
        self._db.execute(
            "DELETE FROM chunks WHERE session=? AND reset_count=?", (session_id, reset_count)
        )

    # --- snapshots ---

    def add_snapshot(self, row: SnapshotRow) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?, ?, ?, ?)",
            (row.session, row.reset_count, row.n_seen, row.path, row.bytes, row.created),
        )

    def snapshots(self, session_id: str, reset_count: int) -> list[SnapshotRow]:
        """Newest first."""
        rows = self._db.execute(
            "SELECT session, reset_count, n_seen, path, bytes, created FROM snapshots"
            " WHERE session=? AND reset_count=? ORDER BY n_seen DESC",
            (session_id, reset_count),
        )
        return [SnapshotRow(*r) for r in rows]

    def snapshot_paths(self) -> set[str]:
        """Every snapshot file the journal references, all sessions."""
        return {r[0] for r in self._db.execute("SELECT path FROM snapshots")}

    def drop_snapshot(self, row: SnapshotRow) -> None:
        self._db.execute(
            "DELETE FROM snapshots WHERE session=? AND reset_count=? AND n_seen=?",
            (row.session, row.reset_count, row.n_seen),
        )
