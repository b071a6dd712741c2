"""What deleted rows leave on disk, and a purge that knows whether it removed it.

Deleted rows are zeroed at their commit (`secure_delete`), but two things keep their content: the
full-text indexes' old segments (a merge rewrites them) and the write-ahead log's pages as they
were (a truncation empties it). A purge does both, in that order, on the engine thread.

- The merge costs in proportion to the indexes that lost rows (a tenant's own, not everyone's), and
  runs at most once per `interval_s`: a tenant forgetting in a loop cannot stall every session's
  steps; its replies wait for the merge instead (`wait`).
- The truncation cannot empty a log that another connection still reads (an operator's backup, a
  `sqlite3` shell): SQLite answers busy and leaves it as it was. The engine thread does not wait
  for that reader. The purge stays owed (journalled: a start pays it), is tried again between
  steps, counted in the metrics and said in the log; the deletion's reply waits for it within its
  bound, then says that it is owed rather than claim the text gone.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from typing import TYPE_CHECKING

from sinkd.daemon import failpoints
from sinkd.daemon.store import wal

if TYPE_CHECKING:
    from sinkd.daemon.metrics import Metrics
    from sinkd.daemon.store.journal import Journal
    from sinkd.daemon.store.memory import MemoryStore

log = logging.getLogger("sinkd.durability")

RETRY_S = 0.1  # the first retry of a log a reader holds; each later one waits twice as long ...
RETRY_MAX_S = 1.0  # ... up to this


class Purge:
    """Deletions are numbered as they ask (`request`, engine thread); `paid` is the last one whose
    text has left the files. A reply waits for its number (`wait`, any other thread)."""

    def __init__(self, interval_s: float = 0.0, metrics: Metrics | None = None) -> None:
        self.interval_s = interval_s
        self.metrics = metrics
        self.asked = 0
        self._paid = 0
        self._merged = True  # no index lost rows since the last merge (as far as asked)
        self._every = False  # merge every index: a start found a purge owed
        self._merged_at = -float("inf")  # monotonic time of the last merge
        self._next_try = 0.0  # monotonic: no truncation is tried before (a reader held the log)
        self._backoff = RETRY_S
        self.held_since: float | None = None  # monotonic: a reader first refused the truncation
        self._cond = threading.Condition()
        if metrics is not None:
            metrics.purge_held.set_function(self.held_for)

    @property
    def pending(self) -> bool:
        return self.asked > self._paid

    def request(self, merge: bool, every: bool = False) -> None:
        """A deletion (in its transaction) asks for a purge: `merge` if an index lost rows
        (`every`: perhaps any did), else the log's truncation alone, which needs no interval."""
        self.asked += 1
        self._merged = self._merged and not (merge or every)
        self._every |= every

    def held_for(self) -> float:
        """Seconds since a reader first kept an owed purge from the log (0: none does)."""
        since = self.held_since
        return 0.0 if since is None else time.monotonic() - since

    def next_in(self) -> float | None:
        """Seconds until the owed purge may run (0: now), None if none is owed."""
        if not self.pending:
            return None
        now = time.monotonic()
        at = self._next_try
        if not self._merged:
            at = max(at, self._merged_at + self.interval_s)
        return max(0.0, at - now)

    def due(self) -> bool:
        return self.next_in() == 0.0

    def run_due(self, memory: MemoryStore | None, journal: Journal, at_once: bool = False) -> None:
        """Purge if one is owed and due (`at_once`: whatever the interval and the retry time)."""
        if memory is None or not self.pending or (not at_once and not self.due()):
            return
        asked = self.asked
        try:
            if not self._merged:
                memory.merge(self._every)  # commits
                self._merged, self._every = True, False
                self._merged_at = time.monotonic()
            journal.db.commit()  # no transaction may be open for the checkpoint
            failpoints.hit("purge-truncate")
            answer = wal.truncate(journal.db)
        except sqlite3.Error as e:  # committed already: tried again, as a busy log is
            log.warning("memory purge deferred: %s", e)
            self._later()
            return
        if answer.busy:
            self._held()
            return
        try:
            journal.purge_paid()
            journal.commit()  # not synced: a mark that survives a power loss costs a purge
        except sqlite3.Error as e:
            log.warning("a done purge stays marked owed (the next start repeats it): %s", e)
        self._pay(asked)

    def wait(self, number: int, timeout: float) -> bool:
        """Until deletion `number`'s purge is done, at most `timeout` seconds: whether it is."""
        with self._cond:
            if self._paid >= number:
                return True
        failpoints.hit("purge-wait")
        with self._cond:
            return self._cond.wait_for(lambda: self._paid >= number, max(0.0, timeout))

    def _later(self) -> None:
        self._next_try = time.monotonic() + self._backoff
        self._backoff = min(RETRY_MAX_S, self._backoff * 2)

    def _held(self) -> None:
        if self.held_since is None:
            self.held_since = time.monotonic()
            log.warning(
                "the write-ahead log could not be truncated: another connection reads journal.db;"
                " what was deleted stays in journal.db-wal until it lets go (tried again between"
                " steps)"
            )
        if self.metrics is not None:
            self.metrics.purge_refusals.inc()
        self._later()

    def _pay(self, asked: int) -> None:
        if self.held_since is not None:
            log.info("the owed purge is done, %.1f s after a reader first held the log",
                     self.held_for())  # fmt: skip
        self.held_since = None
        self._next_try, self._backoff = 0.0, RETRY_S
        if self.metrics is not None:
            self.metrics.purges.inc()
        with self._cond:
            self._paid = asked
            self._cond.notify_all()
