"""A small synchronous client for sinkd's gRPC API: the tests, the benchmarks, Python users.

Each call takes the bearer metadata of the client by default (`md=` overrides it per call), and
streams come back collected: `generate` returns the token ids and the final `Done`.
"""

from __future__ import annotations

from typing import Any

import grpc
import grpc.experimental

from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc

# a stream's messages are read on the thread that iterates it, without grpc's polling thread: a
# wake-up less per token, 0.21 -> 0.17 ms of the client's CPU a token (bench/README.md, row 15),
# which on two busy cores is taken from the decode. Such a stream is iterated on one thread only.
CHANNEL_OPTIONS = [(grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


class Client:
    def __init__(self, address: str, md: Any = None) -> None:
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.s = pb_grpc.SessionsStub(self.channel)  # type: ignore[no-untyped-call]
        self.admin = pb_grpc.AdminStub(self.channel)  # type: ignore[no-untyped-call]
        self.md = md or []

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
