"""Jobs: one append or generation on one session, and the per-session queues they wait in.

A job is bound to the generation its handle was checked against, from the first check to the last
cell: a reset or close that overtakes it (even while its text is still being tokenized) makes the
engine thread drop it unapplied. Every wait on a job ends: a reply, an error, or its deadline.
"""

from __future__ import annotations

import queue
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sinkd.cachepolicy import AppendPlan
from sinkd.daemon.engine.sampler import Sampler
from sinkd.daemon.runtime.api import Done, ErrorEvent, Event
from sinkd.daemon.runtime.loop.textout import TextAssembler
from sinkd.daemon.runtime.recall.across import Said
from sinkd.daemon.runtime.recall.layer import RecallAsk
from sinkd.daemon.runtime.sessions import Session, SessionState
from sinkd.errors import Cancelled, DeadlineExceeded, SinkdError, StaleGeneration

POLL_S = 0.5  # how often a waiter looks at the engine thread's health while it waits


@dataclass
class GenSpec:
    max_tokens: int
    stops: list[str]
    sampler: Sampler
    # the client named no max tokens: a reply that loops (one block of tokens over and over) is
    # cut, reason "repetition"
    repetition_guard: bool = False
    # structured output: the reply's grammar state (engine.grammar.GrammarMask), or None
    grammar: Any = None


REPEAT_CHECK_EVERY = 16  # tokens between two looks for a loop (a look is a few byte compares)
REPEAT_TIMES = 4  # a block repeated this many times in a row is a loop
REPEAT_MIN_SPAN = 64  # ... spanning at least this many tokens (a list of short items is not)
REPEAT_MAX_BLOCK = 64  # the longest block looked for


