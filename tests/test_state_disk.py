"""The state directory on a small real filesystem (a tmpfs mounted for the test) that fills while
the daemon serves, on the real model: writes are refused by name (gRPC RESOURCE_EXHAUSTED, HTTP
429), reads still answer, health stays SERVING, and once the filler is gone the next call is served
with no restart; a restart then resumes the session exactly. Where mounting is not allowed the test
skips: the same logic runs on a failpoint in tests/test_parking_faults.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sinkd.daemon.node import Daemon
from sinkd.errors import ERROR_TRAILER
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc
from tests.support.daemons import openai_client
from tests.support.settings import settings
from tests.support.tokens import ALICE

pytestmark = pytest.mark.model
SIZE_MB, MARGIN_MB = 48, 16


@contextlib.contextmanager
def small_filesystem(where: Path) -> Iterator[Path]:
    where.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here: failpoint test only")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB}m,mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): failpoint test only")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path, leave_mb: int) -> Path:
    """A file that leaves `leave_mb` free on the filesystem holding `where`."""
    st = os.statvfs(where)
    size = st.f_bavail * st.f_frsize - leave_mb * 2**20
    filler = where / "filler"
    with filler.open("wb") as f:
        f.truncate(0)
        chunk = b"\0" * 2**20
        for _ in range(size // 2**20):
            f.write(chunk)
    return filler


def logits(s: pb_grpc.SessionsStub, h: pb.Handle) -> np.ndarray:
    r = s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE)
    return np.frombuffer(r.logits, dtype="<f4").copy()


def test_a_state_directory_that_fills_refuses_writes_serves_reads_and_recovers(
    tmp_path: Path,
) -> None:
    with small_filesystem(tmp_path / "small") as small:
        config = settings(
            tmp_path, state_dir=small / "state", min_free_mb=MARGIN_MB, http="127.0.0.1:0"
        )
        d = Daemon(config)
        d.start()
        d.wait_ready(120)
        try:
            channel = grpc.insecure_channel(d.addresses[0])
            s = pb_grpc.SessionsStub(channel)
            h = s.Create(pb.CreateSessionRequest(), metadata=ALICE).handle
            s.Append(pb.AppendRequest(handle=h, text="Before the disk filled."), metadata=ALICE)
            before = logits(s, h)
            filler = fill(small, leave_mb=MARGIN_MB // 2)
            for call in (
                lambda: s.Append(pb.AppendRequest(handle=h, text="More."), metadata=ALICE),
                lambda: list(
                    s.Generate(pb.GenerateRequest(handle=h, max_tokens=4), metadata=ALICE)
                ),
                lambda: s.Create(pb.CreateSessionRequest(), metadata=ALICE),
            ):
                with pytest.raises(grpc.RpcError) as refused:
                    call()
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert f"below min_free_mb ({MARGIN_MB:.1f} MiB)" in refused.value.details()
                trailer = dict(refused.value.trailing_metadata() or ())  # type: ignore[attr-defined]
                assert trailer[ERROR_TRAILER] == "DiskFull"
            with pytest.raises(openai.RateLimitError, match="below min_free_mb"):
                openai_client(d).chat.completions.create(
                    model="smollm2-135m-instruct",
                    messages=[{"role": "user", "content": "Hi"}],
                    max_tokens=4,
                )
            assert np.array_equal(logits(s, h), before)  # reads answer, nothing changed
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest()).status == 1  # SERVING
            filler.unlink()
            s.Append(pb.AppendRequest(handle=h, text=" And after."), metadata=ALICE)
            after = logits(s, h)
            assert not np.array_equal(after, before)
        finally:
            d.stop()
        d = Daemon(config)
        d.start()
        d.wait_ready(120)
        try:
            s = pb_grpc.SessionsStub(grpc.insecure_channel(d.addresses[0]))
            assert np.array_equal(logits(s, h), after)
        finally:
            d.stop()
