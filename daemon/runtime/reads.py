"""Reads of sessions: receipts, retained text, traces, lists, models and stats.

Owners read their own sessions; the admin reads every session's counts, positions and hashes, never
text, token ids or logits. Whatever the engine thread mutates is copied on that thread.
"""

from __future__ import annotations

import numpy as np

from sinkd.cachepolicy.sequence import TraceEvent
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.models.registry import ModelEntry, load_lock
from sinkd.daemon.runtime.access import Access, admin_only
from sinkd.daemon.runtime.admission import Admission
from sinkd.daemon.runtime.api import Handle, Inspection, ModelInfo, Receipt, Stats
from sinkd.daemon.runtime.loop.scheduler import Scheduler
from sinkd.daemon.runtime.sessions import Principal, Registry, Session, SessionState
from sinkd.errors import PermissionDenied


class SessionReads:
    def __init__(
        self,
        access: Access,
        registry: Registry,
        scheduler: Scheduler,
        admission: Admission,
        metrics: Metrics,
        entry: ModelEntry,
    ) -> None:
        self.access = access
        self.registry = registry
        self.scheduler = scheduler
        self.admission = admission
        self.metrics = metrics
        self.entry = entry

    def receipt(self, session: Session) -> Receipt:
        """Read on the engine thread, between steps: a step may be changing the session now."""
        return self.scheduler.call(lambda e: session.receipt(e.kv_bytes_per_token))

    def inspect(
        self, principal: Principal, handle: Handle, include_text: bool, include_logits: bool = False
    ) -> Inspection:
        """The receipt; for the owner, the retained text and the next-token logits on request."""
        session = self.access.visible(principal, handle)
        if principal.tenant is None and (include_text or include_logits):
            raise PermissionDenied("the admin sees counts and positions, never text or logits")

        def read(engine: Engine) -> tuple[Receipt, list[int] | None, np.ndarray | None]:
            tokens = session.retained.all() if include_text else None
            logits = session.last_logits
            return (
                session.receipt(engine.kv_bytes_per_token),
                tokens,
                (logits.copy() if include_logits and logits is not None else None),
            )

        receipt, tokens, logits = self.scheduler.call(read)
        text = self.access.engine.vocab.detokenize(tokens) if tokens else ""
        if principal.tenant is None:
            receipt = receipt.for_admin()
        return Inspection(receipt, text, logits)

    def trace(self, principal: Principal, handle: Handle) -> list[TraceEvent]:
        session = self.access.visible(principal, handle)
        # the engine thread appends to the trace: copy it there, between steps
        return self.scheduler.call(lambda e: list(session.seq.trace))

    def list_sessions(self, principal: Principal) -> list[Receipt]:
        """The caller's sessions; the admin's token (no tenant), every session, as it reads them."""
        if principal.tenant is None:
            return self.list_all(principal) if principal.admin else []
        sessions = self.registry.of_tenant(principal.tenant)
        return self.scheduler.call(lambda e: [s.receipt(e.kv_bytes_per_token) for s in sessions])

    def list_all(self, principal: Principal) -> list[Receipt]:
        admin_only(principal, "listing every session")
        sessions = self.registry.all()
        return self.scheduler.call(
            lambda e: [s.receipt(e.kv_bytes_per_token).for_admin() for s in sessions]
        )

    def list_models(self, principal: Principal) -> list[ModelInfo]:
        admin_only(principal, "listing the models")
        lock = load_lock()
        backend = self.access.engine.backend
        return [
            ModelInfo(
                name=e.name,
                sha256=e.sha256,
                loaded=e.name == self.entry.name,
                is_default=e.name == lock.default,
                default_sinks=e.default_sinks,
                default_window=e.default_window,
                backend=backend if e.name == self.entry.name else "",
            )
            for e in lock.models.values()
        ]

    def stats(self, principal: Principal) -> Stats:
        admin_only(principal, "stats")
        engine = self.access.engine
        everything = self.registry.all()
        sessions = [s for s in everything if s.state is not SessionState.STALE]
        cells = sum(s.seq.retained for s in sessions)
        self.metrics.cells_in_use.set(cells)
        count = self.metrics.count
        admission = self.admission
        tenants = self.scheduler.call(
            lambda e: tuple(admission.tenancy.usage(admission.capacity(e)))
        )
        return Stats(
            sessions=len(sessions),
            max_sessions=self.admission.limit(engine),
            cells_in_use=cells,
            cells_per_session=engine.n_ctx_seq,
            kv_bytes_per_token=int(engine.kv_bytes_per_token),
            prefill_tokens=count("prefill_tokens"),
            decode_tokens=count("decode_tokens"),
            evictions=count("evictions"),
            steps=count("steps"),
            invariant_violations=count("invariant_violations"),
            model=self.entry.name,
            model_sha256=self.entry.sha256,
            stale_sessions=len(everything) - len(sessions),
            snapshots=count("snapshots"),
            snapshot_failures=count("snapshot_failures"),
            parked_sessions=sum(s.parked for s in sessions),
            max_parked_sessions=self.admission.residency.max_parked,
            parks=count("parks"),
            restores=count("restores"),
            tenants=tenants,
        )
