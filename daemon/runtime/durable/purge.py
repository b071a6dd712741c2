"""What deleted rows leave on disk: the full-text index's old segments still name deleted words, the
write-ahead log still holds the pages as they were. A purge merges the one and truncates the other;
both cost in proportion to what every session stored, on the engine thread, so a purge runs at most
once per interval (the rows themselves are zeroed by `secure_delete` at their commit)."""

from __future__ import annotations

import logging
import sqlite3
import time

from sinkd.daemon.store.memory import MemoryStore

log = logging.getLogger("sinkd.durability")


class Purge:
    def __init__(self, interval_s: float = 0.0) -> None:
        self.interval_s = interval_s
        self.pending = False  # something was deleted that the files may still hold
        self._at = -float("inf")  # monotonic time of the last purge

    def request(self) -> None:
        self.pending = True

    def cancel(self) -> None:
        """The delete was rolled back: nothing to wipe."""
        self.pending = False

    def due(self, memory: MemoryStore | None) -> bool:
        """A purge is pending and the last was at least `interval_s` ago: the next `run_due`
        purges."""
        return (
            self.pending and memory is not None and time.monotonic() - self._at >= self.interval_s
        )

    def run_due(self, memory: MemoryStore | None, at_once: bool = False) -> None:
        """Purge now if one is pending and the last was at least `interval_s` ago (or `at_once`)."""
        if not self.pending or memory is None:
            return
        if not at_once and not self.due(memory):
            return
        self.pending = False
        self._at = time.monotonic()
        try:
            memory.purge()
        except sqlite3.Error as e:  # committed already; the next purge finishes it
            self.pending = True
            log.warning("memory purge deferred: %s", e)
