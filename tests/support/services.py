"""The service in process, driven past its edges: calls whose jobs share one engine step."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sinkd.daemon.runtime.service import SinkdService


def in_one_step(svc: SinkdService, calls: list[Any]) -> list[Any]:
    """Start `calls` (each a job submitted to the engine) so that their jobs enter the same step:
    the engine thread is held by a call until every job waits in its inbox. Returns futures."""
    held, go = threading.Event(), threading.Event()

    def hold(engine: Any) -> None:
        held.set()
        assert go.wait(60)

    pool = ThreadPoolExecutor(len(calls) + 1)
    blocker = pool.submit(svc.scheduler.call, hold)
    assert held.wait(60)  # the engine thread is busy: the jobs wait in its inbox
    futures = [pool.submit(call) for call in calls]
    deadline = time.monotonic() + 30
    while svc.scheduler._inbox.qsize() < len(calls) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.set()
    blocker.result(60)
    pool.shutdown(wait=False)
    return futures
