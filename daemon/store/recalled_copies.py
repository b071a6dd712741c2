"""The recalled copies a session's stream holds, kept so that a resume knows which stream ranges
are copies (and does not store them again as evicted text)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from sinkd.cachepolicy.recall_plan import RecalledSpan
from sinkd.daemon.store.passages import SessionKey
from sinkd.daemon.store.speakers import UNKNOWN


class RecallLog:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def add(self, key: SessionKey, spans: Sequence[RecalledSpan]) -> None:
        for s in spans:
            self.db.execute(
                "INSERT INTO recalls (session, reset_count, stream_start, stream_end,"
                " source_start, source_end, passage_id, offset, score, at, speaker,"
                " conversation, said_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key.session_id, key.reset_count, s.stream[0], s.stream[1], s.source[0],
                 s.source[1], s.passage_id, s.offset, s.score, s.at, s.speaker,
                 s.conversation or None, s.said_at),
            )  # fmt: skip

    def of(self, key: SessionKey) -> list[RecalledSpan]:
        """The session generation's copies, by where they start in the stream."""
        rows = self.db.execute(
            "SELECT passage_id, source_start, source_end, stream_start, stream_end, offset,"
            " score, at, speaker, conversation, said_at FROM recalls"
            " WHERE session=? AND reset_count=? ORDER BY stream_start",
            (key.session_id, key.reset_count),
        )
        return [
            RecalledSpan(
                int(p), (int(a), int(b)), (int(c), int(d)), int(o), float(s), float(t),
                who or UNKNOWN, conv or "", float(said or 0.0),
            )
            for p, a, b, c, d, o, s, t, who, conv, said in rows
        ]  # fmt: skip

    def drop_before(self, key: SessionKey, logical: int) -> None:
        self.db.execute(
            "DELETE FROM recalls WHERE session=? AND reset_count=? AND stream_end<=?",
            (key.session_id, key.reset_count, logical),
        )

    def cut(self, key: SessionKey, n_seen: int) -> None:
        """Copies end at `n_seen`: a recall whose job ended early left the rest undecoded."""
        self.db.execute(
            "DELETE FROM recalls WHERE session=? AND reset_count=? AND stream_start>=?",
            (key.session_id, key.reset_count, n_seen),
        )
        self.db.execute(
            "UPDATE recalls SET stream_end=? WHERE session=? AND reset_count=? AND stream_end>?",
            (n_seen, key.session_id, key.reset_count, n_seen),
        )
