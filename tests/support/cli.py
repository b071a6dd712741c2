"""The CLI run in process, as a user would type it."""

from __future__ import annotations

from typer.testing import CliRunner

from sinkd.cli.main import app

runner = CliRunner()


def sinkd(*args: str, input: str | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), input=input, env={"COLUMNS": "120"})
    return result.exit_code, result.stdout, result.stderr
