from __future__ import annotations

from collections.abc import Iterator

import pytest

from daemon.engine import Engine, EngineConfig
from daemon.errors import ModelMissing
from daemon.loading import open_engine

# A public-domain passage (Melville, Moby-Dick, ch. 1), long enough to overflow small budgets.
TEXT = (
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my "
    "purse, and nothing particular to interest me on shore, I thought I would sail about a little and "
    "see the watery part of the world. It is a way I have of driving off the spleen and regulating the "
    "circulation. Whenever I find myself growing grim about the mouth; whenever it is a damp, drizzly "
    "November in my soul; whenever I find myself involuntarily pausing before coffin warehouses, and "
    "bringing up the rear of every funeral I meet; and especially whenever my hypos get such an upper "
    "hand of me, that it requires a strong moral principle to prevent me from deliberately stepping "
    "into the street, and methodically knocking people's hats off, then, I account it high time to get "
    "to sea as soon as I can. This is my substitute for pistol and ball. With a philosophical flourish "
    "Cato throws himself upon his sword; I quietly take to the ship. There is nothing surprising in "
    "this. If they but knew it, almost all men in their degree, some time or other, cherish very nearly "
    "the same feelings towards the ocean with me. There now is your insular city of the Manhattoes, "
    "belted round by wharves as Indian isles by coral reefs, commerce surrounds it with her surf."
)


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
