"""`sinkd nodes`: a deployment of identical nodes behind HAProxy (docs/deployment.md).

`init` writes the deployment's files; `drain` takes a node out (its tenants marked arriving on
the other nodes, HAProxy sends it no new work, each of its tenants moves whole to the node the ring
now sends it to, then a clean stop); `join` puts a node back and brings it the tenants the ring
sends it again; `rebalance` finishes the moves a kill cut short and moves every tenant to where
the ring sends it; `where` says where that is, and what each node holds.

A tenant moves whole (cli/moves.py): its sessions, its memory across conversations and its prefix
states, out as one archive and in as one transaction, then deleted where it was. While it moves
no node answers it (UNAVAILABLE: its clients retry), never two.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from sinkd.cli import deployment as deploy
from sinkd.cli import moves
from sinkd.cli.console import console, shown
from sinkd.cli.exit_codes import handle_errors
from sinkd.cli.haproxy import RuntimeApi, where
from sinkd.cli.moves import Moved, holds
from sinkd.cli.options import JsonFlag
from sinkd.daemon.rpc.client import Client
from sinkd.daemon.runtime.api import TenantHeld
from sinkd.errors import FailedPrecondition, InvalidInput

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

    def up(self) -> list[str]:
        return [n for n in self.d.names if self.proxy.status(n) == "UP"]

    def rebalance(self, nodes: list[str], report: Callable[[Moved], None]) -> list[Moved]:
        """Every tenant these nodes hold, brought whole to the node the ring sends it to (what a
        cut-short move left finished first: moves.resolve)."""
        done = moves.resolve(self.client, nodes, self.target_of)
        for m in done:
            report(m)
        return done

    def mark_arriving(self, nodes: list[str], tenants: set[str], source: str) -> None:
        """Before the ring changes: none of `tenants`' calls answered on `nodes` until each
        arrives (or the resolver clears the mark where it does not)."""
        for node in nodes:
            there = self.tenants_on([node])  # a part served there already is merged, not held
            for tenant in sorted(tenants - there):
                self.client(node).mark_tenant(tenant, "arriving", "", source)

    def tenants_on(self, nodes: list[str]) -> set[str]:
        return {t.tenant for n in nodes for t in self.client(n).held_tenants()[0] if holds(t)}

    def __enter__(self) -> Nodes:
        return self

    def __exit__(self, *exc: object) -> None:
        for c in self._clients.values():
            c.shutdown()


def _say(as_json: bool) -> Callable[[Moved], None]:
    def say(m: Moved) -> None:
        if as_json:
            print(json.dumps({"event": m.what, **asdict(m)}), flush=True)
        elif m.error:  # the daemon's words: shown as text, never read as markup
            err.print(
                shown(f"{m.tenant}: {m.what}, not done ({m.source} -> {m.target}): {m.error}")
            )
        elif m.what == "moved":
            out.print(shown(
                f"{m.tenant}: {m.source} -> {m.target}: {m.sessions} sessions, {m.passages}"
                f" passages, {m.prefixes} prefix states, {m.archive_bytes} bytes in"
                f" {m.seconds:.2f} s"
            ))  # fmt: skip
        else:
            out.print(shown(f"{m.tenant}: {m.what} on {m.source}"))

    return say


def _summary(what: str, moved: list[Moved], seconds: float, as_json: bool, **extra: object) -> None:
    failed = [m for m in moved if m.error]
    tenants = sum(m.what == "moved" and not m.error for m in moved)
    if as_json:
        print(json.dumps({"event": what, "moved": tenants, "failed": len(failed),
                          "seconds": seconds, **extra}))  # fmt: skip
    else:
        out.print(f"{what}: {tenants} tenants moved, {len(failed)} not, in {seconds:.2f} s")
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
    """Take a node out: its tenants are marked arriving on the other nodes, HAProxy sends it no
    new work, its requests in flight finish, each of its tenants moves whole to the node the ring
    now sends it to, then it stops (only if every tenant moved: one that could not stays, whole,
    and the exit code is 1)."""
    start = time.monotonic()
    with Nodes(deploy.load(deployment), admin_token) as nodes:
        nodes.d.node(node)
        others = [n for n in nodes.up() if n != node]
        nodes.mark_arriving(others, nodes.tenants_on([node]), node)
        nodes.proxy.set_state(node, "drain")
        nodes.proxy.wait_idle(node, wait_s)
        moved = nodes.rebalance([node, *others], _say(as_json))
        if stop and not any(m.error for m in moved) and not nodes.tenants_on([node]):
            nodes.client(node).stop_daemon()
            nodes.proxy.set_state(node, "maint")
    _summary("drained", moved, time.monotonic() - start, as_json, node=node)


@app.command()
@handle_errors
def join(
    node: Annotated[str, typer.Argument(help="The node to put back (it runs and is healthy).")],
    deployment: DeploymentOpt,
    admin_token: AdminTokenOpt = None,
    wait_s: Annotated[float, typer.Option(help="How long a node may take to load.")] = 120.0,
    as_json: JsonFlag = False,
) -> None:
    """Put a node back in the ring, then move to it the tenants the ring now sends it (from every
    other node); until each arrives the node answers none of its calls. Waits (at most
    `--wait-s`) for a node that is still loading its model."""
    start = time.monotonic()
    with Nodes(deploy.load(deployment), admin_token) as nodes:
        nodes.client(nodes.d.node(node).name).wait_serving(wait_s)
        others = [n for n in nodes.up() if n != node]
        nodes.mark_arriving([nodes.d.node(node).name], nodes.tenants_on(others), "")
        nodes.proxy.set_state(node, "ready")
        _wait_up(nodes.proxy, node)
        moved = nodes.rebalance([node, *others], _say(as_json))
    _summary("joined", moved, time.monotonic() - start, as_json, node=node)


@app.command()
@handle_errors
def rebalance(
    deployment: DeploymentOpt, admin_token: AdminTokenOpt = None, as_json: JsonFlag = False
) -> None:
    """Finish the moves a kill cut short, then move every tenant of the nodes that are up to the
    node the ring sends it to."""
    start = time.monotonic()
    with Nodes(deploy.load(deployment), admin_token) as nodes:
        moved = nodes.rebalance(nodes.up(), _say(as_json))
    _summary("rebalanced", moved, time.monotonic() - start, as_json)


@app.command("where")
@handle_errors
def where_(
    deployment: DeploymentOpt,
    tenant: Annotated[str | None, typer.Argument(help="A tenant (default: every one).")] = None,
    admin_token: AdminTokenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """The node the proxy sends each tenant to now; with the admin's token, also what each node
    that is up holds of it (sessions, passages, prefix states) and its marks (leaving, gone,
    arriving): a tenant held where the ring does not send it is what `rebalance` resolves."""
    d = deploy.load(deployment)
    keys = d.route_keys()
    if tenant is not None and tenant not in keys:
        raise InvalidInput(f"no tenant {tenant!r} in {d.base_config}")
    chosen = {t: where(d.proxy_http, k) for t, k in keys.items() if tenant in (None, t)}
    held: dict[str, list[TenantHeld]] = {}
    if admin_token:
        with Nodes(d, admin_token) as nodes:
            held = {n: [t for t in nodes.client(n).held_tenants()[0]
                        if tenant in (None, t.tenant)] for n in nodes.up()}  # fmt: skip
    if as_json:
        print(json.dumps({"ring": chosen, "held": {n: [asdict(t) for t in ts]
                                                  for n, ts in held.items()}}
                         if admin_token else chosen))  # fmt: skip
        return
    for t, n in chosen.items():
        here = [f"{node}: {h.sessions} sessions, {h.passages} passages, {h.prefixes} prefix"
                f" states{', ' + h.state if h.state else ''}"
                for node, hs in held.items() for h in hs if h.tenant == t]  # fmt: skip
        out.print(shown(f"{t}: {n}" + (f" (held on {'; '.join(here)})" if here else "")))


def _wait_up(proxy: RuntimeApi, node: str, deadline_s: float = 30.0) -> None:
    """A joined node counts once its health checks pass (UP), not before."""
    end = time.monotonic() + deadline_s
    while (status := proxy.status(node)) != "UP":
        if time.monotonic() > end:
            raise FailedPrecondition(f"{node} is {status} after {deadline_s:g} s: is it running?")
        time.sleep(0.2)
