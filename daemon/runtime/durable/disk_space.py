"""Room on the state directory's filesystem. Below `min_free_mb` free, nothing new is written:
a call that would write (an append, a generation, a new session, a restore that parks another) is
refused by name before it runs, while reads, closes and deletes still answer; once space returns
the next call is served, nothing to restart. A margin, not the edge: a write that meets a full disk
mid-step fails its sessions (or, in the syncer, stops the daemon acknowledging), so the guard
refuses while a step's writes still fit, as SQLite and Redis refuse a write and keep what is
stored."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from sinkd.daemon.metrics import Metrics
from sinkd.errors import DiskFull


def free_bytes(path: Path) -> int:
    """What an unprivileged writer may still put on the filesystem holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class DiskSpace:
    def __init__(
        self,
        path: Path,
        min_free: int,
        metrics: Metrics | None = None,
        free: Callable[[Path], int] = free_bytes,
    ) -> None:
        self.path = path
        self.min_free = min_free
        self.metrics = metrics
        self.free = free

    def check(self, what: str) -> None:
        """DiskFull naming what was refused, the space left and the setting."""
        if not self.min_free:
            return
        try:
            left = self.free(self.path)
        except OSError:  # the directory itself is gone or unreadable: the write will say why
            return
        if self.metrics is not None:
            self.metrics.state_disk_free.set(left)
        if left < self.min_free:
            if self.metrics is not None:
                self.metrics.disk_full_refusals.inc()
            raise DiskFull(
                f"{what} refused: the state directory's filesystem has {left / 2**20:.1f} MiB free,"
                f" below min_free_mb ({self.min_free / 2**20:.1f} MiB); nothing more is written until"
                " space returns (reads, closes and deletes still answer)"
            )
