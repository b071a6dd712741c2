"""Session operations: what the edges (gRPC, the CLI's embedded backend, an embedded user) call.
No transport here; requests and answers are the typed objects of `runtime.api`.

The service composes the parts and runs the operations that change which sessions exist (create,
reset, fork, close) on the scheduler's thread, between steps; appends and generations are `Turns`,
memory is `Remembering`, reads are `SessionReads`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable

from sinkd.daemon import failpoints
from sinkd.daemon.config import Settings
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.engine.sampler import SamplingParams
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.models.registry import ModelEntry, load_lock
from sinkd.daemon.runtime import boot, requests
from sinkd.daemon.runtime.access import Access
from sinkd.daemon.runtime.admission import Admission
from sinkd.daemon.runtime.api import (
    AppendResult,
    CancelToken,
    ChatRequest,
    Erased,
    GenerationOptions,
    Handle,
    PolicyRequest,
    PrefixInfo,
    RecallRequest,
    Receipt,
    SamplingRequest,
    Stream,
)
from sinkd.daemon.runtime.conversations.clients import ClientState
from sinkd.daemon.runtime.conversations.completions import Completions
from sinkd.daemon.runtime.durable.disk_space import DiskSpace
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.embeddings import Embeddings
from sinkd.daemon.runtime.erasure import Erasure
from sinkd.daemon.runtime.lifecycle import Lifecycle
from sinkd.daemon.runtime.loop.jobs import Job
from sinkd.daemon.runtime.loop.prefixes import PrefixStates
from sinkd.daemon.runtime.loop.scheduler import Scheduler
from sinkd.daemon.runtime.migration import Mover, SessionMoves
from sinkd.daemon.runtime.narrated import NarratedStreams
from sinkd.daemon.runtime.narrated_ask import NarrationQuestions
from sinkd.daemon.runtime.reads import SessionReads
from sinkd.daemon.runtime.recall.framing import Presentation
from sinkd.daemon.runtime.recall.layer import Recall
from sinkd.daemon.runtime.remembering import AcrossConversations, Remembering
from sinkd.daemon.runtime.resume import Resumer
from sinkd.daemon.runtime.sessions import ModelIdentity, Principal, Registry, Session
from sinkd.daemon.runtime.tenancy import Tenancy
from sinkd.daemon.runtime.tenant_moves import TenantMoves
from sinkd.daemon.runtime.turns import Turns
from sinkd.daemon.store.embedder import Embedder
from sinkd.daemon.store.memory import MemoryStore, Segmenting
from sinkd.errors import PermissionDenied

log = logging.getLogger("sinkd.service")


# opens the engine for the settings' model: llama.cpp's (`boot.open_for`), or a test's fake
EngineOpener = Callable[[Settings, ModelEntry], tuple[Engine, ModelIdentity]]


class SinkdService:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics | None = None,
        open_engine: EngineOpener = boot.open_for,
    ) -> None:
        self.settings = settings
        self._open_for = open_engine
        self.metrics = metrics or Metrics()
        lock = load_lock()
        self.entry: ModelEntry = lock.get(settings.model)
        self.registry = Registry(settings.node)
        self.identity: ModelIdentity | None = None
        self.durability: Durability | None = None
        self.embedder: Embedder | None = None  # loaded with the model (`_open_engine`)
        self.embeddings = Embeddings(lock, lambda: self.embedder, lambda: self.recall.search)
        if settings.durable:
            self.durability = durability_for(settings, self.metrics)
        self._memory: MemoryStore | None = None  # without a state directory: in memory
        self.recall = Recall(
            self._memory_store,
            self.metrics,
            settings.memory_max_tokens,
            settings.memory_across_max_tokens,
        )
        self.prefixes = prefix_states_for(settings, self.metrics)
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
            max_kv_bytes=settings.max_kv_bytes,
            max_parked=settings.max_parked_sessions,
            decode_run=settings.decodes_per_pass,
            decode_run_s=settings.decode_run_ms / 1000.0,
            prefixes=self.prefixes,
            max_drafts=settings.max_drafts if settings.speculative == "auto" else 0,
        )
        self.tenancy = Tenancy(
            settings,
            self.registry,
            self.durability,
            lambda: self.prefixes.disk_by_owner(),
            lambda: self.responses.held(),
        )
        self.admission = Admission(
            self.registry, self.metrics, self.scheduler.residency, self.tenancy
        )
        self.lifecycle = Lifecycle(
            self.scheduler,
            self.scheduler.snapshotter,
            self.registry,
            self.admission,
            self.metrics,
            self.durability,
            self.recall,
        )
        self.access = Access(self.registry, self.scheduler, self.metrics)
        self.erasure = Erasure(self.scheduler, self.durability, settings.purge_wait_s)
        presentation = Presentation.named(
            settings.recall_presentation or self.entry.recall_presentation
        )
        self.turns = Turns(
            self.access,
            self.scheduler,
            self.entry,
            settings.call_timeout_s,
            presentation,
            settings.max_reply_tokens,
        )
        self.memory = Remembering(
            self.access,
            self.scheduler,
            self.turns,
            self.recall,
            self.durability,
            settings,
            self.erasure,
        )
        self.memory.on_forgot = self.prefixes.forget_tenant  # a prefix may hold forgotten text
        self.across = AcrossConversations(self.access, self.scheduler, self.memory)
        self.narrated = NarratedStreams(
            self.scheduler, self.durability, self.metrics, settings, self.erasure
        )
        self.questions = NarrationQuestions(
            self.narrated, self.create, self.append, self.generate, self._close_unwaited
        )  # a narrated stream's past, asked
        self.reads = SessionReads(
            self.access, self.registry, self.scheduler, self.admission, self.metrics, self.entry
        )
        # the HTTP front's clients: stateless histories and stored responses, each a session
        self.clients = ClientState(
            self.access,
            self.turns,
            self.scheduler,
            self.durability,
            lambda p, policy, sampling, system: self.create(p, policy, sampling, system),
            self._close_unwaited,
            lambda p, h, n: self.scheduler.call(
                lambda e: self.lifecycle.rewind(e, self.access.owned(p, h), h.generation, n)
            ),
            settings.http_window,
            settings.conversations_key_file,
            min(settings.max_pinned_system_tokens, settings.n_ctx_seq // 2),
            settings.ui_task_grammar,
            self.erasure,
        )
        # the HTTP front's named parts: stateless clients' chats, and stored responses
        self.chats, self.responses = self.clients.stateless, self.clients.responses
        self.completions = Completions(
            self.access,
            lambda p: self.chats.new_session(p, ""),
            lambda p, h, text, cancel: self.turns.append(p, h, text, None, cancel),
            lambda p, h, options, cancel: self.turns.generate(p, h, options, cancel),
            self._close_unwaited,
        )
        self.lifecycle.on_closed = self.chats.forget
        self.lifecycle.on_released = self._released
        self.responses.max_stored = self.tenancy.max_responses
        self.scheduler.on_close = self.lifecycle.close
        self.scheduler.on_ready = self._resume
        self.moves = SessionMoves(self.access, self.scheduler, self.registry, self.metrics)
        self.tenants = TenantMoves(
            self.access, self.scheduler, self.registry, self.durability, self.recall,
            self.prefixes, self.moves, self.erasure, settings.node,
        )  # fmt: skip
        self.tenants.on_released = self.narrated.drop_tenant
        self.narrated.served_here = self.tenants.check_tenant
        self.memory.served_here = self.tenants.check_tenant
        self.scheduler.executor.served_here = self.tenants.check_tenant
        self.lifecycle.served_here = self.tenants.check_tenant

    def _released(self, session_id: str, reset_count: int) -> None:
        """Engine thread: a session generation ended; what was kept of it elsewhere goes."""
        self.prefixes.release(session_id, reset_count)
        self.responses.released(session_id, reset_count)

    def _memory_store(self) -> MemoryStore:
        if self.durability is not None:
            assert self.durability.memory is not None, "the state directory is not open"
            return self.durability.memory
        if self._memory is None:
            self._memory = MemoryStore.temporary(
                Segmenting(self.settings.memory_passages), self.embedder
            )
        return self._memory

    def _open_engine(self) -> Engine:
        """Engine thread, while health says NOT_SERVING: the model, and recall's embedder."""
        failpoints.hit("model-loading")
        self.embedder, self.recall.search = boot.open_embedder(self.settings.recall_dense)
        if self.durability is not None:
            self.durability.embedder = self.embedder
        engine, self.identity = self._open_for(self.settings, self.entry)
        return engine

    def _resume(self, engine: Engine) -> None:
        """Engine thread, before the daemon serves: open the state directory, resume sessions."""
        assert self.identity is not None
        # whether sessions may draft (a probe of the model on a free sequence: row_probe.py),
        # asked before any session holds cells rather than in a first reply
        self.scheduler.executor.verifier.drafting()
        stored = self.settings.state_dir / "prefixes" if self.durability is not None else None
        self.prefixes.configure(
            boot.gates(engine, self.entry, self.identity), stored, engine.min_piece
        )
        if self.durability is None:
            return
        resumer = Resumer(
            self.scheduler.executor,
            self.durability,
            self.registry,
            self.identity,
            self.admission,
            self.metrics,
            self.recall,
        )
        boot.resume(engine, self.entry, self.identity, self.durability, resumer)
        for session in self.registry.all():  # a tenant that no longer keeps a memory across
            if session.recall.across and not self.settings.memory_across(session.tenant):
                session.recall = dataclasses.replace(session.recall, across=False)
        self.prefixes.prune({(s.id, s.reset_count) for s in self.registry.all()})
        assert self.scheduler.snapshotter is not None
        self.moves.mover = Mover(
            self.durability, self.scheduler.snapshotter, resumer, self.registry,
            self.lifecycle.close, self.clients,
        )  # fmt: skip
        self.clients.load()
        self.tenants.load()
        for session_id, tenant in self.durability.moved_out():
            self.registry.moved_out(session_id, tenant)
        self.metrics.active_sessions.set(len(self.registry))
        self.scheduler.residency.counted()

    # --- the daemon ---

    def claim(self) -> None:
        """Make sure of the state directory before anything listens (UntrustedPath, or
        JournalError if another sinkd holds it)."""
        if self.durability is not None:
            self.durability.claim()

    def unclaim(self) -> None:
        if self.durability is not None:
            self.durability.close()

    def start(self) -> None:
        self.scheduler.start()

    def alive(self) -> bool:
        """The engine thread runs (it may still be loading)."""
        return self.scheduler.alive()

    def on_engine_death(self, callback: Callable[[BaseException], None]) -> None:
        """Who is told, on the engine thread, that it died of a bug."""
        self.scheduler.on_death = callback

    def serving(self) -> bool:
        """The model is loaded, its sessions resumed, and the engine runs."""
        s = self.scheduler
        return s.ready.is_set() and s.engine is not None and s.alive()

    def check_serving(self) -> None:
        """Loading (UNAVAILABLE: try again) before the model is loaded; ShuttingDown after."""
        self.access.check_serving()

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
        return self.access.engine

    def receipt(self, session: Session) -> Receipt:
        return self.reads.receipt(session)

    def list_prefixes(self, principal: Principal) -> list[PrefixInfo]:
        """The stored prefix states the caller may see, content-free: a tenant's own and the
        shared ones; the admin's token, all of them with their tenants."""
        if principal.tenant is None and not principal.admin:
            raise PermissionDenied("no tenant: no prefixes")
        tenant = principal.tenant
        return self.scheduler.call(lambda e: self.prefixes.listing(tenant))

    def max_sessions(self) -> int:
        return self.admission.limit(self.engine)

    # --- which sessions exist ---

    def create(
        self,
        principal: Principal,
        policy: PolicyRequest,
        sampling: SamplingRequest | None = None,
        system_prompt: str = "",
        recall: RecallRequest | None = None,
    ) -> Receipt:
        if principal.tenant is None:
            raise PermissionDenied("the admin token owns no sessions; use a tenant's token")
        params = requests.sampling_params(sampling) or SamplingParams()
        engine = self.engine
        system_tokens = requests.system_tokens(engine, system_prompt)
        config, pinned = requests.resolve_policy(
            policy,
            len(system_tokens),
            self.entry,
            self.settings,
            engine.position_limit,
            engine.n_ctx_seq,
        )
        engine.check_policy(config)
        recall_config = requests.resolve_recall(
            recall or RecallRequest(),
            config,
            self.settings,
            across=self.settings.memory_across(principal.tenant),
        )
        assert self.identity is not None
        identity, tenant = self.identity, principal.tenant
        session: Session = self.scheduler.call(
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
        if not system_tokens:
            return self.receipt(session)
        try:  # the system prompt goes in now, batched like any append
            return self.turns.wait(self.scheduler.submit(Job(session, [])), None).receipt
        except BaseException:
            self.scheduler.call(lambda e: self.lifecycle.close(session))
            raise

    def reset(
        self, principal: Principal, handle: Handle, time_left: float | None = None
    ) -> tuple[Receipt, Erased]:
        """A new generation; the old one's content leaves the files before the reply, or the
        reply says its purge is owed (`Erasure`)."""
        session = self.access.owned(principal, handle)
        t0 = time.monotonic()
        receipt, owed = self.erasure.run(
            lambda e: self.lifecycle.reset(e, session, handle.generation).receipt(
                e.kv_bytes_per_token
            ),
            time_left,
        )
        self.metrics.resets.inc()
        self.metrics.reset_latency.observe(time.monotonic() - t0)
        return receipt, Erased(1, owed)

    def fork(self, principal: Principal, handle: Handle) -> Receipt:
        parent = self.access.owned(principal, handle)
        return self.scheduler.call(
            lambda e: self.lifecycle.fork(e, parent, handle.generation).receipt(
                e.kv_bytes_per_token
            )
        )

    def close(
        self,
        principal: Principal,
        handle: Handle,
        time_left: float | None = None,
        wait: bool = True,
    ) -> Erased:
        """Close a session and delete what is stored of it; a stale session can be closed too. The
        admin may close any session at its generation (a removed tenant's, which no one else can
        reach), and reads none of it. Its content leaves the files before the reply, or the reply
        says its purge is owed (`Erasure`; `wait=False`: no wait, for a close no one asked for)."""
        if principal.admin and principal.tenant is None:
            session = self.access.visible(principal, handle)
        else:
            session = self.access.owned(principal, handle, allow_stale=True)
        _, owed = self.erasure.run(
            lambda e: self.lifecycle.close_asked(session, handle.generation), time_left, wait
        )
        return Erased(1, owed)

    def _close_unwaited(self, principal: Principal, handle: Handle) -> None:
        """The HTTP front's own closes (an unstored conversation, a completion session past its
        bound): the reply of the request that made them does not wait for their purge."""
        self.close(principal, handle, wait=False)

    # --- turns: one line each, so that an edge needs only the service ---

    def append(
        self,
        principal: Principal,
        handle: Handle,
        text: str | None,
        tokens: list[int] | None = None,
        cancel: CancelToken | None = None,
        timeout: float | None = None,
    ) -> AppendResult:
        return self.turns.append(principal, handle, text, tokens, cancel, timeout)

    def generate(
        self,
        principal: Principal,
        handle: Handle,
        options: GenerationOptions,
        cancel: CancelToken | None = None,
        timeout: float | None = None,
    ) -> Stream:
        return self.turns.generate(principal, handle, options, cancel, timeout)

    def chat(
        self,
        principal: Principal,
        handle: Handle,
        request: ChatRequest,
        cancel: CancelToken | None = None,
        timeout: float | None = None,
    ) -> Stream:
        return self.turns.chat(principal, handle, request, cancel, timeout)


def durability_for(settings: Settings, metrics: Metrics) -> Durability:
    """The journal, snapshots and memory of a daemon with a state directory, as configured."""
    return Durability(
        settings.state_dir,
        sync=settings.sync,
        sync_interval_s=settings.sync_interval_ms / 1000,
        every_tokens=settings.snapshot_every_tokens,
        every_s=settings.snapshot_every_s,
        keep=settings.snapshots_kept,
        purge_interval_s=settings.purge_interval_s,
        segmenting=Segmenting(settings.memory_passages),
        space=DiskSpace(settings.state_dir, int(settings.min_free_mb * 2**20), metrics),
        metrics=metrics,
    )


def prefix_states_for(settings: Settings, metrics: Metrics) -> PrefixStates:
    """Prefix states within the configured bounds, cut as the scheduler cuts every read."""
    return PrefixStates(
        metrics,
        settings.prefix_ram_mb * 2**20,
        settings.prefix_disk_mb * 2**20,
        settings.prefix_min_tokens,
        min(settings.prefill_chunk, settings.step_tokens),
        frozenset(hashlib.sha256(t.encode()).hexdigest() for t in settings.shared_system_prompts),
    )
