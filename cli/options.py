"""The options several command groups share, declared once; the policy they ask for; and where a
command's sessions live (a daemon, or this process)."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
from rich.progress import ProgressColumn
from rich.text import Text

from sinkd.cachepolicy import PolicyConfig, PolicyName
from sinkd.cli.backend import Backend, EmbeddedBackend
from sinkd.cli.console import console
from sinkd.daemon.rpc.client import Client, TlsFiles, daemon_health, default_address
from sinkd.daemon.runtime.api import PolicyRequest
from sinkd.errors import InvalidInput, echo

err = console(stderr=True)

ModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="Model from models.lock.")]
PolicyOpt = Annotated[PolicyName, typer.Option("--policy", "-p", help="The eviction policy.")]
SinksOpt = Annotated[
    int | None,
    typer.Option("--sinks", "-s", min=0, help="S: sink positions kept (default: the model's)."),
]
WindowOpt = Annotated[
    int | None,
    typer.Option("--window", "-w", help="W: recent positions kept (default: the model's)."),
]
EvictOpt = Annotated[
    int | None,
    typer.Option("--evict", "-e", min=1, help="E: window cells evicted at once (default: 16)."),
]
CompactOpt = Annotated[
    int | None,
    typer.Option(
        "--compact",
        "-k",
        min=0,
        help="K: defer the position shift until the gap reaches K (unset: the daemon's default,"
        " 32 x E at most W, for a daemon session; 0 for the offline tools).",
    ),
]
ThreadsOpt = Annotated[
    int | None, typer.Option("--threads", min=1, help="CPU threads for llama.cpp.")
]
KvTypeOpt = Annotated[str, typer.Option("--kv-type", help="KV cache dtype (checked: f16).")]
DEFAULT_EVICT = 16  # the daemon's default_evict_chunk, for the embedded commands too

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
ConnectOpt = Annotated[
    str | None,
    typer.Option(
        "--connect", help="Daemon address (default: the user's Unix socket; $SINKD_ADDRESS)."
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", help="Bearer token (default: $SINKD_TOKEN).", envvar="SINKD_TOKEN"),
]


tls: TlsFiles | None = None  # `sinkd --tls-ca ...`, set before the command runs


LOADING_WAIT_S = 120.0  # how long a command waits for a daemon to load its model ($SINKD_WAIT_S)


def connect(address: str | None, token: str | None, wait_s: float = 3.0) -> Client:
    """A client of the daemon at `address` (DaemonUnavailable if none answers within wait_s),
    once it serves: a daemon still loading its model is waited for, saying so, within
    $SINKD_WAIT_S seconds (default 120)."""
    client = Client(address, token, wait_s=wait_s, tls=tls)
    try:
        client.wait_serving(
            loading_wait_s(),
            lambda: err.print(
                f"the daemon at {client.address} is loading the model: waiting", highlight=False
            ),
        )
    except BaseException:
        client.shutdown()
        raise
    return client


def loading_wait_s() -> float:
    raw = os.environ.get("SINKD_WAIT_S", "")
    try:
        value = float(raw) if raw else LOADING_WAIT_S
    except ValueError:
        raise InvalidInput(f"SINKD_WAIT_S: not a number of seconds: {echo(raw)}") from None
    if not value > 0:
        raise InvalidInput(f"SINKD_WAIT_S: must be above 0, not {echo(raw)}")
    return value


def offline_policy(
    entry_sinks: int,
    entry_window: int,
    policy: str,
    sinks: int | None,
    window: int | None,
    evict: int | None,
    compact: int | None,
) -> PolicyConfig:
    return PolicyConfig.resolve(
        policy,
        sinks=sinks,
        window=window,
        evict_chunk=evict,
        compact_interval=compact or 0,  # the offline tools shift at every eviction unless told
        default_sinks=entry_sinks,
        default_window=entry_window,
        default_evict_chunk=DEFAULT_EVICT,
    )


def session_backend(
    embedded: bool, address: str | None, token: str | None, model: str | None, budget: int
) -> Backend:
    """--embedded: this process; --connect: that daemon; neither: the daemon at the default
    address if one answers (one model in memory, and the daemon keeps every core instead of
    splitting them with a second engine: bench/two_processes.py), else this process. The first line
    says which."""
    if embedded:
        return EmbeddedBackend(model=model, n_ctx_seq=budget, max_sessions=2)
    if address is not None:
        return connect(address, token)
    address = default_address()
    if daemon_health(address) is not None:  # serving, or loading its model: wait for it
        err.print(f"using the daemon at {address}", highlight=False)
        return connect(address, token)
    err.print(f"no daemon answers at {address}: running the model in this process")
    return EmbeddedBackend(model=model, n_ctx_seq=budget, max_sessions=2)


def policy_request(
    policy: str,
    sinks: int | None,
    window: int | None,
    evict: int | None,
    compact: int | None,
    pin_system_prompt: bool = False,
) -> PolicyRequest:
    """What the user asked for; unset fields take the daemon's defaults (compact included)."""
    return PolicyRequest(
        name=policy,
        sinks=sinks,
        window=window,
        evict_chunk=evict,
        compact_interval=compact,
        pin_system_prompt=pin_system_prompt,
    )


class TokensPerSecond(ProgressColumn):
    def render(self, task: Any) -> Text:
        return Text(f"{task.speed or 0:7.1f} tok/s")
