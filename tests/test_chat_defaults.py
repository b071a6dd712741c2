"""`sinkd chat` with no option but the model, on every pinned model, embedded and through a daemon:
the window fills the session's cells as far as the model allows (Gemma 3's local layers see 512
positions), instead of a default that the model then refuses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sinkd.cli.main import app
from sinkd.daemon.node import Daemon
from tests.support.settings import settings

pytestmark = pytest.mark.model
runner = CliRunner()
# S + W each model's chat gets: 1,024 cells; Gemma 3 at most its sliding window of 512
BUDGET = {"smollm2-135m-instruct": 1024, "gemma3-270m": 512}
TALK = "Hello! Say one short sentence about the sea.\n/quit\n"


def chatted(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """The budget the chat's status line shows, after one answered message."""
    result = runner.invoke(app, ["chat", *args], input=TALK, env={"COLUMNS": "200", **env})
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip(), "the message was answered"
    budgets = re.findall(r"retained \d+/(\d+)", result.stderr)
    assert budgets, result.stderr
    return result.exit_code, budgets[0]


@pytest.mark.parametrize("model", sorted(BUDGET))
def test_chat_with_no_options_answers_on_every_pinned_model(model: str, tmp_path: Path) -> None:
    _, embedded = chatted(["--embedded", "-m", model], {})
    assert int(embedded) == BUDGET[model]
    d = Daemon(settings(tmp_path, model=model, n_ctx_seq=1024))
    d.start()
    d.wait_ready(120)
    try:
        env = {"SINKD_ADDRESS": d.addresses[0], "SINKD_TOKEN": "alice-token"}
        _, served = chatted(["-m", model], env)
        assert int(served) == BUDGET[model]
    finally:
        d.stop()
