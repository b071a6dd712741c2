"""gRPC servicers: protobuf in, protobuf out; typed errors become status codes here and nowhere else.

Each error class carries its status; the servicer aborts with it, a bounded message, and the class
name in the `sinkd-error` trailer (the CLI rebuilds the same class, hence the same exit code).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from sinkd.daemon.callers.auth import Authenticator
from sinkd.daemon.callers.limits import CallLimits
from sinkd.daemon.runtime.access import admin_only
from sinkd.daemon.runtime.api import (
    CancelToken,
    ChatRequest,
    GenerationOptions,
    Handle,
    PolicyRequest,
    RecallRequest,
    SamplingRequest,
)
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import ERROR_TRAILER, InvalidInput, SinkdError, message_of
from sinkd.proto.convert import (
    event_to_pb,
    handle_from_pb,
    handle_to_pb,
    kept_selection_from_pb,
    model_to_pb,
    passage_to_pb,
    prefix_to_pb,
    receipt_to_pb,
    report_to_pb,
    stats_to_pb,
    trace_to_pb,
)
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc

log = logging.getLogger("sinkd.rpc")
Method = Callable[[Any, Any, grpc.ServicerContext], Any]


def abort(context: grpc.ServicerContext, error: SinkdError) -> None:
    context.set_trailing_metadata(((ERROR_TRAILER, type(error).__name__),))
    context.abort(grpc.StatusCode[error.status], message_of(error))


ARCHIVE_PIECE = 1 << 20  # bytes per ArchivePiece (gRPC's default message limit is 4 MiB)
MAX_ARCHIVE_BYTES = 1 << 30  # an archive is held whole while it is checked


def _session_of(request: Any) -> str:
    handle = getattr(request, "handle", None)
    return handle.session_id[:128] if handle is not None else ""


def any_time(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A call answered while the model loads too (the admin's Stop); the others get Loading."""
    fn.any_time = True  # type: ignore[attr-defined]
    return fn


