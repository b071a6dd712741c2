"""A deployment of identical sinkd nodes behind one HAProxy: its plan (nodes, ports, paths), the
files that run it (haproxy.cfg, one environment file per node, a systemd unit) and the plan read
back by the commands that drain or rejoin a node.

Affinity is by tenant: the proxy hashes the sha256 of the request's bearer token (`x-sinkd-route`)
onto a consistent-hash ring of the nodes, for the HTTP APIs and gRPC alike, so that all of a
user's sessions and conversations live on one node, and a node that leaves or joins moves only the
tenants whose keys it held. The same sha256 is what the nodes' settings keep of each token, so the
admin can name a tenant's key without its token. docs/deployment.md says why this key.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from sinkd.errors import InvalidInput

HTTP_BACKEND, GRPC_BACKEND = "sinkd_http", "sinkd_grpc"
BASE_CONFIG = "base.toml"  # the settings every node shares, copied in beside the other files
ROUTE_HEADER, NODE_HEADER = "x-sinkd-route", "x-sinkd-node"


@dataclass(frozen=True)
class Node:
    name: str
    http: str  # host:port of its OpenAI/Ollama front
    grpc: str  # host:port of its gRPC listener (HTTP/2 cleartext on loopback)
    state_dir: Path
    socket: Path


@dataclass(frozen=True)
class Deployment:
    base_config: Path  # the settings every node shares: model, tenants, admin token's sha256
    conversations_key_file: Path
    proxy_http: str
    proxy_grpc: str
    admin_socket: Path  # HAProxy's runtime API (level admin)
    nodes: tuple[Node, ...]
    tls_cert: Path | None = None  # the proxy's certificate + key (PEM), where it faces a network

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise InvalidInput(f"no node {name!r} in this deployment ({', '.join(self.names)})")

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def route_keys(self) -> dict[str, str]:
        """tenant -> the key the proxy hashes for it (its token's sha256, from the base config)."""
        return {str(t["name"]): str(t["token_sha256"]) for t in _tenants(self.base_config)}


def plan(
    nodes: int,
    folder: Path,
    base_config: Path,
    proxy_http: str = "127.0.0.1:7800",
    proxy_grpc: str = "127.0.0.1:7801",
    first_port: int = 7820,
    state_root: Path | None = None,
    run_dir: Path | None = None,
    tls_cert: Path | None = None,
    install_dir: Path | None = None,
) -> Deployment:
    """N nodes on this host's loopback, two ports each from `first_port` (HTTP, then gRPC).
    The files name their paths under `install_dir` (default: the folder they are written to),
    where the folder is to live when it runs (/etc/sinkd, say)."""
    if not 1 <= nodes <= 64:
        raise InvalidInput(f"--nodes {nodes}: between 1 and 64")
    root = (install_dir or folder).absolute()
    state_root = (state_root or root / "state").absolute()
    run_dir = (run_dir or root / "run").absolute()
    _tenants(base_config)  # checked now, not at the first drain
    members = tuple(
        Node(
            name=f"n{i + 1}",
            http=f"127.0.0.1:{first_port + 2 * i}",
            grpc=f"127.0.0.1:{first_port + 2 * i + 1}",
            state_dir=state_root / f"n{i + 1}",
            socket=run_dir / f"n{i + 1}" / "sinkd.sock",
        )
        for i in range(nodes)
    )
    return Deployment(
        root / BASE_CONFIG, root / "conversations.key", proxy_http, proxy_grpc,
        run_dir / "haproxy-admin.sock", members, tls_cert,
    )  # fmt: skip


def _tenants(base_config: Path) -> list[dict[str, Any]]:
    try:
        data = tomllib.loads(base_config.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise InvalidInput(f"{base_config}: {e}") from None
    tenants = data.get("tenants") or []
    if not tenants or not data.get("admin_token_sha256"):
        raise InvalidInput(
            f"{base_config}: a deployment needs tenants (the proxy routes by their tokens) and"
            " admin_token_sha256 (drains move sessions with it)"
        )
    return list(tenants)


def route_key(token: str) -> str:
    """What the proxy hashes for a request with this bearer token."""
    return hashlib.sha256(token.encode()).hexdigest()


# --- the files ---


def haproxy_cfg(d: Deployment) -> str:
    """HAProxy 2.6: one frontend per protocol, one consistent-hash backend each on the same ring
    (servers with the same ids and weights); the gRPC servers track the HTTP servers' health, and
    inherit their drain, so both protocols of a node leave and come back together."""
    ssl = f" ssl crt {d.tls_cert} alpn h2,http/1.1" if d.tls_cert else ""
    route = (
        f"    http-request set-header {ROUTE_HEADER}"
        " %[req.hdr(authorization),word(2,' '),sha2(256),hex,lower]"
        " if { req.hdr(authorization) -m found }"
    )
    lines = [
        "# sinkd behind HAProxy: written by `sinkd nodes init` (docs/deployment.md)",
        "global",
        f"    stats socket {d.admin_socket} mode 600 level admin",
        "    hard-stop-after 30s",
        "",
        "defaults",
        "    mode http",
        "    # send each piece as it comes: without it HAProxy held streamed tokens (SSE) back in",
        "    # ~200 ms bursts (bench/deployment.py)",
        "    option http-no-delay",
        "    timeout connect 2s",
        "    timeout http-request 10s",
        "    # a turn can prefill a long history before its first byte; streams idle between turns",
        "    timeout client 10m",
        "    timeout server 10m",
        "    timeout http-keep-alive 60s",
        "    # a node that refuses a connection (killed, before its checks fail): try another",
        "    retries 2",
        "    option redispatch 1",
        "    # no access log: a request line or header may carry text or a token",
        "",
        "frontend sinkd_http",
        f"    bind {d.proxy_http}{ssl}",
        route,
        f"    default_backend {HTTP_BACKEND}",
        "",
        "frontend sinkd_grpc",
        f"    bind {d.proxy_grpc}{ssl if ssl else ' proto h2'}",
        route,
        f"    default_backend {GRPC_BACKEND}",
        "",
        f"backend {HTTP_BACKEND}",
        f"    balance hdr({ROUTE_HEADER})",
        "    hash-type consistent",
        "    option httpchk GET /health",
        "    http-check expect status 200",
        "    default-server inter 1s fall 2 rise 2",
        f"    http-response set-header {NODE_HEADER} %[srv_name]",
        *(f"    server {n.name} {n.http} id {i + 1} check" for i, n in enumerate(d.nodes)),
        "",
        f"backend {GRPC_BACKEND}",
        f"    balance hdr({ROUTE_HEADER})",
        "    hash-type consistent",
        f"    http-response set-header {NODE_HEADER} %[srv_name]",
        *(
            f"    server {n.name} {n.grpc} id {i + 1} proto h2 track {HTTP_BACKEND}/{n.name}"
            for i, n in enumerate(d.nodes)
        ),
        "",
    ]
    return "\n".join(lines)


def node_env(d: Deployment, node: Node) -> str:
    """The node's settings beside the shared base config (`sinkd serve` reads SINKD_*)."""
    return "".join(
        f"{k}={v}\n"
        for k, v in (
            ("SINKD_CONFIG", d.base_config),
            ("SINKD_NODE", node.name),
            ("SINKD_HTTP", node.http),
            ("SINKD_TCP", node.grpc),
            ("SINKD_STATE_DIR", node.state_dir),
            ("SINKD_SOCKET", node.socket),
            ("SINKD_CONVERSATIONS_KEY_FILE", d.conversations_key_file),
        )
    )


SYSTEMD_UNIT = """\
# /etc/systemd/system/sinkd@.service: `systemctl start sinkd@n1` (written by `sinkd nodes init`)
[Unit]
Description=sinkd node %i
After=network.target

[Service]
EnvironmentFile={folder}/nodes/%i.env
ExecStart={sinkd} serve
# a drain stops the node cleanly (exit 0): it stays stopped; a crash restarts it
Restart=on-failure
KillSignal=SIGTERM
TimeoutStopSec=30

[Install]
WantedBy=multi-user.target
"""


def deployment_toml(d: Deployment) -> str:
    def q(v: object) -> str:
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [
        "# the deployment `sinkd nodes drain|join|rebalance|where` read (`sinkd nodes init`)",
        f"base_config = {q(d.base_config)}",
        f"conversations_key_file = {q(d.conversations_key_file)}",
        *([f"tls_cert = {q(d.tls_cert)}"] if d.tls_cert else []),
        "",
        "[proxy]",
        f"http = {q(d.proxy_http)}",
        f"grpc = {q(d.proxy_grpc)}",
        f"admin_socket = {q(d.admin_socket)}",
    ]
    for n in d.nodes:
        lines += [
            "",
            "[[nodes]]",
            f"name = {q(n.name)}",
            f"http = {q(n.http)}",
            f"grpc = {q(n.grpc)}",
            f"state_dir = {q(n.state_dir)}",
            f"socket = {q(n.socket)}",
        ]
    return "\n".join(lines) + "\n"


def write(d: Deployment, folder: Path, base_config: Path, sinkd: str = "sinkd") -> list[Path]:
    """The deployment's files in `folder`, the base config copied in beside them; the
    conversations key is made once (0600) and kept."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nodes").mkdir(exist_ok=True)
    root = d.base_config.parent
    files = {
        folder / "haproxy.cfg": haproxy_cfg(d),
        folder / "deployment.toml": deployment_toml(d),
        folder / "sinkd@.service": SYSTEMD_UNIT.format(folder=root, sinkd=sinkd),
        **{folder / "nodes" / f"{n.name}.env": node_env(d, n) for n in d.nodes},
    }
    if base_config.absolute() != (folder / BASE_CONFIG).absolute():
        files[folder / BASE_CONFIG] = base_config.read_text()
    for path, text in files.items():
        path.write_text(text)
    key = folder / d.conversations_key_file.name
    if not key.exists():
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    return [*files, key]


def load(path: Path) -> Deployment:
    """A deployment.toml as `write` made it (InvalidInput naming what is missing)."""
    try:
        data = tomllib.loads(path.read_text())
        proxy = data["proxy"]
        return Deployment(
            base_config=Path(data["base_config"]),
            conversations_key_file=Path(data["conversations_key_file"]),
            proxy_http=str(proxy["http"]),
            proxy_grpc=str(proxy["grpc"]),
            admin_socket=Path(proxy["admin_socket"]),
            nodes=tuple(
                Node(
                    str(n["name"]),
                    str(n["http"]),
                    str(n["grpc"]),
                    Path(n["state_dir"]),
                    Path(n["socket"]),
                )  # fmt: skip
                for n in data["nodes"]
            ),
            tls_cert=Path(data["tls_cert"]) if data.get("tls_cert") else None,
        )
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise InvalidInput(f"{path}: {e}") from None
    except (KeyError, TypeError) as e:
        raise InvalidInput(f"{path}: not a sinkd deployment (missing {e})") from None
