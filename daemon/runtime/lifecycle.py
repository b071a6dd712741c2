"""Session transitions that touch the context: create, reset, fork, rewind, close. Engine thread
only.

Each checks the caller's generation here, on the engine thread, in the same step as it acts, so
check-and-act is atomic (six resets racing with one handle: one wins, five are stale). Each records
its transition in the journal and commits it before it changes what a client can see: a failed
commit changes nothing (reset) or undoes the new session (create, fork). A sequence acquired for a
session that does not come to be is released.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable

from sinkd.cachepolicy import CacheSequence, PolicyConfig
from sinkd.cachepolicy.recall_plan import RecallConfig
from sinkd.daemon import failpoints
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.engine.sampler import Sampler, SamplingParams
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.admission import Admission
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.durable.snapshotter import Snapshotter
from sinkd.daemon.runtime.loop.residency import NoRoom
from sinkd.daemon.runtime.loop.scheduler import Scheduler
from sinkd.daemon.runtime.recall.layer import Recall
from sinkd.daemon.runtime.sessions import (
    ModelIdentity,
    Registry,
    Session,
    SessionState,
)
from sinkd.errors import (
    Cancelled,
    FailedPrecondition,
    InvalidInput,
    NotFound,
    ResourceExhausted,
    SessionFailed,
    StaleGeneration,
)

log = logging.getLogger("sinkd.lifecycle")


def check_generation(session: Session, generation: str) -> None:
    """The handle's generation must still be the session's, checked where the change happens."""
    if session.state is SessionState.CLOSED:
        raise NotFound(f"no session {session.id!r} (closed meanwhile)")
    if session.generation != generation:
        raise StaleGeneration(
            f"session {session.id} is at another generation (reset meanwhile): this handle is"
            " stale; use the handle from the latest create, reset or fork"
        )


class Lifecycle:
    def __init__(
        self,
        scheduler: Scheduler,
        snapshotter: Snapshotter | None,
        registry: Registry,
        admission: Admission,
        metrics: Metrics,
        durability: Durability | None,
        recall: Recall,
    ) -> None:
        self.recall = recall
        self.scheduler = scheduler
        self.snapshotter = snapshotter
        self.registry = registry
        self.admission = admission
        self.metrics = metrics
        self.durability = durability
        # told each session id as it closes (engine thread): what is kept beside the session
        # elsewhere (the HTTP conversations' index) goes with it
        self.on_closed: Callable[[str], None] = lambda session_id: None
        # told each session and generation (reset count) that ends, by a close or a reset
        # (engine thread): the prefix states it alone still holds go
        self.on_released: Callable[[str, int], None] = lambda session_id, reset_count: None
        # SessionElsewhere for a tenant marked moving (tenant_moves.py): a create, fork, reset,
        # rewind or close whose call passed the edge's check before the mark changes nothing
        self.served_here: Callable[[str], None] = lambda tenant: None

    def _admit(self, engine: Engine, session: Session) -> Session:
        """Register a new session; journal it (undone if the journal refuses)."""
        self.registry.add(session)
        self.metrics.active_sessions.set(len(self.registry))
        self.scheduler.residency.counted()
        if self.durability is not None:
            try:
                self.durability.record(self.durability.created, session)
            except ResourceExhausted:
                self.close(session)
                raise
        return session

    def create(
        self,
        engine: Engine,
        tenant: str,
        config: PolicyConfig,
        sampling: SamplingParams,
        identity: ModelIdentity,
        system_tokens: list[int],
        system_prompt: str,
        pinned: int,
        recall: RecallConfig,
    ) -> Session:
        self.served_here(tenant)
        seq_id = self.admission.acquire(engine, tenant=tenant, may_wait=True)
        try:
            session = Session(
                id=self.registry.new_id(),
                tenant=tenant,
                seq_id=seq_id,
                policy=config,
                seq=CacheSequence(config),
                sampling=sampling,
                sampler=Sampler(sampling),
                model=identity,
                system_tokens=system_tokens,
                system_prompt_sha256=hashlib.sha256(system_prompt.encode()).hexdigest(),
                pinned=pinned,
                pending_prefix=list(system_tokens),
                recall=recall,
                reads=[],
            )
        except BaseException:
            if seq_id >= 0:
                engine.cells.release_seq(seq_id)
            raise
        session.parked = seq_id < 0  # every resident session busy: its first call waits for one
        if not system_tokens:
            session.transition(SessionState.IDLE)
        return self._admit(engine, session)

    def fork(self, engine: Engine, parent: Session, generation: str) -> Session:
        self.served_here(parent.tenant)
        check_generation(parent, generation)
        if parent.state is SessionState.FAILED:
            raise InvalidInput("cannot fork a failed session; reset it first")
        self._resident(engine, parent)
        seq_id = self.admission.acquire(engine, keep=(parent.id,), tenant=parent.tenant)
        try:
            failpoints.hit("engine-copy")
            engine.cells.copy(parent.seq_id, seq_id)  # physical: per-sequence KV streams
            child = Session(
                id=self.registry.new_id(),
                tenant=parent.tenant,
                seq_id=seq_id,
                policy=parent.policy,
                seq=parent.seq.fork(),
                sampling=parent.sampling,
                sampler=Sampler(parent.sampling),
                model=parent.model,
                system_tokens=parent.system_tokens,
                system_prompt_sha256=parent.system_prompt_sha256,
                pinned=parent.pinned,
                pending_prefix=list(parent.pending_prefix),
            )
        except BaseException:
            engine.cells.release_seq(seq_id)
            raise
        child.retained = parent.retained.copy()
        child.set_logits(
            None if parent.last_logits is None else parent.last_logits.copy(), parent.greedy_hint
        )
        child.transition(SessionState.IDLE)
        try:  # the child's memory is the parent's as it is now, committed with its record
            self.recall.forked(parent, child)
        except BaseException:
            self.recall.dropped(child.id, None)
            engine.cells.release_seq(seq_id)
            raise
        self._admit(engine, child)
        if self.durability is not None and child.seq.state.n_seen:
            assert self.snapshotter is not None  # the child's history starts with one
            if not self.snapshotter.take(child):
                self.close(child)
                raise ResourceExhausted("the fork's first snapshot could not be written")
        return child

    def reset(self, engine: Engine, session: Session, generation: str) -> Session:
        """A new generation with no cells. The journal takes it first: if it refuses, nothing
        changed (the old handle still works)."""
        self.served_here(session.tenant)
        check_generation(session, generation)
        if self.durability is not None:
            session.reset_count += 1
            session.refresh_generation()
            try:
                self.durability.record(self.durability.reset, session)
            except ResourceExhausted:
                session.reset_count -= 1
                session.refresh_generation()
                raise
            self.durability.fresh(session)
        else:
            session.reset_count += 1
            session.refresh_generation()
            if self.recall.dropped(session.id, session.reset_count):
                self.recall.purge()
        self.scheduler.cancel_session_jobs(session, Cancelled("the session was reset"))
        self.on_released(session.id, session.reset_count - 1)  # the old generation's
        if session.seq_id >= 0:
            engine.cells.clear(session.seq_id)  # verified: pos max is -1
        self.scheduler.residency.forget(session)  # parked, it stays parked, empty
        session.clear_history()
        session.pending_prefix = list(session.system_tokens)
        session.reads, session.prefix_tokens = [], 0  # read anew from position 0
        session.failure = ""
        if session.state is not SessionState.IDLE:
            session.transition(SessionState.IDLE)
        session.last_active = time.monotonic()
        return session

    def rewind(self, engine: Engine, session: Session, generation: str, to_n_seen: int) -> None:
        """Back to logical position `to_n_seen`: the newest cells go (a regenerated turn: the
        client dropped the reply), if the window still holds them. Journalled as one snapshot of
        the session as it is now, alone: the chunks past it would replay what was dropped. A
        snapshot that cannot be written fails the session (its files say otherwise)."""
        self.served_here(session.tenant)
        check_generation(session, generation)
        if session.state is not SessionState.IDLE or self.scheduler.queues.busy(session.id):
            raise FailedPrecondition(f"session {session.id} is busy with another request")
        if session.unlogged or session.pending_prefix:
            raise FailedPrecondition(f"session {session.id} has an append under way")
        self._resident(engine, session)
        removed = session.seq.rewind(to_n_seen)  # CannotRewind: nothing changed
        if removed is None:
            return
        engine.cells.remove(session.seq_id, *removed)
        engine.cells.compact(session.seq_id)  # packed, as a restored snapshot is (same bits)
        session.retained.drop_newest(removed[1] - removed[0])
        self.recall.rewound(session)
        session.last_logits = None  # the next append brings its own
        session.reads = None  # no prefix is kept of a stream taken back
        session.rewinds += 1
        session.last_active = time.monotonic()
        if self.snapshotter is not None and not self.snapshotter.take(session, scrub=True):
            self.scheduler.auditor.fail_session(session, "its rewind could not be journalled")
            raise SessionFailed(f"session {session.id}: its rewind could not be journalled")

    def _resident(self, engine: Engine, session: Session) -> None:
        """A parked session's cells back, for an operation on them (a fork, a rewind)."""
        if not session.parked:
            return
        try:
            self.scheduler.residency.restore(engine, session)
        except NoRoom as e:
            raise ResourceExhausted(f"session {session.id} is parked and {e}; retry") from None

    def close_asked(self, session: Session, generation: str) -> None:
        """A close a caller asked for: refused for a tenant marked moving (`served_here`), whose
        move carries the session (a move's own release closes with `close`)."""
        self.served_here(session.tenant)
        self.close(session, generation)

    def close(self, session: Session, generation: str | None = None) -> None:
        """Close and delete what is stored (a stale session too); `generation` None: expiry.

        The journal takes the close first: if it refuses (ResourceExhausted), the session stays
        open and unchanged, for a close that is not answered OK would return at the next start."""
        if generation is not None and session.state is not SessionState.STALE:
            check_generation(session, generation)
        engine = self.scheduler.engine
        if self.durability is not None:
            self.durability.record(self.durability.closed, session)
        elif self.recall.dropped(session.id, None):
            self.recall.purge()
        self.scheduler.cancel_session_jobs(session, Cancelled("the session was closed"))
        session.transition(SessionState.CLOSED)
        self.registry.remove(session.id)
        if engine is not None and session.seq_id >= 0:
            engine.cells.release_seq(session.seq_id)
            session.seq_id = -1
        self.scheduler.residency.forget(session)
        session.parked = False
        self.metrics.active_sessions.set(len(self.registry))
        self.scheduler.residency.counted()
        self.on_closed(session.id)
        self.on_released(session.id, session.reset_count)