def rpc(fn: Callable[..., Any]) -> Method:
    """Authenticate, refuse while loading, admit against the call limits, run, and translate a
    sinkd error."""
    loaded = not getattr(fn, "any_time", False)

    @functools.wraps(fn)
    def wrapper(self: BaseServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            principal = self.auth(context)
            if loaded:
                self.service.check_serving()
            with self.admit(principal, request, context):
                return fn(self, request, context, principal)
        except SinkdError as e:
            abort(context, e)

    return wrapper


def rpc_stream(fn: Callable[..., Iterator[Any]]) -> Method:
    @functools.wraps(fn)
    def wrapper(self: BaseServicer, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            principal = self.auth(context)
            self.service.check_serving()
            with self.admit(principal, request, context):
                yield from fn(self, request, context, principal)
        except SinkdError as e:
            abort(context, e)

    return wrapper


class BaseServicer:
    def __init__(
        self, service: SinkdService, authenticator: Authenticator, limits: CallLimits | None
    ) -> None:
        self.service = service
        self.authenticator = authenticator
        self.limits = limits

    def auth(self, context: grpc.ServicerContext) -> Principal:
        """Who calls, and a tenant this node serves now (UNAVAILABLE: one moving between nodes)."""
        try:
            principal = self.authenticator.authenticate(context.invocation_metadata() or ())
        except SinkdError:
            self.service.metrics.auth_rejections.inc()
            raise
        self.service.tenants.check_here(principal)
        return principal

    def admit(self, principal: Principal, request: Any, context: grpc.ServicerContext) -> Any:
        """A slot under the call limits; a fair wait ends by the client's deadline."""
        if self.limits is None:
            return contextlib.nullcontext()
        return self.limits.admit(
            principal.tenant or "(admin)", _session_of(request), context.time_remaining()
        )


def _archive_of(pieces: Iterator[pb.ArchivePiece]) -> bytes:
    """A streamed archive, whole (it is checked whole), at most MAX_ARCHIVE_BYTES."""
    out, size = [], 0
    for piece in pieces:
        size += len(piece.data)
        if size > MAX_ARCHIVE_BYTES:
            raise InvalidInput(f"the archive is larger than {MAX_ARCHIVE_BYTES} bytes")
        out.append(piece.data)
    return b"".join(out)


def _handle(h: pb.Handle) -> Handle:
    if not h.session_id:
        raise InvalidInput("handle.session_id is required")
    return handle_from_pb(h)


def _options(request: pb.GenerateRequest | pb.ChatRequest) -> GenerationOptions:
    return GenerationOptions(
        max_tokens=request.max_tokens or None,  # proto3: 0 is unset
        stops=tuple(request.stop),
        sampling=_sampling(request.sampling) if request.HasField("sampling") else None,
    )


def _sampling(s: pb.Sampling) -> SamplingRequest:
    """The request's sampling fields; the runtime validates them (INVALID_ARGUMENT by name)."""
    return SamplingRequest(
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p or 1.0,
        min_p=s.min_p,
        seed=s.seed,
        repeat_penalty=s.repeat_penalty if s.HasField("repeat_penalty") else None,
        repeat_last_n=s.repeat_last_n if s.HasField("repeat_last_n") else None,
    )


def _timeout(context: grpc.ServicerContext) -> float | None:
    """The client's deadline, if it set one (None: the daemon's own call_timeout_s)."""
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining < 1e9 else None


def _cancel_with(context: grpc.ServicerContext) -> CancelToken:
    """The RPC's cancel: a client that goes away cancels its work within one scheduler step."""
    token = CancelToken()
    context.add_callback(token.cancel)
    if not context.is_active():
        token.cancel()
    return token


def _optional(message: Any, name: str) -> Any:
    return getattr(message, name) if message.HasField(name) else None


class SessionsServicer(BaseServicer, pb_grpc.SessionsServicer):
    @rpc
    def Create(
        self, request: pb.CreateSessionRequest, context: Any, principal: Principal
    ) -> pb.CreateSessionResponse:
        p = request.policy
        policy = PolicyRequest(
            name=p.name or "sink",
            sinks=_optional(p, "sinks"),
            window=_optional(p, "window"),
            evict_chunk=p.evict_chunk or None,
            compact_interval=_optional(p, "compact_interval"),
            pin_system_prompt=p.pin_system_prompt,
            ingest_chunk=_optional(p, "ingest_chunk"),
            fill_window=p.fill_window,
        )
        sampling = _sampling(request.sampling) if request.HasField("sampling") else None
        r = request.recall
        recall = RecallRequest(
            mode=r.mode or None,
            budget=_optional(r, "budget"),
            passages=_optional(r, "passages"),
            threshold=_optional(r, "threshold"),
            private=r.private,
        )
        receipt = self.service.create(
            principal, policy, sampling, request.system_prompt, recall=recall
        )
        return pb.CreateSessionResponse(
            handle=handle_to_pb(receipt.handle), receipt=receipt_to_pb(receipt)
        )

    @rpc
    def Append(
        self, request: pb.AppendRequest, context: Any, principal: Principal
    ) -> pb.AppendResponse:
        which = request.WhichOneof("content")
        tokens = list(request.tokens.ids) if which == "tokens" else None
        text = request.text if which == "text" else ""
        result = self.service.append(
            principal,
            _handle(request.handle),
            text,
            tokens,
            cancel=_cancel_with(context),
            timeout=_timeout(context),
        )
        return pb.AppendResponse(appended=result.appended, receipt=receipt_to_pb(result.receipt))

    @rpc_stream
    def Generate(
        self, request: pb.GenerateRequest, context: Any, principal: Principal
    ) -> Iterator[pb.GenerateEvent]:
        events = self.service.generate(
            principal,
            _handle(request.handle),
            _options(request),
            cancel=_cancel_with(context),
            timeout=_timeout(context),
        )
        for event in events:
            yield event_to_pb(event)

    @rpc_stream
    def Chat(
        self, request: pb.ChatRequest, context: Any, principal: Principal
    ) -> Iterator[pb.GenerateEvent]:
        chat = ChatRequest(
            request.message,
            _options(request),
            private=request.private,
            reply_before=request.reply_before,
        )
        events = self.service.chat(
            principal,
            _handle(request.handle),
            chat,
            cancel=_cancel_with(context),
            timeout=_timeout(context),
        )
        for event in events:
            yield event_to_pb(event)

    @rpc
    def Reset(
        self, request: pb.HandleRequest, context: Any, principal: Principal
    ) -> pb.ResetResponse:
        receipt, erased = self.service.reset(principal, _handle(request.handle), _timeout(context))
        return pb.ResetResponse(
            handle=handle_to_pb(receipt.handle),
            receipt=receipt_to_pb(receipt),
            purge_owed=erased.purge_owed,
        )

    @rpc
    def Fork(
        self, request: pb.HandleRequest, context: Any, principal: Principal
    ) -> pb.ForkResponse:
        receipt = self.service.fork(principal, _handle(request.handle))
        return pb.ForkResponse(handle=handle_to_pb(receipt.handle), receipt=receipt_to_pb(receipt))

    @rpc
    def Close(
        self, request: pb.HandleRequest, context: Any, principal: Principal
    ) -> pb.CloseResponse:
        erased = self.service.close(principal, _handle(request.handle), _timeout(context))
        return pb.CloseResponse(purge_owed=erased.purge_owed)

    @rpc_stream
    def Export(
        self, request: pb.HandleRequest, context: Any, principal: Principal
    ) -> Iterator[pb.ArchivePiece]:
        for piece in self.service.moves.export(principal, _handle(request.handle)):
            for at in range(0, len(piece), ARCHIVE_PIECE):
                yield pb.ArchivePiece(data=piece[at : at + ARCHIVE_PIECE])

    @rpc
    def Release(
        self, request: pb.HandleRequest, context: Any, principal: Principal
    ) -> pb.CloseResponse:
        self.service.moves.release(principal, _handle(request.handle))
        return pb.CloseResponse()

    @rpc
    def Import(self, request: Any, context: Any, principal: Principal) -> pb.ImportResponse:
        receipt = self.service.moves.import_(principal, _archive_of(request))
        return pb.ImportResponse(
            handle=handle_to_pb(receipt.handle), receipt=receipt_to_pb(receipt)
        )

    @rpc
    def Inspect(
        self, request: pb.InspectRequest, context: Any, principal: Principal
    ) -> pb.InspectResponse:
        seen = self.service.reads.inspect(
            principal, _handle(request.handle), request.include_text, request.include_logits
        )
        return pb.InspectResponse(
            receipt=receipt_to_pb(seen.receipt),
            retained_text=seen.retained_text,
            logits=b"" if seen.logits is None else seen.logits.astype("<f4").tobytes(),
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
    def ListPrefixes(
        self, request: pb.ListPrefixesRequest, context: Any, principal: Principal
    ) -> pb.ListPrefixesResponse:
        return pb.ListPrefixesResponse(
            prefixes=[prefix_to_pb(p) for p in self.service.list_prefixes(principal)]
        )

    @rpc
    def Recall(
        self, request: pb.RecallRequest, context: Any, principal: Principal
    ) -> pb.RecallResponse:
        result = self.service.memory.recall_into(
            principal,
            _handle(request.handle),
            request.query,
            budget=_optional(request, "budget"),
            passages=_optional(request, "passages"),
            threshold=_optional(request, "threshold"),
            timeout=_timeout(context),
        )
        return pb.RecallResponse(
            report=report_to_pb(result.report), receipt=receipt_to_pb(result.receipt)
        )

    @rpc
    def Memory(
        self, request: pb.MemoryRequest, context: Any, principal: Principal
    ) -> pb.MemoryResponse:
        found = self.service.memory.memory(
            principal,
            _handle(request.handle),
            request.search,
            request.limit or 100,
            request.speaker or None,
        )
        return pb.MemoryResponse(passages=[passage_to_pb(p) for p in found])

    @rpc
    def Forget(
        self, request: pb.ForgetRequest, context: Any, principal: Principal
    ) -> pb.ForgetResponse:
        which = request.WhichOneof("target")
        if which is None:
            raise InvalidInput("forget: name a passage_id, a logical range or a speaker")
        erased = self.service.memory.forget(
            principal,
            _handle(request.handle),
            passage_id=request.passage_id if which == "passage_id" else None,
            logical=(request.logical.start, request.logical.end) if which == "logical" else None,
            speaker=request.speaker if which == "speaker" else None,
            time_left=_timeout(context),
        )
        return pb.ForgetResponse(forgotten=erased.count, purge_owed=erased.purge_owed)

    @rpc
    def Kept(self, request: pb.KeptRequest, context: Any, principal: Principal) -> pb.KeptResponse:
        found = self.service.across.listing(
            principal,
            kept_selection_from_pb(request.which),
            request.search,
            request.limit or 100,
        )
        return pb.KeptResponse(passages=[passage_to_pb(p) for p in found])

    @rpc
    def ForgetKept(
        self, request: pb.ForgetKeptRequest, context: Any, principal: Principal
    ) -> pb.ForgetResponse:
        erased = self.service.across.forget(
            principal, kept_selection_from_pb(request.which), _timeout(context)
        )
        return pb.ForgetResponse(forgotten=erased.count, purge_owed=erased.purge_owed)

    @rpc
    def Remember(
        self, request: pb.RememberRequest, context: Any, principal: Principal
    ) -> pb.KeptResponse:
        kept = self.service.across.remember(principal, request.text)
        return pb.KeptResponse(passages=[passage_to_pb(p) for p in kept])


class AdminServicer(BaseServicer, pb_grpc.AdminServicer):
    """Admin calls are not admitted against the call limits: they never wait on a session."""

    def __init__(
        self, service: SinkdService, authenticator: Authenticator, ask_stop: Callable[[], None]
    ) -> None:
        super().__init__(service, authenticator, None)
        self.ask_stop = ask_stop

    def admit(self, principal: Principal, request: Any, context: grpc.ServicerContext) -> Any:
        return contextlib.nullcontext()

    @rpc
    @any_time
    def Stop(self, request: pb.StopRequest, context: Any, principal: Principal) -> pb.StopResponse:
        admin_only(principal, "stopping the daemon")
        self.ask_stop()
        return pb.StopResponse()

    @rpc
    def Stats(
        self, request: pb.StatsRequest, context: Any, principal: Principal
    ) -> pb.StatsResponse:
        return stats_to_pb(self.service.reads.stats(principal))

    @rpc
    def ListModels(
        self, request: pb.ListModelsRequest, context: Any, principal: Principal
    ) -> pb.ListModelsResponse:
        return pb.ListModelsResponse(
            models=[model_to_pb(m) for m in self.service.reads.list_models(principal)]
        )

    @rpc
    def ListAllSessions(
        self, request: pb.ListSessionsRequest, context: Any, principal: Principal
    ) -> pb.ListSessionsResponse:
        return pb.ListSessionsResponse(
            sessions=[receipt_to_pb(r) for r in self.service.reads.list_all(principal)]
        )

    # --- a tenant moved whole ---

    @rpc
    def HeldTenants(
        self, request: pb.HeldTenantsRequest, context: Any, principal: Principal
    ) -> pb.HeldTenantsResponse:
        held, arrived = self.service.tenants.held(principal, request.arrived)
        return pb.HeldTenantsResponse(
            tenants=[pb.HeldTenant(**dataclasses.asdict(h)) for h in held], arrived=arrived
        )

    @rpc
    def MarkTenant(
        self, request: pb.MarkTenantRequest, context: Any, principal: Principal
    ) -> pb.MarkTenantResponse:
        self.service.tenants.mark(
            principal, request.tenant, request.state, request.move_id, request.peer
        )
        return pb.MarkTenantResponse()

    @rpc_stream
    def ExportTenant(
        self, request: pb.TenantRequest, context: Any, principal: Principal
    ) -> Iterator[pb.ArchivePiece]:
        for piece in self.service.tenants.export(principal, request.tenant, request.move_id):
            for at in range(0, len(piece), ARCHIVE_PIECE):
                yield pb.ArchivePiece(data=piece[at : at + ARCHIVE_PIECE])

    @rpc
    def ImportTenant(self, request: Any, context: Any, principal: Principal) -> pb.TenantImported:
        admin_only(principal, "importing a tenant")  # before its pieces are read
        imported = self.service.tenants.import_(principal, _archive_of(request))
        return pb.TenantImported(**dataclasses.asdict(imported))

    @rpc
    def ReleaseTenant(
        self, request: pb.TenantRequest, context: Any, principal: Principal
    ) -> pb.ReleaseTenantResponse:
        if not request.move_id:
            raise InvalidInput("release: name the move (move_id) that took the tenant away")
        erased = self.service.tenants.release(principal, request.tenant, request.move_id)
        return pb.ReleaseTenantResponse(released=erased.count, purge_owed=erased.purge_owed)
