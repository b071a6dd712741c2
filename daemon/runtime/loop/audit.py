"""Run-time invariants: what the cache really holds must be what each session's policy says.

After every step the touched sessions' token ledgers are checked against their policy; the checks that
call into llama.cpp (first and last cache position, cell count) and the one owner per sequence run
at every prefill chunk, every eviction, and every `FULL_CHECK_EVERY` decode steps otherwise: a cell
count is a walk of llama.cpp's cache (~12 us a session here), as much as the rest of a step's own
work at GPU speed (bench/engine_cpu.py). A violation, or any failure that leaves a cache unlike its history,
fails that session alone: its cells are freed, its queued requests fail, and it refuses work until
it is reset or closed.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable

from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.loop.jobs import JobQueues
from sinkd.daemon.runtime.sessions import Registry, Session, SessionState
from sinkd.errors import EngineError, JournalError, SessionFailed

log = logging.getLogger("sinkd.audit")
FULL_CHECK_EVERY = 16  # decode steps without an eviction between two checks against the cells


def ledger_problems(session: Session) -> list[str]:
    """Where the session's token ledger and its policy state disagree (no call into llama.cpp)."""
    seq = session.seq
    retained = seq.state.retained(seq.config)
    if len(session.retained) != retained:
        return [f"{len(session.retained)} token ids for {retained} retained cells"]
    return []


def problems(engine: Engine, registry: Registry, session: Session) -> list[str]:
    """Where the cache and the session's policy state disagree (engine thread)."""
    seq = session.seq
    retained = seq.state.retained(seq.config)
    expected = seq.cache_span()
    lo, hi = engine.cells.pos_range(session.seq_id)
    found = []
    cells = engine.cells.cell_count(session.seq_id)
    if cells != retained:
        found.append(f"llama.cpp holds {cells} cells, the policy retains {retained}")
    if (lo, hi) != expected:
        found.append(f"cache positions {lo}..{hi}, policy expects {expected[0]}..{expected[1]}")
    if len(session.retained) != retained:
        found.append(f"{len(session.retained)} token ids for {retained} retained cells")
    owners = [
        s.id
        for s in registry.all()
        if s.seq_id == session.seq_id and s.state is not SessionState.CLOSED
    ]
    if owners != [session.id]:
        found.append(f"sequence {session.seq_id} owned by {len(owners)} sessions")
    return found


class Auditor:
    def __init__(
        self,
        engine: Callable[[], Engine | None],
        registry: Registry,
        queues: JobQueues,
        metrics: Metrics,
        durability: Durability | None,
    ) -> None:
        self._engine = engine
        self.registry = registry
        self.queues = queues
        self.metrics = metrics
        self.durability = durability

    def check(self, session: Session, full: bool = True) -> bool:
        """True if the session is consistent; else it is failed (alone) and False. Not `full`
        (a decode step without an eviction): its ledger alone, and its cells every
        FULL_CHECK_EVERY such steps."""
        engine = self._engine()
        assert engine is not None
        if session.seq_id < 0:  # parked (or never resident): no cells to disagree
            return True
        if not full and session.unchecked_steps < FULL_CHECK_EVERY - 1:
            session.unchecked_steps += 1
            found = ledger_problems(session)
        else:
            session.unchecked_steps = 0
            found = problems(engine, self.registry, session)
        if not found:
            return True
        self.fail_session(session, "; ".join(found))
        return False

    def fail_session(self, session: Session, why: str) -> None:
        """Fail one session: free its cells, record the failure durably, fail its queued jobs."""
        if session.state in (SessionState.CLOSED, SessionState.STALE):
            return
        log.error("session %s failed: %s", session.id, why)
        self.metrics.invariant_violations.inc()
        session.transition(SessionState.FAILED)
        session.failure = why
        engine = self._engine()
        if engine is not None and session.seq_id >= 0:
            try:
                engine.cells.clear(session.seq_id)
            except EngineError:
                log.exception("could not free the cells of session %s", session.id)
        session.clear_history()
        if self.durability is not None:
            try:  # a transition: durable before anyone is told
                self.durability.failed(session)
                self.durability.commit()
            except (sqlite3.Error, JournalError) as e:
                self.durability.rollback()
                log.error("could not journal the failure of session %s: %s", session.id, e)
        self.queues.cancel_session(session, SessionFailed(f"session {session.id} failed: {why}"))
