"""One thread owns the llama context; every batch is built here from every active session.

Each step: sessions that are generating get one token each (sampled from their last logits, then
decoded), and the rest of the step's token budget goes to prefill sub-batches, round-robin, so a
long append never freezes the others and no session starves. Evictions are applied per session just
before its tokens enter the batch. After the decode, the cache is checked against each touched
session's policy; a violation fails that session alone.

Work from other threads arrives through `call` (run a function between steps) and `submit` (a job).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from cachepolicy import CacheFull, SubBatch
from daemon.engine import BatchItem, Engine, Sampler
from daemon.errors import EngineError, InvalidInput, SinkdError
from daemon.metrics import Metrics
from daemon.sessions import (
    Registry,
    ResourceExhausted,
    Session,
    SessionFailed,
    SessionState,
    StaleGeneration,
)
from daemon.textout import TextAssembler

log = logging.getLogger("sinkd.scheduler")
T = TypeVar("T")


class Cancelled(SinkdError):
    """The client went away or cancelled; the receipt says exactly what was applied."""


class ShuttingDown(SinkdError):
    """The daemon is stopping and takes no more work."""


@dataclass
class GenSpec:
    max_tokens: int
    stops: list[str]
    sampler: Sampler


class Job:
    """Prefill `tokens`, then (with `gen`) sample and decode up to max_tokens, one per step."""

    def __init__(self, session: Session, tokens: list[int], gen: GenSpec | None = None) -> None:
        self.session = session
        self.generation = session.generation
        self.tokens = tokens
        self.gen = gen
        self.offset = 0
        self.started = False
        self.pending: int | None = None  # sampled, emitted, not yet decoded
        self.final = False  # the pending token is the last one
        self.reason = ""
        self.generated = 0
        self.assembler = TextAssembler(gen.stops if gen else [])
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.error: SinkdError | None = None
        self.result: Any = None
        self.submitted = time.monotonic()
        self.last_emit = self.submitted

    def cancel(self) -> None:
        self.cancelled.set()

    def finish(self, result: Any) -> None:
        self.result = result
        self.events.put(("done", result))
        self.done.set()

    def fail(self, error: SinkdError) -> None:
        self.error = error
        self.events.put(("error", error))
        self.done.set()

    def wait(self) -> Any:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result

    @property
    def prefilling(self) -> bool:
        return self.offset < len(self.tokens)


@dataclass
class _Item:
    job: Job
    tokens: list[int]
    sub_batch: SubBatch
    decode_pending: bool


class Scheduler:
    def __init__(
        self,
        engine_factory: Callable[[], Engine],
        registry: Registry,
        metrics: Metrics,
        step_tokens: int = 256,
        idle_timeout_s: float = 3600.0,
        prefill_chunk: int = 64,
    ) -> None:
        self._engine_factory = engine_factory
        self.registry = registry
        self.metrics = metrics
        self.step_tokens = step_tokens
        # NOTE: a session's prefill is cut into chunks of this size whatever the load (a chunk that
        # does not fit this step waits for the next), so its sub-batches, hence its logits, are the
        # same alone or batched with others: a solo replay reproduces any session bit for bit.
        self.prefill_chunk = min(prefill_chunk, step_tokens)
        self.idle_timeout_s = idle_timeout_s
        self.engine: Engine | None = None
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self._inbox: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self._queues: dict[str, deque[Job]] = {}
        self._rr = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sinkd-engine", daemon=True)
        self._last_expiry = time.monotonic()
        self.on_close: Callable[[Session], None] = lambda s: None

    # --- from other threads ---

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        self._inbox.put(None)
        self._thread.join(timeout)

    def call(self, fn: Callable[[Engine], T]) -> T:
        """Run `fn(engine)` on the engine thread between steps and return its result."""
        if self._stopping.is_set() or not self._thread.is_alive():
            raise ShuttingDown("the daemon is shutting down")
        fut: Future[T] = Future()
        self._inbox.put(("call", (fn, fut)))
        return fut.result()

    def submit(self, job: Job) -> Job:
        if self._stopping.is_set() or not self._thread.is_alive():
            raise ShuttingDown("the daemon is shutting down")
        self._inbox.put(("job", job))
        return job

    # --- the engine thread ---

    def _run(self) -> None:
        try:
            self.engine = self._engine_factory()
        except BaseException as e:  # reported by the server; health stays NOT_SERVING
            self.load_error = e
            self.ready.set()
            return
        self.ready.set()
        try:
            while True:
                busy = any(self._queues.values())
                if not self._drain(block=not busy):
                    break
                self._expire_idle()
                if any(self._queues.values()):
                    try:
                        self._step()
                    except Exception:  # a bug must not take the daemon down: fail this step's work
                        log.exception("scheduler step failed; failing the requests in it")
                        self._fail_all(
                            EngineError("internal error in the scheduler (see the daemon log)")
                        )
        finally:
            self._shutdown()

    def _fail_all(self, error: SinkdError) -> None:
        for sid, jobs in list(self._queues.items()):
            for job in jobs:
                job.fail(error)
            del self._queues[sid]
            for session in self.registry.all():
                if session.id == sid:
                    self._check(session)

    def _drain(self, block: bool) -> bool:
        """Take everything waiting in the inbox; False once stopping."""
        while True:
            try:
                msg = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            except queue.Empty:
                return not self._stopping.is_set()
            block = False
            if msg is None or self._stopping.is_set():
                return False
            kind, payload = msg
            if kind == "call":
                fn, fut = payload
                try:
                    fut.set_result(fn(self.engine))
                except BaseException as e:
                    fut.set_exception(e)
            else:
                job: Job = payload
                self._queues.setdefault(job.session.id, deque()).append(job)

    def _shutdown(self) -> None:
        err = ShuttingDown("the daemon is shutting down")
        for jobs in self._queues.values():
            for job in jobs:
                job.fail(err)
        self._queues.clear()
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                break
            if msg is not None:
                kind, payload = msg
                if kind == "call":
                    payload[1].set_exception(err)
                else:
                    payload.fail(err)
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def cancel_session_jobs(self, session: Session, error: SinkdError) -> None:
        """Engine thread only: fail every job queued for the session (reset, close, failure)."""
        for job in self._queues.pop(session.id, deque()):
            job.fail(error)

    def _expire_idle(self) -> None:
        now = time.monotonic()
        if now - self._last_expiry < 1.0:
            return
        self._last_expiry = now
        for session in self.registry.all():
            idle = now - session.last_active
            if idle > self.idle_timeout_s and not self._queues.get(session.id):
                log.info("session %s expired after %.0f s idle", session.id, idle)
                self.on_close(session)

    def _heads(self) -> list[Job]:
        heads = []
        for sid, jobs in list(self._queues.items()):
            while jobs:
                job = jobs[0]
                if job.cancelled.is_set():
                    jobs.popleft()
                    job.fail(Cancelled("cancelled by the client"))
                    self._settle(job.session)
                elif job.generation != job.session.generation:
                    jobs.popleft()
                    job.fail(StaleGeneration("the session was reset while this request waited"))
                else:
                    heads.append(job)
                    break
            if not jobs:
                del self._queues[sid]
        return heads

    def _settle(self, session: Session) -> None:
        if session.state not in (SessionState.CLOSED, SessionState.FAILED):
            session.state = SessionState.IDLE
        session.last_active = time.monotonic()

    def _start(self, job: Job) -> None:
        if job.started:
            return
        job.started = True
        session = job.session
        if session.state is SessionState.FAILED:
            raise SessionFailed(
                f"session {session.id} failed ({session.failure}); reset or close it"
            )
        # the full policy refuses the whole append before any token goes in (CacheFull)
        session.seq.plan(len(session.pending_prefix) + len(job.tokens))
        if session.pending_prefix:
            job.tokens = session.pending_prefix + job.tokens
            session.pending_prefix = []

    def _sample(self, job: Job) -> None:
        """A generating job whose prefill is done: sample its next token from the last logits."""
        session = job.session
        assert job.gen is not None
        if session.last_logits is None:
            raise InvalidInput("the session is empty: append text before generating")
        if not session.policy.evicts and session.seq.retained >= session.policy.budget:
            job.reason = "cache_full"  # the full policy never evicts: generation ends here
            self._queues[session.id].popleft()
            self._settle(session)
            job.finish({"reason": job.reason, "generated": job.generated})
            return
        token = job.gen.sampler.sample_logits(session.last_logits)
        engine = self.engine
        assert engine is not None
        job.generated += 1
        now = time.monotonic()
        if job.generated == 1:
            self.metrics.ttft.observe(now - job.submitted)
        else:
            self.metrics.itl.observe(now - job.last_emit)
        latency_ms = (now - job.last_emit) * 1000.0
        job.last_emit = now
        eog = engine.is_eog(token)
        text = "" if eog else job.assembler.feed(engine.piece(token))
        if eog:
            job.reason = "eog"
        elif job.assembler.stopped is not None:
            job.reason = "stop"
        elif job.generated >= job.gen.max_tokens:
            job.reason = "max_tokens"
            text += job.assembler.flush()
        job.final = bool(job.reason)
        job.pending = token
        session.state = SessionState.GENERATING
        job.events.put(
            (
                "token",
                {"id": token, "text": text, "index": job.generated - 1, "latency_ms": latency_ms},
            )
        )

    def _step(self) -> None:
        engine = self.engine
        assert engine is not None
        heads = self._heads()
        for job in heads:
            try:
                self._start(job)
                if job.gen is not None and not job.prefilling and job.pending is None:
                    self._sample(job)
            except SinkdError as e:
                self._queues[job.session.id].popleft()
                job.fail(e)
                self._settle(job.session)
        heads = [j for j in heads if not j.done.is_set()]
        items = self._build(heads, engine)
        if not items:
            return
        try:
            rows = engine.decode_batch(
                [
                    BatchItem(it.job.session.seq_id, it.tokens, it.sub_batch.cache_pos, logits=True)
                    for it in items
                ]
            )
        except EngineError as e:
            self.metrics.alloc_failures.inc()
            for it in items:
                self._queues[it.job.session.id].popleft()
                it.job.fail(ResourceExhausted(f"the engine could not take this batch: {e}"))
                self._check(it.job.session)
            return
        self.metrics.steps.inc()
        for it, row in zip(items, rows, strict=True):
            self._after_decode(it, row)

    def _build(self, heads: list[Job], engine: Engine) -> list[_Item]:
        budget = self.step_tokens
        items: list[_Item] = []
        decoding = [j for j in heads if j.pending is not None]
        prefilling = [j for j in heads if j.pending is None and j.prefilling]
        if prefilling:
            self._rr = (self._rr + 1) % len(prefilling)
            prefilling = prefilling[self._rr :] + prefilling[: self._rr]
        for job in decoding + prefilling:
            if budget == 0:
                break
            tokens = [job.pending] if job.pending is not None else None
            n = 1 if tokens else min(len(job.tokens) - job.offset, self.prefill_chunk)
            if n > budget:
                continue  # waits for the next step rather than taking a load-dependent piece
            session = job.session
            try:
                plan = session.seq.plan(n, max_batch=n)
            except CacheFull as e:
                self._queues[session.id].popleft()
                job.fail(ResourceExhausted(str(e)))
                self._settle(session)
                continue
            sb = plan.sub_batches[0]
            if tokens is None:
                tokens = job.tokens[job.offset : job.offset + sb.n_tokens]
                session.state = SessionState.PREFILLING
            try:
                engine.apply_ops(session.seq_id, sb)
            except EngineError as e:
                self._fail_session(session, f"memory operation refused: {e}")
                continue
            session.seq.adopt_ops(sb)
            if sb.ops:
                self.metrics.evictions.inc()
                self.metrics.evicted_tokens.inc(
                    sb.after_ops.evicted_tokens - plan.before.evicted_tokens
                )
            items.append(_Item(job, tokens, sb, decode_pending=job.pending is not None))
            budget -= sb.n_tokens
        return items

    def _after_decode(self, it: _Item, row: Any) -> None:
        job, session = it.job, it.job.session
        session.seq.adopt_tokens(it.sub_batch)
        session.retained.apply(it.sub_batch, it.tokens)
        session.last_logits = row
        session.last_active = time.monotonic()
        if it.decode_pending:
            self.metrics.decode_tokens.inc()
            job.pending = None
        else:
            self.metrics.prefill_tokens.inc(len(it.tokens))
            job.offset += len(it.tokens)
        if not self._check(session):
            return
        if job.gen is None and not job.prefilling:
            self._queues[session.id].popleft()
            self._settle(session)
            job.finish({"appended": len(job.tokens)})
        elif job.gen is not None and job.final and job.pending is None:
            self._queues[session.id].popleft()
            self._settle(session)
            job.finish({"reason": job.reason, "generated": job.generated})

    def _check(self, session: Session) -> bool:
        """What the cache really holds must be what the policy says; else fail the session alone."""
        engine = self.engine
        assert engine is not None
        r = session.seq.receipt()
        lo, hi = engine.pos_range(session.seq_id)
        if r.retained == 0:
            expected = (-1, -1)
        else:
            first = 0 if r.anchors_cache[1] > 0 else r.recent_cache[0]
            last = (
                r.recent_cache[1] - 1
                if r.recent_cache[1] > r.recent_cache[0]
                else r.anchors_cache[1] - 1
            )
            expected = (first, last)
        problems = []
        cells = engine.cell_count(session.seq_id)
        if cells != r.retained:
            problems.append(f"llama.cpp holds {cells} cells, the policy retains {r.retained}")
        if (lo, hi) != expected:
            problems.append(
                f"cache positions {lo}..{hi}, policy expects {expected[0]}..{expected[1]}"
            )
        if len(session.retained) != r.retained:
            problems.append(f"{len(session.retained)} token ids for {r.retained} retained cells")
        owners = [
            s.id
            for s in self.registry.all()
            if s.seq_id == session.seq_id and s.state is not SessionState.CLOSED
        ]
        if owners != [session.id]:
            problems.append(f"sequence {session.seq_id} owned by {len(owners)} sessions")
        if not problems:
            return True
        self._fail_session(session, "; ".join(problems))
        return False

    def _fail_session(self, session: Session, why: str) -> None:
        engine = self.engine
        assert engine is not None
        log.error("session %s failed an invariant check: %s", session.id, why)
        self.metrics.invariant_violations.inc()
        session.state = SessionState.FAILED
        session.failure = why
        session.last_logits = None
        try:
            engine.clear(session.seq_id)
        except EngineError:
            log.exception("could not free the cells of session %s", session.id)
        session.seq.reset()
        session.retained = type(session.retained)(session.policy.sinks)
        self.cancel_session_jobs(session, SessionFailed(f"session {session.id} failed: {why}"))
