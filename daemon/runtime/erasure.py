"""A deletion's reply and the disk: the reply waits, off the engine thread and within a bound, for
the purge that takes what the deletion removed out of the files (`durable/purge.py`), and says
whether it did. A reader of journal.db that outlasts the bound leaves the purge owed: the reply
says so (`Erased.purge_owed`) rather than claim the text gone."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.loop.scheduler import Scheduler

T = TypeVar("T")
MARGIN_S = 0.1  # a caller's deadline hears the reply this much before it passes


class Erasure:
    def __init__(self, scheduler: Scheduler, durability: Durability | None, wait_s: float) -> None:
        self.scheduler = scheduler
        self.durability = durability
        self.wait_s = wait_s

    def run(
        self, delete: Callable[[Engine], T], time_left: float | None = None, wait: bool = True
    ) -> tuple[T, bool]:
        """`delete` on the engine thread, then the wait for its purge (at most `wait_s`, and
        never past the caller's deadline; `wait=False`: none, for a deletion no one waits on).
        Returns its result and whether a purge is still owed."""
        durability = self.durability
        if durability is None:  # the memory's private temporary file, purged inside `delete`
            return self.scheduler.call(delete), False
        result, number = self.scheduler.call(lambda e: (delete(e), durability.purge.asked))
        bound = self.wait_s if wait else 0.0
        if time_left is not None:
            bound = min(bound, time_left - MARGIN_S)
        return result, not durability.purged(number, bound)
