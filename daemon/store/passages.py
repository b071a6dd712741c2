"""Stored passages of evicted text: the tables, one passage's row, and their sizes.

A passage keeps its token ids (recall decodes exactly these), its text (for search and for the
owner), its logical range and when it was stored. The tables live in the journal's database, so a
passage is committed in the same transaction as the chunk whose append evicted it. This is the
owner's content: it is deleted, not hidden (`secure_delete`), and never logged.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sinkd.daemon.store.speakers import UNKNOWN, SpeakerState
from sinkd.daemon.store.word_index import WordIndexes

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
    number INTEGER,
    vector BLOB
);
CREATE INDEX IF NOT EXISTS passages_by_session ON passages (session, reset_count, logical_start);
CREATE INDEX IF NOT EXISTS passages_open ON passages (session, reset_count) WHERE sealed=0;
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

# this connection's: a one-row table that stems a query (each tenant's terms: word_index.py)
_SEARCH_SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS temp.query_text USING fts5(text, tokenize='porter unicode61');
CREATE VIRTUAL TABLE IF NOT EXISTS temp.query_terms USING fts5vocab(temp, query_text, instance);
"""


@dataclass(frozen=True)
class SessionKey:
    """One generation of one session: what every stored row is filed under (a reset starts a
    new key; the old key's rows are dropped with it)."""

    session_id: str
    reset_count: int
    tenant: str = ""  # whose: its passages are in the tenant's own full-text index


@dataclass(frozen=True)
class Passage:
    id: int  # its number within its session generation (1, 2, ... never reused)
    logical: tuple[int, int]
    tokens: tuple[int, ...]
    text: str
    created: float
    sealed: bool
    speaker: str = UNKNOWN  # its turn's role (speakers.py); "text" outside any turn
    turn: int = 0  # the number of its turn in the session generation's stream (0: before any)
    # in the tenant's memory across conversations (tenant_memory.py): the conversation that said
    # it ("" elsewhere; `turn` is then that conversation's), and whether the user asked for it to
    # be remembered (a request to remember, or a text given to the memory itself)
    conversation: str = ""
    asked: bool = False


@dataclass(frozen=True)
class Origin:
    """Where a passage of the tenant's memory was said: a conversation's generation, its logical
    range there, and whether the user asked for it to be remembered."""

    session_id: str
    reset_count: int
    logical: tuple[int, int]
    asked: bool = False


@dataclass(frozen=True)
class Segmenting:
    """How evicted tokens become passages: `text` seals at boundaries, `fixed` at max_tokens."""

    kind: str = "text"
    min_tokens: int = 16
    max_tokens: int = 48


def blob(tokens: Sequence[int]) -> bytes:
    return np.asarray(tokens, dtype="<i4").tobytes()


def text_of(tokens: Sequence[int], piece: Callable[[int], bytes]) -> str:
    return b"".join(piece(t) for t in tokens).decode("utf-8", errors="replace")


def unblob(blob: bytes) -> tuple[int, ...]:
    return tuple(int(t) for t in np.frombuffer(blob, dtype="<i4"))


def add_speaker_columns(db: sqlite3.Connection) -> None:
    """A store written before speakers were kept: its passages' speaker is NULL ("unknown"), and
    the reading of turn headers starts afresh at each session's mark."""
    for table, column, kind in (
        ("passages", "speaker", "TEXT"),
        ("passages", "turn", "INTEGER"),
        ("recalls", "speaker", "TEXT"),
        ("memory_marks", "speaker", "TEXT"),
        ("memory_marks", "turn", "INTEGER"),
        ("memory_marks", "header", "TEXT"),
    ):
        columns = {str(r[1]) for r in db.execute(f"PRAGMA table_info({table})")}
        if column not in columns:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def add_tenant_column(db: sqlite3.Connection) -> None:
    """A store written before per-tenant indexes: its passages' tenants are filled in as its
    shared index is split (word_index.py)."""
    columns = {str(r[1]) for r in db.execute("PRAGMA table_info(passages)")}
    if "tenant" not in columns:
        db.execute("ALTER TABLE passages ADD COLUMN tenant TEXT NOT NULL DEFAULT ''")
    # each tenant's passages still to embed, newest first: the indexer takes the tenants in turn
    db.execute(
        "CREATE INDEX IF NOT EXISTS passages_unindexed_by_tenant ON passages (tenant, id)"
        " WHERE vector IS NULL"
    )


