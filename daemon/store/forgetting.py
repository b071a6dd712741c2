"""What the owner and the lifecycle remove from the memory: a passage or a range (forget), a
session's generations (drop, at reset and close), and what deleted text leaves on disk (purge)."""

from __future__ import annotations

import sqlite3

from sinkd.daemon.store import wal
from sinkd.daemon.store.passages import PassageTable, SessionKey
from sinkd.daemon.store.speakers import UNKNOWN
from sinkd.daemon.store.word_index import WordIndexes


class Forgetting:
    def __init__(self, db: sqlite3.Connection, table: PassageTable, words: WordIndexes) -> None:
        self.db = db
        self.table = table
        self.words = words

    def forget(
        self,
        key: SessionKey,
        passage_id: int | None = None,
        logical: tuple[int, int] | None = None,
        speaker: str | None = None,
    ) -> list[tuple[int, int]]:
        """Delete one passage, every passage that overlaps a logical range, or every passage one
        speaker said; returns the logical ranges deleted. A passage that overlaps the range is
        deleted whole (its text is not cut)."""
        columns = "SELECT id, logical_start, logical_end FROM passages"
        if passage_id is not None:
            rows = self.db.execute(
                f"{columns} WHERE session=? AND reset_count=? AND number=?",
                (key.session_id, key.reset_count, passage_id),
            ).fetchall()
        elif speaker is not None:
            rows = self.db.execute(
                f"{columns} WHERE session=? AND reset_count=? AND COALESCE(speaker, ?)=?",
                (key.session_id, key.reset_count, UNKNOWN, speaker),
            ).fetchall()
        else:
            assert logical is not None
            rows = self.db.execute(
                f"{columns} WHERE session=? AND reset_count=? AND logical_start<? AND logical_end>?",
                (key.session_id, key.reset_count, logical[1], logical[0]),
            ).fetchall()
        self.table.delete([int(r[0]) for r in rows])
        return [(int(a), int(b)) for _, a, b in rows]

    def drop(self, session_id: str, keep_reset_count: int | None = None) -> int:
        """Delete the session's passages, marks and recalls of every generation but
        `keep_reset_count` (None: all); returns passages deleted."""
        where = "session=?"
        args: list[object] = [session_id]
        if keep_reset_count is not None:
            where += " AND reset_count<>?"
            args.append(keep_reset_count)
        ids = [int(r[0]) for r in self.db.execute(f"SELECT id FROM passages WHERE {where}", args)]
        self.table.delete(ids)
        self.db.execute(f"DELETE FROM memory_marks WHERE {where}", args)
        self.db.execute(f"DELETE FROM passage_numbers WHERE {where}", args)
        self.db.execute(f"DELETE FROM recalls WHERE {where}", args)
        return len(ids)

    def merge(self, every: bool = False) -> int:
        """After a committed delete: merge the full-text indexes that lost rows (their old
        segments still name the deleted words), and commit. The pages as they were stay in the
        write-ahead log until it is truncated (`wal.truncate`)."""
        n = self.words.optimize(every)
        self.db.commit()
        return n

    def purge(self) -> wal.Checkpoint:
        """Merge, then truncate the log: for a store whose file no other connection opens (a
        daemon's temporary one); the journal's purge is `durable/purge.py`'s."""
        self.merge()
        return wal.truncate(self.db)
