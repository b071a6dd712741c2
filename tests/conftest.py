from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sinkd.daemon.engine.llama import Engine, EngineConfig
from sinkd.daemon.engine.loading import open_engine
from sinkd.daemon.errors import ModelMissing
from sinkd.daemon.rpc.client import Client as RpcClient
from sinkd.evaluation import SAMPLE_TEXT as TEXT  # noqa: F401  (re-exported for the tests)
from sinkd.proto.v1 import sinkd_pb2 as pb

ALICE = [("authorization", "Bearer alice-token")]
BOB = [("authorization", "Bearer bob-token")]
ADMIN = [("authorization", "Bearer admin-token")]


class Client(RpcClient):
    """The library client, speaking as alice unless told otherwise."""

    def __init__(self, address: str) -> None:
        super().__init__(address, md=ALICE)


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
    """A daemon started by a test (in process or not) journals into a temporary state directory."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))


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
