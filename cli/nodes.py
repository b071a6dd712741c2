"""`sinkd nodes`: a deployment of identical nodes behind HAProxy (docs/deployment.md).

`init` writes the deployment's files; `drain` takes a node out (HAProxy first, so no new work
reaches it; then each of its sessions to the node the ring now sends its tenant to; then a clean
stop); `join` puts a node back and brings it the sessions the ring sends it again; `rebalance`
moves every session to where the ring sends its tenant; `where` says where that is.

A move is export, import on the new node (the gates of a resume: refused with the reason, nothing
kept), then release on the old one, which answers UNAVAILABLE for the session from then on: a
request the proxy sent there meanwhile is told to retry, never that the session is gone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer

from sinkd.cli import deployment as deploy
from sinkd.cli.console import console, shown
from sinkd.cli.exit_codes import handle_errors
from sinkd.cli.haproxy import RuntimeApi, where
from sinkd.cli.options import JsonFlag
from sinkd.daemon.rpc.client import Client
from sinkd.daemon.runtime.api import Receipt
from sinkd.errors import FailedPrecondition, InvalidInput, SinkdError, message_of

app = typer.Typer(help="A deployment of sinkd nodes behind HAProxy.", no_args_is_help=True)
out = console()
err = console(stderr=True)

DeploymentOpt = Annotated[
    Path,
    typer.Option(
        "--deployment", "-d", help="The deployment.toml `sinkd nodes init` wrote.",
        envvar="SINKD_DEPLOYMENT",
    ),
]  # fmt: skip
AdminTokenOpt = Annotated[
    str | None,
    typer.Option(
        "--admin-token", help="The admin's token (default: $SINKD_ADMIN_TOKEN).",
        envvar="SINKD_ADMIN_TOKEN",
    ),
]  # fmt: skip


@dataclass(frozen=True)
class Moved:
    session_id: str
    tenant: str
    source: str
    target: str
    seconds: float
    archive_bytes: int
    error: str = ""  # not moved: why (it stays on its node, whole)


def move(source: Client, target: Client, session: Receipt) -> int:
    """One session from `source` to `target`: export, import, release; the archive's size."""
    archive = b"".join(source.export_session(session.handle))
    target.import_session(archive)
    source.release(session.handle)
    return len(archive)


class Nodes:
    """The deployment's nodes as the admin reaches them, and the ring as the proxy answers."""

    def __init__(self, d: deploy.Deployment, admin_token: str | None) -> None:
        if not admin_token:
            raise InvalidInput("moving sessions needs the admin's token (--admin-token)")
        self.d = d
        self.token = admin_token
        self.keys = d.route_keys()
        self.proxy = RuntimeApi(d.admin_socket)
        self._clients: dict[str, Client] = {}

    def client(self, name: str) -> Client:
        if name not in self._clients:
            self._clients[name] = Client(self.d.node(name).grpc, self.token, wait_s=5)
        return self._clients[name]

    def target_of(self, tenant: str) -> str:
        key = self.keys.get(tenant)
        if key is None:
            raise FailedPrecondition(f"tenant {tenant!r} is not in {self.d.base_config}")
        return where(self.d.proxy_http, key)

    def rebalance(
        self, sources: list[str], report: Callable[[Moved], None] = lambda m: None
    ) -> list[Moved]:
        """Every session of these nodes that the ring sends elsewhere, moved there."""
        moved = []
        for source in sources:
            for session in self.client(source).list_all():
                start = time.monotonic()
                try:
                    target = self.target_of(session.tenant)
                    if target == source:
                        continue
                    size = move(self.client(source), self.client(target), session)
                    m = Moved(session.session_id, session.tenant, source, target,
                              time.monotonic() - start, size)  # fmt: skip
                except SinkdError as e:
                    m = Moved(session.session_id, session.tenant, source, "", 0.0, 0,
                              f"{type(e).__name__}: {message_of(e)}")  # fmt: skip
                moved.append(m)
                report(m)
        return moved

    def __enter__(self) -> Nodes:
        return self

    def __exit__(self, *exc: object) -> None:
        for c in self._clients.values():
            c.shutdown()


def _say(as_json: bool) -> Callable[[Moved], None]:
    def say(m: Moved) -> None:
        if as_json:
            print(json.dumps({"event": "moved", **asdict(m)}), flush=True)
        elif m.error:  # the daemon's words: shown as text, never read as markup
            err.print(shown(f"{m.session_id} ({m.tenant}): not moved: {m.error}"))
        else:
            out.print(
                shown(f"{m.session_id} ({m.tenant}): {m.source} -> {m.target} in {m.seconds:.2f} s")
            )

    return say


def _summary(what: str, moved: list[Moved], seconds: float, as_json: bool, **extra: object) -> None:
    failed = [m for m in moved if m.error]
    if as_json:
        print(json.dumps({"event": what, "moved": len(moved) - len(failed), "failed": len(failed),
                          "seconds": seconds, **extra}))  # fmt: skip
    else:
        out.print(
            f"{what}: {len(moved) - len(failed)} sessions moved, {len(failed)} not, in {seconds:.2f} s"
        )
    if failed:
        raise typer.Exit(1)


