"""`sinkd`: the command line. Each command group lives in its own module; this one joins them."""

from __future__ import annotations

import typer

from sinkd.cli import chat, evaluate, models, narrate, serve, sessions, stream

app = typer.Typer(
    help="sinkd: a small local LLM over an unbounded stream at constant memory (attention sinks on"
    " llama.cpp). Evicted tokens are gone: this is not memory.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command()(stream.receipt)
app.command()(stream.stream)
app.command()(serve.serve)
app.command()(chat.chat)
app.command()(narrate.narrate)
app.add_typer(models.app, name="models")
app.add_typer(sessions.app, name="sessions")
app.add_typer(evaluate.eval_app, name="eval")


if __name__ == "__main__":  # pragma: no cover
    app()
