"""Snapshots between steps: every `snapshot_every_tokens` journalled tokens or `snapshot_every_s`,
for every session at a clean stop, and after a forget (a scrub: that snapshot alone is kept). A failed snapshot (disk full, I/O error, a refused read of the
cells) keeps the previous one, is counted, and is not retried for a while; it never stops the engine.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Set

from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.durable.snapshot_writer import SNAPSHOT_RETRY_S, failed
from sinkd.daemon.runtime.sessions import Registry, Session
from sinkd.errors import JournalError, SinkdError

log = logging.getLogger("sinkd.snapshots")
MID_TURN_INTERVALS = 4  # a session mid-turn is snapshotted once this many intervals behind


class Snapshotter:
    def __init__(
        self,
        engine: Callable[[], Engine | None],
        durability: Durability,
        registry: Registry,
        metrics: Metrics,
    ) -> None:
        self._engine = engine
        self.durability = durability
        self.registry = registry
        self.metrics = metrics

    def due(
        self,
        busy: bool = False,
        answering: Set[str] = frozenset(),
        working: Callable[[str], bool] = lambda session_id: False,
    ) -> None:
        """Snapshot the sessions that are due. While jobs wait for steps (`busy`), only the most
        overdue one, its file written beside the next steps and recorded between two of them
        (snapshot_writer.py), and no other until then: a snapshot is megabytes per 256 cells,
        and eight sessions falling due together would otherwise stall every session's next
        token by their writes (the rest follow, one at a time). Not while a turn is still to
        give its first token (`answering`): its time to first token does not wait for a snapshot, of its own session
        or another's, that can be taken a step later (a new chat after a restored prefix reads
        a few tokens: a snapshot of the previous chat would double its wait). A session in the
        middle of a turn (`working`) waits for the turn's end, unless it is MID_TURN_INTERVALS
        intervals behind: a snapshot taken mid-reply is stale by the reply's end, and parking
        the session would write another. A session whose every token came from a stored prefix
        (a new chat between its system prompt and its first turn) waits for tokens of its own:
        its journal holds them all, and a snapshot of them would be the prefix's file again."""
        self.durability.purge_due()
        # a file written beside the last steps gets its row here, between two of them
        self.durability.writer.settle(wait=not busy)
        for session in self.registry.all():  # forgotten tokens leave the files before all else
            if session.scrub_due and session.has_history and not session.unlogged:
                self.take(session, scrub=True)
        if answering or self.durability.writer.busy:
            return
        now = time.time()
        late = MID_TURN_INTERVALS * self.durability.every_tokens
        due = [
            s
            for s in self.registry.all()
            if s.has_history
            and self.durability.due(s, now)
            and (s.logged_since_snap >= late or not working(s.id))
            and s.prefix_tokens < s.seq.state.n_seen  # else all of it is a stored prefix's
        ]
        if busy and due:  # the file is written beside the next steps (snapshot_writer.py)
            self.take_behind(max(due, key=lambda s: s.logged_since_snap))
            return
        for session in due:
            self.take(session)

    def at_stop(self) -> None:
        """A clean stop: snapshot what changed, so resume needs no replay."""
        for session in self.registry.all():
            if session.unlogged:  # an append in flight: never acknowledged, and not kept
                log.info("session %s: an unacknowledged append is dropped", session.id)
            elif session.has_history and session.logged_since_snap:
                self.take(session)

    def take(self, session: Session, scrub: bool = False) -> bool:
        """A snapshot of the session as it is now, written before this returns (False: it failed,
        the previous one stays)."""
        engine = self._engine()
        assert engine is not None
        t0 = time.monotonic()
        self.durability.writer.settle()
        current = session.snap_n_seen == session.seq.state.n_seen
        if not scrub and current and session.logged_since_snap == 0:
            return True  # the write just settled was of the session as it is now
        try:
            if session.parked:  # its cells are its newest snapshot's (a scrub rewrites it)
                kv = self.durability.newest_snapshot(session).kv
            else:
                kv = engine.cells.save_seq(session.seq_id)
            size = self.durability.snapshot(session, kv, scrub=scrub)
        except (SinkdError, JournalError, sqlite3.Error, OSError) as e:
            failed(session, e, self.metrics, self._retry_s)
            return False
        if scrub:
            session.scrub_due = False
        self.metrics.snapshots.inc()
        self.metrics.snapshot_bytes.observe(size)
        self.metrics.snapshot_seconds.observe(time.monotonic() - t0)
        return True

    def take_behind(self, session: Session) -> None:
        """A snapshot of the session as it is now, its file written off the engine thread and
        recorded at a later `settle` (a parked session's is taken here: its cells are a file)."""
        engine = self._engine()
        assert engine is not None
        if session.parked:
            self.take(session)
            return
        try:
            self.durability.snapshot_behind(session, engine.cells.save_seq(session.seq_id))
        except (SinkdError, OSError) as e:
            failed(session, e, self.metrics, self._retry_s)

    @property
    def _retry_s(self) -> float:
        return min(self.durability.every_s, SNAPSHOT_RETRY_S)
