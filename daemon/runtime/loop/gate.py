"""Journal, then reply: nothing is told to a client before what it acknowledges is committed.

Replies wait here until `release` commits the journal (one commit per phase of a step, for every
session in it: group commit). A failed commit acknowledges nothing: the waiting replies fail with
RESOURCE_EXHAUSTED and the sessions ahead of their journal fail until they are reset. With
sync=full the commit's fsync runs on the syncer thread (see syncer.py), which sends the replies once
it is done: the engine thread goes on to the next step meanwhile.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Callable

from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.api import Done, TokenEvent
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.loop.jobs import Job
from sinkd.daemon.runtime.loop.syncer import Syncer
from sinkd.daemon.runtime.sessions import Session, SessionState
from sinkd.errors import JournalError, ResourceExhausted, SinkdError

log = logging.getLogger("sinkd.gate")


class ReplyGate:
    def __init__(
        self,
        durability: Durability | None,
        metrics: Metrics,
        fail_session: Callable[[Session, str], None],
    ) -> None:
        self.durability = durability
        self.metrics = metrics
        self.fail_session = fail_session
        self._replies: list[tuple[Job, Callable[[], None]]] = []
        self.syncer: Syncer | None = None  # started at the first deferred fsync
        self._defer = durability is not None and durability.sync == "full"

    @property
    def sync_error(self) -> BaseException | None:
        """Why acknowledgements stopped (an fsync failed), or None."""
        return self.syncer.error if self.syncer is not None else None

    def close(self) -> None:
        """Send what waits for an fsync (engine thread, at shutdown, before the journal closes)."""
        if self.syncer is not None:
            self.syncer.close()

    def reply(self, job: Job, fn: Callable[[], None]) -> None:
        """Queue a reply; what the session decoded so far joins the journal before it is sent."""
        session = job.session
        if self.durability is not None and session.has_history:
            self.durability.flush(session)
        self._replies.append((job, fn))

    def emit(self, job: Job, event: TokenEvent) -> None:
        """Queue a streamed token (journalled by the caller)."""
        self._replies.append((job, functools.partial(job.events.put, event)))

    def finish(self, job: Job, result: Done) -> None:
        job.answered = True
        self.reply(job, functools.partial(job.finish, result))

    def fail(self, job: Job, error: SinkdError) -> None:
        job.answered = True
        self.reply(job, functools.partial(job.fail, error))

    def release(self) -> None:
        """Commit the journal, then send the replies that waited for it."""
        replies, self._replies = self._replies, []
        if self.durability is not None and replies:
            try:
                with self.metrics.journal_commit_seconds.time():
                    self.durability.commit(defer_sync=self._defer)
            except (sqlite3.Error, JournalError) as e:
                log.error("journal commit failed: %s", e)
                self.metrics.journal_failures.inc()
                self.durability.rollback()
                error = ResourceExhausted(f"the journal could not record this: {e}")
                for job, _ in replies:
                    if job.session.state is not SessionState.FAILED:
                        self.fail_session(job.session, f"the journal could not record it: {e}")
                    job.fail(error)
                return
        if self._defer and replies:
            assert self.durability is not None
            if self.syncer is None:
                self.syncer = Syncer(
                    self.durability.sync_journal, self.metrics, self.durability.sync_interval_s
                )
            self.syncer.submit(replies)  # after the fsync, and after the replies before them
            return
        for _, fn in replies:
            fn()

    def drop(self, jobs: list[Job]) -> None:
        """Forget the replies of jobs that already failed (their session was reset or closed)."""
        self._replies = [(j, fn) for j, fn in self._replies if j not in jobs]
