"""The memory of evicted text: passages in SQLite, found with FTS5, ranked by BM25 per session.

Every token the policy evicts joins its session's open passage; a passage is sealed at a boundary
that follows the text (an end of line, of sentence or of turn) once it holds `min_tokens`, or at
`max_tokens`. A passage keeps its token ids (recall decodes exactly these), its text (for search
and for the owner), its logical range and when it was stored. The tables live in the journal's
database, so a passage is committed in the same transaction as the chunk whose append evicted it.

This is the owner's content: it is deleted, not hidden (`secure_delete`, the full-text index merged
and the write-ahead log truncated after a forget, a reset or a close), and never logged.
"""

from __future__ import annotations

import math
import re
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sinkd.cachepolicy.recall import Candidate

_SCHEMA = """
CREATE TABLE IF NOT EXISTS passages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    reset_count INTEGER NOT NULL,
    logical_start INTEGER NOT NULL,
    logical_end INTEGER NOT NULL,
    tokens BLOB NOT NULL,
    text TEXT NOT NULL,
    sealed INTEGER NOT NULL,
    created REAL NOT NULL,
    number INTEGER
);
CREATE INDEX IF NOT EXISTS passages_by_session ON passages (session, reset_count, logical_start);
CREATE INDEX IF NOT EXISTS passages_open ON passages (session, reset_count) WHERE sealed=0;
CREATE VIRTUAL TABLE IF NOT EXISTS passages_fts USING fts5(text, tokenize='porter unicode61');
CREATE TABLE IF NOT EXISTS memory_marks (
    session TEXT NOT NULL,
    reset_count INTEGER NOT NULL,
    evicted_end INTEGER NOT NULL,
    PRIMARY KEY (session, reset_count)
);
CREATE TABLE IF NOT EXISTS passage_numbers (
    session TEXT NOT NULL,
    reset_count INTEGER NOT NULL,
    last INTEGER NOT NULL,
    PRIMARY KEY (session, reset_count)
);
CREATE TABLE IF NOT EXISTS recalls (
    session TEXT NOT NULL,
    reset_count INTEGER NOT NULL,
    stream_start INTEGER NOT NULL,
    stream_end INTEGER NOT NULL,
    source_start INTEGER NOT NULL,
    source_end INTEGER NOT NULL,
    passage_id INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    score REAL NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS recalls_by_session ON recalls (session, reset_count, stream_start);
"""

# this connection's: the index's terms by passage, and a one-row table that stems a query
_SEARCH_SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS temp.passage_terms USING fts5vocab(main, passages_fts, instance);
CREATE VIRTUAL TABLE IF NOT EXISTS temp.query_text USING fts5(text, tokenize='porter unicode61');
CREATE VIRTUAL TABLE IF NOT EXISTS temp.query_terms USING fts5vocab(temp, query_text, instance);
"""
_K1, _B = 1.2, 0.75  # FTS5's BM25 weights

# words too common to say what a query is about
_STOPWORDS = frozenset(
    """a about above after again all am an and any are as at be been before being below between
    both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me more
    most my myself no nor not now of off on once only or other our ours out over own same she
    should so some such than that the their theirs them then there these they this those through
    to too under until up very was we were what when where which while who whom why will with
    would you your yours yourself tell said say says remember recall earlier""".split()
)
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_BOUNDARY = re.compile(r"(\n|[.!?]\s*$|[.!?][\"')\]]\s*$)")
MAX_QUERY_TERMS = 32


def query_terms(query: str) -> list[str]:
    """The query's content words, lowercased, in order, without repeats (at most 32)."""
    seen: dict[str, None] = {}
    for w in _WORD.findall(query.lower()):
        if w not in _STOPWORDS and (len(w) > 1 or w.isdigit()):
            seen.setdefault(w, None)
    return list(seen)[:MAX_QUERY_TERMS]


@dataclass(frozen=True)
class Passage:
    id: int
    logical: tuple[int, int]
    tokens: tuple[int, ...]
    text: str
    created: float
    sealed: bool

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "passage_id": self.id,
            "logical": list(self.logical),
            "n_tokens": len(self.tokens),
            "created_unix_time": self.created,
            "sealed": self.sealed,
            "text": self.text,
        }
        return d


