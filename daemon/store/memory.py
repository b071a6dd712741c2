"""The memory of evicted text, per session generation: passages in SQLite, found with FTS5, ranked
by BM25 per session. One store, on one connection (the journal's, or its own), composed of parts
with one job each: `EvictedText` writes and trims, `PassageSearch` finds, `Forgetting` deletes,
`RecallLog` records the copies a stream holds, `Sizes` counts.

This is the owner's content: it is deleted, not hidden (`secure_delete`, the full-text index merged
and the write-ahead log truncated after a forget, a reset or a close), and never logged.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from sinkd.cachepolicy.recall_plan import Candidate, RecalledSpan
from sinkd.daemon.store.embedder import Embedder
from sinkd.daemon.store.forgetting import Forgetting
from sinkd.daemon.store.passages import (
    _SCHEMA,
    _SEARCH_SCHEMA,
    Origin,
    Passage,
    PassageTable,
    Segmenting,
    SessionKey,
    Sizes,
    add_origin_columns,
    add_speaker_columns,
    add_tenant_column,
    add_vector_column,
    number_old_passages,
)
from sinkd.daemon.store.recalled_copies import RecallLog
from sinkd.daemon.store.search import PassageSearch, query_terms
from sinkd.daemon.store.speakers import NO_TURNS, Turns
from sinkd.daemon.store.tenant_memory import TenantMemory
from sinkd.daemon.store.wal import Checkpoint
from sinkd.daemon.store.word_index import WordIndexes
from sinkd.daemon.store.writing import EvictedText

__all__ = ["MemoryStore", "Origin", "Passage", "Segmenting", "SessionKey", "query_terms"]


class MemoryStore:
    """A passage is named by its number within its session generation (1, 2, ... in the order
    they were made, never reused): the number is what receipts, listings and `forget` show and
    take."""

    def __init__(
        self,
        db: sqlite3.Connection,
        segmenting: Segmenting | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        self.db = db
        self.segmenting = segmenting or Segmenting()
        self._folder: Path | None = None
        db.execute("PRAGMA secure_delete=ON")
        db.executescript(_SCHEMA)
        number_old_passages(db)
        add_vector_column(db)
        add_speaker_columns(db)
        add_tenant_column(db)
        add_origin_columns(db)
        db.execute("PRAGMA temp_store=MEMORY")  # a query's words never reach a temporary file
        db.executescript(_SEARCH_SCHEMA)
        self.words = WordIndexes(db)
        self.words.split_legacy()
        db.commit()
        self.sizes = Sizes(db)
        self.table = PassageTable(db, self.sizes, self.words)
        self.evicted = EvictedText(self.table, self.segmenting)
        self.finder = PassageSearch(db, self.words, embedder)
        self.forgetting = Forgetting(db, self.table, self.words)
        self.recall_log = RecallLog(db)
        self.across = TenantMemory(db, self.table)  # each tenant's, across its conversations

    @classmethod
    def temporary(
        cls, segmenting: Segmenting | None = None, embedder: Embedder | None = None
    ) -> MemoryStore:
        """For a daemon without a state directory: a private file deleted at `close` (on disk,
        not in RAM, so a long stream's memory does not grow the process)."""
        folder = Path(tempfile.mkdtemp(prefix="sinkd-memory-"))  # mode 0700
        db = sqlite3.connect(folder / "memory.db", check_same_thread=False)
        store = cls(db, segmenting, embedder)
        store.db.execute("PRAGMA journal_mode=WAL")
        store._folder = folder
        return store

    def close(self) -> None:
        """Close a temporary store and delete its file (a journal's store closes with it)."""
        if self._folder is not None:
            self.db.close()
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    # --- one line each: the parts do the work ---

    def mark(self, key: SessionKey) -> int:
        return self.table.mark(key)

    def add_evicted(
        self,
        key: SessionKey,
        logical_start: int,
        tokens: Sequence[int],
        skip: Sequence[bool],
        piece: Callable[[int], bytes],
        turns: Turns = NO_TURNS,
        kept_before: Sequence[int] = (),
    ) -> int:
        return self.evicted.add(key, logical_start, tokens, skip, piece, turns, kept_before)

    def trim(self, key: SessionKey, logical_end: int, piece: Callable[[int], bytes]) -> int:
        return self.evicted.trim(key, logical_end, piece)

    def prune(self, key: SessionKey, max_tokens: int) -> int:
        return self.evicted.prune(key, max_tokens)

    def search(
        self,
        key: SessionKey,
        query: str,
        limit: int,
        embed_missing: bool = True,
        by_meaning: bool = True,
        leave_out: str | None = None,
    ) -> list[Candidate]:
        return self.finder.search(key, query, limit, embed_missing, by_meaning, leave_out)

    @property
    def embedder(self) -> Embedder | None:
        return self.finder.embedder

    @property
    def dense(self) -> bool:
        return self.finder.embedder is not None

    def unindexed(
        self, most: int, key: SessionKey | None = None, tenant: str | None = None
    ) -> list[tuple[int, str]]:
        """(id, text) of up to `most` passages without vectors, newest first: a session's, a
        tenant's or any (see `search.vectors_of`, which makes them anywhere)."""
        return self.finder.unindexed(key, most, tenant)

    def tenants_waiting(self) -> list[str]:
        """The tenants with passages still to embed."""
        return self.finder.tenants_waiting()

    def write_vectors(self, made: Sequence[tuple[int, str, bytes]]) -> int:
        """Vectors made elsewhere for (id, text), kept where the passage still holds that text.
        Derived data: committed here only when no transaction of the journal's was open (then
        nothing but vectors is in it); otherwise with the journal's next commit."""
        opened = not self.db.in_transaction
        n = self.finder.write_vectors(made)
        if opened and self.db.in_transaction:  # an UPDATE of no row opens one too
            self.db.commit()
        return n

    def passages(self, key: SessionKey, ids: Sequence[int] | None = None) -> list[Passage]:
        """The session generation's passages (those numbered `ids`, if given), oldest first."""
        return [p for _, p in self.table.rows(key, ids)]

    def stats(self, key: SessionKey) -> tuple[int, int, int]:
        """(passages, tokens, bytes of token ids and text) stored for the session."""
        return self.sizes.of(key)

    def invalidate(self) -> None:
        """The transaction was rolled back: sizes are read again from the tables."""
        self.sizes.forget()

    def add_recall(self, key: SessionKey, spans: Sequence[RecalledSpan]) -> None:
        self.recall_log.add(key, spans)

    def recalls(self, key: SessionKey) -> list[RecalledSpan]:
        return self.recall_log.of(key)

    def drop_recalls_before(self, key: SessionKey, logical: int) -> None:
        self.recall_log.drop_before(key, logical)

    def cut_recalls(self, key: SessionKey, n_seen: int) -> None:
        self.recall_log.cut(key, n_seen)

    def forget(
        self,
        key: SessionKey,
        passage_id: int | None = None,
        logical: tuple[int, int] | None = None,
        speaker: str | None = None,
    ) -> list[tuple[int, int]]:
        """The logical ranges of the passages deleted."""
        return self.forgetting.forget(key, passage_id, logical, speaker)

    def drop(self, session_id: str, keep_reset_count: int | None = None) -> int:
        """A reset (`keep_reset_count`, the new generation's) or a close (None): the session's
        memory goes. A reset takes what its old generations gave the tenant's memory with it; a
        close leaves that for the tenant's other conversations."""
        n = self.forgetting.drop(session_id, keep_reset_count)
        if keep_reset_count is not None:
            n += self.across.drop_from(session_id, keep_reset_count)
        return n

    @property
    def unmerged(self) -> bool:
        """A full-text index lost rows since its last merge: its old segments still hold words."""
        return bool(self.words.unmerged)

    def merge(self, every: bool = False) -> int:
        return self.forgetting.merge(every)

    def purge(self) -> Checkpoint:
        return self.forgetting.purge()

    def copy(self, parent_key: SessionKey, child_key: SessionKey) -> int:
        """A fork's child starts with the parent's memory as it is now."""
        self.sizes.forget(child_key)
        parent, parent_reset = parent_key.session_id, parent_key.reset_count
        child, child_reset = child_key.session_id, child_key.reset_count
        rows = self.db.execute(
            "SELECT logical_start, logical_end, tokens, text, sealed, created, number, vector,"
            " speaker, turn FROM passages WHERE session=? AND reset_count=? ORDER BY id",
            (parent, parent_reset),
        ).fetchall()
        for a, b, t, x, s, c, number, v, who, turn in rows:  # the same numbers: recalls name them
            cur = self.db.execute(
                "INSERT INTO passages (session, reset_count, logical_start, logical_end, tokens,"
                " text, sealed, created, number, vector, speaker, turn, tenant)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (child, child_reset, a, b, t, x, s, c, number, v, who, turn, child_key.tenant),
            )
            self.words.add(child_key.tenant, int(cur.lastrowid or 0), x)
        self.db.execute(
            "INSERT OR REPLACE INTO memory_marks (session, reset_count, evicted_end, speaker,"
            " turn, header) SELECT ?, ?, evicted_end, speaker, turn, header FROM memory_marks"
            " WHERE session=? AND reset_count=?",
            (child, child_reset, parent, parent_reset),
        )
        self.db.execute(
            "INSERT OR REPLACE INTO passage_numbers SELECT ?, ?, last FROM passage_numbers"
            " WHERE session=? AND reset_count=?",
            (child, child_reset, parent, parent_reset),
        )
        self.db.execute(
            "INSERT INTO recalls (session, reset_count, stream_start, stream_end, source_start,"
            " source_end, passage_id, offset, score, at, speaker, conversation, said_at)"
            " SELECT ?, ?, stream_start, stream_end, source_start, source_end, passage_id,"
            " offset, score, at, speaker, conversation, said_at"
            " FROM recalls WHERE session=? AND reset_count=?",
            (child, child_reset, parent, parent_reset),
        )
        return len(rows)