def add_origin_columns(db: sqlite3.Connection) -> None:
    """The tenant's memory across conversations (tenant_memory.py) keeps where each passage was
    said: the conversation and its generation (a reset of it drops them), its place there, and
    whether the user asked for it; NULL in a conversation's own memory."""
    columns = {str(r[1]) for r in db.execute("PRAGMA table_info(passages)")}
    for column, kind in (
        ("origin_session", "TEXT"),
        ("origin_reset", "INTEGER"),
        ("origin_start", "INTEGER"),
        ("origin_end", "INTEGER"),
        ("asked", "INTEGER"),
        ("corrects", "INTEGER"),  # the number of the passage it corrects (tenant_memory.py)
    ):
        if column not in columns:
            db.execute(f"ALTER TABLE passages ADD COLUMN {column} {kind}")
    db.execute(
        "CREATE INDEX IF NOT EXISTS passages_by_origin ON passages (origin_session, origin_reset)"
        " WHERE origin_session IS NOT NULL"
    )
    columns = {str(r[1]) for r in db.execute("PRAGMA table_info(recalls)")}
    for column, kind in (("conversation", "TEXT"), ("said_at", "REAL")):
        if column not in columns:
            db.execute(f"ALTER TABLE recalls ADD COLUMN {column} {kind}")


def add_vector_column(db: sqlite3.Connection) -> None:
    """A store written before dense search: its passages get their vectors on the next search."""
    columns = {str(r[1]) for r in db.execute("PRAGMA table_info(passages)")}
    if "vector" not in columns:
        db.execute("ALTER TABLE passages ADD COLUMN vector BLOB")
    # the passages still to embed, newest first, found without reading every row's vector
    db.execute(
        "CREATE INDEX IF NOT EXISTS passages_unindexed ON passages (id) WHERE vector IS NULL"
    )


def number_old_passages(db: sqlite3.Connection) -> None:
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


