"""Where the CLI's sessions live: a running daemon over gRPC, or an embedded service in this process.

Both speak plain dicts (the same receipt shape as `SinkdService.receipt`), so commands do not care
which one they hold. gRPC errors become typed CLI errors here and nowhere else.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from sinkd.cachepolicy.errors import SinkdError
from sinkd.daemon.errors import (
    ERROR_TRAILER,
    DaemonUnavailable,
    NotFound,
    Refused,
    by_name,
    echo,
)


@dataclass(frozen=True)
class Handle:
    session_id: str
    generation: str


class Backend(Protocol):
    def create(
        self,
        policy: dict[str, Any],
        system_prompt: str = "",
        sampling: dict[str, Any] | None = None,
        recall: dict[str, Any] | None = None,
    ) -> tuple[Handle, dict[str, Any]]: ...
    def append(self, handle: Handle, text: str) -> dict[str, Any]: ...
    def generate(
        self, handle: Handle, max_tokens: int, stops: list[str]
    ) -> Iterator[tuple[str, dict[str, Any]]]: ...
    def chat(
        self, handle: Handle, message: str, max_tokens: int, stops: list[str]
    ) -> Iterator[tuple[str, dict[str, Any]]]: ...
    def reset(self, handle: Handle) -> tuple[Handle, dict[str, Any]]: ...
    def fork(self, handle: Handle) -> tuple[Handle, dict[str, Any]]: ...
    def close(self, handle: Handle) -> None: ...
    def inspect(self, handle: Handle, include_text: bool = False) -> tuple[dict[str, Any], str]: ...
    def trace(self, handle: Handle) -> list[dict[str, Any]]: ...
    def recall(self, handle: Handle, query: str) -> tuple[dict[str, Any], dict[str, Any]]: ...
    def memory(self, handle: Handle, search: str, limit: int) -> list[dict[str, Any]]: ...
    def forget(
        self, handle: Handle, passage_id: int | None, logical: tuple[int, int] | None
    ) -> int: ...
    def list(self) -> list[dict[str, Any]]: ...
    def shutdown(self) -> None: ...


def default_address() -> str:
    from sinkd.daemon.config import default_socket

    return os.environ.get("SINKD_ADDRESS") or f"unix:{default_socket()}"


def daemon_answers(address: str, timeout: float = 1.0) -> bool:
    """Whether a daemon serves at `address` now (a missing socket file answers at once)."""
    if address.startswith("unix:") and not os.path.exists(address.removeprefix("unix:")):
        return False
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


# --- remote ---


def _receipt(message: Any) -> dict[str, Any]:
    from sinkd.proto.convert import receipt_from_pb

    return receipt_from_pb(message)


def from_pb(message: Any) -> dict[str, Any]:
    from sinkd.proto.convert import from_pb as convert

    return convert(message)


def trace_from_pb(message: Any) -> dict[str, Any]:
    from sinkd.proto.convert import trace_from_pb as convert

    return convert(message)


class RemoteBackend:
    def __init__(
        self, address: str | None = None, token: str | None = None, timeout: float = 3.0
    ) -> None:
        import grpc

        from sinkd.proto.v1 import sinkd_pb2 as pb
        from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc

        self.grpc, self.pb = grpc, pb
        self.address = address or default_address()
        token = token if token is not None else os.environ.get("SINKD_TOKEN")
        self.metadata = [("authorization", f"Bearer {token}")] if token else []
        from sinkd.daemon.rpc.client import CHANNEL_OPTIONS

        self.channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise DaemonUnavailable(
                f"no sinkd daemon answers at {self.address}; start one with `sinkd serve`"
                " (or use --embedded where the command offers it)"
            ) from None
        self.stub = pb_grpc.SessionsStub(self.channel)  # type: ignore[no-untyped-call]

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self.stub, method)(request, metadata=self.metadata)
        except self.grpc.RpcError as e:
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

    def _handle(self, h: Handle) -> Any:
        return self.pb.Handle(session_id=h.session_id, generation=h.generation)

    def create(
        self,
        policy: dict[str, Any],
        system_prompt: str = "",
        sampling: dict[str, Any] | None = None,
        recall: dict[str, Any] | None = None,
    ) -> tuple[Handle, dict[str, Any]]:
        pb = self.pb
        req = pb.CreateSessionRequest(policy=pb.Policy(**policy), system_prompt=system_prompt)
        if sampling:
            req.sampling.CopyFrom(pb.Sampling(**sampling))
        if recall:
            req.recall.CopyFrom(pb.RecallSettings(**recall))
        r = self._call("Create", req)
        return Handle(r.handle.session_id, r.handle.generation), _receipt(r.receipt)

    def append(self, handle: Handle, text: str) -> dict[str, Any]:
        r = self._call("Append", self.pb.AppendRequest(handle=self._handle(handle), text=text))
        return _receipt(r.receipt)

    def _stream(self, method: str, request: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        try:
            for ev in getattr(self.stub, method)(request, metadata=self.metadata):
                if ev.HasField("token"):
                    t = ev.token
                    yield (
                        "token",
                        {"id": t.id, "text": t.text, "index": t.index, "latency_ms": t.latency_ms},
                    )
                else:
                    d = ev.done
                    yield (
                        "done",
                        {
                            "reason": d.reason,
                            "generated": d.generated,
                            "receipt": _receipt(d.receipt),
                            "recall": from_pb(d.recall) if d.HasField("recall") else None,
                        },
                    )
        except self.grpc.RpcError as e:
            raise self._refused(e) from None

    def generate(
        self, handle: Handle, max_tokens: int, stops: list[str]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        req = self.pb.GenerateRequest(
            handle=self._handle(handle), max_tokens=max_tokens, stop=stops
        )
        return self._stream("Generate", req)

    def chat(
        self, handle: Handle, message: str, max_tokens: int, stops: list[str]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        req = self.pb.ChatRequest(
            handle=self._handle(handle), message=message, max_tokens=max_tokens, stop=stops
        )
        return self._stream("Chat", req)

    def reset(self, handle: Handle) -> tuple[Handle, dict[str, Any]]:
        r = self._call("Reset", self.pb.HandleRequest(handle=self._handle(handle)))
        return Handle(r.handle.session_id, r.handle.generation), _receipt(r.receipt)

    def fork(self, handle: Handle) -> tuple[Handle, dict[str, Any]]:
        r = self._call("Fork", self.pb.HandleRequest(handle=self._handle(handle)))
        return Handle(r.handle.session_id, r.handle.generation), _receipt(r.receipt)

    def close(self, handle: Handle) -> None:
        self._call("Close", self.pb.HandleRequest(handle=self._handle(handle)))

    def inspect(self, handle: Handle, include_text: bool = False) -> tuple[dict[str, Any], str]:
        r = self._call(
            "Inspect",
            self.pb.InspectRequest(handle=self._handle(handle), include_text=include_text),
        )
        return _receipt(r.receipt), r.retained_text

    def trace(self, handle: Handle) -> list[dict[str, Any]]:
        r = self._call("Trace", self.pb.HandleRequest(handle=self._handle(handle)))
        return [trace_from_pb(e) for e in r.events]

    def recall(self, handle: Handle, query: str) -> tuple[dict[str, Any], dict[str, Any]]:
        r = self._call("Recall", self.pb.RecallRequest(handle=self._handle(handle), query=query))
        return from_pb(r.report), _receipt(r.receipt)

    def memory(self, handle: Handle, search: str, limit: int) -> list[dict[str, Any]]:
        req = self.pb.MemoryRequest(handle=self._handle(handle), search=search, limit=limit)
        return [from_pb(p) for p in self._call("Memory", req).passages]

    def forget(
        self, handle: Handle, passage_id: int | None, logical: tuple[int, int] | None
    ) -> int:
        pb = self.pb
        req = pb.ForgetRequest(handle=self._handle(handle))
        if passage_id is not None:
            req.passage_id = passage_id
        elif logical is not None:
            req.logical.CopyFrom(pb.Range(start=logical[0], end=logical[1]))
        return int(self._call("Forget", req).forgotten)

    def list(self) -> list[dict[str, Any]]:
        return [_receipt(r) for r in self._call("List", self.pb.ListSessionsRequest()).sessions]

    def resolve(self, session_id: str) -> Handle:
        """The owner's current handle for an id (the CLI names sessions by id alone)."""
        for r in self.list():
            if r["session_id"] == session_id:
                return Handle(session_id, r["generation"])
        raise NotFound(f"no session {echo(session_id)}")

    def shutdown(self) -> None:
        self.channel.close()


