"""A periodic snapshot's file, sealed and written off the engine thread.

A snapshot of 256 cells is megabytes: its checksum, its write and two fsyncs took ~10 ms on the
engine thread, and every session's next token waited for them (a p99 ITL of 71-80 ms at eight
sessions against llama-server's 53). While steps wait, the engine thread now only copies the cells
and the metadata (`body`); this thread seals and writes them, and the engine thread records the row
between two later steps (`settle`). Until then the journal still holds every chunk since the
previous snapshot, so a crash meanwhile resumes as before, and the start's sweep deletes the
unrecorded file.

One write at a time. Anything else that touches a session's stored history (another snapshot, a
reset, a close, a forget's scrub, an export) settles first: a file taken before a forget is
recorded, then scrubbed with the rest, never left behind it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sinkd.daemon import failpoints
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.sessions import Session
from sinkd.daemon.store import snapshots
from sinkd.errors import JournalError, SinkdError

log = logging.getLogger("sinkd.snapshots")
SETTLE_WAIT_S = 120.0  # a write still unfinished then (a hung disk) is given up; its file swept
SNAPSHOT_RETRY_S = 30.0  # a failed snapshot (disk full, ...) is not retried sooner


def failed(session: Session, error: BaseException, metrics: Metrics | None, retry_s: float) -> None:
    """A snapshot that failed: the previous one stays, and the session waits `retry_s` for the
    next try (a full disk is not hammered every step)."""
    log.warning("snapshot of session %s failed, the previous one stays: %s", session.id, error)
    if metrics is not None:
        metrics.snapshot_failures.inc()
    session.snap_retry_at = time.time() + retry_s


@dataclass
class Write:
    """One snapshot taken on the engine thread, its file still to be written."""

    session: Session
    n_seen: int
    rel: str  # its path under the state directory, as the journal's row names it
    path: Path
    pieces: list[bytes]  # `snapshots.body`: copies, nothing the session still changes
    since: int  # the session's tokens logged since its previous snapshot, at the copy
    fsync: bool
    began: float = field(default_factory=time.monotonic)
    took: float = 0.0  # from the copy to the file on disk, seconds
    size: int = 0
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class SnapshotWriter:
    """The thread that seals and writes one `Write` at a time; the engine thread settles each."""

    def __init__(
        self, record: Callable[[Write], None], metrics: Metrics | None, retry_s: float
    ) -> None:
        self._record = record  # engine thread: the journal's row, once the file is on disk
        self._metrics = metrics
        self._retry_s = retry_s
        self._pending: Write | None = None
        self._given_up: set[Path] = set()
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        return self._pending is not None

    def start(self, write: Write) -> None:
        """Write it on a thread of its own (engine thread; none may be pending: `settle` first)."""
        assert self._pending is None, "a snapshot write is already pending"
        self._pending = write
        threading.Thread(
            target=self._write, args=(write,), name="sinkd-snapshot", daemon=True
        ).start()

    def settle(self, wait: bool = True) -> None:
        """Record the pending write if it is done (engine thread); with `wait`, wait for it first,
        at most SETTLE_WAIT_S (a hung disk): then it counts as failed, and its file is deleted if
        it comes."""
        write = self._pending
        if write is None:
            return
        if wait and not write.done.is_set():
            failpoints.hit("snapshot-settle-wait")
            write.done.wait(SETTLE_WAIT_S)
        with self._lock:
            if not write.done.is_set():
                if not wait:
                    return
                self._given_up.add(write.path)
                write.error = SinkdError(f"not written within {SETTLE_WAIT_S:.0f} s")
        self._pending = None
        if write.error is None:
            try:
                self._record(write)
            except JournalError as e:
                write.error = e
        if write.error is not None:
            failed(write.session, write.error, self._metrics, self._retry_s)
        elif self._metrics is not None:
            self._metrics.snapshots.inc()
            self._metrics.snapshot_bytes.observe(write.size)
            self._metrics.snapshot_seconds.observe(write.took)

    def _write(self, write: Write) -> None:
        try:
            data = snapshots.sealed(write.pieces)
            snapshots.write_atomic(write.path, data, fsync=write.fsync)
            write.size = sum(map(len, data))
            write.took = time.monotonic() - write.began
        except BaseException as e:  # SnapshotError, or a bug: the engine thread says so
            write.error = e
        with self._lock:
            late = write.path in self._given_up
            self._given_up.discard(write.path)
            write.done.set()
        if late:
            write.path.unlink(missing_ok=True)
