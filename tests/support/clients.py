"""The tests' gRPC helpers: a protobuf-level client, a status catcher, a session with a fact in
its memory."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from sinkd.daemon.rpc.client import CHANNEL_OPTIONS
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc
from tests.support.texts import FACT, LONG, RECALL_POLICY
from tests.support.tokens import ALICE


class Client:
    """The tests' protobuf-level helper (the wire as it is), speaking as alice unless told
    otherwise; the package's typed client is `sinkd.daemon.rpc.client.Client`."""

    def __init__(self, address: str, md: Any = None) -> None:
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.s = pb_grpc.SessionsStub(self.channel)  # type: ignore[no-untyped-call]
        self.admin = pb_grpc.AdminStub(self.channel)  # type: ignore[no-untyped-call]
        self.md = md or ALICE

    def _md(self, md: Any) -> Any:
        return self.md if md is None else md

    def create(
        self, md: Any = None, system: str = "", recall: Any = None, **policy: Any
    ) -> pb.CreateSessionResponse:
        policy.setdefault("name", "sink")
        policy.setdefault("sinks", 4)
        policy.setdefault("window", 60)
        request = pb.CreateSessionRequest(
            policy=pb.Policy(**policy), system_prompt=system, recall=recall
        )
        response: pb.CreateSessionResponse = self.s.Create(request, metadata=self._md(md))
        return response

    def append(self, h: pb.Handle, text: str, md: Any = None, **kw: Any) -> pb.AppendResponse:
        request = pb.AppendRequest(handle=h, text=text)
        response: pb.AppendResponse = self.s.Append(request, metadata=self._md(md), **kw)
        return response

    def append_tokens(self, h: pb.Handle, ids: list[int], md: Any = None) -> pb.AppendResponse:
        request = pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=ids))
        response: pb.AppendResponse = self.s.Append(request, metadata=self._md(md))
        return response

    def generate(
        self, h: pb.Handle, n: int = 12, md: Any = None, **kw: Any
    ) -> tuple[list[int], pb.Done]:
        ids, done = [], None
        request = pb.GenerateRequest(handle=h, max_tokens=n)
        for ev in self.s.Generate(request, metadata=self._md(md), **kw):
            if ev.HasField("token"):
                ids.append(ev.token.id)
            else:
                done = ev.done
        if done is None:
            raise RuntimeError("the stream ended without Done")
        return ids, done

    def inspect(self, h: pb.Handle, md: Any = None, text: bool = False) -> pb.InspectResponse:
        request = pb.InspectRequest(handle=h, include_text=text)
        response: pb.InspectResponse = self.s.Inspect(request, metadata=self._md(md))
        return response

    def recall(self, h: pb.Handle, query: str, md: Any = None, **kw: Any) -> pb.RecallResponse:
        request = pb.RecallRequest(handle=h, query=query, **kw)
        response: pb.RecallResponse = self.s.Recall(request, metadata=self._md(md))
        return response

    def memory(
        self, h: pb.Handle, search: str = "", limit: int = 0, md: Any = None
    ) -> pb.MemoryResponse:
        request = pb.MemoryRequest(handle=h, search=search, limit=limit)
        response: pb.MemoryResponse = self.s.Memory(request, metadata=self._md(md))
        return response

    def forget(self, h: pb.Handle, md: Any = None, **target: Any) -> pb.ForgetResponse:
        request = pb.ForgetRequest(handle=h, **target)
        response: pb.ForgetResponse = self.s.Forget(request, metadata=self._md(md))
        return response

    def close(self) -> None:
        self.channel.close()


def code_of(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        result = call()
        if hasattr(result, "__iter__") and not isinstance(result, pb.InspectResponse):
            list(result)
    return err.value.code()


def planted(client: Client, md: list[tuple[str, str]] = ALICE, **policy: int) -> pb.Handle:
    """A sink session whose memory holds the sentinel fact (evicted by the text after it)."""
    h = client.create(md=md, **{**RECALL_POLICY, **policy}).handle
    client.append(h, LONG[:200] + FACT, md=md)
    client.append(h, LONG[200:1600], md=md)
    receipt = client.inspect(h, md=md).receipt
    assert receipt.recent_logical.start > 60, "the fact should have left the window"
    return h
