"""Narrated streams, per tenant: each stream's digest state (the miner's templates, every
template's baseline, the interval being read) and every closed interval's facts, in the journal's
database, so that a restart of the daemon or of the pipe continues the stream. Raw lines are not
kept: an interval keeps its facts (templates, counts, first and last lines, incidents, the example
line of each template listed) and the checked sentence said of them.

Bounded per tenant by age and bytes (`fold_oldest`): past either bound a stream's oldest intervals
are folded into one aggregate row (their lines, incidents and errors summed, their time range and
each error template's count kept), never dropped without a trace.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS narrated_streams (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE TABLE IF NOT EXISTS narrated_intervals (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    number INTEGER NOT NULL,
    last_number INTEGER NOT NULL,
    first_line INTEGER NOT NULL,
    last_line INTEGER NOT NULL,
    started REAL NOT NULL,
    ended REAL NOT NULL,
    incidents INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (tenant, name, number)
);
"""


@dataclass(frozen=True)
class IntervalRow:
    """One closed interval (or, `folded`, several old ones summed)."""

    stream: str
    number: int
    last_number: int  # > number: an aggregate of the intervals number..last_number
    first_line: int
    last_line: int
    started: float  # wall-clock seconds: its first line read, its last
    ended: float
    incidents: int
    errors: int  # lines at error or worse
    record: dict[str, Any]  # the facts and the sentence; an aggregate's counts by template

    @property
    def folded(self) -> bool:
        return self.last_number > self.number

    @property
    def lines(self) -> int:
        return self.last_line - self.first_line + 1


@dataclass(frozen=True)
class StreamRow:
    name: str
    created: float
    updated: float
    intervals: int
    lines: int
    incidents: int


class NarratedTables:
    """The journal's connection and transactions (engine thread): what is written here commits
    with the caller's commit."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    @classmethod
    def opened(cls, db: sqlite3.Connection) -> NarratedTables:
        """Once, as the journal opens (`executescript` commits what is open)."""
        db.executescript(_SCHEMA)
        return cls(db)

    def state(self, tenant: str, name: str) -> dict[str, Any] | None:
        row = self._db.execute(
            "SELECT state FROM narrated_streams WHERE tenant=? AND name=?", (tenant, name)
        ).fetchone()
        return json.loads(row[0]) if row else None

    def put_state(self, tenant: str, name: str, state_json: str, now: float) -> None:
        """The stream's digest state, serialized by the caller (off the engine thread)."""
        self._db.execute(
            "INSERT INTO narrated_streams VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, name)"
            " DO UPDATE SET state=excluded.state, updated=excluded.updated",
            (tenant, name, state_json, now, now),
        )

    def count_streams(self, tenant: str) -> int:
        row = self._db.execute(
            "SELECT count(*) FROM narrated_streams WHERE tenant=?", (tenant,)
        ).fetchone()
        return int(row[0])

    def add(self, tenant: str, row: IntervalRow) -> int:
        """The row written; its record's bytes."""
        record = json.dumps(row.record, separators=(",", ":"))
        self._db.execute(
            "INSERT OR REPLACE INTO narrated_intervals VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (tenant, row.stream, row.number, row.last_number, row.first_line, row.last_line,
             row.started, row.ended, row.incidents, row.errors, record),
        )  # fmt: skip
        return len(record)

    def note(self, tenant: str, name: str, number: int, sentence: str) -> bool:
        """The checked sentence said of interval `number`; False if it is not kept (unknown, or
        folded since)."""
        found = self._db.execute(
            "SELECT record FROM narrated_intervals WHERE tenant=? AND name=? AND number=?"
            " AND last_number=number",
            (tenant, name, number),
        ).fetchone()
        if found is None:
            return False
        record = json.loads(found[0])
        record["sentence"] = sentence
        self._db.execute(
            "UPDATE narrated_intervals SET record=? WHERE tenant=? AND name=? AND number=?",
            (json.dumps(record, separators=(",", ":")), tenant, name, number),
        )
        return True

    def intervals(
        self, tenant: str, name: str, since: float = 0.0, until: float = 0.0, limit: int = 0
    ) -> list[IntervalRow]:
        """The stream's intervals that overlap [since, until] (0: open), oldest first; the newest
        `limit` of them (0: all)."""
        overlap, args = _overlapping(tenant, name, since, until)
        sql = f"SELECT * FROM narrated_intervals WHERE {overlap} ORDER BY number DESC"
        if limit:
            sql += " LIMIT ?"
            args.append(limit)
        rows = [_row(r) for r in self._db.execute(sql, args)]
        return rows[::-1]

    def streams(self, tenant: str) -> list[StreamRow]:
        rows = self._db.execute(  # lines: the stream's, read (its open interval's included)
            "SELECT s.name, s.created, s.updated, count(i.number),"
            " coalesce(json_extract(s.state, '$.digest.lines'), 0), coalesce(sum(i.incidents), 0)"
            " FROM narrated_streams s LEFT JOIN narrated_intervals i"
            " ON i.tenant = s.tenant AND i.name = s.name WHERE s.tenant=?"
            " GROUP BY s.name ORDER BY s.name",
            (tenant,),
        )
        return [
            StreamRow(str(n), float(c), float(u), int(k), int(li), int(x))
            for n, c, u, k, li, x in rows
        ]

    def forget(self, tenant: str, name: str) -> int:
        """The stream's state and intervals deleted; how many intervals were kept."""
        n = self._db.execute(
            "DELETE FROM narrated_intervals WHERE tenant=? AND name=?", (tenant, name)
        ).rowcount
        self._db.execute("DELETE FROM narrated_streams WHERE tenant=? AND name=?", (tenant, name))
        return int(n)

    def forget_period(self, tenant: str, name: str, since: float, until: float) -> int:
        """The stream's rows that overlap [since, until] (0: open) deleted, a folded row whole;
        the stream and its state stay. How many rows."""
        overlap, args = _overlapping(tenant, name, since, until)
        return int(
            self._db.execute(f"DELETE FROM narrated_intervals WHERE {overlap}", args).rowcount
        )

    def bytes_of(self, tenant: str) -> int:
        """What the tenant's streams keep, roughly: their state and records' text."""
        row = self._db.execute(
            "SELECT coalesce(sum(length(record)), 0) FROM narrated_intervals WHERE tenant=?",
            (tenant,),
        ).fetchone()
        state = self._db.execute(
            "SELECT coalesce(sum(length(state)), 0) FROM narrated_streams WHERE tenant=?",
            (tenant,),
        ).fetchone()
        return int(row[0]) + int(state[0])

    def fold_oldest(self, tenant: str, name: str, count: int) -> IntervalRow | None:
        """The stream's `count` oldest rows (intervals or aggregates) folded into one aggregate;
        None if it has fewer than two."""
        rows = self._db.execute(
            "SELECT * FROM narrated_intervals WHERE tenant=? AND name=? ORDER BY number LIMIT ?",
            (tenant, name, max(2, count)),
        ).fetchall()
        if len(rows) < 2:
            return None
        parts = [_row(r) for r in rows]
        folded = aggregate(parts)
        self._db.execute(
            "DELETE FROM narrated_intervals WHERE tenant=? AND name=? AND number BETWEEN ? AND ?",
            (tenant, name, folded.number, folded.last_number),
        )
        self.add(tenant, folded)
        return folded

    def oldest(self, tenant: str) -> tuple[str, float] | None:
        """The tenant's stream whose oldest row ended first, and when."""
        row = self._db.execute(
            "SELECT name, min(ended) FROM narrated_intervals WHERE tenant=? GROUP BY name"
            " ORDER BY min(ended) LIMIT 1",
            (tenant,),
        ).fetchone()
        return (str(row[0]), float(row[1])) if row else None


