"""The journal's per-token chunk rows, kept off the engine thread's SQLite work.

A decoding session journals one chunk per token. The engine thread only holds the rows
(`HeldChunksConnection`); at the reply gate's commit, when nothing else waits in its transaction,
it hands them over (`Handoff`), and the syncer thread writes and commits them on a connection of
its own right before the fsync its replies wait for. A statement on the engine thread's connection
first has every handed row written (by whichever thread gets there first): no statement overtakes a
row logged before it, and the two connections never write at once. A handed write that fails
leaves a gap, so the handoff refuses everything after it (JournalError), as a failed fsync does:
the daemon stops acknowledging.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sinkd.daemon import failpoints
from sinkd.errors import JournalError

INSERT_CHUNK = (
    "INSERT INTO chunks (session, reset_count, logical_pos, cache_pos, tokens, draws, crc)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
Row = tuple[Any, ...]


class HeldChunksConnection(sqlite3.Connection):
    """The engine thread's connection, with the chunk rows of a step held until its next statement
    or commit, then written in one `executemany`, in order (or handed over). Every statement goes
    through here (no cursors are made elsewhere); a rollback drops the held rows with the rest."""

    held: list[Row]
    before_statement: Callable[[], None]  # the handed rows written first

    def hold_chunk(self, row: Row) -> None:
        self.held.append(row)

    def _write_held(self) -> None:
        self.before_statement()
        if self.held:
            rows, self.held = self.held, []
            super().executemany(INSERT_CHUNK, rows)

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self._write_held()
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        self._write_held()
        return super().executemany(sql, parameters)

    def executescript(self, sql_script: str, /) -> sqlite3.Cursor:
        self._write_held()
        return super().executescript(sql_script)

    def commit(self) -> None:
        self._write_held()
        super().commit()

    def rollback(self) -> None:
        self.held = []
        super().rollback()

    @property
    def own_transaction(self) -> bool:
        """Statements other than held rows wait for this connection's commit."""
        return bool(sqlite3.Connection.in_transaction.__get__(self))

    @property
    def in_transaction(self) -> bool:
        return bool(self.held) or self.own_transaction


class Handoff:
    """Rows the engine thread handed over, written and committed by `write` (any thread) on a
    connection of their own."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._rows: list[Row] = []
        self._rows_lock = threading.Lock()  # the list alone: handing over never waits for SQLite
        self._write_lock = threading.Lock()  # one writer at a time, on `_db`
        self._db: sqlite3.Connection | None = None
        self.broken: BaseException | None = None

    def take(self, db: HeldChunksConnection) -> bool:
        """Hand over `db`'s held rows; False (nothing taken) if other statements wait in its
        transaction (they commit together, there) or none is held."""
        if not db.held or db.own_transaction:
            return False
        self._refuse_if_broken()
        with self._rows_lock:
            self._rows.extend(db.held)
        db.held = []
        return True

    @property
    def pending(self) -> bool:
        return bool(self._rows) or self._write_lock.locked()

    def write(self) -> None:
        """Write and commit every handed row (JournalError if that fails: then nothing more)."""
        with self._write_lock:
            self._refuse_if_broken()
            with self._rows_lock:
                rows, self._rows = self._rows, []
            if not rows:
                return
            try:
                failpoints.hit("chunk-write")
                db = self._connection()
                db.executemany(INSERT_CHUNK, rows)
                db.commit()
            except sqlite3.Error as e:
                self.broken = e
                if self._db is not None:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.rollback()
                raise JournalError(f"the journal could not record {len(rows)} chunks: {e}") from e

    def written(self) -> None:
        """Before a statement on the engine thread's connection: every handed row committed."""
        if self._rows or self._write_lock.locked():
            self.write()
        else:
            self._refuse_if_broken()

    def close(self) -> None:
        with self._write_lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _refuse_if_broken(self) -> None:
        if self.broken is not None:
            raise JournalError(f"an earlier chunk write failed: {self.broken}")

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level="DEFERRED")
            db.execute("PRAGMA synchronous=NORMAL")  # the journal's `sync` fsyncs, as for its own
            self._db = db
        return self._db
