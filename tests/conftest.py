from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from sinkd.daemon.engine.llama import Engine, EngineConfig
from sinkd.daemon.engine.loading import open_engine
from sinkd.daemon.rpc.client import CHANNEL_OPTIONS
from sinkd.errors import ModelMissing
from sinkd.evaluation import SAMPLE_TEXT as TEXT  # noqa: F401  (re-exported for the tests)
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc

ALICE = [("authorization", "Bearer alice-token")]
BOB = [("authorization", "Bearer bob-token")]
ADMIN = [("authorization", "Bearer admin-token")]


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


@pytest.fixture
def client(daemon: Any) -> Iterator[Client]:
    """A client of the module's `daemon` fixture; alice's and bob's sessions are closed after."""
    c = Client(daemon.addresses[0])
    yield c
    for md in (ALICE, BOB):
        for r in c.s.List(pb.ListSessionsRequest(), metadata=md).sessions:
            h = pb.Handle(session_id=r.session_id, generation=r.generation)
            c.s.Close(pb.HandleRequest(handle=h), metadata=md)
    c.close()


def open_model(model: str | None = None, **config: int | bool | str) -> Engine:
    try:
        return open_engine(model, EngineConfig(**config))  # type: ignore[arg-type]
    except ModelMissing as e:
        pytest.fail(f"{e} (CI pulls it in .ci/run)")


@pytest.fixture(autouse=True)
def _private_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon started by a test (in process or not) journals into a temporary state directory,
    and opens no HTTP front unless the test asks (each would take the default port)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
    monkeypatch.setenv("SINKD_HTTP", "off")


@pytest.fixture
def make_engine() -> Iterator[object]:
    opened: list[Engine] = []

    def make(model: str | None = None, **config: int | bool | str) -> Engine:
        engine = open_model(model, **config)
        opened.append(engine)
        return engine

    yield make
    for engine in opened:
        engine.close()
