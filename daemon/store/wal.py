"""The write-ahead log's truncation, and what SQLite answered.

`PRAGMA wal_checkpoint(TRUNCATE)` copies the log into the database and empties it, unless a reader
still holds a snapshot the log serves (another connection's open read transaction: the syncer's,
an operator's backup, a `sqlite3` shell). Then it answers busy and leaves the log as it was, pages
of deleted rows included, and raises nothing: a caller that does not read the answer cannot know.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass


@dataclass(frozen=True)
class Checkpoint:
    """SQLite's answer: `busy` (the log was not emptied), the log's frames, those copied."""

    busy: bool
    log_frames: int
    checkpointed: int

    @property
    def truncated(self) -> bool:
        return not self.busy


def truncate(db: sqlite3.Connection, wait_ms: int = 0) -> Checkpoint:
    """Empty the log, waiting at most `wait_ms` for readers (SQLite's busy handler: the calling
    thread is blocked meanwhile). No transaction of `db` may be open."""
    (before,) = db.execute("PRAGMA busy_timeout").fetchone()
    db.execute(f"PRAGMA busy_timeout={max(0, int(wait_ms))}")
    try:
        busy, log_frames, checkpointed = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        db.execute(f"PRAGMA busy_timeout={int(before)}")
    return Checkpoint(bool(busy), int(log_frames), int(checkpointed))
