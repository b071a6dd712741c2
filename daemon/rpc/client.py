"""sinkd's one gRPC client: the CLI's remote backend, the benchmarks, Python users.

It speaks the runtime's typed objects (`sinkd.daemon.runtime.api`), as the embedded service does,
so a caller does not care which it holds; a refusal comes back as the same typed error the daemon
raised (named in the `sinkd-error` trailer), hence the same exit code. `sessions` and `admin` are
the raw protobuf stubs, for callers that measure or test the wire itself.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.experimental
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sinkd.cachepolicy.sequence import TraceEvent
from sinkd.daemon.private import check_socket_owner
from sinkd.daemon.rpc.narration_client import NarrationCalls
from sinkd.daemon.runtime.api import (
    AppendResult,
    ChatRequest,
    Done,
    Erased,
    GenerationOptions,
    Handle,
    Inspection,
    KeptSelection,
    PassageView,
    PolicyRequest,
    PrefixInfo,
    RecallRequest,
    RecallResult,
    Receipt,
    SamplingRequest,
    Stream,
    TenantHeld,
    TenantImported,
    TenantUsage,
    TokenEvent,
)
from sinkd.errors import (
    ERROR_TRAILER,
    DaemonUnavailable,
    InvalidInput,
    Refused,
    SinkdError,
    by_name,
)
from sinkd.proto import convert
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc

# a stream's messages are read on the thread that iterates it, without grpc's polling thread: a
# wake-up less per token, 0.21 -> 0.17 ms of the client's CPU a token (bench/README.md,
# "transport.py"), which on two busy cores is taken from the decode. Such a stream is iterated on
# one thread only.
CHANNEL_OPTIONS = [(grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]
Metadata = Sequence[tuple[str, str]]


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def default_address() -> str:
    from sinkd.daemon.config import default_socket

    return os.environ.get("SINKD_ADDRESS") or f"unix:{default_socket()}"


LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class TlsFiles:
    """TLS for a TCP address: the CA that signed the daemon's certificate (None: the system's
    roots), and this client's own certificate and key where the daemon asks for one."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    @classmethod
    def from_env(cls) -> TlsFiles | None:
        """$SINKD_TLS_CA, $SINKD_CLIENT_CERT and $SINKD_CLIENT_KEY, or None when none is set
        (not SINKD_TLS_CERT: that is the daemon's own certificate, a setting of `serve`)."""
        names = ("SINKD_TLS_CA", "SINKD_CLIENT_CERT", "SINKD_CLIENT_KEY")
        ca, cert, key = (os.environ.get(n) for n in names)
        if not (ca or cert or key):
            return None
        return cls(*(Path(v) if v else None for v in (ca, cert, key)))


def _host(address: str) -> str:
    return address.removeprefix("dns:").rsplit(":", 1)[0].strip("[]")


def open_channel(address: str, tls: TlsFiles | None, sends_token: bool) -> grpc.Channel:
    """A channel to `address` that never hands a token or text to a stranger: a Unix socket must
    be this user's (or root's); TCP beyond loopback needs TLS before a token is sent."""
    if address.startswith("unix:"):
        check_socket_owner(Path(address.removeprefix("unix:")))
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    if tls is None:
        if sends_token and _host(address) not in LOOPBACK:
            raise InvalidInput(
                f"refusing to send a bearer token in clear to {address}: give the daemon's CA"
                " (--tls-ca, or $SINKD_TLS_CA)"
            )
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    if bool(tls.cert) != bool(tls.key):
        raise InvalidInput(
            "a client certificate and its key go together (--client-cert, --client-key)"
        )
    try:
        creds = grpc.ssl_channel_credentials(
            root_certificates=tls.ca.read_bytes() if tls.ca else None,
            private_key=tls.key.read_bytes() if tls.key else None,
            certificate_chain=tls.cert.read_bytes() if tls.cert else None,
        )
    except OSError as e:
        raise InvalidInput(f"TLS: {e.filename}: {e.strerror}") from None
    return grpc.secure_channel(address, creds, options=CHANNEL_OPTIONS)


SERVING = "SERVING"
NOT_SERVING = "NOT_SERVING"  # loading its model, or stopping


def daemon_health(address: str, timeout: float = 1.0) -> str | None:
    """SERVING or NOT_SERVING, as the daemon at `address` says now; None where none answers (a
    missing socket file answers at once)."""
    if address.startswith("unix:") and not os.path.exists(address.removeprefix("unix:")):
        return None
    with grpc.insecure_channel(address) as channel:
        try:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return None
    return SERVING if reply.status == health_pb2.HealthCheckResponse.SERVING else NOT_SERVING