class Sizes:
    """(passages, tokens, bytes) per session generation, kept by every write and delete so that
    the size a receipt shows costs no scan; filled lazily, dropped on a rollback."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self._by_key: dict[SessionKey, list[int]] = {}

    def of(self, key: SessionKey) -> tuple[int, int, int]:
        if key not in self._by_key:
            self._by_key[key] = list(self.count(key))
        n, toks, size = self._by_key[key]
        return n, toks, size

    def count(self, key: SessionKey) -> tuple[int, int, int]:
        """The sizes as the tables hold them now (a scan: `of` keeps them instead)."""
        n, toks, size = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(logical_end - logical_start), 0),"
            " COALESCE(SUM(LENGTH(tokens) + LENGTH(CAST(text AS BLOB))), 0) FROM passages"
            " WHERE session=? AND reset_count=?",
            (key.session_id, key.reset_count),
        ).fetchone()
        return int(n), int(toks), int(size)

    def bump(self, key: SessionKey, passages: int, toks: int, size: int) -> None:
        cached = self._by_key.get(key)
        if cached is not None:
            cached[0] += passages
            cached[1] += toks
            cached[2] += size

    def forget(self, key: SessionKey | None = None) -> None:
        """Read again from the tables (all of them after a rollback)."""
        if key is None:
            self._by_key.clear()
        else:
            self._by_key.pop(key, None)


class PassageTable:
    """Rows of `passages` and its full-text index, kept in step, with their sizes.

    The row id counts every session's passages, so it would tell one tenant how much another's
    sessions evicted: it stays inside the store (the full-text index's row id); callers name a
    passage by its number."""

    def __init__(self, db: sqlite3.Connection, sizes: Sizes, words: WordIndexes) -> None:
        self.db = db
        self.sizes = sizes
        self.words = words

    def write(
        self,
        key: SessionKey,
        pid: int | None,
        start: int,
        toks: list[int],
        text: str,
        sealed: bool,
        speaker: tuple[str, int] = (UNKNOWN, 0),
        origin: Origin | None = None,
    ) -> None:
        """Rewrite row `pid` (its start, number, speaker and creation time stay), or add one,
        numbered next in its session generation, said by `speaker` (role, turn), in `origin`
        (the tenant's memory)."""
        end = start + len(toks)
        data = blob(toks)
        size = len(data) + len(text.encode("utf-8"))
        if pid is None:
            self.sizes.bump(key, 1, len(toks), size)
            o = origin
            cur = self.db.execute(
                "INSERT INTO passages (session, reset_count, logical_start, logical_end,"
                " tokens, text, sealed, created, number, speaker, turn, tenant, origin_session,"
                " origin_reset, origin_start, origin_end, asked)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key.session_id, key.reset_count, start, end, data, text, int(sealed),
                 time.time(), self._next_number(key), speaker[0], speaker[1], key.tenant,
                 o and o.session_id, o and o.reset_count, o and o.logical[0],
                 o and o.logical[1], o and int(o.asked)),
            )  # fmt: skip
            pid = int(cur.lastrowid or 0)
        else:
            old = self._size_of(pid)
            if old is not None:
                self.sizes.bump(key, 0, len(toks) - old[1], size - old[2])
            self.db.execute(
                "UPDATE passages SET logical_end=?, tokens=?, text=?, sealed=?, vector=NULL"
                " WHERE id=?",  # the text grew: its vector is made again when next searched
                (end, data, text, int(sealed), pid),
            )
            self.words.remove(key.tenant, pid)
        self.words.add(key.tenant, pid, text)

    def delete(self, ids: Sequence[int]) -> None:
        for pid in ids:
            old = self._size_of(pid)
            if old is not None:
                self.sizes.bump(old[0], -1, -old[1], -old[2])
                self.words.remove(old[0].tenant, pid)
            self.db.execute("DELETE FROM passages WHERE id=?", (pid,))

    def rows(
        self, key: SessionKey, numbers: Sequence[int] | None = None
    ) -> list[tuple[int, Passage]]:
        """(row id, passage) of the session generation's passages, by logical start."""
        sql = (
            "SELECT id, number, logical_start, logical_end, tokens, text, created, sealed,"
            " speaker, turn, origin_session, asked FROM passages WHERE session=? AND reset_count=?"
        )
        args: list[object] = [key.session_id, key.reset_count]
        if numbers is not None:
            sql += f" AND number IN ({','.join('?' * len(numbers))})"
            args += list(numbers)
        rows = self.db.execute(sql + " ORDER BY logical_start", args)
        return [
            (
                int(i),
                Passage(
                    int(n), (int(a), int(b)), unblob(t), x, float(c), bool(s), who or UNKNOWN,
                    int(turn or 0), origin or "", bool(asked),
                ),
            )
            for i, n, a, b, t, x, c, s, who, turn, origin, asked in rows
        ]  # fmt: skip

    def ids(self, key: SessionKey, limit: int = -1) -> list[tuple[int, int, int]]:
        """(row id, logical start, end) of the session generation's passages, oldest first (the
        `limit` oldest; -1: all). The index on (session, reset_count, logical_start) serves it."""
        return [
            (int(i), int(a), int(b))
            for i, a, b in self.db.execute(
                "SELECT id, logical_start, logical_end FROM passages"
                " WHERE session=? AND reset_count=? ORDER BY logical_start LIMIT ?",
                (key.session_id, key.reset_count, limit),
            )
        ]

    def open_passage(self, key: SessionKey) -> tuple[int, int, int, bytes, tuple[str, int]] | None:
        """(row id, start, end, token ids, (speaker, turn)) of the passage still growing."""
        row = self.db.execute(
            "SELECT id, logical_start, logical_end, tokens, speaker, turn FROM passages"
            " WHERE session=? AND reset_count=? AND sealed=0",
            (key.session_id, key.reset_count),
        ).fetchone()
        if row is None:
            return None
        return int(row[0]), int(row[1]), int(row[2]), row[3], (row[4] or UNKNOWN, int(row[5] or 0))

    def seal_open(self, key: SessionKey) -> None:
        self.db.execute(
            "UPDATE passages SET sealed=1 WHERE session=? AND reset_count=? AND sealed=0",
            (key.session_id, key.reset_count),
        )

    def mark(self, key: SessionKey) -> int:
        """Where the stored evicted text ends (a replay stores nothing below it)."""
        row = self.db.execute(
            "SELECT evicted_end FROM memory_marks WHERE session=? AND reset_count=?",
            (key.session_id, key.reset_count),
        ).fetchone()
        return int(row[0]) if row else 0

    def reading(self, key: SessionKey) -> tuple[int, SpeakerState]:
        """The mark and where the reading of turn headers stands there (fresh before any), in
        one read: every eviction asks for both."""
        row = self.db.execute(
            "SELECT evicted_end, speaker, turn, header FROM memory_marks"
            " WHERE session=? AND reset_count=?",
            (key.session_id, key.reset_count),
        ).fetchone()
        if row is None:
            return 0, SpeakerState()
        if row[1] is None:  # marked before speakers were kept
            return int(row[0]), SpeakerState()
        return int(row[0]), SpeakerState(str(row[1]), int(row[2] or 0), row[3])

    def set_mark(self, key: SessionKey, end: int, state: SpeakerState | None = None) -> None:
        state = state or SpeakerState()
        self.db.execute(
            "INSERT OR REPLACE INTO memory_marks (session, reset_count, evicted_end, speaker,"
            " turn, header) VALUES (?, ?, ?, ?, ?, ?)",
            (key.session_id, key.reset_count, end, state.speaker, state.turn, state.header),
        )

    def _next_number(self, key: SessionKey) -> int:
        row = self.db.execute(
            "SELECT last FROM passage_numbers WHERE session=? AND reset_count=?",
            (key.session_id, key.reset_count),
        ).fetchone()
        number = (int(row[0]) if row else 0) + 1
        self.db.execute(
            "INSERT OR REPLACE INTO passage_numbers VALUES (?, ?, ?)",
            (key.session_id, key.reset_count, number),
        )
        return number

    def _size_of(self, pid: int) -> tuple[SessionKey, int, int] | None:
        row = self.db.execute(
            "SELECT session, reset_count, logical_end - logical_start,"
            " LENGTH(tokens) + LENGTH(CAST(text AS BLOB)), tenant FROM passages WHERE id=?",
            (pid,),
        ).fetchone()
        if row is None:
            return None
        return SessionKey(str(row[0]), int(row[1]), str(row[4])), int(row[2]), int(row[3])