@dataclass(frozen=True)
class Segmenting:
    """How evicted tokens become passages: `text` seals at boundaries, `fixed` at max_tokens."""

    kind: str = "text"
    min_tokens: int = 16
    max_tokens: int = 48


def _blob(tokens: Sequence[int]) -> bytes:
    return np.asarray(tokens, dtype="<i4").tobytes()


def _text(tokens: Sequence[int], piece: Callable[[int], bytes]) -> str:
    return b"".join(piece(t) for t in tokens).decode("utf-8", errors="replace")


def _unblob(blob: bytes) -> tuple[int, ...]:
    return tuple(int(t) for t in np.frombuffer(blob, dtype="<i4"))


def _number_old_passages(db: sqlite3.Connection) -> None:
    """A store written before passages had numbers of their own: each keeps its old id as its
    number (what receipts and listings showed stays valid), and its session generation numbers on
    from its highest."""
    columns = {str(r[1]) for r in db.execute("PRAGMA table_info(passages)")}
    if "number" not in columns:  # once, at the first start on such a file: no scan after
        db.execute("ALTER TABLE passages ADD COLUMN number INTEGER")
        db.execute("UPDATE passages SET number=id")
        db.execute(
            "INSERT OR REPLACE INTO passage_numbers SELECT session, reset_count, MAX(number)"
            " FROM passages GROUP BY session, reset_count"
        )
    db.execute(
        "CREATE UNIQUE INDEX IF NOT EXISTS passages_by_number ON passages"
        " (session, reset_count, number)"
    )


