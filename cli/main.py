"""`sinkd`: the command line. Each command group lives in its own module; this one joins them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sinkd.cli import (
    chat,
    evaluate,
    memory,
    models,
    narrate,
    nodes,
    options,
    serve,
    sessions,
    stream,
    tenants,
)
from sinkd.daemon.rpc.client import TlsFiles

app = typer.Typer(
    help="sinkd: a small local LLM over an unbounded stream at constant memory (attention sinks on"
    " llama.cpp). Evicted tokens are gone: this is not memory.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _file(help: str, env: str) -> object:
    return typer.Option(help=help, envvar=env, exists=True, dir_okay=False)


@app.callback()
def main(
    tls_ca: Annotated[
        Path | None,
        _file("CA certificate of a TLS daemon (--connect host:port).", "SINKD_TLS_CA"),
    ] = None,
    client_cert: Annotated[
        Path | None,
        _file("This client's certificate, for a daemon that asks for one.", "SINKD_CLIENT_CERT"),
    ] = None,
    client_key: Annotated[Path | None, _file("Its private key.", "SINKD_CLIENT_KEY")] = None,
) -> None:
    """Options for every command that talks to a daemon."""
    given = tls_ca or client_cert or client_key
    options.tls = TlsFiles(tls_ca, client_cert, client_key) if given else None


app.command()(stream.receipt)
app.command()(stream.stream)
app.command()(serve.serve)
app.command()(chat.chat)
app.add_typer(narrate.app, name="narrate")
app.add_typer(models.app, name="models")
app.add_typer(sessions.app, name="sessions")
app.add_typer(memory.app, name="memory")
app.add_typer(nodes.app, name="nodes")
app.add_typer(tenants.app, name="tenants")
app.add_typer(evaluate.eval_app, name="eval")


if __name__ == "__main__":  # pragma: no cover
    app()
