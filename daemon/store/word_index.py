"""Each tenant's own full-text index of its passages (FTS5, porter stems), so that the cost of one
tenant's search depends on its own text alone.

One index shared by every tenant let a tenant time its own recalls and learn, noisily, how common a
word is in the others' memories: a lookup reads the word's whole list of occurrences, everyone's.
Here a tenant's passages are in its own FTS5 table, named by a hash of the tenant (any name is a
safe SQL name), with its own vocabulary view on this connection.

A store written before (one `passages_fts` for all) is split at its first open: each passage's
tenant read from the journal's sessions, its row moved to that tenant's index, the old one dropped.
"""

from __future__ import annotations

import hashlib
import sqlite3

LEGACY = "passages_fts"
_PREFIX = "passages_fts_"


def table_of(tenant: str) -> str:
    return _PREFIX + hashlib.sha256(tenant.encode()).hexdigest()[:16]


class WordIndexes:
    """The tenants' indexes on one connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self._made: set[str] = set()
        self.unmerged: set[str] = set()  # indexes that lost rows since their last merge

    def table(self, tenant: str) -> str:
        """The tenant's index (made the first time), and its terms view on this connection."""
        name = table_of(tenant)
        if name not in self._made:
            self.db.execute(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {name} USING fts5(text,"
                " tokenize='porter unicode61')"
            )
            self.db.execute(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{self.terms(tenant)} USING"
                f" fts5vocab(main, {name}, instance)"
            )
            self._made.add(name)
        return name

    @staticmethod
    def terms(tenant: str) -> str:
        """The tenant's terms by passage (FTS5's instance vocabulary), a temporary view."""
        return "terms_" + table_of(tenant)[len(_PREFIX) :]

    def add(self, tenant: str, rowid: int, text: str) -> None:
        self.db.execute(
            f"INSERT INTO {self.table(tenant)} (rowid, text) VALUES (?, ?)", (rowid, text)
        )

    def remove(self, tenant: str, rowid: int) -> None:
        name = self.table(tenant)
        self.db.execute(f"DELETE FROM {name} WHERE rowid=?", (rowid,))
        self.unmerged.add(name)

    def all(self) -> list[str]:
        """Every tenant's index in the database."""
        return [
            str(r[0])
            for r in self.db.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name LIKE ? AND sql LIKE"
                " 'CREATE VIRTUAL TABLE%'",
                (_PREFIX + "%",),
            )
            if len(str(r[0])) == len(_PREFIX) + 16
        ]

    def optimize(self, every: bool = False) -> int:
        """Merge the indexes that lost rows since their last merge (`every`: all of them, when
        that is not known, at a start), for a delete's old segments still name the deleted words.
        Returns how many were merged: a tenant's forget costs its own index's merge, not all."""
        present = self.all()
        names = present if every else [n for n in present if n in self.unmerged]
        for name in names:
            self.db.execute(f"INSERT INTO {name} ({name}) VALUES ('optimize')")
        self.unmerged.clear()
        return len(names)

    def split_legacy(self) -> int:
        """A store from before: every passage into its tenant's index, the shared one dropped.
        Returns the passages moved (0: nothing to split)."""
        found = self.db.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (LEGACY,)
        ).fetchone()
        if found is None:
            return 0
        has_sessions = self.db.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='sessions'"
        ).fetchone()
        if has_sessions is not None:
            self.db.execute(
                "UPDATE passages SET tenant=COALESCE((SELECT s.tenant FROM sessions s WHERE"
                " s.id=passages.session), '')"
            )
        moved = 0
        for (tenant,) in self.db.execute("SELECT DISTINCT tenant FROM passages").fetchall():
            moved += self.db.execute(
                f"INSERT INTO {self.table(str(tenant))} (rowid, text)"
                " SELECT id, text FROM passages WHERE tenant=?",
                (tenant,),
            ).rowcount
        self.db.execute(f"DROP TABLE {LEGACY}")
        return moved
