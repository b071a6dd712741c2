"""Where a tenant stands on this node while it moves between the nodes of a deployment, journalled
beside the sessions so that a node killed in the middle of a move still knows it at its restart.

- `leaving`: its state is being exported to `peer`; the node answers none of its calls.
- `gone`: it moved to `peer`; none of its calls, until it comes back (an import clears it).
- `arriving`: the ring is about to send it here; none of its calls until its archive is imported
  (which clears it), so that a node never answers a tenant whose state is still elsewhere.

And the moves whose archives this node imported, by id: what a resolver asks a destination to
learn whether it holds a tenant whole (then the source may delete its copy), or not (then the
source keeps it and the move is made again).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

STATES = ("leaving", "gone", "arriving")
ARRIVALS_KEPT = 10_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenant_marks (
    tenant TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    move_id TEXT NOT NULL,
    peer TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tenant_arrivals (
    move_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    peer TEXT NOT NULL,
    at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class TenantMark:
    tenant: str
    state: str  # one of STATES
    move_id: str
    peer: str  # the node it leaves for, went to, or arrives from ("" unknown)
    at: float


class TenantMarks:
    """The journal's connection and transactions: a mark commits with what it stands for."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    @classmethod
    def opened(cls, db: sqlite3.Connection) -> TenantMarks:
        """Once, as the journal opens: `executescript` commits whatever transaction is open, so
        never in the middle of one (an import's rows would be committed before they are whole)."""
        db.executescript(_SCHEMA)
        return cls(db)

    def put(self, mark: TenantMark) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO tenant_marks VALUES (?, ?, ?, ?, ?)",
            (mark.tenant, mark.state, mark.move_id, mark.peer, mark.at),
        )

    def drop(self, tenant: str) -> None:
        self._db.execute("DELETE FROM tenant_marks WHERE tenant=?", (tenant,))

    def all(self) -> list[TenantMark]:
        rows = self._db.execute("SELECT tenant, state, move_id, peer, at FROM tenant_marks")
        return [TenantMark(str(t), str(s), str(m), str(p), float(a)) for t, s, m, p, a in rows]

    def arrived(self, move_id: str, tenant: str, peer: str, at: float) -> None:
        """Move `move_id`'s archive was imported here (at most ARRIVALS_KEPT kept, the oldest
        dropped: a resolver asks about the moves of the last few minutes)."""
        self._db.execute(
            "INSERT OR REPLACE INTO tenant_arrivals VALUES (?, ?, ?, ?)",
            (move_id, tenant, peer, at),
        )
        self._db.execute(
            "DELETE FROM tenant_arrivals WHERE move_id NOT IN"
            " (SELECT move_id FROM tenant_arrivals ORDER BY at DESC LIMIT ?)",
            (ARRIVALS_KEPT,),
        )

    def has_arrived(self, move_id: str) -> str | None:
        """The tenant move `move_id` brought here, or None."""
        row = self._db.execute(
            "SELECT tenant FROM tenant_arrivals WHERE move_id=?", (move_id,)
        ).fetchone()
        return None if row is None else str(row[0])
