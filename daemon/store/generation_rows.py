"""One session generation's stored rows as data and back: what an archive carries between two
nodes' journals (the journal's chunks after the snapshot, the HTTP clients' rows, the memory's
passages, marks and recalled copies). Same schema on both sides: the archive names its version."""

from __future__ import annotations

import base64
import sqlite3
from typing import Any

from sinkd.daemon.store.word_index import WordIndexes

# table -> the columns that file a row under its session generation; `n` and `id` are this
# database's own row numbers, never carried (the order of the rows is)
TABLES: dict[str, tuple[str, ...]] = {
    "chunks": ("session", "reset_count"),
    "conversations": ("session", "reset_count"),
    "responses": ("session", "reset_count"),
    "passages": ("session", "reset_count"),
    "memory_marks": ("session", "reset_count"),
    "passage_numbers": ("session", "reset_count"),
    "recalls": ("session", "reset_count"),
}
OWN_ROW_NUMBERS = {"chunks": "n", "passages": "id"}
# a passage's tenant is the importing owner's, set as it is loaded: not carried, so that archives
# move between nodes from before per-tenant indexes and after
FILLED_IN = {"passages": "tenant"}


def _columns(db: sqlite3.Connection, table: str) -> list[str]:
    own = (OWN_ROW_NUMBERS.get(table), FILLED_IN.get(table))
    return [str(r[1]) for r in db.execute(f"PRAGMA table_info({table})") if r[1] not in own]


def _plain(value: Any) -> Any:
    return {"b64": base64.b64encode(value).decode()} if isinstance(value, bytes) else value


def _typed(value: Any) -> Any:
    return base64.b64decode(value["b64"]) if isinstance(value, dict) else value


def rows_of(db: sqlite3.Connection, session_id: str, reset_count: int) -> dict[str, Any]:
    """Every row of the generation, per table: {"columns": [...], "rows": [[...], ...]}."""
    out: dict[str, Any] = {}
    for table in TABLES:
        columns = _columns(db, table)
        order = OWN_ROW_NUMBERS.get(table, "rowid")
        rows = db.execute(
            f"SELECT {', '.join(columns)} FROM {table} WHERE session=? AND reset_count=?"
            f" ORDER BY {order}",
            (session_id, reset_count),
        )
        out[table] = {"columns": columns, "rows": [[_plain(v) for v in r] for r in rows]}
    return out


def load_rows(db: sqlite3.Connection, session_id: str, tenant: str, data: dict[str, Any]) -> None:
    """Insert `rows_of`'s data under `session_id` of `tenant`, in the caller's transaction (a
    failure rolls back with it). Raises ValueError when a table has columns this database lacks;
    columns an older node's archive lacks (columns added since, e.g. a passage's speaker) are left
    NULL."""
    words = WordIndexes(db)
    for table in TABLES:
        part = data.get(table, {"columns": _columns(db, table), "rows": []})
        columns = list(part["columns"])
        ours = _columns(db, table)
        if not set(columns) <= set(ours) or columns != [c for c in ours if c in columns]:
            raise ValueError(f"{table}: columns {columns} differ from this store's")
        at = columns.index("session")
        marks = ", ".join("?" * len(columns))
        for row in part["rows"]:
            values = [_typed(v) for v in row]
            if values[at] != session_id:
                raise ValueError(f"{table}: a row of another session")
            cur = db.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", values)
            if table == "passages":  # the full-text index's row beside it, its tenant's
                db.execute("UPDATE passages SET tenant=? WHERE id=?", (tenant, cur.lastrowid))
                words.add(tenant, int(cur.lastrowid or 0), values[columns.index("text")])
