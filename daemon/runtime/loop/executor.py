"""Carry out a step plan on the engine: sample, evict, decode, record. Engine thread only.

For each slot of the plan the session's policy cuts the next sub-batch, its evictions and shift are
applied to the cache and then to the policy state, and the sub-batches of one length join one
`llama_decode` (`by_length`).
After it the sub-batch is recorded (policy, token ledger, logits), the sequence is packed after an
eviction (see `Engine.compact`), and the session is audited. A failure touches only the sessions it
concerns. `replay` decodes journalled chunks the same way, for resume.

Speculative decoding: a sampled token may carry drafts, verified in the same step; the rules are
verification.py's (`Verifier`).
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from sinkd.cachepolicy import CacheFull, Shift, SubBatch
from sinkd.daemon import failpoints
from sinkd.daemon.engine.decoding import BatchItem, Next, by_length
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.api import Done, TokenEvent
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.loop.audit import Auditor
from sinkd.daemon.runtime.loop.gate import ReplyGate
from sinkd.daemon.runtime.loop.jobs import REPEAT_CHECK_EVERY, Job, JobQueues, loops
from sinkd.daemon.runtime.loop.prefixes import PrefixStates
from sinkd.daemon.runtime.loop.residency import NoRoom, ParkFailed, Residency
from sinkd.daemon.runtime.loop.runahead import RunAhead
from sinkd.daemon.runtime.loop.stepplan import Slot
from sinkd.daemon.runtime.loop.swaps import place_in_one_run
from sinkd.daemon.runtime.loop.verification import StepItem, Verifier
from sinkd.daemon.runtime.recall.layer import Recall
from sinkd.daemon.runtime.sessions import Session, SessionState
from sinkd.errors import (
    EngineError,
    InvalidInput,
    JournalError,
    ResourceExhausted,
    SessionFailed,
    SinkdError,
    StaleGeneration,
)

log = logging.getLogger("sinkd.executor")


class Executor:
    def __init__(
        self,
        engine: Callable[[], Engine | None],
        queues: JobQueues,
        gate: ReplyGate,
        auditor: Auditor,
        metrics: Metrics,
        durability: Durability | None,
        residency: Residency,
        recall: Recall | None = None,
        prefixes: PrefixStates | None = None,
        max_drafts: int = 0,
    ) -> None:
        self._engine = engine
        self.residency = residency
        self.recall = recall
        self.prefixes = prefixes
        self.queues = queues
        self.gate = gate
        self.auditor = auditor
        self.metrics = metrics
        self.durability = durability
        # rows lent by the last decode (a view of llama.cpp's buffer, as the session's
        # last_logits), and the sessions whose pending token this step decodes
        self._lent: list[tuple[Session, Any]] = []
        self.decoding_now: set[str] = set()
        self._hooked: Engine | None = None
        self._runs = RunAhead(self)
        self.verifier = Verifier(self, max_drafts)  # speculative decoding (verification.py)
        # SessionElsewhere for a tenant marked moving (tenant_moves.py): a job whose call passed
        # the edge's check before the mark starts nothing after it, so a move's export misses none
        self.served_here: Callable[[str], None] = lambda tenant: None

    @property
    def engine(self) -> Engine:
        engine = self._engine()
        assert engine is not None
        return engine

    def end(self, job: Job, error: SinkdError | None = None) -> None:
        """The job is over: off its queue, its session settled, its reply queued behind the journal."""
        self.queues.pop(job)
        job.session.settle()
        if error is not None:
            if job.recall is not None and self.recall is not None and job.started:
                self.recall.abandoned(job.session)
            self.gate.fail(job, error)
        else:  # the receipt as the job left the session, not as a later reset or close leaves it
            if job.gen is not None:
                job.session.turns_taken += 1
            receipt = job.session.receipt(self.engine.kv_bytes_per_token)
            if job.restored_ms:
                receipt = dataclasses.replace(receipt, restored_ms=job.restored_ms)
            recall = job.session.last_recall if job.recall is not None else None
            self.gate.finish(job, Done(job.reason, job.generated, receipt, recall))

    # --- before the plan: start jobs, sample the decoding sessions' next tokens ---

    def prepare(self, job: Job) -> None:
        try:
            try:
                self._start(job)
            except ParkFailed as e:  # waiting would not help: said now
                job.started = False
                raise ResourceExhausted(f"session {job.session.id} is parked and {e}") from None
            except NoRoom:  # its session is parked and every resident one busy: a later step
                job.started = False
                return
            if job.gen is None and not job.prefilling:  # nothing to read (all from a prefix)
                self.end(job)
                return
            if job.gen is not None and not job.prefilling and job.pending is None:
                self.sample(job)
        except SinkdError as e:
            self.end(job, e)

    def _start(self, job: Job) -> None:
        if job.started:
            return
        job.started = True
        session = job.session
        self.served_here(session.tenant)
        if session.state is SessionState.FAILED:
            raise SessionFailed(
                f"session {session.id} failed ({session.failure}); reset or close it"
            )
        if session.state is SessionState.STALE:
            raise StaleGeneration(f"session {session.id} is stale: {session.failure}")
        if session.parked:  # its cells come back first (NoRoom: none can be freed yet)
            job.restored_ms = self.residency.restore(self.engine, session)
        if job.on_start is not None:
            job.on_start(job)
        if self.recall is not None:
            self._across(job)
        if job.recall is not None and self.recall is not None:
            try:  # recalled passages go in where the job says (after the question)
                at = job.recall.insert_at
                found = self.recall.prepare(self.engine, session, job.recall)
                job.tokens = job.tokens[:at] + found + job.tokens[at:]
                if found:
                    session.reads = None  # recalled text in the stream: no prefix of it is kept
            except sqlite3.Error as e:
                raise JournalError(f"recall: the memory could not be read: {e}") from None
        # the full policy refuses the whole append before any token goes in (CacheFull)
        session.seq.plan(len(session.pending_prefix) + len(job.tokens))
        if session.pending_prefix:
            job.tokens = session.pending_prefix + job.tokens
            session.pending_prefix = []
        if (
            self.prefixes is not None
            and self.prefixes.begin(self.engine, session, job, self.durability is not None)
            and not self.auditor.check(session, full=True)  # restored cells, as a decode's
        ):
            raise SessionFailed(f"session {session.id}: {session.failure}; reset or close it")

    def _across(self, job: Job) -> None:
        """A private turn takes its conversation out of the tenant's memory (journalled with the
        turn); a chat turn of a conversation that takes part gives its words to it."""
        assert self.recall is not None
        session = job.session
        try:
            if job.private and session.recall.across:
                self.recall.made_private(session)
                if self.durability is not None:
                    self.durability.put(session)
            if job.keep is not None:
                self.recall.keep(self.engine, session, job.keep, len(session.pending_prefix))
        except sqlite3.Error as e:
            raise JournalError(f"memory: the tenant's memory could not be written: {e}") from None

    def sample(self, job: Job) -> None:
        """A generating job whose prefill is done: sample its next token from the last logits."""
        session = job.session
        assert job.gen is not None
        if session.last_logits is None:
            raise InvalidInput("the session is empty: append text before generating")
        if not session.policy.evicts and session.seq.retained >= session.policy.budget:
            job.reason = "cache_full"  # the full policy never evicts: generation ends here
            self.end(job)
            return
        sampler = job.gen.sampler
        recent = session.penalty_history(sampler.history_needed)
        token = sampler.sample_logits(
            session.last_logits, recent, job.gen.grammar, session.greedy_hint
        )
        engine = self.engine
        job.generated += 1
        now = time.monotonic()
        if job.generated == 1:
            self.metrics.ttft.observe(now - job.submitted)
        else:
            self.metrics.itl.observe(now - job.last_emit)
        latency_ms = (now - job.last_emit) * 1000.0
        job.last_emit = now
        eog = engine.vocab.is_eog(token)
        text = "" if eog else job.assembler.feed(engine.vocab.piece(token))
        if eog:
            job.reason = "eog"
        elif job.assembler.stopped is not None:
            job.reason = "stop"
        elif job.generated >= job.gen.max_tokens:
            job.reason = "max_tokens"
            text += job.assembler.flush()
        elif job.gen.repetition_guard and self._loops(job, token):
            job.reason = "repetition"
            text += job.assembler.flush()
        job.final = bool(job.reason)
        job.pending = token
        session.transition(SessionState.GENERATING)
        if self.durability is not None:  # the token is the session's before the client sees it
            self.durability.flush(session)
            job.pending_plan = session.seq.plan(1, max_batch=1)  # the step decodes it as planned
            at = job.pending_plan.sub_batches[0]
            draws = session.sampler.draws if job.gen.sampler is session.sampler else None
            self.durability.log(session, at.logical_pos, at.cache_pos, [token], draws)
        self.gate.emit(job, TokenEvent(token, text, job.generated - 1, latency_ms))

    @staticmethod
    def _loops(job: Job, token: int) -> bool:
        job.ids.append(token)
        return job.generated % REPEAT_CHECK_EVERY == 0 and loops(job.ids)

    # --- the plan: evict, decode, record ---

    def run(self, slots: list[tuple[Job, Slot]]) -> None:
        """Carry out the step: one `llama_decode` per sub-batch length (`by_length`, as the engine
        would cut them), each its own: a failed length fails its own sessions alone."""
        largest = max(by_length(slots, lambda js: js[1].n_tokens), key=len, default=[])
        self._place([job.session for job, _ in largest])
        items = self._build([(job, slot) for job, slot in slots if not job.answered])
        engine = self.engine
        if self._hooked is not engine:
            engine.before_overwrite.append(self._keep_lent)
            self._hooked = engine
        self.decoding_now = {it.job.session.id for it in items if it.decode_pending}
        try:
            verifying = [it for it in items if it.drafts]
            if verifying:
                self.verifier.verify(verifying, len(items) == len(verifying))
            for group in by_length(
                [it for it in items if not it.drafts], lambda it: len(it.tokens)
            ):
                # a lone token's pass, what drafts are weighed against; not one after a shift:
                # llama.cpp turns the keys again (RoPE) in it, a cost of the eviction's, not the
                # token's, which made a draft's rows look cheaper beside a full cache
                solo = (
                    len(group) == 1
                    and len(items) == 1
                    and group[0].decode_pending
                    and not any(isinstance(op, Shift) for op in group[0].sub_batch.ops)
                )
                after, started = engine.last_rows, time.perf_counter()
                try:
                    rows = engine.decode_next(
                        [
                            BatchItem(it.job.session.seq_id, it.tokens, it.sub_batch.cache_pos)
                            for it in group
                        ],
                        lend=True,
                    )
                except EngineError as e:
                    self.decode_failed(group, e)
                    continue
                if solo:
                    self.verifier.costs.observe(1, time.perf_counter() - started, after)
                self.metrics.steps.inc()
                for it, row in zip(group, rows, strict=True):
                    self.decoding_now.discard(it.job.session.id)  # its new row is needed
                    self._after_decode(it, row)
                    if row is not None:
                        self.lend(it.job.session, row.logits)
        finally:
            self.decoding_now = set()

    def run_ahead(self, jobs: list[Job], decodes: int, interrupted: Callable[[], bool]) -> None:
        """After a step whose every job decoded: up to `decodes` more decodes for the greedy ones
        (runahead.py), stopped by `interrupted()`."""
        self._runs.run(jobs, decodes, interrupted)

    def lend(self, session: Session, row: Any) -> None:
        """The session's last_logits is now `row`, a view of llama.cpp's buffer (`_keep_lent`)."""
        self._lent.append((session, row))

    def _keep_lent(self) -> None:
        """Before llama.cpp's logits buffer changes (a decode, a close): a lent row its session
        still needs becomes a copy of its own; one it sampled from, whose token decodes now, is
        dropped (the decode gives the next; a failed one fails the session)."""
        lent, self._lent = self._lent, []
        for session, row in lent:
            if session.last_logits is not row:  # replaced since (a reset, a resume, a fork's)
                continue
            if session.id in self.decoding_now:
                session.set_logits(None, None)
            else:
                session.set_logits(row.copy(), session.greedy_hint)

    def _place(self, sessions: list[Session]) -> None:
        """Exchange sequences until these sessions (the step's largest group of one sub-batch
        length, usually its decoding sessions) hold one run of ids: one pass of llama.cpp rather
        than one per run (see placement). A failed exchange fails the sessions involved."""
        swaps = place_in_one_run(self.engine, sessions, self.auditor.registry.all())
        for failed, why in swaps.failed:
            self.auditor.fail_session(failed, f"moving its cells to another sequence failed: {why}")
        self.metrics.sequence_swaps.inc(swaps.done)

    def _build(self, slots: list[tuple[Job, Slot]]) -> list[StepItem]:
        items: list[StepItem] = []
        for job, slot in slots:
            session = job.session
            planned, job.pending_plan = job.pending_plan, None
            try:
                if slot.decoding and planned is not None and planned.before is session.seq.state:
                    plan = planned  # a pure function of the same state: the same plan
                else:  # a decoding slot plans its pending token alone (drafts own no cell)
                    n = 1 if slot.decoding else slot.n_tokens
                    plan = session.seq.plan(n, max_batch=n)
            except CacheFull as e:
                self.end(job, ResourceExhausted(str(e)))
                continue
            sb = plan.sub_batches[0]
            drafts: list[int] = []
            if slot.decoding:
                assert job.pending is not None
                drafts = self.verifier.taken(job, sb, slot.n_tokens - 1)
                tokens = [job.pending, *drafts]
            else:
                tokens = job.tokens[job.offset : job.offset + sb.n_tokens]
                session.transition(SessionState.PREFILLING)
            before = session.seq.state.evicted_tokens
            try:
                self.apply(session, sb)
            except EngineError as e:
                self.auditor.fail_session(session, f"memory operation refused: {e}")
                continue
            if sb.ops:
                self.metrics.evictions.inc()
                self.metrics.evicted_tokens.inc(sb.after_ops.evicted_tokens - before)
            items.append(StepItem(job, tokens, sb, slot.decoding, len(drafts)))
        return items

    def decode_failed(self, items: list[StepItem], e: EngineError) -> None:
        self.metrics.alloc_failures.inc()
        for it in items:
            session = it.job.session
            if it.decode_pending or it.sub_batch.ops:
                # a journalled token or an applied shift that never reached a decode: the cache is
                # not what the history says, so the session fails (reset recovers)
                self.auditor.fail_session(session, f"llama_decode failed: {e}")
            elif self.auditor.check(session):
                self.end(it.job, ResourceExhausted(f"the engine could not take this batch: {e}"))

    def apply(self, session: Session, sb: SubBatch) -> None:
        """Apply a sub-batch's evictions to the cache, then to the policy state (EngineError if
        llama.cpp refuses)."""
        self.engine.cells.apply_ops(session.seq_id, sb)
        session.seq.adopt_ops(sb)

    def absorb(self, session: Session, sb: SubBatch, tokens: list[int], row: Next | None) -> None:
        """Record a decoded sub-batch; after an eviction, pack the sequence's cells (see
        Engine.compact: a snapshot restores to exactly this layout). A refused packing fails
        this session alone."""
        session.seq.adopt_tokens(sb)
        evicted = session.retained.apply(sb, tokens)
        if self.recall is not None:
            try:
                for logical_start, gone in evicted:
                    self.recall.evicted(self.engine, session, logical_start, gone)
            except sqlite3.Error as e:
                raise JournalError(f"the memory could not store evicted text: {e}") from None
        if row is None:
            session.set_logits(None, None)
        else:
            session.set_logits(row.logits, row.greedy)
        session.last_active = time.monotonic()
        if sb.ops:
            session.reads = None  # evicted or shifted: no longer as read from position 0
            failpoints.hit("before-compact")
            self.engine.cells.compact(session.seq_id)

    def recorded(self, it: StepItem, tokens: list[int], row: Next | None) -> bool:
        """Record the item's decoded `tokens` (`absorb`); a failure fails its session (False)."""
        try:
            self.absorb(it.job.session, it.sub_batch, tokens, row)
        except (EngineError, JournalError) as e:
            self.auditor.fail_session(it.job.session, f"recording the step failed: {e}")
            return False
        return True

    def _after_decode(self, it: StepItem, row: Next | None) -> None:
        job, session = it.job, it.job.session
        if not self.recorded(it, it.tokens, row):
            return
        if it.decode_pending:
            self.metrics.decode_tokens.inc()
            job.pending = None
        else:
            self.metrics.prefill_tokens.inc(len(it.tokens))
            job.offset += len(it.tokens)
            if self.durability is not None:
                sb = it.sub_batch
                session.unlogged.append((sb.logical_pos, sb.cache_pos, list(it.tokens)))
            failpoints.hit("prefill-chunk")
            if job.store_at and self.prefixes is not None:
                self.prefixes.reached(self.engine, session, job)
        if not self.auditor.check(session, full=bool(it.sub_batch.ops) or not it.decode_pending):
            return
        if (job.gen is None and not job.prefilling) or (
            job.gen is not None and job.final and job.pending is None
        ):
            self.end(job)
