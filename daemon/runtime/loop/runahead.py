"""Decode runs: greedy sessions decode several tokens per scheduler pass, their bookkeeping once.

A step's Python (sampling, the journal, the plan, the reply, the audit) costs the same whatever
the decode costs: beside a GPU's few-millisecond step for a small model it is what the GPU waits
for (bench/engine_cpu.py). A session whose next tokens need nothing of Python between them, greedy
with llama.cpp's argmax computed in the decode (`Next.greedy`), no penalty, no grammar, no stop
string, goes on decoding the token its last row names, up to `decode_run` decodes a pass (vLLM's
multi-step scheduling does the same); then its tokens are journalled, one row each as a step at a
time would write them, and sent, before the journal commits (the gate), as before.

A run never decides what a step at a time would decide otherwise: it stops before an eviction, the
last token allowed (max tokens), the token the repetition guard looks at, and an end-of-generation
token, each left to the next ordinary step, and it decodes every token alone in its row, so its
bits are a step at a time's (per-sequence streams; the NOTE of engine/llama.py). A request that
arrives meanwhile stops it (`interrupted`), so the run delays no one by more than one decode.
The price: a run's tokens reach the client together, at its end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.api import TokenEvent
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.loop.audit import Auditor
from sinkd.daemon.runtime.loop.gate import ReplyGate
from sinkd.daemon.runtime.loop.jobs import REPEAT_CHECK_EVERY, Job
from sinkd.daemon.runtime.sessions import Session
from sinkd.errors import EngineError


class RunHost(Protocol):
    """What a run uses of the executor (executor.py), named here so that the two modules do not
    import each other."""

    metrics: Metrics
    auditor: Auditor
    gate: ReplyGate
    durability: Durability | None
    decoding_now: set[str]

    @property
    def engine(self) -> Engine: ...

    def lend(self, session: Session, row: Any) -> None: ...


def tokens_allowed(job: Job) -> int:
    """How many tokens the job's session may decode in a run now (0: none): greedy from the
    decode's argmax, no penalty, grammar or stop string; before the token its max tokens ends it
    on, before the one the repetition guard checks, and while its cells need no eviction."""
    gen, session = job.gen, job.session
    if gen is None or job.final or job.pending is not None or job.answered:
        return 0
    sampler = gen.sampler
    if sampler.stochastic or sampler.history_needed or gen.grammar is not None:
        return 0
    if job.assembler.has_stops or session.greedy_hint is None:
        return 0
    limit = gen.max_tokens - job.generated - 1
    if gen.repetition_guard:
        limit = min(limit, REPEAT_CHECK_EVERY - job.generated % REPEAT_CHECK_EVERY - 1)
    seq = session.seq
    free = seq.config.budget - seq.state.retained(seq.config)
    return max(0, min(limit, free))


class RunAhead:
    """The executor's decode runs (engine thread)."""

    def __init__(self, executor: RunHost) -> None:
        self.executor = executor

    def run(self, jobs: list[Job], decodes: int, interrupted: Callable[[], bool]) -> None:
        """Up to `decodes` more decodes for the jobs that may run (`tokens_allowed`), then their
        bookkeeping; stops early when `interrupted()` (a request or a call waits, or the time
        bound passed). A cancel takes effect at the run's end.

        Between two decodes only the tokens move (`Engine.decode_greedy`), while the same
        sessions decode: a session's row is read once, as it leaves the run (its last decode's,
        before the next overwrites it), and its tokens are gathered when the set changes."""
        ex = self.executor
        engine = ex.engine
        if engine.solo_passes and len(jobs) > 1:  # one sequence a pass here: a run each, in turn
            for job in jobs:
                if not interrupted():
                    self.run([job], decodes, interrupted)
            return
        is_eog = engine.vocab.is_eog
        running = [job for job in jobs if tokens_allowed(job) > 0]
        running.sort(key=lambda job: job.session.seq_id)  # llama.cpp wants them rising
        limit = [tokens_allowed(job) for job in running]  # the decodes each may make
        live = [k for k, job in enumerate(running) if not is_eog(job.session.greedy_hint or 0)]
        tokens = [running[k].session.greedy_hint or 0 for k in live]
        positions = [running[k].session.seq.state.next_cache_pos() for k in live]
        decoded: list[list[int]] = [[] for _ in running]
        made = 0
        if live:
            engine.before_decoding()
        while live and made < decodes and not interrupted():
            ids = [running[k].session.seq_id for k in live]
            until = min(decodes, *(limit[k] for k in live))
            history: list[list[int]] = []  # the tokens each decode took, in `live` order
            ex.decoding_now = {running[k].session.id for k in live}
            try:
                while True:  # the same sessions: nothing is lent between two of these decodes
                    got = engine.decode_greedy(
                        ids, tokens, positions, True, len(history), lent=not history
                    )
                    made += 1
                    history.append(tokens)
                    tokens = got
                    if made >= until or any(map(is_eog, got)) or interrupted():
                        break
            except EngineError as e:  # decoded and unjournalled: the cache is not the history
                ex.metrics.alloc_failures.inc()
                for k in live:
                    decoded[k] = []
                    ex.auditor.fail_session(running[k].session, f"llama_decode failed: {e}")
                live = []
                break
            finally:
                ex.decoding_now = set()
                ex.metrics.steps.inc(len(history))
            for j, k in enumerate(live):
                decoded[k].extend(h[j] for h in history)
            positions = [p + len(history) for p in positions]
            ending = made >= decodes or interrupted()
            stay = []
            for j, k in enumerate(live):
                if ending or made >= limit[k] or is_eog(tokens[j]):
                    self._keep_row(running[k], j)  # it leaves the run: its row stays
                else:
                    stay.append(j)
            live = [live[j] for j in stay]
            tokens = [tokens[j] for j in stay]
            positions = [positions[j] for j in stay]
        for k, job in enumerate(running):
            if decoded[k]:
                self._record(job, decoded[k])

    def _keep_row(self, job: Job, index: int) -> None:
        """The session's next-token row is the last decode's at `index` (lent: copied if it is
        still needed when the next decode comes)."""
        row = self.executor.engine.row_at(index)
        job.session.set_logits(row.logits, row.greedy)
        self.executor.lend(job.session, row.logits)

    def _record(self, job: Job, tokens: list[int]) -> None:
        """What a step at a time records for each token, for the run's tokens at once: the
        journal's rows (one a token), the policy and the ledger, the events, the audit."""
        ex, session = self.executor, job.session
        gen = job.gen
        assert gen is not None
        sb = session.seq.plan(len(tokens), max_batch=len(tokens)).sub_batches[0]
        if sb.ops or sb.n_tokens != len(tokens):  # tokens_allowed rules this out
            ex.auditor.fail_session(session, "a decode run crossed an eviction")
            return
        if ex.durability is not None:
            ex.durability.flush(session)
            draws = session.sampler.draws if gen.sampler is session.sampler else None
            for k, token in enumerate(tokens):
                ex.durability.log(session, sb.logical_pos + k, sb.cache_pos + k, [token], draws)
        session.seq.adopt_ops(sb)
        session.seq.adopt_tokens(sb)
        session.retained.apply(sb, tokens)
        now = time.monotonic()
        session.last_active = now
        vocab = ex.engine.vocab
        for token in tokens:
            job.generated += 1
            ex.metrics.itl.observe(now - job.last_emit)
            latency_ms = (now - job.last_emit) * 1000.0
            job.last_emit = now
            if gen.repetition_guard:
                job.ids.append(token)
            text = job.assembler.feed(vocab.piece(token))
            ex.gate.emit(job, TokenEvent(token, text, job.generated - 1, latency_ms))
        ex.metrics.decode_tokens.inc(len(tokens))
        ex.metrics.run_tokens.inc(len(tokens))
        ex.auditor.check(session, full=False)
