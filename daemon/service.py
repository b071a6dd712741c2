"""Session operations: what the gRPC servicer (and an embedded user) calls. No gRPC here.

Operations that touch the llama context run on the scheduler's thread (`Scheduler.call`), between
steps; appends and generations are jobs the scheduler batches with everyone else's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np

from cachepolicy import CacheSequence, PolicyConfig, PolicyName
from daemon.auth import Principal
from daemon.config import Settings
from daemon.durability import Durability
from daemon.engine import Engine, EngineConfig, Sampler, SamplingParams
from daemon.errors import InvalidInput, Unsupported
from daemon.journal import JournalError
from daemon.loading import open_engine
from daemon.metrics import Metrics
from daemon.models import ModelEntry, load_lock
from daemon.resume import Resumer
from daemon.scheduler import Cancelled, GenSpec, Job, Scheduler
from daemon.sessions import (
    ModelIdentity,
    NotFound,
    PermissionDenied,
    Registry,
    ResourceExhausted,
    Session,
    SessionState,
    StaleGeneration,
    new_session_id,
)

log = logging.getLogger("sinkd.service")
MAX_GENERATE_TOKENS = 4096


def admitted_sessions(
    sequences: int, cells_per_session: int, bytes_per_token: float, max_kv_bytes: int | None
) -> int:
    """Admission: the context's sequences, and with a memory budget as many sessions as it holds
    at their tensor-shape size."""
    if not max_kv_bytes:
        return sequences
    return min(sequences, int(max_kv_bytes // (cells_per_session * bytes_per_token)))


@dataclass(frozen=True)
class PolicyRequest:
    name: str = "sink"
    sinks: int | None = None
    window: int | None = None
    evict_chunk: int | None = None
    compact_interval: int = 0
    pin_system_prompt: bool = False


class SinkdService:
    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.entry: ModelEntry = load_lock().get(settings.model)
        self.registry = Registry()
        self.scheduler = Scheduler(
            self._open_engine,
            self.registry,
            self.metrics,
            step_tokens=settings.step_tokens,
            idle_timeout_s=settings.idle_timeout_s,
            prefill_chunk=settings.prefill_chunk,
        )
        self.scheduler.on_close = self._close_on_engine
        self.scheduler.on_ready = self._resume
        self.identity: ModelIdentity | None = None
        self.durability: Durability | None = None
        if settings.durable:
            self.durability = Durability(
                settings.state_dir,
                sync=settings.sync,
                every_tokens=settings.snapshot_every_tokens,
                every_s=settings.snapshot_every_s,
                keep=settings.snapshots_kept,
            )
            self.scheduler.durability = self.durability

    def _open_engine(self) -> Engine:
        s = self.settings
        config = EngineConfig(
            n_ctx_seq=s.n_ctx_seq,
            n_seq_max=s.max_sessions,
            n_batch=s.n_batch,
            n_gpu_layers=s.n_gpu_layers,
            kv_type=s.kv_type,
        )
        if s.n_threads:
            config = dataclasses.replace(config, n_threads=s.n_threads)
        engine = open_engine(
            self.entry.name,
            config,
            verify_hash=s.verify_model_hash,
            allow_unchecked=s.allow_unchecked,
        )
        self.identity = ModelIdentity(
            self.entry.name, self.entry.sha256, engine.tokenizer_sha256, engine.template_sha256
        )
        return engine

    def _resume(self, engine: Engine) -> None:
        """Engine thread, before the daemon serves: open the state directory, resume sessions."""
        if self.durability is None:
            return
        assert self.identity is not None
        self.durability.open(
            {
                "model": self.entry.name,
                "model_sha256": self.identity.sha256,
                "tokenizer_sha256": self.identity.tokenizer_sha256,
                "template_sha256": self.identity.template_sha256,
                "kv_type": engine.config.kv_type,
                "llama_cpp": llama_cpp.__version__,
                "n_ctx_seq": engine.n_ctx_seq,
            }
        )
        Resumer(
            self.scheduler,
            self.durability,
            self.registry,
            self.identity,
            self.max_sessions,
            self.metrics,
        ).run(engine)
        self.metrics.active_sessions.set(len(self.registry))

    def _journal(self, fn: Any, *args: Any) -> None:
        """Record a transition and commit it before the caller replies (engine thread)."""
        if self.durability is None:
            return
        try:
            fn(*args)
            self.durability.commit()
        except (sqlite3.Error, JournalError) as e:
            self.metrics.journal_failures.inc()
            raise ResourceExhausted(f"the journal could not record this: {e}") from None

    # --- lifecycle ---

    def start(self) -> None:
        self.scheduler.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        self.scheduler.ready.wait(timeout)
        if self.scheduler.load_error is not None:
            raise self.scheduler.load_error
        return self.scheduler.ready.is_set()

    def stop(self) -> None:
        self.scheduler.stop()

    @property
    def engine(self) -> Engine:
        engine = self.scheduler.engine
        if engine is None:
            raise Unsupported("the model is not loaded")
        return engine

    def max_sessions(self) -> int:
        engine = self.engine
        return admitted_sessions(
            engine.config.n_seq_max,
            engine.n_ctx_seq,
            engine.kv_bytes_per_token,
            self.settings.max_kv_bytes,
        )

    # --- sessions ---

    def _owned(
        self, principal: Principal, session_id: str, generation: str, allow_stale: bool = False
    ) -> Session:
        if principal.tenant is None:
            raise NotFound(f"no session {session_id!r}")  # the admin owns no sessions
        try:
            return self.registry.lookup(principal.tenant, session_id, generation, allow_stale)
        except StaleGeneration:
            self.metrics.stale_handles.inc()
            raise

    def create(
        self,
        principal: Principal,
        policy: PolicyRequest,
        sampling: SamplingParams,
        system_prompt: str = "",
    ) -> Session:
        if principal.tenant is None:
            raise PermissionDenied("the admin token owns no sessions; use a tenant's token")
        engine = self.engine
        sampling.validate()
        system_tokens = self._system_tokens(engine, system_prompt)
        config, pinned = self._policy(engine, policy, len(system_tokens))
        engine.check_policy(config)
        assert self.identity is not None
        identity = self.identity

        def admit(engine: Engine) -> Session:
            if len(self.registry) >= self.max_sessions():
                self.metrics.alloc_failures.inc()
                raise ResourceExhausted(
                    f"session limit reached: {self.max_sessions()} sessions of"
                    f" {engine.n_ctx_seq} cells x {engine.kv_bytes_per_token:.0f} bytes"
                )
            try:
                seq_id = engine.acquire_seq()
            except Unsupported as e:
                self.metrics.alloc_failures.inc()
                raise ResourceExhausted(str(e)) from None
            engine.clear(seq_id)
            session = Session(
                id=new_session_id(),
                tenant=principal.tenant or "",
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
            )
            self.registry.add(session)
            self.metrics.active_sessions.set(len(self.registry))
            if self.durability is not None:
                try:
                    self._journal(self.durability.created, session)
                except ResourceExhausted:
                    self._close_on_engine(session)
                    raise
            return session

        session = self.scheduler.call(admit)
        if system_tokens:  # the system prompt goes in now, batched like any append
            try:
                self.scheduler.submit(Job(session, [])).wait()
            except BaseException:
                self.scheduler.call(lambda engine: self._close_on_engine(session))
                raise
        session.state = SessionState.IDLE
        return session

    def _system_tokens(self, engine: Engine, system_prompt: str) -> list[int]:
        if not system_prompt:
            return engine.tokenize("", add_bos=True)
        text = system_prompt
        if engine.chat_template:
            text = engine.render_chat([("system", system_prompt)], add_assistant=False)
        return engine.tokenize(text, add_bos=True)

    def _policy(
        self, engine: Engine, req: PolicyRequest, n_system: int
    ) -> tuple[PolicyConfig, int]:
        sinks = self.entry.default_sinks if req.sinks is None else req.sinks
        window = self.entry.default_window if req.window is None else req.window
        evict = req.evict_chunk or min(self.settings.default_evict_chunk, window)
        pinned = min(sinks, n_system)
        if req.pin_system_prompt:
            if req.name not in (PolicyName.SINK.value, PolicyName.SINK_NOSHIFT.value):
                raise InvalidInput("pin_system_prompt: only the sink policies have sinks to pin")
            if n_system > self.settings.max_pinned_system_tokens:
                raise InvalidInput(
                    f"pin_system_prompt: the system prompt is {n_system} tokens, above the bound of"
                    f" {self.settings.max_pinned_system_tokens}"
                )
            sinks = max(sinks, n_system)
            pinned = n_system
        config = PolicyConfig.named(
            req.name,
            sinks=sinks,
            window=window,
            evict_chunk=evict,
            compact_interval=req.compact_interval,
        )
        if config.policy is PolicyName.WINDOW:
            pinned = 0
        return config, pinned

    def append(
        self,
        principal: Principal,
        handle: tuple[str, str],
        text: str | None,
        tokens: list[int] | None,
        job_hook: Any = None,
    ) -> tuple[Session, int]:
        """Append text or token ids; returns the session and how many of the caller's tokens went in."""
        session = self._owned(principal, *handle)
        engine = self.engine
        if tokens is None:
            tokens = engine.tokenize(text or "", add_bos=False)
        else:
            engine.check_tokens(tokens)
        if not tokens and not session.pending_prefix:
            return session, 0  # an empty append changes nothing
        job = Job(session, tokens)
        if job_hook:
            job_hook(job)
        self.scheduler.submit(job).wait()
        return session, len(tokens)

    def generate(
        self,
        principal: Principal,
        handle: tuple[str, str],
        max_tokens: int,
        stops: list[str],
        sampling: SamplingParams | None,
        prompt_tokens: list[int] | None = None,
        job_hook: Any = None,
    ) -> Iterator[tuple[str, Any]]:
        """Yield ("token", {...}) events, then ("done", {...}); errors raise."""
        session = self._owned(principal, *handle)
        if not 1 <= max_tokens <= MAX_GENERATE_TOKENS:
            raise InvalidInput(f"max_tokens: must be in 1..{MAX_GENERATE_TOKENS}, got {max_tokens}")
        if len(stops) > 16 or any(len(s) > 256 for s in stops):
            raise InvalidInput("stop: at most 16 strings of at most 256 characters")
        sampler = session.sampler
        if sampling is not None:
            sampling.validate()
            sampler = Sampler(sampling)
        job = Job(session, prompt_tokens or [], GenSpec(max_tokens, stops, sampler))
        if job_hook:
            job_hook(job)
        self.scheduler.submit(job)
        while True:
            kind, payload = job.events.get()
            if kind == "error":
                raise payload
            yield kind, payload
            if kind == "done":
                return

    def chat_tokens(self, principal: Principal, handle: tuple[str, str], message: str) -> list[int]:
        session = self._owned(principal, *handle)
        engine = self.engine
        if not engine.chat_template:
            raise Unsupported(
                f"model {self.entry.name} has no chat template; use append and generate"
            )
        text = engine.render_chat([("user", message)], add_assistant=True)
        prefix = "\n" if session.seq.state.n_seen > len(session.system_tokens) else ""
        return engine.tokenize(prefix + text, add_bos=False)

    def reset(self, principal: Principal, handle: tuple[str, str]) -> Session:
        session = self._owned(principal, *handle)
        t0 = time.monotonic()

        def do_reset(engine: Engine) -> Session:
            self.scheduler.cancel_session_jobs(session, Cancelled("the session was reset"))
            engine.clear(session.seq_id)  # verified: pos max is -1
            session.seq.reset()
            session.retained = type(session.retained)(session.policy.sinks)
            session.sampler.reset()
            session.last_logits = None
            session.reset_count += 1
            session.refresh_generation()
            session.pending_prefix = list(session.system_tokens)
            session.state = SessionState.IDLE
            session.failure = ""
            session.last_active = time.monotonic()
            if self.durability is not None:
                self._journal(self.durability.reset, session)
            return session

        self.scheduler.call(do_reset)
        self.metrics.resets.inc()
        self.metrics.reset_latency.observe(time.monotonic() - t0)
        return session

    def fork(self, principal: Principal, handle: tuple[str, str]) -> Session:
        parent = self._owned(principal, *handle)

        def do_fork(engine: Engine) -> Session:
            if parent.state is SessionState.FAILED:
                raise InvalidInput("cannot fork a failed session; reset it first")
            if len(self.registry) >= self.max_sessions():
                self.metrics.alloc_failures.inc()
                raise ResourceExhausted(f"session limit reached: {self.max_sessions()} sessions")
            seq_id = engine.acquire_seq()
            engine.copy(parent.seq_id, seq_id)  # physical: per-sequence KV streams
            child = Session(
                id=new_session_id(),
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
            child.retained = parent.retained.copy()
            child.last_logits = None if parent.last_logits is None else parent.last_logits.copy()
            child.state = SessionState.IDLE
            self.registry.add(child)
            self.metrics.active_sessions.set(len(self.registry))
            if self.durability is not None:  # the child's history starts with a snapshot
                try:
                    self._journal(self.durability.created, child)
                    if child.seq.state.n_seen and not self.scheduler._snapshot(child):
                        raise ResourceExhausted("the fork's first snapshot could not be written")
                except ResourceExhausted:
                    self._close_on_engine(child)
                    raise
            return child

        return self.scheduler.call(do_fork)

    def close(self, principal: Principal, handle: tuple[str, str]) -> None:
        """Close a session and delete what is stored of it; a stale session can be closed too."""
        session = self._owned(principal, *handle, allow_stale=True)
        self.scheduler.call(lambda engine: self._close_on_engine(session))

    def _close_on_engine(self, session: Session) -> None:
        engine = self.scheduler.engine
        self.scheduler.cancel_session_jobs(session, Cancelled("the session was closed"))
        if self.durability is not None:
            try:
                self._journal(self.durability.closed, session)
            except ResourceExhausted as e:  # it is closed now; the next start may resume it
                log.error("session %s closed, but the journal kept it: %s", session.id, e)
        session.state = SessionState.CLOSED
        self.registry.remove(session.id)
        if engine is not None and session.seq_id >= 0:
            engine.release_seq(session.seq_id)
        self.metrics.active_sessions.set(len(self.registry))
        self.metrics.forget_session(session.id)

    def inspect(
        self,
        principal: Principal,
        handle: tuple[str, str],
        include_text: bool,
        include_logits: bool = False,
    ) -> tuple[dict[str, Any], str, np.ndarray | None]:
        """The receipt; for the owner, the retained text and the next-token logits on request."""
        session = self._owned(principal, *handle)
        text = ""
        if include_text:
            tokens = self.scheduler.call(lambda engine: session.retained.all())
            text = self.engine.detokenize(tokens)
        logits = None
        if include_logits:
            logits = self.scheduler.call(
                lambda engine: None if session.last_logits is None else session.last_logits.copy()
            )
        return self.receipt(session), text, logits

    def trace(self, principal: Principal, handle: tuple[str, str]) -> list[dict[str, Any]]:
        session = self._owned(principal, *handle)
        # the engine thread appends to the trace: copy it there, between steps
        return self.scheduler.call(lambda engine: [e.as_dict() for e in session.seq.trace])

    def list_sessions(self, principal: Principal) -> list[dict[str, Any]]:
        if principal.tenant is None:
            return []
        return [self.receipt(s) for s in self.registry.of_tenant(principal.tenant)]

    def list_all(self, principal: Principal) -> list[dict[str, Any]]:
        if not principal.admin:
            raise PermissionDenied("listing every session needs the admin token")
        return [self.receipt(s) for s in self.registry.all()]

    def receipt(self, session: Session) -> dict[str, Any]:
        return session.receipt(self.engine.kv_bytes_per_token)

    def stats(self, principal: Principal) -> dict[str, Any]:
        if not principal.admin:
            raise PermissionDenied("stats need the admin token")
        engine = self.engine
        everything = self.registry.all()
        sessions = [s for s in everything if s.state is not SessionState.STALE]
        cells = sum(s.seq.retained for s in sessions)
        self.metrics.cells_in_use.set(cells)
        for s in sessions:
            self.metrics.session_cells.labels(session=s.id).set(s.seq.retained)
        count = self.metrics.count
        return {
            "sessions": len(sessions),
            "max_sessions": self.max_sessions(),
            "cells_in_use": cells,
            "cells_per_session": engine.n_ctx_seq,
            "kv_bytes_per_token": int(engine.kv_bytes_per_token),
            "prefill_tokens": count("prefill_tokens"),
            "decode_tokens": count("decode_tokens"),
            "evictions": count("evictions"),
            "steps": count("steps"),
            "invariant_violations": count("invariant_violations"),
            "model": self.entry.name,
            "model_sha256": self.entry.sha256,
            "stale_sessions": len(everything) - len(sessions),
            "snapshots": count("snapshots"),
            "snapshot_failures": count("snapshot_failures"),
        }
