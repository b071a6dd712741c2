"""Session operations: what the gRPC servicer (and an embedded user) calls. No gRPC here.

Operations that touch the llama context run on the scheduler's thread (`Scheduler.call`), between
steps; appends and generations are jobs the scheduler batches with everyone else's. Text is turned
into tokens on the caller's thread (the engine guards its vocabulary against a concurrent close),
and the request stays bound to the generation its handle was checked against.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sinkd.cachepolicy.recall import RecallMode
from sinkd.daemon import failpoints
from sinkd.daemon.config import Settings
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.engine.models import ModelEntry, load_lock
from sinkd.daemon.engine.sampler import Sampler, SamplingParams
from sinkd.daemon.errors import (
    FailedPrecondition,
    InvalidInput,
    NotFound,
    PermissionDenied,
    ShuttingDown,
    StaleGeneration,
    Unsupported,
    echo,
)
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime import boot, lifecycle, requests
from sinkd.daemon.runtime.admission import Admission
from sinkd.daemon.runtime.durability import Durability
from sinkd.daemon.runtime.jobs import GenSpec, Job
from sinkd.daemon.runtime.lifecycle import Lifecycle
from sinkd.daemon.runtime.reads import SessionReads
from sinkd.daemon.runtime.recall import Recall, RecallAsk, check_query
from sinkd.daemon.runtime.requests import PolicyRequest, RecallRequest
from sinkd.daemon.runtime.scheduler import Scheduler
from sinkd.daemon.runtime.sessions import ModelIdentity, Principal, Registry, Session
from sinkd.daemon.store.memory import MemoryStore, Segmenting

log = logging.getLogger("sinkd.service")
Handle = tuple[str, str]
RECALL_HEADER = "Recalled from earlier in this conversation (it may be incomplete):\n"


class SinkdService:
    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.entry: ModelEntry = load_lock().get(settings.model)
        self.registry = Registry()
        self.identity: ModelIdentity | None = None
        self.durability: Durability | None = None
        if settings.durable:
            self.durability = Durability(
                settings.state_dir,
                sync=settings.sync,
                sync_interval_s=settings.sync_interval_ms / 1000,
                every_tokens=settings.snapshot_every_tokens,
                every_s=settings.snapshot_every_s,
                keep=settings.snapshots_kept,
                segmenting=Segmenting(settings.memory_passages),
            )
        self._memory: MemoryStore | None = None  # without a state directory: in memory
        self.recall = Recall(self._memory_store, self.metrics, settings.memory_max_tokens)
        self.scheduler = Scheduler(
            self._open_engine,
            self.registry,
            self.metrics,
            durability=self.durability,
            step_tokens=settings.step_tokens,
            idle_timeout_s=settings.idle_timeout_s,
            prefill_chunk=settings.prefill_chunk,
            call_timeout_s=settings.call_timeout_s,
            recall=self.recall,
        )
        self.admission = Admission(self.registry, self.metrics, settings.max_kv_bytes)
        self.lifecycle = Lifecycle(
            self.scheduler,
            self.registry,
            self.admission,
            self.metrics,
            self.durability,
            self.recall,
        )
        self.reads = SessionReads(self)
        self.scheduler.on_close = self.lifecycle.close
        self.scheduler.on_ready = self._resume

    def _memory_store(self) -> MemoryStore:
        if self.durability is not None:
            assert self.durability.memory is not None, "the state directory is not open"
            return self.durability.memory
        if self._memory is None:
            self._memory = MemoryStore.temporary(Segmenting(self.settings.memory_passages))
        return self._memory

    def _open_engine(self) -> Engine:
        engine, self.identity = boot.open_for(self.settings, self.entry)
        return engine

    def _resume(self, engine: Engine) -> None:
        """Engine thread, before the daemon serves: open the state directory, resume sessions."""
        if self.durability is not None:
            assert self.identity is not None
            boot.resume(engine, self.entry, self.identity, self.durability, self)

    # --- lifecycle ---

    def start(self) -> None:
        self.scheduler.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        self.scheduler.ready.wait(timeout)
        if self.scheduler.load_error is not None:
            raise self.scheduler.load_error
        return self.scheduler.ready.is_set()

    def stop(self, snapshot: bool = True) -> None:
        self.scheduler.stop(snapshot=snapshot)
        if self._memory is not None and not self.scheduler.alive():
            self._memory.close()  # a temporary memory goes with the daemon that kept it
            self._memory = None

    @property
    def engine(self) -> Engine:
        engine = self.scheduler.engine
        if engine is None or not self.scheduler.alive():
            if self.scheduler.ready.is_set():
                raise ShuttingDown("the engine has stopped: the daemon is shutting down")
            raise Unsupported("the model is not loaded")
        return engine

    def receipt(self, session: Session) -> dict[str, Any]:
        return session.receipt(self.engine.kv_bytes_per_token)

    def max_sessions(self) -> int:
        return self.admission.limit(self.engine)

    def _on_engine(self, fn: Callable[[Engine], Any]) -> Any:
        return self.scheduler.call(fn)

    # --- sessions ---

    def owned(self, principal: Principal, handle: Handle, allow_stale: bool = False) -> Session:
        session_id, generation = handle
        if principal.tenant is None:
            raise NotFound(f"no session {echo(session_id)}")  # the admin owns no sessions
        try:
            session = self.registry.lookup(principal.tenant, session_id, generation, allow_stale)
        except StaleGeneration:
            self.metrics.stale_handles.inc()
            raise
        failpoints.hit("handle-checked")
        return session

    def create(
        self,
        principal: Principal,
        policy: PolicyRequest,
        sampling: Mapping[str, Any] | None,
        system_prompt: str = "",
        recall: RecallRequest | None = None,
    ) -> Session:
        if principal.tenant is None:
            raise PermissionDenied("the admin token owns no sessions; use a tenant's token")
        params = requests.sampling_params(sampling) or SamplingParams()
        engine = self.engine
        system_tokens = requests.system_tokens(engine, system_prompt)
        config, pinned = requests.resolve_policy(
            policy, len(system_tokens), self.entry, self.settings, engine.position_limit
        )
        engine.check_policy(config)
        recall_config = requests.resolve_recall(recall or RecallRequest(), config, self.settings)
        assert self.identity is not None
        identity, tenant = self.identity, principal.tenant
        session: Session = self._on_engine(
            lambda e: self.lifecycle.create(
                e,
                tenant,
                config,
                params,
                identity,
                system_tokens,
                system_prompt,
                pinned,
                recall_config,
            )
        )
        if system_tokens:  # the system prompt goes in now, batched like any append
            try:
                self._wait(self.scheduler.submit(Job(session, [])), None)
            except BaseException:
                self._on_engine(lambda e: self.lifecycle.close(session))
                raise
        return session

    def _wait(self, job: Job, timeout: float | None) -> Any:
        return job.wait(timeout or self.settings.call_timeout_s, self.scheduler.alive)

    def append(
        self,
        principal: Principal,
        handle: Handle,
        text: str | None,
        tokens: list[int] | None,
        job_hook: Callable[[Job], None] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """Append text or token ids; returns how many of the caller's tokens went in and the
        receipt as the append left it."""
        session = self.owned(principal, handle)
        engine = self.engine
        if tokens is None:
            tokens = engine.tokenize(text or "", add_bos=False)
        else:
            engine.check_tokens(tokens)
        failpoints.hit("append-tokenized")
        if not tokens and not session.pending_prefix:
            return 0, self.receipt(session)  # an empty append changes nothing
        job = Job(session, tokens, generation=handle[1])
        if job_hook:
            job_hook(job)
        result = self._wait(self.scheduler.submit(job), timeout)
        return len(tokens), result["receipt"]

    def generate(
        self,
        principal: Principal,
        handle: Handle,
        max_tokens: int,
        stops: list[str],
        sampling: Mapping[str, Any] | None,
        prompt_tokens: list[int] | None = None,
        job_hook: Callable[[Job], None] | None = None,
        timeout: float | None = None,
        recall: RecallAsk | None = None,
    ) -> Iterator[tuple[str, Any]]:
        """Yield ("token", {...}) events, then ("done", {... "receipt"}); errors raise."""
        session = self.owned(principal, handle)
        requests.check_generation_args(max_tokens, stops)
        params = requests.sampling_params(sampling)
        sampler = session.sampler if params is None else Sampler(params)
        spec = GenSpec(max_tokens, stops, sampler)
        job = Job(session, prompt_tokens or [], spec, generation=handle[1])
        job.recall = recall
        if job_hook:
            job_hook(job)
        self.scheduler.submit(job)
        deadline = time.monotonic() + (timeout or self.settings.call_timeout_s)
        while True:
            kind, payload = job.next_event(deadline, self.scheduler.alive)
            if kind == "error":
                raise payload
            if kind == "done":
                failpoints.hit("generation-done")
            yield kind, payload
            if kind == "done":
                return

    def chat(
        self,
        principal: Principal,
        handle: Handle,
        message: str,
        max_tokens: int,
        stops: list[str],
        sampling: Mapping[str, Any] | None,
        job_hook: Callable[[Job], None] | None = None,
        timeout: float | None = None,
    ) -> Iterator[tuple[str, Any]]:
        session = self.owned(principal, handle)
        engine = self.engine
        if not engine.chat_template:
            raise Unsupported(
                f"model {self.entry.name} has no chat template; use append and generate"
            )
        turn = engine.render_chat([("user", message)], add_assistant=False)
        text = engine.render_chat([("user", message)], add_assistant=True)
        prefix = "\n" if session.seq.state.n_seen > len(session.system_tokens) else ""
        if not text.startswith(turn):  # a template that does not end the turn before the header
            turn = text
        question = engine.tokenize(prefix + turn, add_bos=False)
        prompt = question + engine.tokenize(text[len(turn) :], add_bos=False)
        ask = None
        if session.recall.mode is RecallMode.AUTO and message.strip():
            # after the user's turn, before the assistant's: the small model copies a fact best
            # when it comes between the question and the answer (bench/recall.py, placement)
            ask = RecallAsk(
                message,
                session.recall,
                self._chat_frame(engine),
                strip_control=True,
                insert_at=len(question),
            )
        if sampling is None and not session.sampling.chosen:
            recommended = requests.chat_sampling(
                self.entry.sampling, session.generation, session.seq.state.n_seen
            )
            if recommended is not None:
                sampling = recommended.model_dump()
        return self.generate(
            principal, handle, max_tokens, stops, sampling, prompt, job_hook, timeout, ask
        )

    def _chat_frame(self, engine: Engine) -> tuple[str, str]:
        """A recalled passage in a chat is a system turn of its own, said to be recalled.

        The template is rendered around a marker and cut there. The marker is printable: llama.cpp
        takes the content as a C string, so a NUL would end it (and the passage would land after
        the turn's end, outside the system turn, as a first version did)."""
        mark = "@@sinkd-recalled-passage@@"
        turn = engine.render_chat([("system", RECALL_HEADER + mark)], add_assistant=False)
        head, found, tail = turn.partition(mark)
        if not found:  # a template that rewrites content: the passage follows a turn of its own
            return (turn, "")
        return (head, tail)

    # --- recall: the session's memory ---

    def recall_into(
        self,
        principal: Principal,
        handle: Handle,
        query: str,
        budget: int | None = None,
        passages: int | None = None,
        threshold: float | None = None,
        timeout: float | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Search the session's memory and decode the best passages into its cache now (after
        whatever the stream holds). Returns the recall's report and the receipt."""
        session = self.owned(principal, handle)
        check_query(query)
        current = session.recall
        if not session.policy.evicts:
            raise FailedPrecondition(
                f"session {session.id} uses the full policy: it never evicts, so nothing left the"
                " cache to be recalled"
            )
        if current.mode is RecallMode.OFF:
            raise FailedPrecondition(
                f"session {session.id} keeps no memory (recall mode off): nothing to recall"
            )
        config = requests.resolve_recall(
            RecallRequest(
                current.mode.value,
                current.budget if budget is None else budget,
                current.passages if passages is None else passages,
                current.threshold if threshold is None else threshold,
            ),
            session.policy,
            self.settings,
        )
        job = Job(session, [], generation=handle[1])
        job.recall = RecallAsk(query, config)
        result = self._wait(self.scheduler.submit(job), timeout)
        return result["recall"], result["receipt"]

    def memory(
        self, principal: Principal, handle: Handle, search: str = "", limit: int = 100
    ) -> list[dict[str, Any]]:
        """The session's stored passages (text included: the owner's), newest last, or the best
        matches of `search`."""
        session = self.owned(principal, handle)
        if not 1 <= limit <= 10_000:
            raise InvalidInput(f"limit: must be in 1..10000, got {limit}")
        found = self._on_engine(lambda e: self._memory_read(session, handle[1], search, limit))
        return [{**p.as_dict(), "score": score} for p, score in found]

    def _memory_read(self, session: Session, generation: str, search: str, limit: int) -> Any:
        lifecycle.check_generation(session, generation)
        return self.recall.passages(session, search, limit)

    def forget(
        self,
        principal: Principal,
        handle: Handle,
        passage_id: int | None = None,
        logical: tuple[int, int] | None = None,
    ) -> int:
        """Delete a passage, or every passage overlapping a logical range, from disk."""
        session = self.owned(principal, handle)
        if (passage_id is None) == (logical is None):
            raise InvalidInput("forget: name one passage or one logical range")
        if logical is not None and not 0 <= logical[0] < logical[1]:
            raise InvalidInput(f"forget: the range must be start < end, got {list(logical)}")
        n: int = self._on_engine(lambda e: self._forget(session, handle[1], passage_id, logical))
        if n == 0:
            what = (
                f"passage {passage_id}"
                if passage_id is not None
                else f"range {list(logical or ())}"
            )
            raise NotFound(f"session {session.id} stores no {what}")
        return n

    def _forget(
        self,
        session: Session,
        generation: str,
        passage_id: int | None,
        logical: tuple[int, int] | None,
    ) -> int:
        lifecycle.check_generation(session, generation)
        n = self.recall.forget(session, passage_id, logical)
        if n:
            if self.durability is not None:
                self.durability.purge_after_commit()
                self.durability.record(lambda: None)
            else:
                self.recall.purge()
        return n

    def reset(self, principal: Principal, handle: Handle) -> Session:
        session = self.owned(principal, handle)
        t0 = time.monotonic()
        self._on_engine(lambda e: self.lifecycle.reset(e, session, handle[1]))
        self.metrics.resets.inc()
        self.metrics.reset_latency.observe(time.monotonic() - t0)
        return session

    def fork(self, principal: Principal, handle: Handle) -> Session:
        parent = self.owned(principal, handle)
        child: Session = self._on_engine(lambda e: self.lifecycle.fork(e, parent, handle[1]))
        return child

    def close(self, principal: Principal, handle: Handle) -> None:
        """Close a session and delete what is stored of it; a stale session can be closed too."""
        session = self.owned(principal, handle, allow_stale=True)
        self._on_engine(lambda e: self.lifecycle.close(session, handle[1]))