def _overlapping(tenant: str, name: str, since: float, until: float) -> tuple[str, list[Any]]:
    """The WHERE clause (and its arguments) of a stream's rows overlapping [since, until], each
    0 for open."""
    where = "tenant=? AND name=?"
    args: list[Any] = [tenant, name]
    if since:
        where += " AND ended >= ?"
        args.append(since)
    if until:
        where += " AND started <= ?"
        args.append(until)
    return where, args


def aggregate(parts: list[IntervalRow]) -> IntervalRow:
    """Several rows as one: lines, incidents and errors summed, each error template's count and
    each incident's first line kept (what `history` still answers about a folded period)."""
    errors: dict[str, int] = {}
    incident_lines: list[int] = []
    for part in parts:
        record = part.record
        if part.folded:
            for template, n in record.get("error_templates", {}).items():
                errors[template] = errors.get(template, 0) + n
            incident_lines += record.get("incident_lines", [])
            continue
        facts = record.get("facts", {})
        for fact in facts.get("errors", []):
            errors[fact["template"]] = errors.get(fact["template"], 0) + fact["count"]
        if facts.get("incident"):
            incident_lines.append(part.first_line)
    first, last = parts[0], parts[-1]
    record = {
        "folded": len(parts),
        "error_templates": errors,
        "incident_lines": incident_lines,
    }
    return IntervalRow(
        first.stream, first.number, last.last_number, first.first_line, last.last_line,
        first.started, last.ended, sum(p.incidents for p in parts), sum(p.errors for p in parts),
        record,
    )  # fmt: skip


def _row(r: tuple[Any, ...]) -> IntervalRow:
    _, name, number, last_number, first_line, last_line, started, ended, incidents, errors, rec = r
    return IntervalRow(
        str(name), int(number), int(last_number), int(first_line), int(last_line),
        float(started), float(ended), int(incidents), int(errors), json.loads(rec),
    )  # fmt: skip


def rows_of(db: sqlite3.Connection, tenant: str) -> dict[str, list[list[Any]]]:
    """A tenant's narrated streams as data (a tenant archive's member), every column but the
    tenant's."""
    return {
        table: [list(r[1:]) for r in db.execute(f"SELECT * FROM {table} WHERE tenant=?", (tenant,))]
        for table in ("narrated_streams", "narrated_intervals")
    }


def load_rows(db: sqlite3.Connection, tenant: str, rows: dict[str, list[list[Any]]]) -> int:
    """An archive's streams under `tenant`, in the caller's transaction. A stream of the same
    name already here (served while the tenant's node was down) is kept, and the archive's
    dropped: each stream's state and intervals stay one digest's. Returns the streams loaded."""
    here = {
        str(n) for (n,) in db.execute("SELECT name FROM narrated_streams WHERE tenant=?", (tenant,))
    }
    streams = [r for r in rows.get("narrated_streams", []) if str(r[0]) not in here]
    names = {str(r[0]) for r in streams}
    for r in streams:
        db.execute("INSERT INTO narrated_streams VALUES (?, ?, ?, ?, ?)", (tenant, *r))
    for r in rows.get("narrated_intervals", []):
        if str(r[0]) in names:
            db.execute(
                "INSERT INTO narrated_intervals VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (tenant, *r),
            )
    return len(streams)


def drop_tenant(db: sqlite3.Connection, tenant: str) -> None:
    db.execute("DELETE FROM narrated_intervals WHERE tenant=?", (tenant,))
    db.execute("DELETE FROM narrated_streams WHERE tenant=?", (tenant,))
