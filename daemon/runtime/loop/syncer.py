"""The journal's fsync, off the engine thread: replies wait for it, the next decode does not.

With sync=full every acknowledgement waits for an fsync of the journal's write-ahead log (~1 ms
here, more on a busy disk). Done on the engine thread it adds that to every step; here it runs
beside the next `llama_decode`, and the replies that waited for it go out, in commit order, as soon
as the log is on disk. One fsync covers every commit queued before it (group commit).

Each fsync also slows the decode it runs beside (on two cores, ~0.6 ms a token here: the kernel's
journal and the disk's completions take a core from llama.cpp's threads; bench/README.md, "overhead.py").
With an interval the syncer starts an fsync no sooner than that long after the previous one began,
and every commit made meanwhile rides on it: fewer fsyncs, and replies that wait up to the
interval. Nothing is acknowledged before it is on disk either way.

An fsync that fails leaves the journal's durability unknown (the kernel may have dropped the pages):
the replies waiting for it fail, and the daemon stops rather than acknowledge anything more.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from sinkd.daemon import failpoints
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.loop.jobs import Job
from sinkd.errors import ResourceExhausted

log = logging.getLogger("sinkd.syncer")

Replies = list[tuple[Job, Callable[[], None]]]


class Syncer:
    def __init__(
        self,
        sync: Callable[[], None],
        metrics: Metrics,
        interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._sync = sync
        self._metrics = metrics
        self._interval_s = interval_s
        self._clock = clock
        self._sleep = sleep
        self._last_sync: float | None = None
        self._queue: queue.SimpleQueue[Replies | None] = queue.SimpleQueue()
        self.error: BaseException | None = None  # set once; the engine thread then stops
        self._thread = threading.Thread(target=self._run, name="sinkd-sync", daemon=True)
        self._thread.start()

    def submit(self, replies: Replies) -> None:
        """Send these replies once every commit made so far is durable (after earlier ones)."""
        self._queue.put(replies)

    def close(self, timeout: float = 30.0) -> None:
        """Deliver what is queued, then stop (the journal must still be open)."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                return
            if self._interval_s > 0 and self._last_sync is not None:
                wait = self._last_sync + self._interval_s - self._clock()
                if wait > 0:
                    self._sleep(wait)  # the commits of the steps meanwhile join this fsync
            batches = [first]
            while True:  # everything queued meanwhile rides on the same fsync
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                    break
                batches.append(more)
            try:
                failpoints.hit("before-sync")
                self._last_sync = self._clock()
                with self._metrics.journal_sync_seconds.time():
                    self._sync()
            except BaseException as e:
                self._failed(e, batches)
                return
            for replies in batches:
                for _, send in replies:
                    send()

    def _failed(self, e: BaseException, batches: list[Replies]) -> None:
        log.error("journal fsync failed; the daemon stops acknowledging: %s", e)
        self._metrics.journal_failures.inc()
        self.error = e
        error = ResourceExhausted(f"the journal could not be made durable: {e}")
        while True:
            for replies in batches:
                for job, _ in replies:
                    job.fail(error)
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                return
            batches = [more] if more is not None else []
