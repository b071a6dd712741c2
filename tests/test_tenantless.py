"""Calls that need no tenant (health, reflection) cannot take the workers from those that do."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from sinkd.daemon.node import Daemon
from sinkd.errors import ListenError
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc
from tests.support.settings import settings
from tests.support.tokens import ALICE

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def tcp_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(settings(tmp_path_factory.mktemp("tenantless"), durable=False, tcp="127.0.0.1:0"))
    d.start()
    d.wait_ready(120)
    yield d
    d.stop()


def _held_reflection(channel: grpc.Channel, md: Any, release: threading.Event) -> Any:
    """A reflection stream that asks once, then stays open until `release`."""

    def requests() -> Iterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        release.wait(60)

    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    return stub.ServerReflectionInfo(requests(), metadata=md, timeout=60)


def _settled(call: Any) -> str:
    """Its first answer ('open': the stream holds a worker now) or its status code's name."""
    try:
        next(call)
        return "open"
    except grpc.RpcError as e:
        return str(e.code().name)


def test_64_tenantless_streams_leave_health_and_tenants_answering(tcp_daemon: Daemon) -> None:
    address = tcp_daemon.addresses[1]
    with grpc.insecure_channel(address) as before:
        alices_sessions = [
            s.session_id
            for s in pb_grpc.SessionsStub(before)
            .List(pb.ListSessionsRequest(), metadata=ALICE, timeout=5)
            .sessions
        ]
    release = threading.Event()
    channels = [grpc.insecure_channel(address) for _ in range(8)]
    calls = []
    try:
        for i in range(64):
            channel = channels[i % len(channels)]
            if i % 2:
                watch = health_pb2_grpc.HealthStub(channel).Watch(
                    health_pb2.HealthCheckRequest(), timeout=60
                )
                calls.append(watch)
            else:  # with a tenant's token: reflection answers it, and it is bounded all the same
                calls.append(_held_reflection(channel, ALICE, release))
        with ThreadPoolExecutor(len(calls)) as pool:  # a stream with no worker never answers
            pending = [pool.submit(_settled, c) for c in calls]
            outcomes = []
            for f in pending:
                try:
                    outcomes.append(f.result(timeout=15))
                except FuturesTimeout:
                    outcomes.append("no answer")
                    break
            if "no answer" in outcomes:
                release.set()
                for c in calls:
                    c.cancel()
        assert "no answer" not in outcomes, "a stream found no worker: the pool is taken"
        assert outcomes.count("open") == tcp_daemon.settings.max_tenantless_streams
        assert set(outcomes) == {"open", "RESOURCE_EXHAUSTED"}

        # with every tenantless stream held, health and a tenant's call still find a worker: they
        # answer (a refusal or no worker would raise, within the timeout) what they answered before
        fresh = grpc.insecure_channel(address)
        health = health_pb2_grpc.HealthStub(fresh).Check(health_pb2.HealthCheckRequest(), timeout=5)
        listed = pb_grpc.SessionsStub(fresh).List(
            pb.ListSessionsRequest(), metadata=ALICE, timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert [s.session_id for s in listed.sessions] == alices_sessions
        fresh.close()
    finally:
        release.set()
        for c in calls:
            c.cancel()
        for ch in channels:
            ch.close()
    deadline = time.monotonic() + 10  # cancelled streams give their workers back
    while tcp_daemon.grpc.tenantless.count() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tcp_daemon.grpc.tenantless.count() == 0


def test_reflection_needs_a_token_where_tokens_exist(tcp_daemon: Daemon) -> None:
    channel = grpc.insecure_channel(tcp_daemon.addresses[1])
    release = threading.Event()
    release.set()
    try:
        assert _settled(_held_reflection(channel, (), release)) == "UNAUTHENTICATED"
        assert _settled(_held_reflection(channel, ALICE, release)) == "open"
    finally:
        channel.close()


@pytest.mark.unit
def test_a_second_daemon_cannot_share_a_tcp_port(tmp_path: Path) -> None:
    """gRPC sets SO_REUSEPORT by default: two daemons would split one port's connections."""
    first = Daemon(settings(tmp_path / "a", durable=False, tcp="127.0.0.1:0"))
    try:
        first._listen()
        port = first.addresses[1].rsplit(":", 1)[1]
        second = Daemon(settings(tmp_path / "b", durable=False, tcp=f"127.0.0.1:{port}"))
        with pytest.raises(ListenError, match="could not listen"):
            second.start()
    finally:
        first.grpc.stop(0)
        first.grpc.remove_own_socket()
