"""A tenant's memory across its conversations: what the user said in each (and what the user asked
to be remembered), kept past the conversation's close, found by a later conversation's turn.

Its passages are rows of `passages` filed under one key per tenant (`key_of`), so they share the
conversations' search (BM25 and vectors), the tenant's own full-text index, the background
embedder, secure deletion and the purge. Each row keeps where it was said (`Origin`: conversation,
generation, range) and its turn; its `logical` range is its place in the tenant's memory, a count
of the tokens kept in order, so the oldest come first. A reset of the conversation drops what its
old generation gave (forgetting.py), a close does not; the owner forgets by passage, conversation,
speaker or time.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sinkd.daemon.store.embedder import DIM, Embedder
from sinkd.daemon.store.passages import Origin, Passage, PassageTable, SessionKey, text_of
from sinkd.daemon.store.search import sentences_of

# a key no conversation has: session ids are hex or a node's name and hex (never a "~")
_PREFIX = "~memory-"
# where a text given to the memory itself was said: no conversation (session ids start "s_")
GIVEN = "(given)"


def key_of(tenant: str) -> SessionKey:
    return SessionKey(_PREFIX + hashlib.sha256(tenant.encode()).hexdigest()[:16], 0, tenant)


@dataclass(frozen=True)
class Selection:
    """Which of a tenant's kept passages a listing or a forget takes: one passage, one
    conversation's, one speaker's, those kept within [since, until) (unix time); unset: any."""

    passage_id: int | None = None
    conversation: str | None = None
    speaker: str | None = None
    since: float | None = None
    until: float | None = None

    def where(self) -> tuple[str, list[object]]:
        sql, args = "", list[object]()
        for column, op, value in (
            ("number", "=", self.passage_id),
            ("origin_session", "=", self.conversation),
            ("speaker", "=", self.speaker),
            ("created", ">=", self.since),
            ("created", "<", self.until),
        ):
            if value is not None:
                sql += f" AND {column}{op}?"
                args.append(value)
        return sql, args


# a correction corrects the kept passage whose closest sentence is the closest to one of its own,
# at least this close (MiniLM: "I collect old radios." / "I collect old clocks." 0.59, against "My
# grandfather collects old stamps." 0.44; "I work as a baker." / "... a librarian." 0.50, against
# "My brother works as a carpenter." 0.48: the nearest wins, narrowly)
LINK_COSINE = 0.45


# words that say a correction is one ("Correction, that changed:"): a sentence of these alone says
# nothing to compare, and every correction says it alike
_MARKS = re.compile(
    r"\b(?:actually|correction|correct(?:ed|ing)?|changed?|update[ds]?|now|anymore|no|longer|"
    r"instead|that|it|this|has|have|is|was|my|the|a|an)\b|[^\w\s]",
    re.IGNORECASE,
)


def says_something(sentence: str) -> bool:
    """A sentence with two words or more besides those that mark a correction."""
    return len(_MARKS.sub(" ", sentence).split()) >= 2


@dataclass(frozen=True)
class Correction:
    """A passage that corrects another: its number, place, size, speaker, conversation, time."""

    number: int
    logical: tuple[int, int]
    speaker: str
    conversation: str
    said_at: float


class TenantMemory:
    MAX_PASSAGE_TOKENS = 64  # a long message is kept in pieces of at most this many tokens

    def __init__(self, db: sqlite3.Connection, table: PassageTable) -> None:
        self.db = db
        self.table = table

    def keep(
        self,
        tenant: str,
        origin: Origin,
        tokens: Sequence[int],
        piece: Callable[[int], bytes],
        speaker: str,
        turn: int,
    ) -> int:
        """Keep words said in a conversation; returns passages kept (0: the same words were kept
        before from this conversation, as a client that resends its history sends them again)."""
        if not tokens:
            return 0
        key = key_of(tenant)
        first = text_of(tokens[: self.MAX_PASSAGE_TOKENS], piece)  # what its first piece holds
        if not first.strip() or self._kept_already(key, origin.session_id, first):
            return 0
        end = self._end(key)
        n = 0
        for i in range(0, len(tokens), self.MAX_PASSAGE_TOKENS):
            part = list(tokens[i : i + self.MAX_PASSAGE_TOKENS])
            at = origin.logical[0] + i
            self.table.write(
                key, None, end, part, text_of(part, piece), True, (speaker, turn),
                Origin(origin.session_id, origin.reset_count, (at, at + len(part)), origin.asked),
            )  # fmt: skip
            end += len(part)
            n += 1
        return n

    def link_correction(self, tenant: str, embedder: Embedder, conversation: str) -> int | None:
        """The newest passage `conversation` gave, which says it corrects something: linked to
        the kept passage of another conversation it is closest to (its sentences' vectors against
        theirs), if one is close enough (`LINK_COSINE`). A later search that finds the old one
        brings the correction with it. Returns the number linked to, or None."""
        key = key_of(tenant)
        row = self.db.execute(
            "SELECT id, text, logical_start FROM passages WHERE session=? AND reset_count=?"
            " AND origin_session=? ORDER BY logical_start DESC LIMIT 1",
            (key.session_id, key.reset_count, conversation),
        ).fetchone()
        if row is None:
            return None
        sentences = [t for t in sentences_of(str(row[1])) if says_something(t)]
        if not sentences:
            return None
        mine = embedder.embed(sentences)
        best, best_cos = None, LINK_COSINE
        for number, vector in self.db.execute(
            "SELECT number, vector FROM passages WHERE session=? AND reset_count=?"
            " AND logical_start<? AND origin_session<>? AND vector IS NOT NULL"
            " AND LENGTH(vector) > 0",
            (key.session_id, key.reset_count, int(row[2]), conversation),
        ):
            theirs = np.frombuffer(vector, dtype=np.float32).reshape(-1, DIM)
            cos = float(np.max(mine @ theirs.T))
            if cos >= best_cos:
                best, best_cos = int(number), cos
        if best is not None:
            self.db.execute("UPDATE passages SET corrects=? WHERE id=?", (best, int(row[0])))
        return best

    def corrections_of(self, tenant: str, numbers: Sequence[int]) -> dict[int, Correction]:
        """For each of `numbers` that a newer passage corrects: the newest such correction."""
        if not numbers:
            return {}
        key = key_of(tenant)
        rows = self.db.execute(
            "SELECT corrects, number, logical_start, logical_end, speaker, origin_session, created"
            " FROM passages WHERE session=? AND reset_count=?"
            f" AND corrects IN ({','.join('?' * len(numbers))}) ORDER BY logical_start",
            (key.session_id, key.reset_count, *numbers),
        )
        return {
            int(old): Correction(int(n), (int(a), int(b)), str(who), str(conv), float(at))
            for old, n, a, b, who, conv, at in rows
        }  # ordered by time: the newest wins

    def _kept_already(self, key: SessionKey, conversation: str, text: str) -> bool:
        return (
            self.db.execute(
                "SELECT 1 FROM passages INDEXED BY passages_by_origin WHERE origin_session=?"
                " AND session=? AND text=? LIMIT 1",
                (conversation, key.session_id, text),
            ).fetchone()
            is not None
        )

    def _end(self, key: SessionKey) -> int:
        """Where the memory's count of kept tokens stands: the newest passage's end (the ranges
        follow each other, so the index on the start finds it in one seek)."""
        row = self.db.execute(
            "SELECT logical_end FROM passages WHERE session=? AND reset_count=?"
            " ORDER BY logical_start DESC LIMIT 1",
            (key.session_id, key.reset_count),
        ).fetchone()
        return int(row[0]) if row else 0

    def count(self, tenant: str) -> int:
        """How many passages the tenant's memory keeps."""
        key = key_of(tenant)
        (n,) = self.db.execute(
            "SELECT COUNT(*) FROM passages WHERE session=? AND reset_count=?",
            (key.session_id, key.reset_count),
        ).fetchone()
        return int(n)

    def following(self, tenant: str, rows: dict[str, Any]) -> dict[str, Any]:
        """Another node's rows of the tenant's memory (`generation_rows.rows_of` of its key),
        made to follow what this node keeps of it, to be loaded in the caller's transaction: its
        passages numbered after this memory's last number and placed after its last range, their
        corrections' links renumbered with them (they name passages of the same memory), one
        numbering for both. A tenant served on two nodes (its own down a while) is merged so."""
        key = key_of(tenant)
        row = self.db.execute(
            "SELECT last FROM passage_numbers WHERE session=? AND reset_count=?",
            (key.session_id, key.reset_count),
        ).fetchone()
        last, end = (int(row[0]) if row else 0), self._end(key)
        part = rows.get("passages", {"columns": [], "rows": []})
        columns = list(part["columns"])
        at = {c: columns.index(c) for c in ("number", "corrects") if c in columns}
        start, stop = columns.index("logical_start"), columns.index("logical_end")
        moved = []
        for r in part["rows"]:
            r = list(r)
            for c in at.values():
                if r[c] is not None:
                    r[c] = int(r[c]) + last
            r[start], r[stop] = int(r[start]) + end, int(r[stop]) + end
            moved.append(r)
        numbering = rows.get("passage_numbers", {"columns": [], "rows": []})
        theirs = max([len(moved)] + [int(r[numbering["columns"].index("last")])
                                      for r in numbering["rows"]])  # fmt: skip
        self.db.execute(
            "DELETE FROM passage_numbers WHERE session=? AND reset_count=?",
            (key.session_id, key.reset_count),
        )
        return {
            **rows,
            "passages": {"columns": columns, "rows": moved},
            "passage_numbers": {
                "columns": ["session", "reset_count", "last"],
                "rows": [[key.session_id, key.reset_count, last + theirs]],
            },
            "memory_marks": {"columns": ["session", "reset_count"], "rows": []},
            "recalls": {"columns": ["session", "reset_count"], "rows": []},
        }

    def tenants(self) -> list[str]:
        """The tenants whose memory keeps a passage (their key's owner, as its rows name it)."""
        return [
            str(r[0])
            for r in self.db.execute(
                "SELECT DISTINCT tenant FROM passages WHERE session LIKE ?", (_PREFIX + "%",)
            )
        ]

    def numbers(self, tenant: str, which: Selection, limit: int = -1) -> list[int]:
        """The numbers of the tenant's kept passages `which` names, newest first (the newest
        `limit`; -1: all)."""
        key = key_of(tenant)
        sql, args = which.where()
        return [
            int(r[0])
            for r in self.db.execute(
                "SELECT number FROM passages WHERE session=? AND reset_count=?"
                f"{sql} ORDER BY logical_start DESC LIMIT ?",
                (key.session_id, key.reset_count, *args, limit),
            )
        ]

    def passages(self, tenant: str, which: Selection, limit: int) -> list[Passage]:
        """The tenant's kept passages `which` names, the newest `limit`, oldest first."""
        numbers = self.numbers(tenant, which, limit)
        return [p for _, p in self.table.rows(key_of(tenant), numbers)] if numbers else []

    def forget(self, tenant: str, which: Selection) -> list[int]:
        """Delete the passages `which` names; returns their numbers."""
        key = key_of(tenant)
        sql, args = which.where()
        rows = self.db.execute(
            "SELECT id, number FROM passages WHERE session=? AND reset_count=?" + sql,
            (key.session_id, key.reset_count, *args),
        ).fetchall()
        self.table.delete([int(r[0]) for r in rows])
        return [int(r[1]) for r in rows]

    def drop_from(self, session_id: str, keep_reset_count: int | None) -> int:
        """What a conversation's generations gave, but `keep_reset_count`'s (None: every one)."""
        sql, args = "origin_session=?", list[object]([session_id])
        if keep_reset_count is not None:
            sql += " AND origin_reset<>?"
            args.append(keep_reset_count)
        ids = [
            int(r[0])
            for r in self.db.execute(
                f"SELECT id FROM passages INDEXED BY passages_by_origin WHERE {sql}", args
            )
        ]
        self.table.delete(ids)
        return len(ids)
