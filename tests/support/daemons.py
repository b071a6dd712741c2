"""Daemons in another process, and stopping one the way a kill would leave its state."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sinkd.daemon.node import Daemon


def serve_subprocess(sock: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`sinkd serve` in its own process, returned once its health check says SERVING."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sinkd.cli.main", "serve", "--socket", str(sock)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
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
    raise AssertionError(proc.stderr.read().decode() if proc.stderr else "no output")


def stop_without_snapshots(d: Daemon) -> None:
    """Stop writing nothing more to the state directory (no stop snapshots): resume then finds what
    a kill -9 would leave, the journal's tail to replay. The real kill -9 is tests/test_crash.py."""
    d.stop(snapshot=False)
