"""A daemon that is up but still loading its model answers every call with UNAVAILABLE (gRPC's
"try again"), named Loading, and the CLI waits for it to serve, saying so, within a deadline. The
load is held at a failpoint: no test here depends on how long a model takes to load."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sinkd.daemon import failpoints
from sinkd.daemon.node import Daemon
from sinkd.errors import ERROR_TRAILER
from sinkd.proto.v1 import sinkd_pb2 as pb
from tests.support.clients import Client
from tests.support.settings import settings
from tests.support.tokens import ADMIN, ALICE

pytestmark = pytest.mark.model
WAIT_S = 60  # every wait here ends; none is reached unless something is broken


@pytest.fixture
def loading(tmp_path: Path) -> Iterator[tuple[Daemon, threading.Event]]:
    """A daemon bound and listening, its engine thread held inside the model's load until the
    returned event is set."""
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        release.wait(WAIT_S)

    with failpoints.armed("model-loading", hold):
        d = Daemon(settings(tmp_path))
        d.start()
        try:
            assert inside.wait(WAIT_S), "the engine thread never began loading"
            yield d, release
        finally:
            release.set()
            d.stop()


def refusal(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        result = call()  # type: ignore[operator]
        if hasattr(result, "__next__"):
            list(result)
    trailer = dict(e.value.trailing_metadata() or ()).get(ERROR_TRAILER, "")
    return e.value.code(), trailer


def test_every_call_while_the_model_loads_is_unavailable(
    loading: tuple[Daemon, threading.Event],
) -> None:
    d, release = loading
    client = Client(d.addresses[0])
    h = pb.Handle(session_id="s_x", generation="g")
    calls = {
        "Create": lambda: client.s.Create(pb.CreateSessionRequest(), metadata=ALICE),
        "List": lambda: client.s.List(pb.ListSessionsRequest(), metadata=ALICE),
        "Inspect": lambda: client.s.Inspect(pb.InspectRequest(handle=h), metadata=ALICE),
        "Chat": lambda: client.s.Chat(pb.ChatRequest(handle=h, message="hi"), metadata=ALICE),
        "Stats": lambda: client.admin.Stats(pb.StatsRequest(), metadata=ADMIN),
    }
    try:
        for name, call in calls.items():
            assert refusal(call) == (grpc.StatusCode.UNAVAILABLE, "Loading"), name
        release.set()
        d.wait_ready(WAIT_S)
        assert client.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions == []
    finally:
        client.close()


def test_the_cli_waits_for_a_loading_daemon_then_chats(
    loading: tuple[Daemon, threading.Event],
) -> None:
    d, release = loading
    env = {**os.environ, "SINKD_ADDRESS": d.addresses[0], "SINKD_TOKEN": "alice-token"}
    # past its deadline a command gives up with the daemon's exit code (10), saying why
    late = subprocess.run(
        [sys.executable, "-m", "sinkd.cli.main", "sessions", "list"],
        env={**env, "SINKD_WAIT_S": "0.5"}, capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    assert late.returncode == 10, late.stderr
    assert "did not finish loading its model within 0.5 s" in late.stderr
    chat = subprocess.Popen(
        [sys.executable, "-m", "sinkd.cli.main", "chat", "--max-tokens", "8"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert chat.stderr is not None
    reader = threading.Thread(target=lambda: [lines.put(x) for x in chat.stderr], daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        seen = []
        while not any("is loading the model: waiting" in x for x in seen):
            seen.append(lines.get(timeout=WAIT_S))
        assert chat.poll() is None, "it waits, rather than failing or running its own model"
        release.set()
        d.wait_ready(WAIT_S)
        out, _ = chat.communicate("Say hello.\n/quit\n", timeout=WAIT_S)
    finally:
        chat.kill()
    assert chat.returncode == 0, "".join(seen)
    assert out.strip(), "the message was answered"
    assert any("using the daemon at" in x for x in seen)
