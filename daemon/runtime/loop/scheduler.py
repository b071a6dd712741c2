"""One thread owns the llama context; every batch is built here from every active session.

Each step: the head job of each session is started (generating sessions sample their next token),
`plan_step` decides who gets which tokens, the executor evicts, decodes and records, and the reply
gate commits the journal before anyone hears back. After a step in which every head decoded,
greedy sessions may go on decoding without a plan (decode runs: runahead.py). Between steps: calls
from other threads run, idle sessions expire, due snapshots are written.

Every wait on this thread ends. Calls and jobs enter through one gate that shutdown closes before
it drains, so none is stranded; waiters poll the thread's liveness; and if the thread dies of a
bug outside a step, `on_death` tells the daemon, which stops serving (health NOT_SERVING) and exits
non-zero rather than keep a zombie that says SERVING.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from sinkd.daemon import failpoints
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.durable.snapshotter import Snapshotter
from sinkd.daemon.runtime.loop.audit import Auditor
from sinkd.daemon.runtime.loop.executor import Executor
from sinkd.daemon.runtime.loop.gate import ReplyGate
from sinkd.daemon.runtime.loop.jobs import POLL_S, Job, JobQueues
from sinkd.daemon.runtime.loop.prefixes import PrefixStates
from sinkd.daemon.runtime.loop.residency import Residency
from sinkd.daemon.runtime.loop.stepplan import Candidate, plan_step
from sinkd.daemon.runtime.recall.layer import Recall
from sinkd.daemon.runtime.sessions import Registry, Session, SessionState
from sinkd.errors import (
    Cancelled,
    DeadlineExceeded,
    EngineError,
    JournalError,
    ResourceExhausted,
    ShuttingDown,
    SinkdError,
)

log = logging.getLogger("sinkd.scheduler")
EXPIRY_RETRY_S = 60.0  # an expiry the journal refused is tried again after this
IDLE_WAIT_S = 0.5  # an idle loop's wait for a message, at most
T = TypeVar("T")


class Scheduler:
    def __init__(
        self,
        engine_factory: Callable[[], Engine],
        registry: Registry,
        metrics: Metrics,
        durability: Durability | None = None,
        step_tokens: int = 256,
        idle_timeout_s: float = 3600.0,
        prefill_chunk: int = 64,
        call_timeout_s: float = 600.0,
        recall: Recall | None = None,
        max_kv_bytes: int | None = None,
        max_parked: int = 0,
        decode_run: int = 1,
        decode_run_s: float = 0.0,
        prefixes: PrefixStates | None = None,
        max_drafts: int = 0,
    ) -> None:
        self._engine_factory = engine_factory
        self.decode_run = decode_run  # decodes a greedy session may make per pass (runahead.py)
        self.decode_run_s = decode_run_s  # ... within this long (0: no bound)
        self._run_ends = 0.0
        self.registry = registry
        self.metrics = metrics
        self.durability = durability
        self.step_tokens = step_tokens
        self.prefill_chunk = min(prefill_chunk, step_tokens)
        self.idle_timeout_s = idle_timeout_s
        self.call_timeout_s = call_timeout_s
        self.engine: Engine | None = None
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.died: BaseException | None = None
        self.on_close: Callable[[Session], None] = lambda s: None
        self.on_ready: Callable[[Engine], None] = lambda e: None  # e.g. resume stored sessions
        self.on_death: Callable[[BaseException], None] = lambda e: None
        self.queues = JobQueues()
        self.auditor = Auditor(lambda: self.engine, registry, self.queues, metrics, durability)
        self.gate = ReplyGate(durability, metrics, self.auditor.fail_session)
        self.snapshotter = (
            Snapshotter(lambda: self.engine, durability, registry, metrics) if durability else None
        )
        self.residency = Residency(
            lambda: self.engine,
            registry,
            self.queues,
            self.snapshotter,
            metrics,
            max_kv_bytes,
            max_parked,
        )
        self.executor = Executor(
            lambda: self.engine,
            self.queues,
            self.gate,
            self.auditor,
            metrics,
            durability,
            self.residency,
            recall,
            prefixes,
            max_drafts,
        )
        self._inbox: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self._closed = False  # the gate: once set (under the lock) nothing enters the inbox
        self._snapshot_at_stop = True
        self._gate_lock = threading.Lock()
        self._rr = 0
        # the last step ran nothing: every head waits for a sequence (its session parked, every
        # resident one busy or not yet idle); the loop then sleeps until a message or a poll
        self._waiting = False
        self._last_expiry = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="sinkd-engine", daemon=True)

    # --- from other threads ---

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0, snapshot: bool = True) -> None:
        """Stop after the current step. `snapshot=False` writes nothing more to the state directory
        (no stop snapshots): what resume then finds is what a kill -9 would leave."""
        with self._gate_lock:
            self._snapshot_at_stop = snapshot
            self._closed = True
            self._inbox.put(None)
        self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread.is_alive() and self.died is None and self.gate.sync_error is None

    def _enqueue(self, kind: str, payload: Any) -> None:
        with self._gate_lock:
            if self._closed or not self._thread.is_alive():
                raise ShuttingDown("the daemon is shutting down")
            self._inbox.put((kind, payload))

    def call(self, fn: Callable[[Engine], T], timeout: float | None = None) -> T:
        """Run `fn(engine)` on the engine thread between steps and return its result (or raise
        its error, ShuttingDown if the thread is gone, DeadlineExceeded past `timeout`)."""
        fut: Future[T] = Future()
        self._enqueue("call", (fn, fut))
        failpoints.hit("call-enqueued")
        deadline = time.monotonic() + (timeout or self.call_timeout_s)
        while True:
            try:
                return fut.result(timeout=min(POLL_S, max(0.0, deadline - time.monotonic())))
            except FutureTimeout:
                if not self._thread.is_alive() and not fut.done():
                    raise ShuttingDown("the engine stopped before answering") from None
                if time.monotonic() >= deadline:
                    fut.cancel()  # a call not yet taken is skipped; one running finishes
                    raise DeadlineExceeded("the engine did not answer in time") from None

    def submit(self, job: Job) -> Job:
        """Queue a job (every job writes: its tokens, or a restore's parked neighbour); DiskFull
        first if the state directory's filesystem is below its margin."""
        if self.durability is not None:
            self.durability.check_space("this call")
        self._enqueue("job", job)
        return job

    # --- the engine thread ---

    def _run(self) -> None:
        try:
            self.engine = self._engine_factory()
            self.on_ready(self.engine)
        except BaseException as e:  # reported by the server; health stays NOT_SERVING
            self.load_error = e
            self.ready.set()
            self._shutdown(snapshot=False)
            return
        self.ready.set()
        clean = False
        try:
            while self._drain(block=not self.queues or self._waiting):
                if self.gate.sync_error is not None:  # nothing more may be acknowledged
                    raise JournalError(f"the journal's fsync failed: {self.gate.sync_error}")
                self._expire_idle()
                if self.queues:
                    self._guarded_step()
                elif self.engine is not None:
                    self.engine.idle()  # an idle daemon leaves the cores to other engines
                if self.executor.recall is not None:  # vectors made off this thread go in
                    self.executor.recall.between_steps()
                if self.snapshotter is not None:
                    self.snapshotter.due(
                        bool(self.queues), self.queues.answering(), self.queues.busy
                    )
            clean = True
        except BaseException as e:  # a bug outside a step: no zombie, the daemon must stop
            log.exception("the engine thread died")
            self.died = e
        finally:
            self._shutdown(snapshot=clean and self._snapshot_at_stop)
            if self.died is not None:
                self.on_death(self.died)

    def _guarded_step(self) -> None:
        heads: list[Job] = []
        try:
            heads = self.queues.heads(self._cancelled)
            self._step(heads)
        except Exception:  # a bug in a step fails the sessions it touched, not the daemon
            log.exception("scheduler step failed; failing the requests in it")
            self.gate.drop(heads)
            for job in heads:
                if job.answered:
                    continue
                self.queues.pop(job)
                job.fail(EngineError("internal error in the scheduler (see the daemon log)"))
                if job.pending is not None:  # emitted (and journalled) but never decoded
                    why = "a step failed between sampling a token and decoding it"
                    self.auditor.fail_session(job.session, why)
                elif self.auditor.check(job.session):
                    job.session.settle()
            self.gate.release()

    def _cancelled(self, job: Job) -> None:
        job.session.settle()
        self.gate.fail(job, Cancelled("cancelled by the client"))

    def _step(self, heads: list[Job]) -> None:
        for job in heads:
            self.executor.prepare(job)
        self.executor.verifier.draft(
            heads
        )  # speculative decoding: what each decoding session may verify
        self.gate.release()  # tokens sampled above are journalled before they are sent
        live = [  # a job not started waits for a sequence (its session parked, none free)
            j for j in heads if j.started and not j.answered and self.queues.busy(j.session.id)
        ]
        plan = plan_step(
            [
                Candidate(i, j.pending is not None, self._next_take(j), len(j.drafts))
                for i, j in enumerate(live)
            ],
            self.step_tokens,
            self.prefill_chunk,
            self._rr,
        )
        self._rr = plan.next_rr
        self._waiting = bool(heads) and not live and not any(j.answered for j in heads)
        try:
            self.executor.run([(live[s.key], s) for s in plan.slots])
            if (
                self.decode_run > 1
                and len(plan.slots) == len(heads)
                and all(s.decoding for s in plan.slots)
            ):  # every head decoded a token: the greedy ones go on (runahead.py)
                self._run_ends = time.monotonic() + self.decode_run_s if self.decode_run_s else 0.0
                self.executor.run_ahead(
                    [live[s.key] for s in plan.slots], self.decode_run - 1, self._interrupted
                )
        finally:
            self.gate.release()

    def _interrupted(self) -> bool:
        """A request or a call waits, or the run has decoded for `decode_run_s`: it ends now."""
        if self._inbox.queue:
            return True
        return bool(self._run_ends) and time.monotonic() >= self._run_ends

    def _next_take(self, job: Job) -> int:
        """The prefill tokens this job's next sub-batch holds: a chunk, cut where the policy must
        evict, so that several sessions past their budget share one step."""
        if job.pending is not None:
            return 0
        take = min(len(job.tokens) - job.offset, self.prefill_chunk)
        if job.store_at:  # cut where the read is to be kept (prefixes.py)
            assert self.executor.prefixes is not None  # store points are its
            take = self.executor.prefixes.cut_before(job, job.session.seq.state.n_seen, take)
        return job.session.seq.next_take(take)

    def _drain(self, block: bool) -> bool:
        """Take everything waiting in the inbox; False once stopping."""
        while True:
            if not block and not self._inbox.queue:  # between two steps: no lock, no exception
                return not self._closed
            try:
                msg = (
                    self._inbox.get(timeout=self._idle_wait())
                    if block
                    else self._inbox.get_nowait()
                )
            except queue.Empty:
                return not self._closed
            block = False
            if msg is None:
                return False
            kind, payload = msg
            if kind == "call":
                fn, fut = payload
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn(self.engine))
                    except BaseException as e:
                        fut.set_exception(e)
            else:
                self.queues.add(payload)

    def _idle_wait(self) -> float:
        """How long an idle loop waits for a message: IDLE_WAIT_S, or until an owed purge is due
        (a deletion's reply may be waiting for it)."""
        due = self.durability.purge.next_in() if self.durability is not None else None
        return IDLE_WAIT_S if due is None else min(IDLE_WAIT_S, max(due, 0.01))

    def _expire_idle(self) -> None:
        now = time.monotonic()
        if now - self._last_expiry < 1.0:
            return
        self._last_expiry = now
        failpoints.hit("expire-idle")
        self.expire_idle(now)

    def expire_idle(self, now: float) -> None:
        """Close the sessions idle for longer than `idle_timeout_s` (or their own, shorter one)
        at `now` (engine thread; a test passes a later `now` rather than wait for it)."""
        for session in self.registry.all():
            if session.state is SessionState.STALE:
                continue  # its data waits for its owner, or for the configuration it was made under
            idle = now - session.last_active
            own = session.idle_timeout_s
            limit = self.idle_timeout_s if own is None else min(own, self.idle_timeout_s)
            if idle > limit and not self.queues.busy(session.id):
                log.info("session %s expired after %.0f s idle", session.id, idle)
                try:
                    self.on_close(session)
                except ResourceExhausted as e:  # kept open: expiry tries again in a while
                    session.last_active = now - self.idle_timeout_s + EXPIRY_RETRY_S
                    log.warning("session %s: expiry could not be journalled: %s", session.id, e)

    def _shutdown(self, snapshot: bool = True) -> None:
        """Close the gate, answer everything waiting, free the context. Never raises."""
        err = ShuttingDown("the daemon is shutting down")
        with self._gate_lock:
            self._closed = True
        try:
            if snapshot and self.engine is not None and self.snapshotter is not None:
                self.snapshotter.at_stop()
        except Exception:
            log.exception("snapshots at stop failed; resume will replay the journal")
        finally:
            try:
                self.gate.close()  # replies that wait for an fsync go out before the rest fail
            except Exception:
                log.exception("the journal's syncer did not stop")
            self.queues.drain(err)
            while True:
                try:
                    msg = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if msg is not None:
                    kind, payload = msg
                    if kind == "call":
                        if payload[1].set_running_or_notify_cancel():
                            payload[1].set_exception(err)
                    else:
                        payload.fail(err)
            if self.executor.recall is not None:
                self.executor.recall.close()  # before the store it writes to closes
            if self.executor.prefixes is not None:
                self.executor.prefixes.close()
            if self.engine is not None:
                self.engine.close()
                self.engine = None
            if self.durability is not None:
                self.durability.close()

    # --- for the service and resume (engine thread) ---

    def cancel_session_jobs(self, session: Session, error: SinkdError) -> None:
        """Fail every job queued for the session (reset, close, failure), and any reply of theirs
        still waiting for the journal."""
        self.gate.drop(self.queues.cancel_session(session, error))
