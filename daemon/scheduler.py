"""One thread owns the llama context; every batch is built here from every active session.

Each step: sessions that are generating get one token each (sampled from their last logits, then
decoded), and the rest of the step's token budget goes to prefill sub-batches, round-robin, so a
long append never freezes the others and no session starves. Evictions are applied per session just
before its tokens enter the batch. After the decode, the cache is checked against each touched
session's policy; a violation fails that session alone.

Work from other threads arrives through `call` (run a function between steps) and `submit` (a job).

With durability on, nothing is told to a client before what it acknowledges is committed to the
journal: replies wait in `_replies` until `_release` commits (one commit per phase of a step, for
every session in it). A prefill chunk joins the journal when its append is acknowledged (or ends
with part of it applied); a generated token joins it before the client sees it. Between steps,
sessions whose snapshot is due are snapshotted.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from cachepolicy import CacheFull, SubBatch
from daemon.durability import Durability
from daemon.engine import BatchItem, Engine, Sampler
from daemon.errors import EngineError, InvalidInput, SinkdError
from daemon.journal import JournalError
from daemon.metrics import Metrics
from daemon.sessions import (
    Registry,
    ResourceExhausted,
    Session,
    SessionFailed,
    SessionState,
    StaleGeneration,
)
from daemon.snapshots import SnapshotError
from daemon.textout import TextAssembler

log = logging.getLogger("sinkd.scheduler")
SNAPSHOT_RETRY_S = 30.0  # a failed snapshot (disk full, ...) is not retried sooner
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
        self.on_ready: Callable[[Engine], None] = lambda e: None  # e.g. resume stored sessions
        self.durability: Durability | None = None
        self._replies: list[tuple[Job, Callable[[], None]]] = []

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
            self.on_ready(self.engine)
        except BaseException as e:  # reported by the server; health stays NOT_SERVING
            self.load_error = e
            self.ready.set()
            self._shutdown(snapshot=False)
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
                self._snapshot_due()
        finally:
            self._shutdown()

    def _fail_all(self, error: SinkdError) -> None:
        failed: list[Session] = []
        for sid, jobs in list(self._queues.items()):
            for job in jobs:
                if job.pending is not None:  # emitted (and journalled) but never decoded
                    failed.append(job.session)
                job.fail(error)
            del self._queues[sid]
            for session in self.registry.all():
                if session.id == sid and session not in failed:
                    self._check(session)
        for session in failed:
            self._fail_session(session, "a step failed between sampling a token and decoding it")
        self._release()

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

    def _shutdown(self, snapshot: bool = True) -> None:
        err = ShuttingDown("the daemon is shutting down")
        if snapshot and self.engine is not None and self.durability is not None:
            for session in self.registry.all():  # a clean stop: resume needs no replay
                if session.unlogged:
                    # an append in flight: it was never acknowledged, and it is not kept
                    log.info("session %s: an unacknowledged append is dropped", session.id)
                elif session.logged_since_snap:
                    self._snapshot(session)
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
        if self.durability is not None:
            self.durability.close()

    def cancel_session_jobs(self, session: Session, error: SinkdError) -> None:
        """Engine thread only: fail every job queued for the session (reset, close, failure)."""
        for job in self._queues.pop(session.id, deque()):
            job.fail(error)

    def _reply(self, job: Job, fn: Callable[[], None]) -> None:
        """Queue a reply; what the session decoded so far joins the journal before it is sent."""
        session = job.session
        if self.durability is not None and session.has_history:
            self.durability.flush(session)
        self._replies.append((job, fn))

    def _release(self) -> None:
        """Commit the journal, then send the replies that waited for it."""
        replies, self._replies = self._replies, []
        if self.durability is not None and replies:
            try:
                with self.metrics.journal_commit_seconds.time():
                    self.durability.commit()
            except (sqlite3.Error, JournalError) as e:
                # nothing of this may be acknowledged: the sessions are ahead of their journal
                log.error("journal commit failed: %s", e)
                self.metrics.journal_failures.inc()
                with contextlib.suppress(sqlite3.Error):
                    self.durability.j.rollback()
                error = ResourceExhausted(f"the journal could not record this: {e}")
                for job, _ in replies:
                    if job.session.state is not SessionState.FAILED:
                        self._fail_session(job.session, f"the journal could not record it: {e}")
                    if not job.done.is_set():
                        job.fail(error)
                return
        for _, fn in replies:
            fn()

    def _expire_idle(self) -> None:
        now = time.monotonic()
        if now - self._last_expiry < 1.0:
            return
        self._last_expiry = now
        for session in self.registry.all():
            if session.state is SessionState.STALE:
                continue  # its data waits for its owner, or for the configuration it was made under
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
                    self._settle(job.session)
                    self._reply(
                        job, functools.partial(job.fail, Cancelled("cancelled by the client"))
                    )
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
            self._reply(
                job,
                functools.partial(job.finish, {"reason": job.reason, "generated": job.generated}),
            )
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
        if self.durability is not None:  # the token is the session's before the client sees it
            self.durability.flush(session)
            at = session.seq.plan(1, max_batch=1).sub_batches[0]
            draws = session.sampler.draws if job.gen.sampler is session.sampler else None
            self.durability.log(session, at.logical_pos, at.cache_pos, [token], draws)
        event = {"id": token, "text": text, "index": job.generated - 1, "latency_ms": latency_ms}
        self._replies.append((job, functools.partial(job.events.put, ("token", event))))

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
                self._settle(job.session)
                self._reply(job, functools.partial(job.fail, e))
        self._release()  # tokens sampled above are journalled before they are sent
        heads = [j for j in heads if not j.done.is_set()]
        try:
            self._decode(heads, engine)
        finally:
            self._release()

    def _decode(self, heads: list[Job], engine: Engine) -> None:
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
                session = it.job.session
                if it.decode_pending or it.sub_batch.ops:
                    # a journalled token or an applied shift that never reached a decode: the
                    # cache is not what the history says, so the session fails (reset recovers)
                    self._fail_session(session, f"llama_decode failed: {e}")
                    continue
                self._queues[session.id].popleft()
                if self._check(session):
                    self._reply(
                        it.job,
                        functools.partial(
                            it.job.fail,
                            ResourceExhausted(f"the engine could not take this batch: {e}"),
                        ),
                    )
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
                self._settle(session)
                self._reply(job, functools.partial(job.fail, ResourceExhausted(str(e))))
                continue
            sb = plan.sub_batches[0]
            if tokens is None:
                tokens = job.tokens[job.offset : job.offset + sb.n_tokens]
                session.state = SessionState.PREFILLING
            before = session.seq.state.evicted_tokens
            try:
                self._apply(session, sb)
            except EngineError as e:
                self._fail_session(session, f"memory operation refused: {e}")
                continue
            if sb.ops:
                self.metrics.evictions.inc()
                self.metrics.evicted_tokens.inc(sb.after_ops.evicted_tokens - before)
            items.append(_Item(job, tokens, sb, decode_pending=job.pending is not None))
            budget -= sb.n_tokens
        return items

    def _apply(self, session: Session, sb: SubBatch) -> None:
        """Apply a sub-batch's evictions to the cache, then to the policy state (EngineError if
        llama.cpp refuses)."""
        engine = self.engine
        assert engine is not None
        engine.apply_ops(session.seq_id, sb)
        session.seq.adopt_ops(sb)

    def _absorb(self, session: Session, sb: SubBatch, tokens: list[int], row: Any) -> None:
        """Record a decoded sub-batch; after an eviction, pack the sequence's cells (see
        Engine.compact: a snapshot restores to exactly this layout)."""
        engine = self.engine
        assert engine is not None
        session.seq.adopt_tokens(sb)
        session.retained.apply(sb, tokens)
        session.last_logits = row
        session.last_active = time.monotonic()
        if sb.ops:
            engine.compact(session.seq_id)

    def _after_decode(self, it: _Item, row: Any) -> None:
        job, session = it.job, it.job.session
        self._absorb(session, it.sub_batch, it.tokens, row)
        if it.decode_pending:
            self.metrics.decode_tokens.inc()
            job.pending = None
        else:
            self.metrics.prefill_tokens.inc(len(it.tokens))
            job.offset += len(it.tokens)
            if self.durability is not None:
                sb = it.sub_batch
                session.unlogged.append((sb.logical_pos, sb.cache_pos, list(it.tokens)))
        if not self._check(session):
            return
        if job.gen is None and not job.prefilling:
            self._queues[session.id].popleft()
            self._settle(session)
            self._reply(job, functools.partial(job.finish, {"appended": len(job.tokens)}))
        elif job.gen is not None and job.final and job.pending is None:
            self._queues[session.id].popleft()
            self._settle(session)
            result = {"reason": job.reason, "generated": job.generated}
            self._reply(job, functools.partial(job.finish, result))

    # --- durability (engine thread) ---

    def replay(self, chunks: list[tuple[Session, list[int], int]]) -> list[tuple[Session, str]]:
        """Decode journalled chunks of different sessions in one batch, each exactly as its live
        step did: the same plan, the same ops, the same sub-batch (per-sequence streams make the
        batch's other members irrelevant to each one's bits). Returns the sessions whose chunk the
        policy would not place where the journal says, with why."""
        engine = self.engine
        assert engine is not None
        refused: list[tuple[Session, str]] = []
        items: list[tuple[Session, list[int], SubBatch]] = []
        for session, tokens, cache_pos in chunks:
            sb = session.seq.plan(len(tokens), max_batch=len(tokens)).sub_batches[0]
            if sb.n_tokens != len(tokens) or sb.cache_pos != cache_pos:
                refused.append(
                    (
                        session,
                        f"the policy places it at cache {sb.cache_pos} ({sb.n_tokens} tokens),"
                        f" the journal says {cache_pos} ({len(tokens)} tokens)",
                    )
                )
                continue
            try:
                self._apply(session, sb)
            except EngineError as e:
                refused.append((session, str(e)))
                continue
            items.append((session, tokens, sb))
        if items:
            rows = engine.decode_batch(
                [BatchItem(s.seq_id, t, sb.cache_pos, logits=True) for s, t, sb in items]
            )
            for (session, tokens, sb), row in zip(items, rows, strict=True):
                self._absorb(session, sb, tokens, row)
        return refused

    def _snapshot_due(self) -> None:
        if self.durability is None:
            return
        now = time.time()
        for session in self.registry.all():
            if session.has_history and self.durability.due(session, now):
                self._snapshot(session)

    def _snapshot(self, session: Session) -> bool:
        engine, durability = self.engine, self.durability
        assert engine is not None and durability is not None
        t0 = time.monotonic()
        try:
            size = durability.snapshot(session, engine.save_seq(session.seq_id))
        except (SnapshotError, JournalError, sqlite3.Error) as e:
            log.warning("snapshot of session %s failed, the previous one stays: %s", session.id, e)
            self.metrics.snapshot_failures.inc()
            session.snap_retry_at = time.time() + min(durability.every_s, SNAPSHOT_RETRY_S)
            return False
        self.metrics.snapshots.inc()
        self.metrics.snapshot_bytes.observe(size)
        self.metrics.snapshot_seconds.observe(time.monotonic() - t0)
        return True

    def _check(self, session: Session) -> bool:
        """What the cache really holds must be what the policy says; else fail the session alone."""
        problems = self.problems(session)
        if not problems:
            return True
        self._fail_session(session, "; ".join(problems))
        return False

    def problems(self, session: Session) -> list[str]:
        """Where the cache and the session's policy state disagree (engine thread)."""
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
        return problems

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
        if self.durability is not None:
            try:  # a transition: durable before anyone is told
                self.durability.failed(session)
                self.durability.commit()
            except (sqlite3.Error, JournalError) as e:
                log.error("could not journal the failure of session %s: %s", session.id, e)
        self.cancel_session_jobs(session, SessionFailed(f"session {session.id} failed: {why}"))
