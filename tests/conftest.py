from __future__ import annotations

from collections.abc import Iterator

import pytest

from sinkd.daemon.engine.llama import Engine, EngineConfig
from sinkd.daemon.engine.loading import open_engine
from sinkd.daemon.errors import ModelMissing
from sinkd.evaluation import SAMPLE_TEXT as TEXT  # noqa: F401  (re-exported for the tests)


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
