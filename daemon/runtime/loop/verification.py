"""Speculative decoding's rules in one place: whether sessions draft here, which drafts a pending
token carries, and how a verification is settled. Engine thread only.

A sampled token may carry drafts, the tokens its session's own text suggests come next
(drafting.py). The step decodes them after it, every row asked; then the session samples from
each row in turn, exactly as a step at a time would (the same sampler, penalties, grammar, stops,
journal rows and events, one token each), and keeps a draft's cell only where the token it
sampled is the draft. Where a row's bits do not depend on how many rows of its sequence share the
pass (`Engine.rows_not_exact`), this gives the tokens plain decoding gives. A draft is never
counted as seen, journalled, sent, penalised or recorded: its cells are gone before the step's
audit, on every path out of the verification (`Verifier.settle`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from sinkd.cachepolicy import SubBatch
from sinkd.daemon import failpoints
from sinkd.daemon.engine.decoding import BatchItem, Next, by_length
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.loop.audit import Auditor
from sinkd.daemon.runtime.loop.drafting import DecodeCosts, DraftControl, guesses
from sinkd.daemon.runtime.loop.jobs import Job
from sinkd.daemon.runtime.sessions import Session, SessionState
from sinkd.errors import EngineError, JournalError, SinkdError

log = logging.getLogger("sinkd.executor")


@dataclass
class StepItem:
    """One job's part of a step, as the executor built it."""

    job: Job
    tokens: list[int]  # a verification: the pending token, then its drafts
    sub_batch: SubBatch  # of the decoded or prefilled tokens (a verification: the pending one)
    decode_pending: bool
    drafts: int = 0


class VerifyHost(Protocol):
    """What a verification uses of the executor (executor.py), named here so that the two
    modules do not import each other."""

    metrics: Metrics
    auditor: Auditor
    decoding_now: set[str]

    @property
    def engine(self) -> Engine: ...

    def sample(self, job: Job) -> None: ...

    def end(self, job: Job, error: SinkdError | None = None) -> None: ...

    def absorb(
        self, session: Session, sb: SubBatch, tokens: list[int], row: Next | None
    ) -> None: ...

    def recorded(self, it: StepItem, tokens: list[int], row: Next | None) -> bool: ...

    def lend(self, session: Session, row: Any) -> None: ...

    def decode_failed(self, items: list[StepItem], e: EngineError) -> None: ...


