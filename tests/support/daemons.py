"""Daemons in another process, and stopping one the way a kill would leave its state."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sinkd.daemon.node import Daemon


def serve_subprocess(
    sock: Path, env: dict[str, str], log: Path | None = None
) -> subprocess.Popen[bytes]:
    """`sinkd serve` in its own process, returned once its health check says SERVING. Its log
    goes to a pipe (read on failure), or appended to `log` for a daemon that runs long."""
    sink: Any = log.open("ab") if log is not None else subprocess.PIPE
    proc = subprocess.Popen(
        [sys.executable, "-m", "sinkd.cli.main", "serve", "--socket", str(sock)],
        stdout=subprocess.DEVNULL, stderr=sink, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"unix:{sock}"))
            if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                return proc
        except grpc.RpcError:
            time.sleep(0.1)
    proc.kill()
    if log is not None:
        raise AssertionError(log.read_text(errors="replace")[-3000:])
    raise AssertionError(proc.stderr.read().decode() if proc.stderr else "no output")


def stop_without_snapshots(d: Daemon) -> None:
    """Stop writing nothing more to the state directory (no stop snapshots): resume then finds what
    a kill -9 would leave, the journal's tail to replay. The real kill -9 is tests/test_crash.py."""
    d.stop(snapshot=False)


def http_daemon(tmp: Path, **kw: Any) -> Daemon:
    """A daemon with its HTTP front on a free port (the test settings' tenants), started and
    ready; the caller stops it."""
    from tests.support.settings import settings

    d = Daemon(settings(tmp, http="127.0.0.1:0", **kw))
    d.start()
    d.wait_ready(120)
    assert d.http is not None
    return d


def openai_client(d: Daemon, key: str = "alice-token") -> Any:
    """The openai SDK on a daemon's HTTP front, without retries."""
    import openai

    assert d.http is not None
    return openai.OpenAI(base_url=f"{d.http.address}/v1", api_key=key, max_retries=0)


def http_serve_env(tmp: Path, **extra: str) -> tuple[dict[str, str], int]:
    """`sinkd serve`'s environment with an HTTP front on a free port and its state under `tmp`
    (no tenants: the local token in `tmp/http-token` guards the port); and the port."""
    import os
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "SINKD_HTTP": f"127.0.0.1:{port}", "SINKD_STATE_DIR": str(tmp / "state")}
    return {**env, **{f"SINKD_{k.upper()}": v for k, v in extra.items()}}, port
