"""gRPC servicers: protobuf in, protobuf out; typed errors become status codes here and nowhere else."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from cachepolicy.errors import CacheFull, ConfigError, SinkdError
from daemon.auth import Authenticator, Principal, Unauthenticated
from daemon.engine import SamplingParams
from daemon.errors import EngineError, InvalidInput, ModelMismatch, ModelNotAllowed, Unsupported
from daemon.scheduler import Cancelled, Job, ShuttingDown
from daemon.service import PolicyRequest, SinkdService
from daemon.sessions import (
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    SessionFailed,
    StaleGeneration,
)
from proto.sinkd.v1 import sinkd_pb2 as pb
from proto.sinkd.v1 import sinkd_pb2_grpc as pb_grpc

log = logging.getLogger("sinkd.rpc")
R = TypeVar("R")
Method = Callable[[Any, Any, grpc.ServicerContext], Any]

STATUS: list[tuple[type[SinkdError], grpc.StatusCode]] = [
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (StaleGeneration, grpc.StatusCode.FAILED_PRECONDITION),
    (SessionFailed, grpc.StatusCode.FAILED_PRECONDITION),
    (Unsupported, grpc.StatusCode.FAILED_PRECONDITION),
    (ModelNotAllowed, grpc.StatusCode.FAILED_PRECONDITION),
    (ModelMismatch, grpc.StatusCode.FAILED_PRECONDITION),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (CacheFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (Cancelled, grpc.StatusCode.CANCELLED),
    (ShuttingDown, grpc.StatusCode.UNAVAILABLE),
    (EngineError, grpc.StatusCode.INTERNAL),
]


def status_of(error: SinkdError) -> grpc.StatusCode:
    return next((code for cls, code in STATUS if isinstance(error, cls)), grpc.StatusCode.INTERNAL)


def rpc(fn: Callable[..., Any]) -> Method:
    """Authenticate, run, and translate a sinkd error into the matching status and message."""

    @functools.wraps(fn)
    def wrapper(self: _Base, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            principal = self.auth(context)
            return fn(self, request, context, principal)
        except SinkdError as e:
            context.abort(status_of(e), str(e))

    return wrapper


def rpc_stream(fn: Callable[..., Iterator[Any]]) -> Method:
    @functools.wraps(fn)
    def wrapper(self: _Base, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            principal = self.auth(context)
            yield from fn(self, request, context, principal)
        except SinkdError as e:
            context.abort(status_of(e), str(e))

    return wrapper


class _Base:
    def __init__(self, service: SinkdService, authenticator: Authenticator) -> None:
        self.service = service
        self.authenticator = authenticator

    def auth(self, context: grpc.ServicerContext) -> Principal:
        try:
            return self.authenticator.authenticate(context.invocation_metadata() or ())
        except Unauthenticated:
            self.service.metrics.auth_rejections.inc()
            raise


def _handle(h: pb.Handle) -> tuple[str, str]:
    if not h.session_id:
        raise InvalidInput("handle.session_id is required")
    return h.session_id, h.generation


def _sampling(s: pb.Sampling | None, default: SamplingParams | None = None) -> SamplingParams:
    if s is None:
        return default or SamplingParams()
    return SamplingParams(
        temperature=s.temperature, top_k=s.top_k, top_p=s.top_p or 1.0, min_p=s.min_p, seed=s.seed
    )


def _range(r: list[int] | tuple[int, int] | None) -> pb.Range | None:
    return None if r is None else pb.Range(start=r[0], end=r[1])


def receipt_pb(r: dict[str, Any]) -> pb.Receipt:
    p = r["policy"]
    return pb.Receipt(
        session_id=r["session_id"],
        generation=r["generation"],
        reset_count=r["reset_count"],
        state=r["state"],
        tenant=r["tenant"],
        policy=pb.Policy(
            name=p["policy"],
            sinks=p["sinks"],
            window=p["window"],
            evict_chunk=p["evict_chunk"],
            compact_interval=p["compact_interval"],
        ),
        n_seen=r["n_seen"],
        retained=r["retained"],
        anchors_logical=_range(r["anchors_logical"]),
        recent_logical=_range(r["recent_logical"]),
        anchors_cache=_range(r["anchors_cache"]),
        recent_cache=_range(r["recent_cache"]),
        pending_gap=r["pending_gap"],
        evictions=r["evictions"],
        evicted_tokens=r["evicted_tokens"],
        shifts=r["shifts"],
        kv_payload_bytes=r["kv_payload_bytes"],
        model=r["model"],
        model_sha256=r["model_sha256"],
        system_prompt_tokens=r["system_prompt_tokens"],
        system_prompt_tokens_pinned=r["system_prompt_tokens_pinned"],
        system_prompt_sha256=r["system_prompt_sha256"],
        resume=r["resume"],
        stale_reason=r["stale_reason"],
        snapshot_n_seen=r["snapshot_n_seen"],
        snapshot_unix_time=r["snapshot_unix_time"],
        journal_chunks=r["journal_chunks"],
        journal_tokens=r["journal_tokens"],
    )


def _cancel_with(context: grpc.ServicerContext) -> Callable[[Job], None]:
    """Hook a job to the RPC: a client that goes away cancels it within one scheduler step."""

    def hook(job: Job) -> None:
        context.add_callback(job.cancel)
        if not context.is_active():
            job.cancel()

    return hook


class SessionsServicer(_Base, pb_grpc.SessionsServicer):
    def _handle_and_receipt(self, session: Any) -> dict[str, Any]:
        return {
            "handle": pb.Handle(session_id=session.id, generation=session.generation),
            "receipt": receipt_pb(self.service.receipt(session)),
        }

    @rpc
    def Create(
        self, request: pb.CreateSessionRequest, context: Any, principal: Principal
    ) -> pb.CreateSessionResponse:
        p = request.policy
        policy = PolicyRequest(
            name=p.name or "sink",
            sinks=p.sinks if p.HasField("sinks") else None,
            window=p.window if p.HasField("window") else None,
            evict_chunk=p.evict_chunk or None,
            compact_interval=p.compact_interval,
            pin_system_prompt=p.pin_system_prompt,
        )
        sampling = _sampling(request.sampling if request.HasField("sampling") else None)
        session = self.service.create(principal, policy, sampling, request.system_prompt)
        return pb.CreateSessionResponse(**self._handle_and_receipt(session))

    @rpc
    def Append(
        self, request: pb.AppendRequest, context: Any, principal: Principal
    ) -> pb.AppendResponse:
        which = request.WhichOneof("content")
        tokens = list(request.tokens.ids) if which == "tokens" else None
        text = request.text if which == "text" else ""
        session, appended = self.service.append(
            principal, _handle(request.handle), text, tokens, job_hook=_cancel_with(context)
        )
        return pb.AppendResponse(
            appended=appended, receipt=receipt_pb(self.service.receipt(session))
        )

    def _events(
        self, events: Iterator[tuple[str, Any]], handle: tuple[str, str], principal: Principal
    ) -> Iterator[pb.GenerateEvent]:
        for kind, payload in events:
            if kind == "token":
                yield pb.GenerateEvent(token=pb.Token(**payload))
            else:
                session = self.service.registry.lookup(principal.tenant or "", *handle)
                yield pb.GenerateEvent(
                    done=pb.Done(
                        reason=payload["reason"],
                        generated=payload["generated"],
                        receipt=receipt_pb(self.service.receipt(session)),
                    )
                )

    @rpc_stream
    def Generate(
        self, request: pb.GenerateRequest, context: Any, principal: Principal
    ) -> Iterator[pb.GenerateEvent]:
        handle = _handle(request.handle)
        sampling = _sampling(request.sampling) if request.HasField("sampling") else None
        events = self.service.generate(
            principal,
            handle,
            request.max_tokens or 64,
            list(request.stop),
            sampling,
            job_hook=_cancel_with(context),
        )
        yield from self._events(events, handle, principal)

    @rpc_stream
    def Chat(
        self, request: pb.ChatRequest, context: Any, principal: Principal
    ) -> Iterator[pb.GenerateEvent]:
        handle = _handle(request.handle)
        prompt = self.service.chat_tokens(principal, handle, request.message)
        sampling = _sampling(request.sampling) if request.HasField("sampling") else None
        events = self.service.generate(
            principal, handle, request.max_tokens or 256, list(request.stop), sampling,
            prompt_tokens=prompt, job_hook=_cancel_with(context),
        )  # fmt: skip
        yield from self._events(events, handle, principal)

    @rpc
    def Reset(
        self, request: pb.HandleRequest, context: Any, principal: Principal
    ) -> pb.ResetResponse:
        session = self.service.reset(principal, _handle(request.handle))
        return pb.ResetResponse(**self._handle_and_receipt(session))

    @rpc
    def Fork(
        self, request: pb.HandleRequest, context: Any, principal: Principal
    ) -> pb.ForkResponse:
        child = self.service.fork(principal, _handle(request.handle))
        return pb.ForkResponse(**self._handle_and_receipt(child))

    @rpc
    def Close(
        self, request: pb.HandleRequest, context: Any, principal: Principal
    ) -> pb.CloseResponse:
        self.service.close(principal, _handle(request.handle))
        return pb.CloseResponse()

    @rpc
    def Inspect(
        self, request: pb.InspectRequest, context: Any, principal: Principal
    ) -> pb.InspectResponse:
        receipt, text, logits = self.service.inspect(
            principal, _handle(request.handle), request.include_text, request.include_logits
        )
        return pb.InspectResponse(
            receipt=receipt_pb(receipt),
            retained_text=text,
            logits=b"" if logits is None else logits.astype("<f4").tobytes(),
        )

    @rpc
    def Trace(
        self, request: pb.HandleRequest, context: Any, principal: Principal
    ) -> pb.TraceResponse:
        events = self.service.trace(principal, _handle(request.handle))
        return pb.TraceResponse(
            events=[
                pb.TraceEvent(
                    at_token=e["at_token"],
                    evicted_logical=_range(e["evicted_logical"]),
                    evicted_cache=_range(e["evicted_cache"]),
                    shift_delta=e["shift_delta"],
                    shifted_cache=_range(e["shifted_cache"]),
                )
                for e in events
            ]
        )

    @rpc
    def List(
        self, request: pb.ListSessionsRequest, context: Any, principal: Principal
    ) -> pb.ListSessionsResponse:
        return pb.ListSessionsResponse(
            sessions=[receipt_pb(r) for r in self.service.list_sessions(principal)]
        )


class AdminServicer(_Base, pb_grpc.AdminServicer):
    @rpc
    def Stats(
        self, request: pb.StatsRequest, context: Any, principal: Principal
    ) -> pb.StatsResponse:
        return pb.StatsResponse(**self.service.stats(principal))

    @rpc
    def ListModels(
        self, request: pb.ListModelsRequest, context: Any, principal: Principal
    ) -> pb.ListModelsResponse:
        from daemon.models import load_lock

        lock = load_lock()
        return pb.ListModelsResponse(
            models=[
                pb.ModelInfo(
                    name=e.name,
                    sha256=e.sha256,
                    loaded=e.name == self.service.entry.name,
                    is_default=e.name == lock.default,
                    default_sinks=e.default_sinks,
                    default_window=e.default_window,
                )
                for e in lock.models.values()
            ]
        )

    @rpc
    def ListAllSessions(
        self, request: pb.ListSessionsRequest, context: Any, principal: Principal
    ) -> pb.ListSessionsResponse:
        return pb.ListSessionsResponse(
            sessions=[receipt_pb(r) for r in self.service.list_all(principal)]
        )