class MemoryStore:
    """Passages of every session, on one SQLite connection (the journal's, or its own).

    A passage is named by its number within its session generation (1, 2, ... in the order they
    were made, never reused): the number is what receipts, listings and `forget` show and take.
    The row id under it counts every session's passages, so it would tell one tenant how much
    another's sessions evicted; it stays inside this class (the full-text index's row id)."""

    def __init__(self, db: sqlite3.Connection, segmenting: Segmenting | None = None) -> None:
        self.db = db
        self.segmenting = segmenting or Segmenting()
        self._folder: Path | None = None
        # (passages, tokens, bytes) per (session, reset count), kept by every write and delete so
        # that the size a receipt shows costs no scan; filled lazily, dropped on a rollback
        self._stats: dict[tuple[str, int], list[int]] = {}
        db.execute("PRAGMA secure_delete=ON")
        db.executescript(_SCHEMA)
        _number_old_passages(db)
        db.commit()
        db.execute("PRAGMA temp_store=MEMORY")  # a query's words never reach a temporary file
        db.executescript(_SEARCH_SCHEMA)

    @classmethod
    def temporary(cls, segmenting: Segmenting | None = None) -> MemoryStore:
        """For a daemon without a state directory: a private file deleted at `close` (on disk,
        not in RAM, so a long stream's memory does not grow the process)."""
        folder = Path(tempfile.mkdtemp(prefix="sinkd-memory-"))  # mode 0700
        store = cls(sqlite3.connect(folder / "memory.db", check_same_thread=False), segmenting)
        store.db.execute("PRAGMA journal_mode=WAL")
        store._folder = folder
        return store

    def close(self) -> None:
        """Close a temporary store and delete its file (a journal's store closes with it)."""
        if self._folder is not None:
            self.db.close()
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    # --- writing, as the stream evicts ---

    def mark(self, session: str, reset_count: int) -> int:
        row = self.db.execute(
            "SELECT evicted_end FROM memory_marks WHERE session=? AND reset_count=?",
            (session, reset_count),
        ).fetchone()
        return int(row[0]) if row else 0

    def add_evicted(
        self,
        session: str,
        reset_count: int,
        logical_start: int,
        tokens: Sequence[int],
        skip: Sequence[bool],
        piece: Callable[[int], bytes],
    ) -> int:
        """Store evicted tokens [logical_start, +len): those below the session's mark are stored
        already (a replay), those with `skip` are recalled copies; a skipped token seals the open
        passage so that a passage is always one contiguous range. Returns tokens stored."""
        mark = self.mark(session, reset_count)
        stored = 0
        run: list[tuple[int, int]] = []
        for i, (tok, skipped) in enumerate(zip(tokens, skip, strict=True)):
            pos = logical_start + i
            if pos < mark:
                continue
            if skipped:
                stored += self._extend(session, reset_count, run, piece)
                run = []
                self._seal_open(session, reset_count)
                continue
            run.append((pos, tok))
        stored += self._extend(session, reset_count, run, piece)
        end = logical_start + len(tokens)
        if end > mark:
            self.db.execute(
                "INSERT OR REPLACE INTO memory_marks VALUES (?, ?, ?)", (session, reset_count, end)
            )
        return stored

    def _open(self, session: str, reset_count: int) -> tuple[int, int, int, bytes, str] | None:
        row = self.db.execute(
            "SELECT id, logical_start, logical_end, tokens, text FROM passages"
            " WHERE session=? AND reset_count=? AND sealed=0",
            (session, reset_count),
        ).fetchone()
        return (int(row[0]), int(row[1]), int(row[2]), row[3], row[4]) if row else None

    def _seal_open(self, session: str, reset_count: int) -> None:
        self.db.execute(
            "UPDATE passages SET sealed=1 WHERE session=? AND reset_count=? AND sealed=0",
            (session, reset_count),
        )

    def _extend(
        self,
        session: str,
        reset_count: int,
        run: list[tuple[int, int]],
        piece: Callable[[int], bytes],
    ) -> int:
        """Add a contiguous run of tokens to the open passage, sealing (and opening a new one)
        where the segmenting says; one write per passage touched."""
        if not run:
            return 0
        seg = self.segmenting
        open_ = self._open(session, reset_count)
        if open_ is not None and open_[2] != run[0][0]:  # not contiguous: start afresh
            self._seal_open(session, reset_count)
            open_ = None
        pid: int | None = None
        start, toks = run[0][0], []
        if open_ is not None:
            pid, start, _, blob, _ = open_
            toks = list(_unblob(blob))
        for pos, tok in run:
            if not toks:
                start = pos
            toks.append(tok)
            tail = piece(tok).decode("utf-8", errors="ignore")
            boundary = seg.kind == "text" and len(toks) >= seg.min_tokens and _BOUNDARY.search(tail)
            if boundary or len(toks) >= seg.max_tokens:
                self._write(session, reset_count, pid, start, toks, _text(toks, piece), sealed=True)
                pid, toks = None, []
        if toks:
            self._write(session, reset_count, pid, start, toks, _text(toks, piece), sealed=False)
        return len(run)

    def _write(
        self,
        session: str,
        reset_count: int,
        pid: int | None,
        start: int,
        toks: list[int],
        text: str,
        sealed: bool,
    ) -> None:
        """Rewrite passage `pid` (its start, number and creation time stay), or add one, numbered
        next in its session generation."""
        end = start + len(toks)
        blob = _blob(toks)
        size = len(blob) + len(text.encode("utf-8"))
        if pid is None:
            self._bump(session, reset_count, 1, len(toks), size)
            cur = self.db.execute(
                "INSERT INTO passages (session, reset_count, logical_start, logical_end,"
                " tokens, text, sealed, created, number) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (session, reset_count, start, end, blob, text, int(sealed), time.time(),
                 self._next_number(session, reset_count)),
            )  # fmt: skip
            pid = int(cur.lastrowid or 0)
        else:
            old = self._size_of(pid)
            if old is not None:
                self._bump(session, reset_count, 0, len(toks) - old[2], size - old[3])
            self.db.execute(
                "UPDATE passages SET logical_end=?, tokens=?, text=?, sealed=? WHERE id=?",
                (end, blob, text, int(sealed), pid),
            )
            self.db.execute("DELETE FROM passages_fts WHERE rowid=?", (pid,))
        self.db.execute("INSERT INTO passages_fts (rowid, text) VALUES (?, ?)", (pid, text))

    def _next_number(self, session: str, reset_count: int) -> int:
        row = self.db.execute(
            "SELECT last FROM passage_numbers WHERE session=? AND reset_count=?",
            (session, reset_count),
        ).fetchone()
        number = (int(row[0]) if row else 0) + 1
        self.db.execute(
            "INSERT OR REPLACE INTO passage_numbers VALUES (?, ?, ?)",
            (session, reset_count, number),
        )
        return number

    # --- reading ---

    def search(self, session: str, reset_count: int, query: str, limit: int) -> list[Candidate]:
        """BM25 over this session generation's passages alone, best first (higher is better).

        Not FTS5's `bm25()`: it takes its statistics (passage count, lengths, how many passages
        hold a word) from the whole index, every session and tenant, so another's text would move
        a session's scores, and which passages it recalls, and the scores would tell of it. Here
        they come from the session's own passages: FTS5 finds a word's occurrences (its porter
        stems, as a MATCH would), the length of a passage is its tokens, and the weights are
        FTS5's (k1 1.2, b 0.75, idf log((N - n + 0.5) / (n + 0.5)), at least 1e-6).
        """
        stems = self._stems(query_terms(query))
        spans, numbers = {}, {}
        for i, a, b, number in self.db.execute(
            "SELECT id, logical_start, logical_end, number FROM passages"
            " WHERE session=? AND reset_count=?",
            (session, reset_count),
        ):
            spans[int(i)], numbers[int(i)] = (int(a), int(b)), int(number)
        if not stems or not spans:
            return []
        length = {i: b - a for i, (a, b) in spans.items()}
        n, avgdl = len(spans), max(sum(length.values()) / len(spans), 1.0)
        score: dict[int, float] = {}
        for stem in stems:
            hits = self.db.execute(
                "SELECT v.doc, COUNT(*) FROM temp.passage_terms v JOIN passages p ON p.id = v.doc"
                " WHERE v.term=? AND p.session=? AND p.reset_count=? GROUP BY v.doc",
                (stem, session, reset_count),
            ).fetchall()
            idf = math.log((n - len(hits) + 0.5) / (len(hits) + 0.5))
            idf = idf if idf > 0 else 1e-6
            for doc, tf in hits:
                norm = _K1 * (1 - _B + _B * length[doc] / avgdl)
                score[doc] = score.get(doc, 0.0) + idf * tf * (_K1 + 1) / (tf + norm)
        ranked = sorted(score, key=lambda d: (-score[d], spans[d]))[:limit]
        return [Candidate(numbers[d], spans[d], length[d], score[d]) for d in ranked]

    def _stems(self, terms: list[str]) -> list[str]:
        """The index's forms of the query's words (porter, unicode61), in order, without repeats:
        FTS5's own tokenizer, over a one-row table of this connection's."""
        if not terms:
            return []
        opened = not self.db.in_transaction  # then the temp write must not leave one open
        self.db.execute(
            "INSERT INTO temp.query_text (rowid, text) VALUES (1, ?)", (" ".join(terms),)
        )
        try:
            rows = self.db.execute("SELECT term FROM temp.query_terms ORDER BY offset").fetchall()
        finally:
            self.db.execute("DELETE FROM temp.query_text")
            if opened:
                self.db.commit()  # the temp database only: nothing of the journal's
        return list(dict.fromkeys(str(r[0]) for r in rows))

    def passages(
        self, session: str, reset_count: int, ids: Sequence[int] | None = None
    ) -> list[Passage]:
        """The session generation's passages (those numbered `ids`, if given), oldest first."""
        return [p for _, p in self._rows(session, reset_count, ids)]

    def _rows(
        self, session: str, reset_count: int, numbers: Sequence[int] | None = None
    ) -> list[tuple[int, Passage]]:
        """(row id, passage) of the session generation's passages, by logical start."""
        sql = (
            "SELECT id, number, logical_start, logical_end, tokens, text, created, sealed"
            " FROM passages WHERE session=? AND reset_count=?"
        )
        args: list[object] = [session, reset_count]
        if numbers is not None:
            sql += f" AND number IN ({','.join('?' * len(numbers))})"
            args += list(numbers)
        rows = self.db.execute(sql + " ORDER BY logical_start", args)
        return [
            (int(i), Passage(int(n), (int(a), int(b)), _unblob(t), x, float(c), bool(s)))
            for i, n, a, b, t, x, c, s in rows
        ]

    def stats(self, session: str, reset_count: int) -> tuple[int, int, int]:
        """(passages, tokens, bytes of token ids and text) stored for the session."""
        key = (session, reset_count)
        if key not in self._stats:
            self._stats[key] = list(self._aggregate(session, reset_count))
        n, toks, size = self._stats[key]
        return n, toks, size

    def invalidate(self) -> None:
        """The transaction was rolled back: sizes are read again from the tables."""
        self._stats.clear()

    def _bump(self, session: str, reset_count: int, passages: int, toks: int, size: int) -> None:
        cached = self._stats.get((session, reset_count))
        if cached is not None:
            cached[0] += passages
            cached[1] += toks
            cached[2] += size

    def _size_of(self, pid: int) -> tuple[str, int, int, int] | None:
        row = self.db.execute(
            "SELECT session, reset_count, logical_end - logical_start,"
            " LENGTH(tokens) + LENGTH(CAST(text AS BLOB)) FROM passages WHERE id=?",
            (pid,),
        ).fetchone()
        return (str(row[0]), int(row[1]), int(row[2]), int(row[3])) if row else None

    def _aggregate(self, session: str, reset_count: int) -> tuple[int, int, int]:
        n, toks, size = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(logical_end - logical_start), 0),"
            " COALESCE(SUM(LENGTH(tokens) + LENGTH(CAST(text AS BLOB))), 0) FROM passages"
            " WHERE session=? AND reset_count=?",
            (session, reset_count),
        ).fetchone()
        return int(n), int(toks), int(size)

    # --- recalls, so a resume knows which stream ranges are copies ---

    def add_recall(self, session: str, reset_count: int, spans: Sequence[object]) -> None:
        for s in spans:
            self.db.execute(
                "INSERT INTO recalls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    session,
                    reset_count,
                    s.stream[0],  # type: ignore[attr-defined]
                    s.stream[1],  # type: ignore[attr-defined]
                    s.source[0],  # type: ignore[attr-defined]
                    s.source[1],  # type: ignore[attr-defined]
                    s.passage_id,  # type: ignore[attr-defined]
                    s.offset,  # type: ignore[attr-defined]
                    s.score,  # type: ignore[attr-defined]
                    s.at,  # type: ignore[attr-defined]
                ),
            )

    def recalls(self, session: str, reset_count: int) -> list[tuple[Any, ...]]:
        """(passage, source start, end, stream start, end, offset, score, at), oldest first."""
        return list(
            self.db.execute(
                "SELECT passage_id, source_start, source_end, stream_start, stream_end, offset,"
                " score, at FROM recalls WHERE session=? AND reset_count=? ORDER BY stream_start",
                (session, reset_count),
            )
        )

    def drop_recalls_before(self, session: str, reset_count: int, logical: int) -> None:
        self.db.execute(
            "DELETE FROM recalls WHERE session=? AND reset_count=? AND stream_end<=?",
            (session, reset_count, logical),
        )

    def cut_recalls(self, session: str, reset_count: int, n_seen: int) -> None:
        """Copies end at `n_seen`: a recall whose job ended early left the rest undecoded."""
        self.db.execute(
            "DELETE FROM recalls WHERE session=? AND reset_count=? AND stream_start>=?",
            (session, reset_count, n_seen),
        )
        self.db.execute(
            "UPDATE recalls SET stream_end=? WHERE session=? AND reset_count=? AND stream_end>?",
            (n_seen, session, reset_count, n_seen),
        )

    # --- what the owner and the lifecycle remove ---

    def forget(
        self,
        session: str,
        reset_count: int,
        passage_id: int | None = None,
        logical: tuple[int, int] | None = None,
    ) -> int:
        """Delete one passage, or every passage that overlaps a logical range; returns how many.
        A passage that overlaps the range is deleted whole (its text is not cut)."""
        if passage_id is not None:
            rows = self.db.execute(
                "SELECT id FROM passages WHERE session=? AND reset_count=? AND number=?",
                (session, reset_count, passage_id),
            )
        else:
            assert logical is not None
            rows = self.db.execute(
                "SELECT id FROM passages WHERE session=? AND reset_count=?"
                " AND logical_start<? AND logical_end>?",
                (session, reset_count, logical[1], logical[0]),
            )
        ids = [int(r[0]) for r in rows]
        self._delete(ids)
        return len(ids)

    def _delete(self, ids: Sequence[int]) -> None:
        for pid in ids:
            old = self._size_of(pid)
            if old is not None:
                self._bump(old[0], old[1], -1, -old[2], -old[3])
            self.db.execute("DELETE FROM passages_fts WHERE rowid=?", (pid,))
            self.db.execute("DELETE FROM passages WHERE id=?", (pid,))

    def drop(self, session: str, keep_reset_count: int | None = None) -> int:
        """Delete the session's passages, marks and recalls of every generation but
        `keep_reset_count` (None: all); returns passages deleted."""
        where, args = "session=?", [session]
        if keep_reset_count is not None:
            where += " AND reset_count<>?"
            args.append(keep_reset_count)  # type: ignore[arg-type]
        ids = [int(r[0]) for r in self.db.execute(f"SELECT id FROM passages WHERE {where}", args)]
        self._delete(ids)
        self.db.execute(f"DELETE FROM memory_marks WHERE {where}", args)
        self.db.execute(f"DELETE FROM passage_numbers WHERE {where}", args)
        self.db.execute(f"DELETE FROM recalls WHERE {where}", args)
        return len(ids)

    def purge(self) -> None:
        """After a committed delete: merge the full-text index (its old segments still name the
        deleted words) and truncate the write-ahead log, so deleted text leaves the disk."""
        self.db.execute("INSERT INTO passages_fts (passages_fts) VALUES ('optimize')")
        self.db.commit()
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def copy(self, parent: str, parent_reset: int, child: str, child_reset: int) -> int:
        """A fork's child starts with the parent's memory as it is now."""
        self._stats.pop((child, child_reset), None)
        rows = self.db.execute(
            "SELECT logical_start, logical_end, tokens, text, sealed, created, number FROM passages"
            " WHERE session=? AND reset_count=? ORDER BY id",
            (parent, parent_reset),
        ).fetchall()
        for a, b, t, x, s, c, number in rows:  # the same numbers: its recalls name them
            cur = self.db.execute(
                "INSERT INTO passages (session, reset_count, logical_start, logical_end, tokens,"
                " text, sealed, created, number) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (child, child_reset, a, b, t, x, s, c, number),
            )
            self.db.execute(
                "INSERT INTO passages_fts (rowid, text) VALUES (?, ?)", (cur.lastrowid, x)
            )
        self.db.execute(
            "INSERT OR REPLACE INTO memory_marks SELECT ?, ?, evicted_end FROM memory_marks"
            " WHERE session=? AND reset_count=?",
            (child, child_reset, parent, parent_reset),
        )
        self.db.execute(
            "INSERT OR REPLACE INTO passage_numbers SELECT ?, ?, last FROM passage_numbers"
            " WHERE session=? AND reset_count=?",
            (child, child_reset, parent, parent_reset),
        )
        self.db.execute(
            "INSERT INTO recalls SELECT ?, ?, stream_start, stream_end, source_start, source_end,"
            " passage_id, offset, score, at FROM recalls WHERE session=? AND reset_count=?",
            (child, child_reset, parent, parent_reset),
        )
        return len(rows)

    def trim(
        self,
        session: str,
        reset_count: int,
        logical_end: int,
        piece: Callable[[int], bytes],
    ) -> int:
        """At resume: drop evicted text at or beyond `logical_end` (committed ahead of the chunk
        that evicted it, which never was); a passage that straddles it keeps its head. Returns
        tokens dropped. The recalled copies are not evicted text: `cut_recalls` ends them where the
        resumed stream does."""
        dropped = 0
        for pid, p in self._rows(session, reset_count):
            if p.logical[1] <= logical_end:
                continue
            keep = max(0, logical_end - p.logical[0])
            dropped += len(p.tokens) - keep
            if keep:  # the same passage, shortened in place: its number stays
                head = list(p.tokens[:keep])
                self._write(
                    session, reset_count, pid, p.logical[0], head, _text(head, piece), False
                )
            else:
                self._delete([pid])
        if self.mark(session, reset_count) > logical_end:
            self.db.execute(
                "UPDATE memory_marks SET evicted_end=? WHERE session=? AND reset_count=?",
                (logical_end, session, reset_count),
            )
        return dropped

    def prune(self, session: str, reset_count: int, max_tokens: int) -> int:
        """Delete the oldest passages until at most `max_tokens` are stored; returns tokens
        pruned."""
        _, total, _ = self.stats(session, reset_count)
        pruned = 0
        if total <= max_tokens:
            return 0
        for pid, a, b in self.db.execute(
            "SELECT id, logical_start, logical_end FROM passages WHERE session=? AND reset_count=?"
            " ORDER BY logical_start",
            (session, reset_count),
        ).fetchall():
            if total - pruned <= max_tokens:
                break
            self._delete([int(pid)])
            pruned += int(b) - int(a)
        return pruned
