"""gRPC servicers: protobuf in, protobuf out; typed errors become status codes here and nowhere else.

Each error class carries its status; the servicer aborts with it, a bounded message, and the class
name in the `sinkd-error` trailer (the CLI rebuilds the same class, hence the same exit code).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from sinkd.cachepolicy.errors import SinkdError
from sinkd.daemon.errors import ERROR_TRAILER, InvalidInput, message_of
from sinkd.daemon.rpc.auth import Authenticator
from sinkd.daemon.rpc.limits import CallLimits
from sinkd.daemon.runtime.jobs import Job
from sinkd.daemon.runtime.requests import PolicyRequest, RecallRequest
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.proto.convert import receipt_to_pb, to_pb, trace_to_pb
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc

log = logging.getLogger("sinkd.rpc")
Method = Callable[[Any, Any, grpc.ServicerContext], Any]


def abort(context: grpc.ServicerContext, error: SinkdError) -> None:
    context.set_trailing_metadata(((ERROR_TRAILER, type(error).__name__),))
    context.abort(grpc.StatusCode[error.status], message_of(error))


def _session_of(request: Any) -> str:
    handle = getattr(request, "handle", None)
    return handle.session_id[:128] if handle is not None else ""


def rpc(fn: Callable[..., Any]) -> Method:
    """Authenticate, admit against the call limits, run, and translate a sinkd error."""

    @functools.wraps(fn)
    def wrapper(self: _Base, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            principal = self.auth(context)
            with self.admit(principal, request):
                return fn(self, request, context, principal)
        except SinkdError as e:
            abort(context, e)

    return wrapper


def rpc_stream(fn: Callable[..., Iterator[Any]]) -> Method:
    @functools.wraps(fn)
    def wrapper(self: _Base, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            principal = self.auth(context)
            with self.admit(principal, request):
                yield from fn(self, request, context, principal)
        except SinkdError as e:
            abort(context, e)

    return wrapper


class _Base:
    def __init__(
        self, service: SinkdService, authenticator: Authenticator, limits: CallLimits | None
    ) -> None:
        self.service = service
        self.authenticator = authenticator
        self.limits = limits

    def auth(self, context: grpc.ServicerContext) -> Principal:
        try:
            return self.authenticator.authenticate(context.invocation_metadata() or ())
        except SinkdError:
            self.service.metrics.auth_rejections.inc()
            raise

    def admit(self, principal: Principal, request: Any) -> Any:
        if self.limits is None:
            return contextlib.nullcontext()
        return self.limits.admit(principal.tenant or "(admin)", _session_of(request))


def _handle(h: pb.Handle) -> tuple[str, str]:
    if not h.session_id:
        raise InvalidInput("handle.session_id is required")
    return h.session_id, h.generation


def _sampling(s: pb.Sampling | None) -> dict[str, Any] | None:
    """The request's sampling fields; the runtime validates them (INVALID_ARGUMENT by name)."""
    if s is None:
        return None
    fields: dict[str, Any] = {
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p or 1.0,
        "min_p": s.min_p,
        "seed": s.seed,
    }
    for name in ("repeat_penalty", "repeat_last_n"):
        if s.HasField(name):
            fields[name] = getattr(s, name)
    return fields


def _timeout(context: grpc.ServicerContext) -> float | None:
    """The client's deadline, if it set one (None: the daemon's own call_timeout_s)."""
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining < 1e9 else None


def _cancel_with(context: grpc.ServicerContext) -> Callable[[Job], None]:
    """Hook a job to the RPC: a client that goes away cancels it within one scheduler step."""

    def hook(job: Job) -> None:
        context.add_callback(job.cancel)
        if not context.is_active():
            job.cancel()

    return hook


def _events(events: Iterator[tuple[str, Any]]) -> Iterator[pb.GenerateEvent]:
    for kind, payload in events:
        if kind == "token":
            yield pb.GenerateEvent(token=pb.Token(**payload))
        else:  # the receipt was taken on the engine thread when the generation finished
            yield pb.GenerateEvent(
                done=pb.Done(
                    reason=payload["reason"],
                    generated=payload["generated"],
                    receipt=receipt_to_pb(payload["receipt"]),
                    recall=to_pb(payload["recall"], pb.RecallReport)
                    if payload.get("recall")
                    else None,
                )
            )