@app.command()
@handle_errors
def init(
    folder: Annotated[Path, typer.Argument(help="Where to write the deployment's files.")],
    base_config: Annotated[
        Path,
        typer.Option(
            "--base-config",
            help="Settings every node shares (TOML: model, tenants, admin token's sha256).",
        ),
    ],
    nodes: Annotated[int, typer.Option("--nodes", "-n", help="How many nodes.")] = 3,
    proxy_http: Annotated[
        str, typer.Option(help="The proxy's HTTP API address.")
    ] = "127.0.0.1:7800",
    proxy_grpc: Annotated[str, typer.Option(help="The proxy's gRPC address.")] = "127.0.0.1:7801",
    first_port: Annotated[int, typer.Option(help="Nodes' ports from here, two each.")] = 7820,
    state_root: Annotated[
        Path | None, typer.Option(help="Nodes' state dirs (default FOLDER/state).")
    ] = None,
    run_dir: Annotated[Path | None, typer.Option(help="Sockets (default FOLDER/run).")] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="The proxy's certificate and key (PEM).")
    ] = None,
    install_dir: Annotated[
        Path | None, typer.Option(help="Where FOLDER will live when it runs (default: FOLDER).")
    ] = None,
) -> None:
    """Write haproxy.cfg, deployment.toml, one environment file per node, a systemd unit, a copy
    of the base config and the nodes' shared conversations key (0600, made once)."""
    d = deploy.plan(nodes, folder, base_config, proxy_http, proxy_grpc, first_port, state_root,
                    run_dir, tls_cert, install_dir)  # fmt: skip
    for path in deploy.write(d, folder, base_config):
        out.print(str(path), highlight=False)


@app.command()
@handle_errors
def drain(
    node: Annotated[str, typer.Argument(help="The node to take out, e.g. n2.")],
    deployment: DeploymentOpt,
    admin_token: AdminTokenOpt = None,
    stop: Annotated[
        bool, typer.Option("--stop/--no-stop", help="Stop the node once empty.")
    ] = True,
    wait_s: Annotated[float, typer.Option(help="How long requests in flight may take.")] = 120.0,
    as_json: JsonFlag = False,
) -> None:
    """Take a node out: HAProxy sends it no new work, its requests in flight finish, each of its
    sessions moves to the node the ring now sends its tenant to, then it stops (only if every
    session moved: one that could not stays, whole, and the exit code is 1)."""
    start = time.monotonic()
    with Nodes(deploy.load(deployment), admin_token) as nodes:
        nodes.d.node(node)
        nodes.proxy.set_state(node, "drain")
        nodes.proxy.wait_idle(node, wait_s)
        moved = nodes.rebalance([node], _say(as_json))
        if stop and not any(m.error for m in moved):
            nodes.client(node).stop_daemon()
            nodes.proxy.set_state(node, "maint")
    _summary("drained", moved, time.monotonic() - start, as_json, node=node)


@app.command()
@handle_errors
def join(
    node: Annotated[str, typer.Argument(help="The node to put back (it runs and is healthy).")],
    deployment: DeploymentOpt,
    admin_token: AdminTokenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Put a node back in the ring, then move to it the sessions the ring now sends it (from
    every other node)."""
    start = time.monotonic()
    with Nodes(deploy.load(deployment), admin_token) as nodes:
        nodes.proxy.set_state(nodes.d.node(node).name, "ready")
        _wait_up(nodes.proxy, node)
        others = [n for n in nodes.d.names if n != node and nodes.proxy.status(n) == "UP"]
        moved = nodes.rebalance(others, _say(as_json))
    _summary("joined", moved, time.monotonic() - start, as_json, node=node)


@app.command()
@handle_errors
def rebalance(
    deployment: DeploymentOpt, admin_token: AdminTokenOpt = None, as_json: JsonFlag = False
) -> None:
    """Move every session of the nodes that are up to the node the ring sends its tenant to."""
    start = time.monotonic()
    with Nodes(deploy.load(deployment), admin_token) as nodes:
        up = [n for n in nodes.d.names if nodes.proxy.status(n) == "UP"]
        moved = nodes.rebalance(up, _say(as_json))
    _summary("rebalanced", moved, time.monotonic() - start, as_json)


@app.command("where")
@handle_errors
def where_(
    deployment: DeploymentOpt,
    tenant: Annotated[str | None, typer.Argument(help="A tenant (default: every one).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """The node the proxy sends each tenant to now."""
    d = deploy.load(deployment)
    keys = d.route_keys()
    if tenant is not None and tenant not in keys:
        raise InvalidInput(f"no tenant {tenant!r} in {d.base_config}")
    chosen = {t: where(d.proxy_http, k) for t, k in keys.items() if tenant in (None, t)}
    if as_json:
        print(json.dumps(chosen))
    else:
        for t, n in chosen.items():
            out.print(f"{t}: {n}", highlight=False)


def _wait_up(proxy: RuntimeApi, node: str, deadline_s: float = 30.0) -> None:
    """A joined node counts once its health checks pass (UP), not before."""
    end = time.monotonic() + deadline_s
    while (status := proxy.status(node)) != "UP":
        if time.monotonic() > end:
            raise FailedPrecondition(f"{node} is {status} after {deadline_s:g} s: is it running?")
        time.sleep(0.2)