def daemon_answers(address: str, timeout: float = 1.0) -> bool:
    """Whether a daemon serves at `address` now."""
    return daemon_health(address, timeout) == SERVING


class Client:
    def __init__(
        self,
        address: str | None = None,
        token: str | None = None,
        md: Metadata | None = None,
        wait_s: float | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        """`token` (or $SINKD_TOKEN) authenticates every call; `md` replaces the metadata whole.
        With `wait_s` the channel must be ready within it (DaemonUnavailable otherwise). `tls` (or
        $SINKD_TLS_*) for a daemon's TLS port; without it no token goes beyond loopback."""
        self.address = address or default_address()
        token = token if token is not None else os.environ.get("SINKD_TOKEN")
        self.md: Metadata = md if md is not None else (bearer(token) if token else [])
        self.channel = open_channel(self.address, tls or TlsFiles.from_env(), bool(self.md))
        if wait_s is not None:
            try:
                grpc.channel_ready_future(self.channel).result(timeout=wait_s)
            except grpc.FutureTimeoutError:
                self.channel.close()
                raise DaemonUnavailable(
                    f"no sinkd daemon answers at {self.address}; start one with `sinkd serve`"
                    " (or use --embedded where the command offers it)"
                ) from None
        self.s = pb_grpc.SessionsStub(self.channel)  # type: ignore[no-untyped-call]
        self.admin = pb_grpc.AdminStub(self.channel)  # type: ignore[no-untyped-call]
        self.narration = NarrationCalls(self.channel, self.md, self._refused)  # narrated streams

    def wait_serving(self, deadline_s: float, on_wait: Callable[[], None] = lambda: None) -> None:
        """Return once the daemon says SERVING (its model loaded); `on_wait` is called once if it
        does not yet. DaemonUnavailable past `deadline_s`, or if the daemon goes away."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        waited = False
        try:
            for reply in stub.Watch(health_pb2.HealthCheckRequest(), timeout=deadline_s):
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                if not waited:
                    waited = True
                    on_wait()
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise DaemonUnavailable(
                    f"the daemon at {self.address} did not finish loading its model within"
                    f" {deadline_s:g} s"
                ) from None
            raise DaemonUnavailable(
                f"the daemon at {self.address} went away: {e.details()}"
            ) from None
        raise DaemonUnavailable(f"the daemon at {self.address} ended its health stream")

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self.s, method)(request, metadata=self.md)
        except grpc.RpcError as e:
            raise self._refused(e) from None

    def _refused(self, e: Any) -> SinkdError:
        """The error the daemon raised, rebuilt from the class it named (so the exit code is the
        embedded run's); a refusal by gRPC itself keeps its status."""
        status, details = e.code().name, e.details() or "refused"
        named = dict(e.trailing_metadata() or ()).get(ERROR_TRAILER)
        if named:
            return by_name(named, status, details)
        if status == "UNAVAILABLE":
            return DaemonUnavailable(f"the daemon at {self.address} went away: {details}")
        return Refused(status, details)

    def create(
        self,
        policy: PolicyRequest,
        system_prompt: str = "",
        sampling: SamplingRequest | None = None,
        recall: RecallRequest | None = None,
    ) -> Receipt:
        req = pb.CreateSessionRequest(policy=_policy(policy), system_prompt=system_prompt)
        if sampling is not None:
            req.sampling.CopyFrom(_sampling(sampling))
        if recall is not None:
            req.recall.CopyFrom(_recall(recall))
        return convert.receipt_from_pb(self._call("Create", req).receipt)

    def append(
        self, handle: Handle, text: str | None = None, tokens: list[int] | None = None
    ) -> AppendResult:
        h = convert.handle_to_pb(handle)
        req = (
            pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=tokens))
            if tokens is not None
            else pb.AppendRequest(handle=h, text=text or "")
        )
        r = self._call("Append", req)
        return AppendResult(r.appended, convert.receipt_from_pb(r.receipt))

    def _stream(self, method: str, request: Any) -> Iterator[TokenEvent | Done]:
        try:
            for ev in getattr(self.s, method)(request, metadata=self.md):
                yield convert.event_from_pb(ev)
        except grpc.RpcError as e:
            raise self._refused(e) from None

    def generate(self, handle: Handle, options: GenerationOptions) -> Stream:
        req = pb.GenerateRequest(
            handle=convert.handle_to_pb(handle),
            max_tokens=options.max_tokens or 0,  # 0: unset
            stop=list(options.stops),
        )
        if options.sampling is not None:
            req.sampling.CopyFrom(_sampling(options.sampling))
        return self._stream("Generate", req)

    def chat(self, handle: Handle, request: ChatRequest) -> Stream:
        options = request.options
        req = pb.ChatRequest(
            handle=convert.handle_to_pb(handle),
            message=request.message,
            max_tokens=options.max_tokens or 0,  # 0: unset
            stop=list(options.stops),
            private=request.private,
            reply_before=request.reply_before,
        )
        if options.sampling is not None:
            req.sampling.CopyFrom(_sampling(options.sampling))
        return self._stream("Chat", req)

    def reset(self, handle: Handle) -> tuple[Receipt, Erased]:
        r = self._call("Reset", pb.HandleRequest(handle=convert.handle_to_pb(handle)))
        return convert.receipt_from_pb(r.receipt), Erased(1, r.purge_owed)

    def fork(self, handle: Handle) -> Receipt:
        r = self._call("Fork", pb.HandleRequest(handle=convert.handle_to_pb(handle)))
        return convert.receipt_from_pb(r.receipt)

    def close(self, handle: Handle) -> Erased:
        r = self._call("Close", pb.HandleRequest(handle=convert.handle_to_pb(handle)))
        return Erased(1, r.purge_owed)

    def export_session(self, handle: Handle) -> Iterator[bytes]:
        """The session's archive, piece by piece."""
        try:
            request = pb.HandleRequest(handle=convert.handle_to_pb(handle))
            for piece in self.s.Export(request, metadata=self.md):
                yield piece.data
        except grpc.RpcError as e:
            raise self._refused(e) from None

    def import_session(self, data: bytes) -> Receipt:
        step = 1 << 20  # gRPC's default message limit is 4 MiB
        pieces = (pb.ArchivePiece(data=data[at : at + step]) for at in range(0, len(data), step))
        r = self._call("Import", pieces)
        return convert.receipt_from_pb(r.receipt)

    def release(self, handle: Handle) -> None:
        """The session moved to another node: closed here, answered UNAVAILABLE from now on."""
        self._call("Release", pb.HandleRequest(handle=convert.handle_to_pb(handle)))

    def inspect(
        self, handle: Handle, include_text: bool = False, include_logits: bool = False
    ) -> Inspection:
        r = self._call(
            "Inspect",
            pb.InspectRequest(
                handle=convert.handle_to_pb(handle),
                include_text=include_text,
                include_logits=include_logits,
            ),
        )
        import numpy as np

        logits = np.frombuffer(r.logits, dtype="<f4") if r.logits else None
        return Inspection(convert.receipt_from_pb(r.receipt), r.retained_text, logits)

    def trace(self, handle: Handle) -> list[TraceEvent]:
        r = self._call("Trace", pb.HandleRequest(handle=convert.handle_to_pb(handle)))
        return [convert.trace_from_pb(e) for e in r.events]

    def recall(self, handle: Handle, query: str) -> RecallResult:
        r = self._call("Recall", pb.RecallRequest(handle=convert.handle_to_pb(handle), query=query))
        return RecallResult(convert.report_from_pb(r.report), convert.receipt_from_pb(r.receipt))

    def memory(
        self, handle: Handle, search: str = "", limit: int = 100, speaker: str | None = None
    ) -> list[PassageView]:
        req = pb.MemoryRequest(
            handle=convert.handle_to_pb(handle), search=search, limit=limit, speaker=speaker or ""
        )
        return [convert.passage_from_pb(p) for p in self._call("Memory", req).passages]

    def forget(
        self,
        handle: Handle,
        passage_id: int | None = None,
        logical: tuple[int, int] | None = None,
        speaker: str | None = None,
    ) -> Erased:
        req = pb.ForgetRequest(handle=convert.handle_to_pb(handle))
        if passage_id is not None:
            req.passage_id = passage_id
        elif logical is not None:
            req.logical.CopyFrom(pb.Range(start=logical[0], end=logical[1]))
        elif speaker is not None:
            req.speaker = speaker
        r = self._call("Forget", req)
        return Erased(int(r.forgotten), r.purge_owed)

    def kept(
        self, which: KeptSelection | None = None, search: str = "", limit: int = 100
    ) -> builtins.list[PassageView]:
        """The tenant's memory across conversations: the newest, or the best matches."""
        req = pb.KeptRequest(
            which=convert.kept_selection_to_pb(which or KeptSelection()), search=search, limit=limit
        )
        return [convert.passage_from_pb(p) for p in self._call("Kept", req).passages]

    def forget_kept(self, which: KeptSelection) -> Erased:
        req = pb.ForgetKeptRequest(which=convert.kept_selection_to_pb(which))
        r = self._call("ForgetKept", req)
        return Erased(int(r.forgotten), r.purge_owed)

    def remember(self, text: str) -> builtins.list[PassageView]:
        """Keep a text in the tenant's memory across conversations, as the user's words."""
        found = self._call("Remember", pb.RememberRequest(text=text)).passages
        return [convert.passage_from_pb(p) for p in found]

    def list(self) -> list[Receipt]:
        sessions = self._call("List", pb.ListSessionsRequest()).sessions
        return [convert.receipt_from_pb(r) for r in sessions]

    def list_prefixes(self) -> builtins.list[PrefixInfo]:
        """The stored prefix states this token may see (the admin's: all)."""
        found = self._call("ListPrefixes", pb.ListPrefixesRequest()).prefixes
        return [convert.prefix_from_pb(p) for p in found]

    def resolve(self, session_id: str) -> Handle:
        """The owner's current handle for an id (the CLI names sessions by id alone). An id the
        owner's list lacks is asked of the daemon as it is, which says why: gone (NOT_FOUND) or
        on another node (UNAVAILABLE)."""
        for r in self.list():
            if r.session_id == session_id:
                return r.handle
        return Handle(session_id, "")

    def list_all(self) -> builtins.list[Receipt]:
        """Every session of the daemon (the admin's token)."""
        try:
            r = self.admin.ListAllSessions(pb.ListSessionsRequest(), metadata=self.md)
        except grpc.RpcError as e:
            raise self._refused(e) from None
        return [convert.receipt_from_pb(x) for x in r.sessions]

    def tenants(self) -> builtins.list[TenantUsage]:
        """Each tenant's holdings and limits (the admin's token)."""
        try:
            r = self.admin.Stats(pb.StatsRequest(), metadata=self.md)
        except grpc.RpcError as e:
            raise self._refused(e) from None
        return [convert.tenant_usage_from_pb(t) for t in r.tenants]

    # --- a tenant moved whole (the admin's token) ---

    def _admin(self, method: str, request: Any) -> Any:
        try:
            return getattr(self.admin, method)(request, metadata=self.md)
        except grpc.RpcError as e:
            raise self._refused(e) from None

    def held_tenants(self, arrived: str = "") -> tuple[builtins.list[TenantHeld], str]:
        """What the node holds of each tenant, and the tenant move `arrived` brought there."""
        r = self._admin("HeldTenants", pb.HeldTenantsRequest(arrived=arrived))
        held = [
            TenantHeld(t.tenant, t.sessions, t.passages, t.prefixes, t.state, t.move_id, t.peer)
            for t in r.tenants
        ]
        return held, r.arrived

    def mark_tenant(self, tenant: str, state: str, move_id: str = "", peer: str = "") -> None:
        request = pb.MarkTenantRequest(tenant=tenant, state=state, move_id=move_id, peer=peer)
        self._admin("MarkTenant", request)

    def export_tenant(self, tenant: str, move_id: str = "") -> Iterator[bytes]:
        try:
            request = pb.TenantRequest(tenant=tenant, move_id=move_id)
            for piece in self.admin.ExportTenant(request, metadata=self.md):
                yield piece.data
        except grpc.RpcError as e:
            raise self._refused(e) from None

    def import_tenant(self, data: bytes) -> TenantImported:
        step = 1 << 20
        pieces = (pb.ArchivePiece(data=data[at : at + step]) for at in range(0, len(data), step))
        r = self._admin("ImportTenant", pieces)
        return TenantImported(r.tenant, r.sessions, r.passages, r.prefixes, r.move_id)

    def release_tenant(self, tenant: str, move_id: str) -> Erased:
        r = self._admin("ReleaseTenant", pb.TenantRequest(tenant=tenant, move_id=move_id))
        return Erased(int(r.released), r.purge_owed)

    def stop_daemon(self) -> None:
        """Ask the daemon to stop gracefully (the admin's token)."""
        try:
            self.admin.Stop(pb.StopRequest(), metadata=self.md)
        except grpc.RpcError as e:
            raise self._refused(e) from None

    def shutdown(self) -> None:
        self.channel.close()


def _policy(p: PolicyRequest) -> pb.Policy:
    return pb.Policy(
        name=p.name,
        sinks=p.sinks,
        window=p.window,
        evict_chunk=p.evict_chunk or 0,
        compact_interval=p.compact_interval,
        pin_system_prompt=p.pin_system_prompt,
        ingest_chunk=p.ingest_chunk,
        fill_window=p.fill_window,
    )


def _recall(r: RecallRequest) -> pb.RecallSettings:
    return pb.RecallSettings(
        mode=r.mode or "",
        budget=r.budget,
        passages=r.passages,
        threshold=r.threshold,
        private=r.private,
    )


def _sampling(s: SamplingRequest) -> pb.Sampling:
    return pb.Sampling(
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        min_p=s.min_p,
        seed=s.seed,
        repeat_penalty=s.repeat_penalty,
        repeat_last_n=s.repeat_last_n,
    )