class SessionsServicer(_Base, pb_grpc.SessionsServicer):
    def _handle_and_receipt(self, session: Any) -> dict[str, Any]:
        return {
            "handle": pb.Handle(session_id=session.id, generation=session.generation),
            "receipt": receipt_to_pb(self.service.receipt(session)),
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
            compact_interval=p.compact_interval if p.HasField("compact_interval") else None,
            pin_system_prompt=p.pin_system_prompt,
            ingest_chunk=p.ingest_chunk if p.HasField("ingest_chunk") else None,
        )
        sampling = _sampling(request.sampling if request.HasField("sampling") else None)
        r = request.recall
        recall = RecallRequest(
            mode=r.mode or None,
            budget=r.budget if r.HasField("budget") else None,
            passages=r.passages if r.HasField("passages") else None,
            threshold=r.threshold if r.HasField("threshold") else None,
        )
        session = self.service.create(
            principal, policy, sampling, request.system_prompt, recall=recall
        )
        return pb.CreateSessionResponse(**self._handle_and_receipt(session))

    @rpc
    def Append(
        self, request: pb.AppendRequest, context: Any, principal: Principal
    ) -> pb.AppendResponse:
        which = request.WhichOneof("content")
        tokens = list(request.tokens.ids) if which == "tokens" else None
        text = request.text if which == "text" else ""
        appended, receipt = self.service.append(
            principal,
            _handle(request.handle),
            text,
            tokens,
            job_hook=_cancel_with(context),
            timeout=_timeout(context),
        )
        return pb.AppendResponse(appended=appended, receipt=receipt_to_pb(receipt))

    @rpc_stream
    def Generate(
        self, request: pb.GenerateRequest, context: Any, principal: Principal
    ) -> Iterator[pb.GenerateEvent]:
        events = self.service.generate(
            principal,
            _handle(request.handle),
            request.max_tokens or 64,
            list(request.stop),
            _sampling(request.sampling) if request.HasField("sampling") else None,
            job_hook=_cancel_with(context),
            timeout=_timeout(context),
        )
        yield from _events(events)

    @rpc_stream
    def Chat(
        self, request: pb.ChatRequest, context: Any, principal: Principal
    ) -> Iterator[pb.GenerateEvent]:
        events = self.service.chat(
            principal,
            _handle(request.handle),
            request.message,
            request.max_tokens or 256,
            list(request.stop),
            _sampling(request.sampling) if request.HasField("sampling") else None,
            job_hook=_cancel_with(context),
            timeout=_timeout(context),
        )
        yield from _events(events)

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
        receipt, text, logits = self.service.reads.inspect(
            principal, _handle(request.handle), request.include_text, request.include_logits
        )
        return pb.InspectResponse(
            receipt=receipt_to_pb(receipt),
            retained_text=text,
            logits=b"" if logits is None else logits.astype("<f4").tobytes(),
        )

    @rpc
    def Trace(
        self, request: pb.HandleRequest, context: Any, principal: Principal
    ) -> pb.TraceResponse:
        events = self.service.reads.trace(principal, _handle(request.handle))
        return pb.TraceResponse(events=[trace_to_pb(e) for e in events])

    @rpc
    def List(
        self, request: pb.ListSessionsRequest, context: Any, principal: Principal
    ) -> pb.ListSessionsResponse:
        return pb.ListSessionsResponse(
            sessions=[receipt_to_pb(r) for r in self.service.reads.list_sessions(principal)]
        )

    @rpc
    def Recall(
        self, request: pb.RecallRequest, context: Any, principal: Principal
    ) -> pb.RecallResponse:
        report, receipt = self.service.recall_into(
            principal,
            _handle(request.handle),
            request.query,
            budget=request.budget if request.HasField("budget") else None,
            passages=request.passages if request.HasField("passages") else None,
            threshold=request.threshold if request.HasField("threshold") else None,
            timeout=_timeout(context),
        )
        return pb.RecallResponse(
            report=to_pb(report, pb.RecallReport), receipt=receipt_to_pb(receipt)
        )

    @rpc
    def Memory(
        self, request: pb.MemoryRequest, context: Any, principal: Principal
    ) -> pb.MemoryResponse:
        found = self.service.memory(
            principal, _handle(request.handle), request.search, request.limit or 100
        )
        return pb.MemoryResponse(passages=[to_pb(p, pb.Passage) for p in found])

    @rpc
    def Forget(
        self, request: pb.ForgetRequest, context: Any, principal: Principal
    ) -> pb.ForgetResponse:
        which = request.WhichOneof("target")
        if which is None:
            raise InvalidInput("forget: name a passage_id or a logical range")
        n = self.service.forget(
            principal,
            _handle(request.handle),
            passage_id=request.passage_id if which == "passage_id" else None,
            logical=(request.logical.start, request.logical.end) if which == "logical" else None,
        )
        return pb.ForgetResponse(forgotten=n)


class AdminServicer(_Base, pb_grpc.AdminServicer):
    """Admin calls are not admitted against the call limits: they never wait on a session."""

    def admit(self, principal: Principal, request: Any) -> Any:
        return contextlib.nullcontext()

    @rpc
    def Stats(
        self, request: pb.StatsRequest, context: Any, principal: Principal
    ) -> pb.StatsResponse:
        return pb.StatsResponse(**self.service.reads.stats(principal))

    @rpc
    def ListModels(
        self, request: pb.ListModelsRequest, context: Any, principal: Principal
    ) -> pb.ListModelsResponse:
        return pb.ListModelsResponse(
            models=[pb.ModelInfo(**m) for m in self.service.reads.list_models(principal)]
        )

    @rpc
    def ListAllSessions(
        self, request: pb.ListSessionsRequest, context: Any, principal: Principal
    ) -> pb.ListSessionsResponse:
        return pb.ListSessionsResponse(
            sessions=[receipt_to_pb(r) for r in self.service.reads.list_all(principal)]
        )