# --- embedded ---


class EmbeddedBackend:
    """The same service the daemon runs, in this process, for one local user."""

    def __init__(
        self,
        model: str | None = None,
        n_ctx_seq: int = 512,
        max_sessions: int = 2,
        threads: int | None = None,
    ) -> None:
        from sinkd.daemon.config import Settings
        from sinkd.daemon.runtime.service import SinkdService
        from sinkd.daemon.runtime.sessions import LOCAL_TENANT, Principal

        settings = Settings(  # in-process and gone with the process: nothing to make durable
            model=model,
            n_ctx_seq=n_ctx_seq,
            max_sessions=max_sessions,
            n_threads=threads,
            durable=False,
        )
        self.service = SinkdService(settings)
        self.principal = Principal(LOCAL_TENANT, admin=True)
        self.service.start()
        self.service.wait_ready()

    def _h(self, session: Any) -> Handle:
        return Handle(session.id, session.generation)

    def _t(self, h: Handle) -> tuple[str, str]:
        return h.session_id, h.generation

    def create(
        self,
        policy: dict[str, Any],
        system_prompt: str = "",
        sampling: dict[str, Any] | None = None,
        recall: dict[str, Any] | None = None,
    ) -> tuple[Handle, dict[str, Any]]:
        from sinkd.daemon.runtime.requests import PolicyRequest, RecallRequest

        req = PolicyRequest(
            name=policy.get("name", "sink"),
            sinks=policy.get("sinks"),
            window=policy.get("window"),
            evict_chunk=policy.get("evict_chunk") or None,
            compact_interval=policy.get("compact_interval"),
            pin_system_prompt=policy.get("pin_system_prompt", False),
        )
        session = self.service.create(
            self.principal,
            req,
            sampling or None,
            system_prompt,
            recall=RecallRequest(**(recall or {})),
        )
        return self._h(session), self.service.receipt(session)

    def append(self, handle: Handle, text: str) -> dict[str, Any]:
        _, receipt = self.service.append(self.principal, self._t(handle), text, None)
        return receipt

    def generate(
        self, handle: Handle, max_tokens: int, stops: list[str]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        return self.service.generate(self.principal, self._t(handle), max_tokens, stops, None)

    def chat(
        self, handle: Handle, message: str, max_tokens: int, stops: list[str]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        return self.service.chat(self.principal, self._t(handle), message, max_tokens, stops, None)

    def reset(self, handle: Handle) -> tuple[Handle, dict[str, Any]]:
        session = self.service.reset(self.principal, self._t(handle))
        return self._h(session), self.service.receipt(session)

    def fork(self, handle: Handle) -> tuple[Handle, dict[str, Any]]:
        child = self.service.fork(self.principal, self._t(handle))
        return self._h(child), self.service.receipt(child)

    def close(self, handle: Handle) -> None:
        self.service.close(self.principal, self._t(handle))

    def inspect(self, handle: Handle, include_text: bool = False) -> tuple[dict[str, Any], str]:
        receipt, text, _ = self.service.reads.inspect(self.principal, self._t(handle), include_text)
        return receipt, text

    def trace(self, handle: Handle) -> list[dict[str, Any]]:
        return self.service.reads.trace(self.principal, self._t(handle))

    def recall(self, handle: Handle, query: str) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.service.recall_into(self.principal, self._t(handle), query)

    def memory(self, handle: Handle, search: str, limit: int) -> list[dict[str, Any]]:
        return self.service.memory(self.principal, self._t(handle), search, limit)

    def forget(
        self, handle: Handle, passage_id: int | None, logical: tuple[int, int] | None
    ) -> int:
        return self.service.forget(self.principal, self._t(handle), passage_id, logical)

    def list(self) -> list[dict[str, Any]]:
        return self.service.reads.list_sessions(self.principal)

    def shutdown(self) -> None:
        self.service.stop()