def loops(ids: list[int]) -> bool:
    """Whether the newest tokens are one block of up to REPEAT_MAX_BLOCK tokens repeated at least
    REPEAT_TIMES times in a row and over at least REPEAT_MIN_SPAN tokens: a small model's loop,
    which only max tokens would end otherwise."""
    tail = ids[-REPEAT_TIMES * REPEAT_MAX_BLOCK :]
    raw = array("i", tail).tobytes()
    for block in range(1, REPEAT_MAX_BLOCK + 1):
        times = max(REPEAT_TIMES, -(-REPEAT_MIN_SPAN // block))
        if block * times > len(tail):
            break
        unit = raw[-block * 4 :]
        if raw[-block * times * 4 :] == unit * times:
            return True
    return False


class Job:
    """Prefill `tokens`, then (with `gen`) sample and decode up to max_tokens, one per step."""

    def __init__(
        self,
        session: Session,
        tokens: list[int],
        gen: GenSpec | None = None,
        generation: str | None = None,
        on_start: Callable[[Job], None] | None = None,
    ) -> None:
        self.session = session
        # engine thread, as the job starts: what depends on where the session stands then (a chat
        # turn's framing after a reply, its sampling's seed) is decided here, not by the caller
        self.on_start = on_start
        self.generation = session.generation if generation is None else generation
        self.tokens = tokens
        self.gen = gen
        self.offset = 0
        self.started = False
        self.restored_ms = 0.0  # its session was parked: the time its cells took to come back
        self.pending: int | None = None  # sampled, emitted, not yet decoded
        self.pending_plan: AppendPlan | None = None  # its journalled placement
        # tokens guessed to follow the pending one, verified with it (executor; never the job's)
        self.drafts: list[int] = []
        self.final = False  # the pending token is the last one
        self.reason = ""
        self.generated = 0
        self.ids: list[int] = []  # what it generated, kept for the repetition guard alone
        self.assembler = TextAssembler(gen.stops if gen else [])
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()  # put in C: per token
        self.cancelled = threading.Event()
        self.done = threading.Event()
        # its final reply is decided (the engine thread's view: the reply itself may still wait
        # for the journal's fsync, and `done` with it)
        self.answered = False
        self.error: SinkdError | None = None
        self.result: Done | None = None
        self.recall: RecallAsk | None = None  # passages go in first
        # a chat turn's words for the tenant's memory across conversations; a private turn takes
        # its conversation out of it
        self.keep: Said | None = None
        self.private = False
        self.store_at: list[int] = []  # stream lengths at which its read is kept (prefixes.py)
        self.submitted = time.monotonic()
        self.last_emit = self.submitted

    @property
    def prefilling(self) -> bool:
        return self.offset < len(self.tokens)

    def cancel(self) -> None:
        self.cancelled.set()

    def finish(self, result: Done) -> None:
        self.answered = True
        self.result = result
        self.events.put(result)
        self.done.set()

    def fail(self, error: SinkdError) -> None:
        if self.done.is_set():
            return
        self.answered = True
        self.error = error
        self.events.put(ErrorEvent(error))
        self.done.set()

    def wait(self, timeout: float, alive: Callable[[], bool]) -> Done:
        """The job's result; its error; DeadlineExceeded (the job is cancelled) past `timeout`;
        Cancelled if the engine thread is gone (`alive` says)."""
        deadline = time.monotonic() + timeout
        while not self.done.wait(_slice(deadline)):
            self._stalled(deadline, alive)
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result

    def next_event(self, deadline: float, alive: Callable[[], bool]) -> Event:
        """The next streamed event, with the same guarantees as `wait`."""
        while True:
            try:
                return self.events.get(timeout=_slice(deadline))
            except queue.Empty:
                self._stalled(deadline, alive)

    def _stalled(self, deadline: float, alive: Callable[[], bool]) -> None:
        """A poll went by without news: fail the job if its engine is gone, or give up at the
        deadline (cancelling it, so the engine drops what is left)."""
        if not alive():
            self.fail(Cancelled("the engine stopped before this request finished"))
        elif time.monotonic() >= deadline:
            self.cancel()
            raise DeadlineExceeded("no answer before the deadline; the request was cancelled")


def _slice(deadline: float) -> float:
    return min(POLL_S, max(0.0, deadline - time.monotonic()))


class JobQueues:
    """Each session's jobs, in order; only the head of a queue runs. Engine thread only."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[Job]] = {}

    def __bool__(self) -> bool:
        return any(self._queues.values())

    def add(self, job: Job) -> None:
        self._queues.setdefault(job.session.id, deque()).append(job)

    def busy(self, session_id: str) -> bool:
        return bool(self._queues.get(session_id))

    def answering(self) -> set[str]:
        """The sessions whose running generation has not given its first token yet."""
        return {
            jobs[0].session.id
            for jobs in self._queues.values()
            if jobs and jobs[0].gen is not None and jobs[0].generated == 0
        }

    def pop(self, job: Job) -> None:
        """Remove a finished or failed head."""
        jobs = self._queues.get(job.session.id)
        if jobs and jobs[0] is job:
            jobs.popleft()
            if not jobs:
                del self._queues[job.session.id]

    def heads(self, on_cancelled: Callable[[Job], None]) -> list[Job]:
        """The runnable head of each queue; cancelled heads go to `on_cancelled`, heads of an
        older generation fail unapplied."""
        heads = []
        for sid, jobs in list(self._queues.items()):
            while jobs:
                job = jobs[0]
                if job.session.state is SessionState.CLOSED:
                    jobs.popleft()
                    job.fail(Cancelled("the session was closed while this request waited"))
                elif job.generation != job.session.generation:
                    jobs.popleft()
                    job.fail(StaleGeneration("the session was reset while this request waited"))
                elif job.cancelled.is_set():
                    jobs.popleft()
                    on_cancelled(job)
                else:
                    heads.append(job)
                    break
            if not jobs:
                del self._queues[sid]
        return heads

    def cancel_session(self, session: Session, error: SinkdError) -> list[Job]:
        """Fail every job queued for the session (reset, close, failure); returns them."""
        jobs = list(self._queues.pop(session.id, deque()))
        for job in jobs:
            job.fail(error)
        return jobs

    def drain(self, error: SinkdError) -> None:
        for jobs in self._queues.values():
            for job in jobs:
                job.fail(error)
        self._queues.clear()
