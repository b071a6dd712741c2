"""`sinkd serve`: the daemon, in the foreground, until a signal."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from sinkd.cli import models
from sinkd.cli.console import console
from sinkd.cli.exit_codes import handle_errors
from sinkd.cli.options import (
    ModelOpt,
    ThreadsOpt,
)

out = console()
err = console(stderr=True)
ENGINE_DIED = 70  # EX_SOFTWARE: the daemon stopped itself rather than serve without an engine


@handle_errors
def serve(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML settings file.")
    ] = None,
    socket: Annotated[Path | None, typer.Option("--socket", help="Unix socket path.")] = None,
    tcp: Annotated[
        str | None, typer.Option("--tcp", help="Also listen on host:port (needs tenants).")
    ] = None,
    http: Annotated[
        str | None,
        typer.Option(
            "--http",
            help="OpenAI and Ollama APIs on host:port (default 127.0.0.1:7812; off: none).",
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option("--tls-cert", help="Certificate for the TCP listener (PEM).")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key", help="Its private key.")] = None,
    tls_client_ca: Annotated[
        Path | None,
        typer.Option("--tls-client-ca", help="Ask TCP clients for a certificate this CA signed."),
    ] = None,
    model: ModelOpt = None,
    max_sessions: Annotated[
        int | None, typer.Option("--max-sessions", help="Sequences in the context.")
    ] = None,
    n_ctx_seq: Annotated[int | None, typer.Option("--ctx", help="Cells per session.")] = None,
    threads: ThreadsOpt = None,
    gpu_layers: Annotated[
        int | None,
        typer.Option("--gpu-layers", help="Layers to offload (CUDA, Metal, Vulkan builds)."),
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="Prometheus endpoint on 127.0.0.1.")
    ] = None,
    allow_unchecked: Annotated[
        bool,
        typer.Option(
            "--allow-unchecked", help="Run a KV dtype or backend not checked in models.lock."
        ),
    ] = False,
    state_dir: Annotated[
        Path | None,
        typer.Option("--state-dir", help="Journal and snapshots (default ~/.local/state/sinkd)."),
    ] = None,
    durable: Annotated[
        bool | None,
        typer.Option("--durable/--no-durable", help="Keep sessions across restarts (default on)."),
    ] = None,
) -> None:
    """Run the daemon until SIGTERM or Ctrl-C; pulls and verifies the model (and recall's
    embedder) first if missing."""
    import logging

    from pydantic import ValidationError

    from sinkd.daemon.config import load_settings
    from sinkd.daemon.models.registry import load_lock, model_path
    from sinkd.daemon.node import Daemon

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = load_settings(
            config, socket=socket, tcp=tcp, http=http, tls_cert=tls_cert, tls_key=tls_key,
            tls_client_ca=tls_client_ca, model=model, max_sessions=max_sessions,
            n_ctx_seq=n_ctx_seq, n_threads=threads, n_gpu_layers=gpu_layers, metrics_port=metrics_port,
            allow_unchecked=allow_unchecked or None, state_dir=state_dir, durable=durable,
        )  # fmt: skip
    except ValidationError as e:
        for problem in e.errors():
            where = ".".join(str(p) for p in problem["loc"]) or "settings"
            print(f"sinkd: {where}: {problem['msg']}", file=sys.stderr)
        raise typer.Exit(2) from None
    entry = load_lock().get(settings.model)
    if not model_path(entry).is_file():
        err.print(f"model {entry.name} is not pulled yet: pulling it now")
        models.fetch(entry)
    if settings.recall_dense:
        models.fetch_first_start()
    daemon = Daemon(settings)
    daemon.trap_signals()
    daemon.start()
    try:
        daemon.wait_ready()
    except BaseException:
        daemon.stop()
        raise
    engine = daemon.service.scheduler.engine
    on = f" ({engine.backend})" if engine is not None else ""
    err.print(f"sinkd serving {entry.name}{on} on {', '.join(daemon.addresses)}", highlight=False)
    if daemon.http is not None:
        key = (
            f"api key: the content of {settings.socket.parent / 'http-token'}"
            if daemon.http.local_sha256
            else "api key: a tenant's token"
        )
        err.print(f"OpenAI API at {daemon.http.address}/v1, Ollama's at {daemon.http.address} ({key})",
                  highlight=False)  # fmt: skip
    if settings.durable:
        count = daemon.service.metrics.count
        err.print(
            f"state in {settings.state_dir}: {count('resumed_sessions')} sessions resumed,"
            f" {count('stale_sessions')} stale (`sinkd sessions list` says why)",
            highlight=False,
        )
    daemon.serve_until_signal()
    if daemon.died.is_set():
        print("sinkd: the engine thread died (see the log); stopped serving", file=sys.stderr)
        raise typer.Exit(ENGINE_DIED)
    err.print("sinkd stopped", highlight=False)
