"""Reads of sessions: receipts, retained text, traces, lists, models and stats.

Owners read their own sessions; the admin reads every session's counts, positions and hashes, never
text, token ids or logits. Whatever the engine thread mutates is copied on that thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.engine.models import load_lock
from sinkd.daemon.errors import NotFound, PermissionDenied, echo
from sinkd.daemon.runtime.sessions import Principal, Session, SessionState

if TYPE_CHECKING:
    from sinkd.daemon.runtime.service import Handle, SinkdService


class SessionReads:
    def __init__(self, service: SinkdService) -> None:
        self.service = service

    def _visible(self, principal: Principal, handle: Handle) -> Session:
        """The owner's session; for the admin, any session (content-free reads only)."""
        if principal.admin and principal.tenant is None:
            session = self.service.registry.get(handle[0])
            if session is None:
                raise NotFound(f"no session {echo(handle[0])}")
            return session
        return self.service.owned(principal, handle)

    def inspect(
        self, principal: Principal, handle: Handle, include_text: bool, include_logits: bool = False
    ) -> tuple[dict[str, Any], str, np.ndarray | None]:
        """The receipt; for the owner, the retained text and the next-token logits on request."""
        session = self._visible(principal, handle)
        if principal.tenant is None and (include_text or include_logits):
            raise PermissionDenied("the admin sees counts and positions, never text or logits")

        def read(engine: Engine) -> tuple[dict[str, Any], list[int] | None, np.ndarray | None]:
            tokens = session.retained.all() if include_text else None
            logits = session.last_logits
            return (
                self.service.receipt(session),
                tokens,
                (logits.copy() if include_logits and logits is not None else None),
            )

        receipt, tokens, logits = self.service.scheduler.call(read)
        text = self.service.engine.detokenize(tokens) if tokens else ""
        return receipt, text, logits

    def trace(self, principal: Principal, handle: Handle) -> list[dict[str, Any]]:
        session = self._visible(principal, handle)
        # the engine thread appends to the trace: copy it there, between steps
        events: list[dict[str, Any]] = self.service.scheduler.call(
            lambda e: [ev.as_dict() for ev in session.seq.trace]
        )
        return events

    def list_sessions(self, principal: Principal) -> list[dict[str, Any]]:
        if principal.tenant is None:
            return []
        return [self.service.receipt(s) for s in self.service.registry.of_tenant(principal.tenant)]

    def list_all(self, principal: Principal) -> list[dict[str, Any]]:
        _admin_only(principal, "listing every session")
        return [self.service.receipt(s) for s in self.service.registry.all()]

    def list_models(self, principal: Principal) -> list[dict[str, Any]]:
        _admin_only(principal, "listing the models")
        lock = load_lock()
        return [
            {
                "name": e.name,
                "sha256": e.sha256,
                "loaded": e.name == self.service.entry.name,
                "is_default": e.name == lock.default,
                "default_sinks": e.default_sinks,
                "default_window": e.default_window,
            }
            for e in lock.models.values()
        ]

    def stats(self, principal: Principal) -> dict[str, Any]:
        _admin_only(principal, "stats")
        engine = self.service.engine
        everything = self.service.registry.all()
        sessions = [s for s in everything if s.state is not SessionState.STALE]
        cells = sum(s.seq.retained for s in sessions)
        self.service.metrics.cells_in_use.set(cells)
        for s in sessions:
            self.service.metrics.session_cells.labels(session=s.id).set(s.seq.retained)
        count = self.service.metrics.count
        return {
            "sessions": len(sessions),
            "max_sessions": self.service.max_sessions(),
            "cells_in_use": cells,
            "cells_per_session": engine.n_ctx_seq,
            "kv_bytes_per_token": int(engine.kv_bytes_per_token),
            "prefill_tokens": count("prefill_tokens"),
            "decode_tokens": count("decode_tokens"),
            "evictions": count("evictions"),
            "steps": count("steps"),
            "invariant_violations": count("invariant_violations"),
            "model": self.service.entry.name,
            "model_sha256": self.service.entry.sha256,
            "stale_sessions": len(everything) - len(sessions),
            "snapshots": count("snapshots"),
            "snapshot_failures": count("snapshot_failures"),
        }


def _admin_only(principal: Principal, what: str) -> None:
    if not principal.admin:
        raise PermissionDenied(f"{what} needs the admin token")
