from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sinkd.daemon.engine.llama import Engine, EngineConfig
from sinkd.daemon.engine.loading import open_engine
from sinkd.errors import ModelMissing
from sinkd.proto.v1 import sinkd_pb2 as pb
from tests.support.clients import Client
from tests.support.tokens import ALICE, BOB


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
