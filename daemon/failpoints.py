"""Crash points for the kill -9 tests: with SINKD_FAILPOINT=<name>, the process kills itself
(SIGKILL, no cleanup) when it reaches that point. Unset, a point costs one dictionary lookup."""

from __future__ import annotations

import os
import signal

POINTS = ("snapshot-before-rename", "snapshot-before-journal")


def hit(name: str) -> None:
    assert name in POINTS, name
    if os.environ.get("SINKD_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
