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
from sinkd.daemon.runtime.sessions import Registry, Session
from sinkd.errors import JournalError, SinkdError

log = logging.getLogger("sinkd.snapshots")
SNAPSHOT_RETRY_S = 30.0  # a failed snapshot (disk full, ...) is not retried sooner
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
        overdue one per gap between steps: a snapshot costs milliseconds per 256 cells, and eight
        sessions falling due together would otherwise stall every session's next token by their
        sum (the rest follow, one per step). Not while a turn is still to give its first token
        (`answering`): its time to first token does not wait for a snapshot, of its own session
        or another's, that can be taken a step later (a new chat after a restored prefix reads
        a few tokens: a snapshot of the previous chat would double its wait). A session in the
        middle of a turn (`working`) waits for the turn's end, unless it is MID_TURN_INTERVALS
        intervals behind: a snapshot taken mid-reply is stale by the reply's end, and parking
        the session would write another. A session whose every token came from a stored prefix
        (a new chat between its system prompt and its first turn) waits for tokens of its own:
        its journal holds them all, and a snapshot of them would be the prefix's file again."""
        self.durability.purge_due()
        for session in self.registry.all():  # forgotten tokens leave the files before all else
            if session.scrub_due and session.has_history and not session.unlogged:
                self.take(session, scrub=True)
        if answering:
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
        if busy and len(due) > 1:
            due = [max(due, key=lambda s: s.logged_since_snap)]
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
        engine = self._engine()
        assert engine is not None
        t0 = time.monotonic()
        try:
            if session.parked:  # its cells are its newest snapshot's (a scrub rewrites it)
                kv = self.durability.newest_snapshot(session).kv
            else:
                kv = engine.cells.save_seq(session.seq_id)
            size = self.durability.snapshot(session, kv, scrub=scrub)
        except (SinkdError, JournalError, sqlite3.Error, OSError) as e:
            log.warning("snapshot of session %s failed, the previous one stays: %s", session.id, e)
            self.metrics.snapshot_failures.inc()
            session.snap_retry_at = time.time() + min(self.durability.every_s, SNAPSHOT_RETRY_S)
            return False
        if scrub:
            session.scrub_due = False
        self.metrics.snapshots.inc()
        self.metrics.snapshot_bytes.observe(size)
        self.metrics.snapshot_seconds.observe(time.monotonic() - t0)
        return True