class Verifier:
    """The executor's drafts: chosen before the plan, verified in the step."""

    def __init__(self, host: VerifyHost, max_drafts: int) -> None:
        self.host = host
        # at most this many drafts a token (0: off), where exact (`drafting`)
        self.max_drafts = max_drafts
        self._exact: bool | None = None  # the engine's rows are exact (asked once it is loaded)
        self.costs = DecodeCosts()
        host.metrics.watch_solo_passes(self.costs.totals, self.costs.rebuilt)
        self._controls: dict[tuple[str, str], DraftControl] = {}

    def drafting(self) -> bool:
        """Whether sessions draft here: asked for, and exact on this engine (said once)."""
        if self.max_drafts <= 0:
            return False
        if self._exact is None:
            engine = self.host.engine
            why = engine.rows_not_exact()
            if not engine.rows_settled:
                return False  # asked again at the next draft (row_probe.py needs a free sequence)
            self._exact = why is None
            if why is not None:
                log.warning("speculative decoding is off: %s", why)
        return self._exact

    def control(self, session: Session) -> DraftControl:
        """The session's drafting state, of its current generation alone (a reset starts anew)."""
        key = (session.id, session.generation)
        control = self._controls.get(key)
        if control is None:
            registry = self.host.auditor.registry
            if len(self._controls) >= 4 * max(len(registry), 16):
                live = {(s.id, s.generation) for s in registry.all()}
                self._controls = {k: v for k, v in self._controls.items() if k in live}
            control = self._controls[key] = DraftControl(self.max_drafts)
        return control

    def draft(self, jobs: list[Job]) -> None:
        """Once every head is prepared: drafts for each job whose token waits to be decoded,
        weighed against a step in which all of them decode."""
        decoding = [j for j in jobs if j.gen is not None and j.pending is not None]
        for job in decoding:
            job.drafts = [] if job.answered else self._drafts(job, len(decoding))

    def _drafts(self, job: Job, sequences: int) -> list[int]:
        """Drafts to verify with the job's pending token: as many as pay (DraftControl), none
        past its max tokens, none where its cells would need an eviction or a shift, and none
        after a final token."""
        if job.final or not self.drafting():
            return []
        session = job.session
        assert job.gen is not None
        control = self.control(session)
        k = min(control.max_drafts, job.gen.max_tokens - job.generated)
        k = min(k, self.host.engine.max_rows - 1)
        planned = job.pending_plan
        if planned is not None and planned.sub_batches[0].ops:
            k = 0  # the pending token evicts: its step stays a plain one
        seq = session.seq
        k = min(k, seq.config.budget - seq.state.retained(seq.config) - 1)
        drafts: list[int] = []
        if k > 0 and control.worth_looking(self.costs, sequences):
            context = session.retained.all()
            context.append(job.pending or 0)
            drafts = control.choose(self.costs, guesses(context, k), sequences)
        if drafts and seq.plan(1 + len(drafts), max_batch=1 + len(drafts)).sub_batches[0].ops:
            drafts = []  # the policy would move cells for them (a shift): none
        if not drafts:
            control.skipped()
        return drafts

    def taken(self, job: Job, sb: SubBatch, room: int) -> list[int]:
        """The job's drafts this step verifies (at most `room`, none where its pending token's
        sub-batch moves cells); they are the job's no longer."""
        drafts = job.drafts[:room] if not sb.ops else []
        if job.drafts and not drafts:
            self.control(job.session).skipped()
        job.drafts = []
        return drafts

    def verify(self, items: list[StepItem], solo: bool) -> None:
        """Decode the verifications (a pending token and its drafts each, every row asked) by
        length, then settle each. `solo`: nothing else decodes in this step, so the pass's time
        is what its rows cost (DecodeCosts)."""
        host = self.host
        engine = host.engine
        for group in by_length(items, lambda it: len(it.tokens)):
            after, started = engine.last_rows, time.perf_counter()
            try:
                rows = engine.decode_rows(
                    [
                        BatchItem(it.job.session.seq_id, it.tokens, it.sub_batch.cache_pos)
                        for it in group
                    ]
                )
            except EngineError as e:
                host.decode_failed(group, e)
                continue
            if solo and len(group) == 1:
                self.costs.observe(len(group[0].tokens), time.perf_counter() - started, after)
            host.metrics.steps.inc()
            for it, item_rows in zip(group, rows, strict=True):
                host.decoding_now.discard(it.job.session.id)
                self.settle(it, item_rows)

    def settle(self, it: StepItem, rows: list[Next]) -> None:
        """Settle one verification: record the pending token as a step would, then, row by row,
        sample the next token as a step would and keep the draft's cell while the draft is that
        token. The first token that differs stays pending (the next step decodes it); the cells
        of every draft not kept are removed before the audit, whatever happens here."""
        host = self.host
        metrics = host.metrics
        job, session = it.job, it.job.session
        drafts = it.tokens[1:]
        first_draft_pos = it.sub_batch.cache_pos + 1
        kept = 0
        control = self.control(session)
        try:
            if not host.recorded(it, it.tokens[:1], rows[0]):  # the pending token, as a step's
                return
            metrics.decode_tokens.inc()
            job.pending = None
            for i, draft in enumerate(drafts, start=1):
                if job.final or job.answered:
                    break
                failpoints.hit("verify-draft")
                try:
                    host.sample(job)  # journals and sends it, exactly as a step at a time does
                except SinkdError as e:  # as `prepare` would: the job ends, the session stays
                    host.end(job, e)
                    break
                if job.pending != draft:
                    break
                planned, job.pending_plan = job.pending_plan, None
                if planned is None or planned.before is not session.seq.state:
                    planned = session.seq.plan(1, max_batch=1)
                sb = planned.sub_batches[0]
                if sb.ops or sb.cache_pos != first_draft_pos + kept:  # ruled out by _drafts
                    raise EngineError("a draft's cell is not where its token belongs")
                kept += 1
                job.pending = None
                host.absorb(session, sb, [draft], rows[i])
                metrics.decode_tokens.inc()
        except (EngineError, JournalError) as e:
            host.auditor.fail_session(session, f"verifying drafts failed: {e}")
        finally:
            self._drop(session, first_draft_pos + kept, len(drafts) - kept)
            control.observe(len(drafts), kept)
            metrics.verifications.inc()
            metrics.draft_tokens.labels("accepted").inc(kept)
            metrics.draft_tokens.labels("rejected").inc(len(drafts) - kept)
        if session.state is SessionState.FAILED:
            return
        if session.last_logits is not None:
            host.lend(session, session.last_logits)
        if not host.auditor.check(session, full=kept < len(drafts)):
            return
        if job.gen is not None and job.final and job.pending is None and not job.answered:
            host.end(job)

    def _drop(self, session: Session, first: int, n: int) -> None:
        """Remove the cells of `n` drafts not kept, from cache position `first`. A refusal fails
        the session: its cells would hold tokens it never had."""
        if n <= 0 or session.seq_id < 0 or session.state is SessionState.FAILED:
            return
        try:
            self.host.engine.cells.remove(session.seq_id, first, first + n)
        except EngineError as e:
            self.host.auditor.fail_session(session, f"removing rejected drafts failed: {e}")
