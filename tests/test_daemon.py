"""The gRPC daemon on a temporary Unix socket with the real model: tenants, handles, resets, forks,
continuous batching, cancellation, admission, invariants and shutdown."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sinkd.daemon import failpoints
from sinkd.daemon.node import Daemon
from sinkd.daemon.runtime.api import GenerationOptions, Handle, PolicyRequest, TokenEvent
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal, SessionState
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc
from tests.support.certs import self_signed
from tests.support.clients import Client, code_of
from tests.support.daemons import serve_subprocess
from tests.support.services import in_one_step
from tests.support.settings import settings
from tests.support.texts import TEXT
from tests.support.tokens import ADMIN, ALICE, BOB

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(settings(tmp_path_factory.mktemp("sinkd")))
    d.start()
    d.wait_ready(120)
    yield d
    d.stop()


def test_health_serves_only_once_loaded(tmp_path: Path, daemon: Daemon) -> None:
    unstarted = Daemon(settings(tmp_path))
    req = health_pb2.HealthCheckRequest()
    assert (
        unstarted.grpc.health.Check(req, None).status == health_pb2.HealthCheckResponse.NOT_SERVING
    )
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(daemon.addresses[0]))
    assert stub.Check(req).status == health_pb2.HealthCheckResponse.SERVING


def test_socket_is_private(daemon: Daemon) -> None:
    mode = os.stat(daemon.settings.socket).st_mode & 0o777
    assert mode == 0o600
    assert os.stat(daemon.settings.socket.parent).st_mode & 0o777 == 0o700


def test_tenants_cannot_see_or_touch_each_other(client: Client) -> None:
    h = client.create().handle
    client.append(h, "Alice's private notes about the harbour.")
    req = pb.HandleRequest(handle=h)
    for call in (
        lambda: client.inspect(h, md=BOB),
        lambda: client.append(h, "x", md=BOB),
        lambda: client.s.Generate(pb.GenerateRequest(handle=h, max_tokens=2), metadata=BOB),
        lambda: client.s.Chat(pb.ChatRequest(handle=h, message="hi"), metadata=BOB),
        lambda: client.s.Reset(req, metadata=BOB),
        lambda: client.s.Fork(req, metadata=BOB),
        lambda: client.s.Trace(req, metadata=BOB),
        lambda: client.s.Close(req, metadata=BOB),
    ):
        assert code_of(call) == grpc.StatusCode.NOT_FOUND
    assert client.s.List(pb.ListSessionsRequest(), metadata=BOB).sessions == []
    assert [
        r.session_id for r in client.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions
    ] == [h.session_id]
    assert client.inspect(h).receipt.n_seen > 0  # untouched by bob's attempts
    # the admin sees every session content-free, and can read no text
    everyone = client.admin.ListAllSessions(pb.ListSessionsRequest(), metadata=ADMIN).sessions
    assert h.session_id in [r.session_id for r in everyone]
    # the admin inspects any session content-free (docs/security.md), and never reads its text
    assert client.inspect(h, md=ADMIN).receipt.n_seen == client.inspect(h).receipt.n_seen
    assert (
        code_of(lambda: client.inspect(h, md=ADMIN, text=True)) == grpc.StatusCode.PERMISSION_DENIED
    )
    assert (
        code_of(lambda: client.admin.ListModels(pb.ListModelsRequest(), metadata=ALICE))
        == grpc.StatusCode.PERMISSION_DENIED
    )
    assert (
        code_of(lambda: client.admin.Stats(pb.StatsRequest(), metadata=ALICE))
        == grpc.StatusCode.PERMISSION_DENIED
    )


@pytest.mark.parametrize(
    "md", [[], [("authorization", "Bearer nope")], [("authorization", "Basic abc")]]
)
def test_missing_or_wrong_token_is_unauthenticated(client: Client, md: Any) -> None:
    assert (
        code_of(lambda: client.s.List(pb.ListSessionsRequest(), metadata=md))
        == grpc.StatusCode.UNAUTHENTICATED
    )
    assert code_of(lambda: client.create(md=md)) == grpc.StatusCode.UNAUTHENTICATED


def test_reset_stales_the_handle_frees_cells_and_leaves_nothing(
    client: Client, daemon: Daemon
) -> None:
    h = client.create().handle
    client.append(h, TEXT)
    before = client.admin.Stats(pb.StatsRequest(), metadata=ADMIN).cells_in_use
    held = client.inspect(h).receipt.retained
    assert held > 0
    r = client.s.Reset(pb.HandleRequest(handle=h), metadata=ALICE)
    session = daemon.service.registry.lookup("alice", h.session_id, r.handle.generation)
    assert daemon.service.scheduler.call(lambda e: e.cells.pos_range(session.seq_id)) == (-1, -1)
    assert (
        r.receipt.retained == 0
        and r.receipt.reset_count == 1
        and r.handle.generation != h.generation
    )
    assert client.admin.Stats(pb.StatsRequest(), metadata=ADMIN).cells_in_use == before - held
    for call in (
        lambda: client.append(h, "x"),
        lambda: client.inspect(h),
        lambda: client.s.Reset(pb.HandleRequest(handle=h), metadata=ALICE),
        lambda: client.s.Generate(pb.GenerateRequest(handle=h, max_tokens=2), metadata=ALICE),
    ):
        assert code_of(call) == grpc.StatusCode.FAILED_PRECONDITION
    # the next stream inherits nothing: it continues exactly as a fresh session does
    client.append(r.handle, "The lighthouse keeper counted the ships")
    after_reset, _ = client.generate(r.handle)
    fresh = client.create().handle
    client.append(fresh, "The lighthouse keeper counted the ships")
    assert client.generate(fresh)[0] == after_reset
    s_fresh = daemon.service.registry.lookup("alice", fresh.session_id, fresh.generation)
    s_reset = daemon.service.registry.lookup("alice", r.handle.session_id, r.handle.generation)
    assert np.array_equal(s_fresh.last_logits, s_reset.last_logits)  # bit-identical


def test_fork_is_owned_and_independent(client: Client, daemon: Daemon) -> None:
    parent = client.create().handle
    client.append(parent, TEXT[:200])
    child = client.s.Fork(pb.HandleRequest(handle=parent), metadata=ALICE)
    assert child.handle.session_id != parent.session_id and child.receipt.tenant == "alice"
    assert child.receipt.n_seen == client.inspect(parent).receipt.n_seen
    assert code_of(lambda: client.inspect(child.handle, md=BOB)) == grpc.StatusCode.NOT_FOUND
    p = daemon.service.registry.lookup("alice", parent.session_id, parent.generation)
    logits_before = p.last_logits.copy()
    parent_before = client.inspect(parent).receipt
    assert parent_before.evictions == 0
    client.append(child.handle, TEXT[200:])  # evicts and shifts in the child only
    assert client.inspect(child.handle).receipt.evictions > 0
    assert client.inspect(parent).receipt == parent_before
    assert np.array_equal(p.last_logits, logits_before)
    control = client.create().handle
    client.append(control, TEXT[:200])
    assert client.generate(parent)[0] == client.generate(control)[0]
    fork_of_fork = client.s.Fork(pb.HandleRequest(handle=child.handle), metadata=ALICE)
    assert fork_of_fork.receipt.n_seen == client.inspect(child.handle).receipt.n_seen


def test_batched_sessions_match_solo_runs(client: Client) -> None:
    prompts = [TEXT[i * 90 : i * 90 + 200] for i in range(4)]
    solo = []
    for prompt in prompts:
        h = client.create().handle
        client.append(h, prompt)
        solo.append(client.generate(h, n=16)[0])
        client.s.Close(pb.HandleRequest(handle=h), metadata=ALICE)
    handles = [client.create().handle for _ in prompts]
    results: list[list[int]] = [[] for _ in prompts]

    def run(i: int) -> None:
        client.append(handles[i], prompts[i])
        results[i] = client.generate(handles[i], n=16)[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == solo


def test_admission_parks_past_the_resident_limit_and_refuses_past_the_parked_one(
    tmp_path: Path,
) -> None:
    """Two resident sessions and two parked beyond them: a third session parks the least recently
    used one, a fifth is refused with the limits named, and the parked ones still answer. (One
    tenant alone is refused sooner, at its share: tests/test_tenant_limits.py.)"""
    d = Daemon(settings(tmp_path, max_sessions=2, max_parked_sessions=2))
    d.start()
    d.wait_ready(120)
    try:
        client = Client(d.addresses[0])
        handles = [client.create().handle for _ in range(2)]
        for h in handles:
            client.append(h, "still fine")
        third = client.create()
        assert third.receipt.residency == "resident"
        assert client.inspect(handles[0]).receipt.residency == "parked"
        client.create(md=BOB)  # within bob's reserve (1 of the 4: half, split between two)
        with pytest.raises(grpc.RpcError) as err:
            client.create()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "session limit reached: 2 resident and 2 parked sessions" in err.value.details()
        appended = client.append(handles[0], " and more")
        assert appended.receipt.residency == "resident" and appended.receipt.restored_ms > 0
        assert client.inspect(handles[0]).receipt.n_seen > 3
        stats = client.admin.Stats(pb.StatsRequest(), metadata=ADMIN)
        assert (stats.sessions, stats.max_sessions, stats.parked_sessions) == (4, 2, 2)
        assert stats.max_parked_sessions == 2 and stats.parks >= 3 and stats.restores == 1
        client.close()
    finally:
        d.stop()


def settled(daemon: Daemon, h: pb.Handle) -> None:
    """Return once the engine thread has nothing queued for the session, asked between steps. The
    client's cancel reaches the server asynchronously, so this polls for that positive condition
    (bounded), never sleeps to prove a negative."""
    scheduler = daemon.service.scheduler
    deadline = time.monotonic() + 30
    while scheduler.call(lambda e: scheduler.queues.busy(h.session_id)):
        assert time.monotonic() < deadline, "the cancelled request is still queued after 30 s"
        time.sleep(0.01)


def test_cancelled_append_stops_and_leaves_a_consistent_session(
    daemon: Daemon, client: Client
) -> None:
    h = client.create().handle
    long_text = " ".join([TEXT] * 8)  # about 2,200 tokens: dozens of prefill chunks
    chunks, cut = [0], threading.Event()

    def count() -> None:
        chunks[0] += 1
        if chunks[0] == 3:
            cut.set()

    with failpoints.armed("prefill-chunk", count):
        call = client.s.Append.future(pb.AppendRequest(handle=h, text=long_text), metadata=ALICE)
        assert cut.wait(60)
        call.cancel()
        with pytest.raises(grpc.FutureCancelledError):
            call.result()
        settled(daemon, h)
    first = client.inspect(h).receipt
    settled(daemon, h)
    assert client.inspect(h).receipt.n_seen == first.n_seen  # no more work after the cancel
    assert 0 < first.n_seen < 2200
    assert first.retained + first.evicted_tokens == first.n_seen
    client.append(h, "And then")
    assert len(client.generate(h, n=4)[0]) == 4


def test_cancelled_generate_stops_within_a_step(daemon: Daemon, client: Client) -> None:
    h = client.create().handle
    client.append(h, TEXT[:200])
    n0 = client.inspect(h).receipt.n_seen
    call = client.s.Generate(pb.GenerateRequest(handle=h, max_tokens=200), metadata=ALICE)
    got = 0
    for ev in call:
        got += ev.HasField("token")
        if got == 3:
            call.cancel()
            break
    settled(daemon, h)
    r1 = client.inspect(h).receipt
    settled(daemon, h)
    assert client.inspect(h).receipt.n_seen == r1.n_seen
    # stopped once the server saw the cancel (which travels asynchronously): far short of 200
    assert n0 + 2 <= r1.n_seen < n0 + 100
    assert len(client.generate(h, n=3)[0]) == 3


def test_system_prompt_longer_than_s_is_evicted_unless_pinned(client: Client) -> None:
    system = "You are a lighthouse keeper. Always answer in one short sentence about the sea."
    plain = client.create(system=system, sinks=4, window=60)
    pinned = client.create(system=system, sinks=4, window=60, pin_system_prompt=True)
    n_sys = plain.receipt.system_prompt_tokens
    assert n_sys > 4
    assert plain.receipt.system_prompt_tokens_pinned == 4 and plain.receipt.policy.sinks == 4
    assert pinned.receipt.system_prompt_tokens_pinned == n_sys == pinned.receipt.policy.sinks
    for h in (plain.handle, pinned.handle):
        client.append(h, TEXT[:600])
    plain_text = client.inspect(plain.handle, text=True).retained_text
    pinned_text = client.inspect(pinned.handle, text=True).retained_text
    assert "one short sentence about the sea" in pinned_text
    assert "one short sentence about the sea" not in plain_text


def test_invariant_violation_fails_that_session_alone(client: Client, daemon: Daemon) -> None:
    victim = client.create().handle
    bystander = client.create().handle
    client.append(victim, TEXT[:200])
    client.append(bystander, TEXT[:200])
    s = daemon.service.registry.lookup("alice", victim.session_id, victim.generation)
    daemon.service.scheduler.call(
        lambda e: e.cells.clear(s.seq_id)
    )  # corrupt: cells vanish behind the policy
    before = client.admin.Stats(pb.StatsRequest(), metadata=ADMIN).invariant_violations
    with pytest.raises(grpc.RpcError) as err:
        client.append(victim, "more")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cache positions" in err.value.details()
    assert client.admin.Stats(pb.StatsRequest(), metadata=ADMIN).invariant_violations == before + 1
    assert code_of(lambda: client.generate(victim)) == grpc.StatusCode.FAILED_PRECONDITION
    assert len(client.generate(bystander, n=3)[0]) == 3
    r = client.s.Reset(pb.HandleRequest(handle=victim), metadata=ALICE)  # reset recovers it
    client.append(r.handle, "A fresh start")
    assert client.inspect(r.handle).receipt.state == "idle"


def test_trace_and_receipt_report_logical_and_cache_positions(client: Client) -> None:
    h = client.create(sinks=4, window=60, evict_chunk=8).handle
    client.append(h, TEXT[:700])
    r = client.inspect(h).receipt
    assert (r.anchors_logical.start, r.anchors_logical.end) == (0, 4)
    assert r.recent_logical.end == r.n_seen and r.retained <= 64
    assert (r.recent_cache.start, r.recent_cache.end) == (4, r.retained)
    events = client.s.Trace(pb.HandleRequest(handle=h), metadata=ALICE).events
    assert len(events) == r.evictions and events[0].evicted_logical.start == 4
    assert all(e.evicted_logical.end - e.evicted_logical.start == 8 for e in events)


def test_bad_requests_get_clear_statuses(client: Client) -> None:
    bad = pb.Handle(session_id="s_doesnotexist", generation="x")
    assert code_of(lambda: client.inspect(bad)) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: client.create(window=0)) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: client.create(name="lru")) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: client.create(window=300)) == grpc.StatusCode.INVALID_ARGUMENT
    h = client.create().handle
    bad_tokens = pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=[1, 2, 10**6]))
    assert (
        code_of(lambda: client.s.Append(bad_tokens, metadata=ALICE))
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    assert code_of(lambda: client.generate(h)) == grpc.StatusCode.INVALID_ARGUMENT  # empty session
    sampling = pb.Sampling(temperature=9.0)
    req = pb.GenerateRequest(handle=h, max_tokens=2, sampling=sampling)
    assert (
        code_of(lambda: client.s.Generate(req, metadata=ALICE)) == grpc.StatusCode.INVALID_ARGUMENT
    )


def test_idle_sessions_expire(tmp_path: Path) -> None:
    d = Daemon(settings(tmp_path, idle_timeout_s=1.0))
    d.start()
    d.wait_ready(60)
    try:
        c = Client(d.addresses[0])
        h = c.create().handle
        deadline = time.monotonic() + 30  # expiry is a matter of time: poll it, with a bound
        while (
            time.monotonic() < deadline
            and c.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions
        ):
            time.sleep(0.2)
        assert code_of(lambda: c.inspect(h)) == grpc.StatusCode.NOT_FOUND
    finally:
        d.stop()


def test_stop_with_sessions_open_cancels_and_frees(tmp_path: Path) -> None:
    d = Daemon(settings(tmp_path))
    d.start()
    d.wait_ready(60)
    c = Client(d.addresses[0])
    h = c.create().handle
    c.append(h, TEXT[:200])
    codes: list[grpc.StatusCode] = []
    streaming = threading.Event()

    def long_generate() -> None:
        try:
            for _ in c.s.Generate(pb.GenerateRequest(handle=h, max_tokens=2000), metadata=ALICE):
                streaming.set()
        except grpc.RpcError as e:
            codes.append(e.code())

    t = threading.Thread(target=long_generate)
    t.start()
    assert streaming.wait(60)
    d.stop(grace=1.0)
    t.join(60)  # a wait that ends: the stop cut the 2,000-token stream, which did not complete
    assert not t.is_alive()
    assert codes and codes[0] in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    assert d.service.scheduler.engine is None  # the context was freed
    assert not d.settings.socket.exists()


def test_sigterm_exits_zero_and_sessions_survive_a_kill_unless_durability_is_off(
    tmp_path: Path,
) -> None:
    sock = tmp_path / "d.sock"
    env = dict(
        os.environ,
        SINKD_MAX_SESSIONS="2",
        SINKD_N_CTX_SEQ="256",
        SINKD_STATE_DIR=str(tmp_path / "state"),
    )

    def start(**extra: str) -> subprocess.Popen[bytes]:
        return serve_subprocess(sock, dict(env, **extra))

    proc = start()
    c = Client(f"unix:{sock}")
    h = c.create(md=[]).handle  # no tenants: the socket's user is the single tenant
    c.append(h, "A few words to keep.", md=[])
    seen = c.inspect(h, md=[]).receipt.n_seen
    proc.send_signal(signal.SIGKILL)  # a crash leaves the socket file behind
    proc.wait(10)
    assert sock.exists()
    proc = start()  # the stale socket does not block the restart
    c = Client(f"unix:{sock}")
    receipt = c.inspect(h, md=[]).receipt  # the same handle works: the session was resumed
    assert receipt.n_seen == seen and receipt.resume.endswith("chunks replayed from the journal")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert not sock.exists()
    proc = start(SINKD_DURABLE="false")
    c = Client(f"unix:{sock}")
    h2 = c.create(md=[]).handle
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc = start(SINKD_DURABLE="false")
    c = Client(f"unix:{sock}")
    assert code_of(lambda: c.inspect(h2, md=[])) == grpc.StatusCode.NOT_FOUND  # not kept
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def test_generated_code_is_current() -> None:
    result = subprocess.run(
        [sys.executable, "proto/generate.py", "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_text_in_logs_metrics_or_admin_replies(
    client: Client, daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    from prometheus_client import generate_latest

    sentinel = "ZQXJ-sentinel-4471"
    caplog.set_level("DEBUG")
    h = client.create(system=f"Secret rule {sentinel}.").handle
    client.append(h, f"The password is {sentinel}. " * 3)
    client.generate(h, n=4)
    list(
        client.s.Chat(
            pb.ChatRequest(handle=h, message=f"Repeat {sentinel}", max_tokens=4), metadata=ALICE
        )
    )
    assert sentinel in client.inspect(h, text=True).retained_text  # the owner can read it back
    admin_replies = str(client.admin.ListAllSessions(pb.ListSessionsRequest(), metadata=ADMIN))
    admin_replies += str(client.admin.Stats(pb.StatsRequest(), metadata=ADMIN))
    for where in (caplog.text, generate_latest(daemon.metrics.registry).decode(), admin_replies):
        assert sentinel not in where and "password" not in where


def test_tcp_tls_metrics_and_reflection(tmp_path: Path) -> None:
    import socket
    import urllib.request

    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    cert, key = self_signed(tmp_path)

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    metrics_port = free_port()
    d = Daemon(
        settings(tmp_path, tcp="localhost:0", tls_cert=cert, tls_key=key, metrics_port=metrics_port)
    )
    d.start()
    d.wait_ready(60)
    try:
        tcp = d.addresses[1]
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        stub = pb_grpc.SessionsStub(grpc.secure_channel(tcp, creds))
        h = stub.Create(
            pb.CreateSessionRequest(policy=pb.Policy(name="sink", sinks=4, window=60)), metadata=BOB
        ).handle
        stub.Append(pb.AppendRequest(handle=h, text="over TLS"), metadata=BOB)
        plain = pb_grpc.SessionsStub(grpc.insecure_channel(tcp))
        assert code_of(lambda: plain.List(pb.ListSessionsRequest(), metadata=BOB, timeout=2)) in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        )
        scrape = (
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
            .read()
            .decode()
        )
        assert "sinkd_prefill_tokens_total" in scrape and "sinkd_active_sessions 1.0" in scrape
        d.service.reads.stats(Principal(None, admin=True))  # what once set a gauge per session
        scrape = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
        assert h.session_id not in scrape.read().decode()  # anyone on the machine can read it
        refl = reflection_pb2_grpc.ServerReflectionStub(grpc.insecure_channel(d.addresses[0]))
        reply = next(
            refl.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=BOB
            )
        )
        names = {s.name for s in reply.list_services_response.service}
        assert {"sinkd.v1.Sessions", "sinkd.v1.Admin", "grpc.health.v1.Health"} <= names
    finally:
        d.stop()


def test_a_bug_in_a_step_fails_its_requests_and_the_daemon_serves_on(
    client: Client, daemon: Daemon
) -> None:
    victim = client.create().handle
    client.append(victim, TEXT[:100])
    executor = daemon.service.scheduler.executor
    original = executor.run

    def broken(*args: Any) -> Any:
        executor.run = original  # type: ignore[method-assign]  # fail once
        raise RuntimeError("a bug")

    executor.run = broken  # type: ignore[method-assign]
    with pytest.raises(grpc.RpcError) as err:
        client.append(victim, "more words")
    assert err.value.code() == grpc.StatusCode.INTERNAL and "internal error" in err.value.details()
    assert client.inspect(victim).receipt.retained > 0  # its cells still match its policy
    other = client.create().handle
    client.append(other, "the daemon still serves")
    assert len(client.generate(other, n=3)[0]) == 3


def test_sessions_past_their_budget_share_a_step(tmp_path: Path) -> None:
    """Past its budget a session's sub-batch is E tokens. A step holds every appending session's
    sub-batch, not one session's E tokens and an empty rest: with prefill_chunk == step_tokens,
    two long appends queued together are decoded side by side."""
    svc = SinkdService(settings(tmp_path, step_tokens=64, prefill_chunk=64, durable=False))
    svc.start()
    svc.wait_ready(120)
    me = Principal("local")
    try:
        policy = PolicyRequest("sink", sinks=4, window=60, evict_chunk=8, ingest_chunk=0)
        handles = []
        for _ in range(2):
            handles.append(svc.create(me, policy, None).handle)
        ids = svc.engine.vocab.tokenize(TEXT, add_bos=False)[:200]
        for h in handles:
            svc.append(me, h, None, ids[:64])  # the budget is full from here on
        steps_at_chunk: list[int] = []
        held, go = threading.Event(), threading.Event()

        def on_chunk() -> None:
            if not held.is_set():
                held.set()
                go.wait(60)
            steps_at_chunk.append(int(svc.metrics.steps._value.get()))

        with failpoints.armed("prefill-chunk", on_chunk), ThreadPoolExecutor(2) as pool:
            first = pool.submit(svc.append, me, handles[0], None, ids[64:200])
            assert held.wait(60)  # the engine thread waits inside a step of the first append
            second = pool.submit(svc.append, me, handles[1], None, ids[64:200])
            deadline = time.monotonic() + 30
            while svc.scheduler._inbox.qsize() == 0 and time.monotonic() < deadline:
                time.sleep(0.01)  # the second append's job reaches the engine's inbox
            go.set()
            first.result(120)
            second.result(120)
        per_step = Counter(steps_at_chunk)
        assert len(steps_at_chunk) == 2 * (136 // 8)
        # after the held step the two go side by side: 16 shared steps (one at a time: 4)
        assert sum(n == 2 for n in per_step.values()) == 16, sorted(per_step.items())
    finally:
        svc.stop()


@pytest.fixture
def local_service(tmp_path: Path) -> Iterator[SinkdService]:
    """A started in-process service (no gRPC, not durable) for the local user."""
    svc = SinkdService(settings(tmp_path, durable=False))
    svc.start()
    svc.wait_ready(120)
    yield svc
    svc.stop()


def opened(svc: SinkdService, policy: PolicyRequest, prompt: list[int]) -> Handle:
    """A new session of the local user with `prompt` appended; its handle."""
    h = svc.create(Principal("local"), policy, None).handle
    svc.append(Principal("local"), h, None, prompt)
    return h


def generated(svc: SinkdService, handle: Handle, n: int) -> list[int]:
    """The ids of `n` greedy tokens generated in process."""
    events = svc.generate(Principal("local"), handle, GenerationOptions(n))
    return [e.id for e in events if isinstance(e, TokenEvent)]


def test_a_steps_scattered_sessions_are_moved_to_one_run_and_stay_exact(
    local_service: SinkdService,
) -> None:
    """llama.cpp decodes only rising, consecutive sequence ids in one pass. Sessions at ids 0 and 2
    generating together would cost two: the executor first exchanges sequence 2 with 1 (an idle
    session's). Every session, moved or not, continues exactly as it would have unmoved."""
    svc, me = local_service, Principal("local")
    policy = PolicyRequest("sink", sinks=4, window=124)
    ids = svc.engine.vocab.tokenize(TEXT, add_bos=False)
    prompts = [ids[i * 30 : i * 30 + 40] for i in range(3)]
    tokens = functools.partial(generated, svc, n=8)
    alone = []
    for prompt in prompts:
        h = opened(svc, policy, prompt)
        alone.append(tokens(h))
        svc.close(me, h)
    handles = [opened(svc, policy, p) for p in prompts]
    sessions = [svc.registry.get(h.session_id) for h in handles]
    assert [s.seq_id for s in sessions] == [0, 1, 2]  # the lowest free ids
    first, third = in_one_step(
        svc, [functools.partial(tokens, handles[0]), functools.partial(tokens, handles[2])]
    )
    together = [first.result(120), third.result(120)]
    assert int(svc.metrics.sequence_swaps._value.get()) == 1
    assert sorted([sessions[0].seq_id, sessions[2].seq_id]) == [0, 1]
    assert sessions[1].seq_id == 2
    assert together == [alone[0], alone[2]]
    assert tokens(handles[1]) == alone[1]  # the idle session moved too, intact


def test_sessions_of_different_lengths_in_one_step_each_end_as_alone(tmp_path: Path) -> None:
    """One step with appends of 2, 64 and 5 tokens and a decoding session: in one batch llama.cpp
    would cut the longer items into pieces (1, 1, 3, 59) and their sums would differ from the items
    alone; the executor decodes each length apart (`by_length`), so every session's next-token
    logits, and the generated tokens, are bit for bit what the session makes alone."""
    svc = SinkdService(settings(tmp_path, durable=False, step_tokens=256, prefill_chunk=128))
    svc.start()
    svc.wait_ready(120)
    me = Principal("local")
    policy = PolicyRequest("sink", sinks=4, window=124)
    ids = svc.engine.vocab.tokenize(TEXT * 2, add_bos=False)
    histories = [ids[:35], ids[40:141], ids[150:154], ids[160:283]]  # at sequences 0..3
    appends = [ids[300:302], ids[310:374], ids[380:385]]  # then 2, 64 and 5 more; 3 generates
    tokens = functools.partial(generated, svc, n=4)

    def logits(handle: Handle) -> np.ndarray:
        session = svc.registry.get(handle.session_id)
        assert session is not None and session.last_logits is not None
        return session.last_logits.copy()

    try:
        alone: list[Any] = []
        for i, history in enumerate(histories):
            h = opened(svc, policy, history)
            if i < 3:
                svc.append(me, h, None, appends[i])
                alone.append(logits(h))
            else:
                alone.append(tokens(h))
            svc.close(me, h)
        handles = [opened(svc, policy, history) for history in histories]
        assert [svc.registry.get(h.session_id).seq_id for h in handles] == [0, 1, 2, 3]  # type: ignore[union-attr]
        calls: list[Any] = [
            functools.partial(svc.append, me, handles[i], None, appends[i]) for i in range(3)
        ]
        futures = in_one_step(svc, [*calls, functools.partial(tokens, handles[3])])
        assert futures[3].result(120) == alone[3]
        for i in range(3):
            futures[i].result(120)
            assert np.array_equal(logits(handles[i]), alone[i]), i
    finally:
        svc.stop()


def test_a_refused_exchange_fails_the_two_sessions_it_touched_and_no_other(
    local_service: SinkdService,
) -> None:
    """An exchange that fails after both sequences were emptied (llama.cpp refusing an image, say)
    leaves two caches unlike their histories: those two sessions fail, alone; the step goes on for
    the others and the daemon serves on."""
    from sinkd.errors import EngineError

    svc, me = local_service, Principal("local")
    policy = PolicyRequest("sink", sinks=4, window=124)
    ids = svc.engine.vocab.tokenize(TEXT, add_bos=False)
    handles = []
    for i in range(3):
        handles.append(svc.create(me, policy, None).handle)
        svc.append(me, handles[-1], None, ids[i * 30 : i * 30 + 40])
    sessions = [svc.registry.get(h.session_id) for h in handles]

    def refuse() -> None:
        raise EngineError("llama.cpp took 0 of the image's bytes (failpoint)")

    def tokens(handle: Handle) -> list[int]:
        events = svc.generate(me, handle, GenerationOptions(4))
        return [e.id for e in events if isinstance(e, TokenEvent)]

    with failpoints.armed("swap-cleared", refuse):
        first, third = in_one_step(
            svc, [functools.partial(tokens, handles[0]), functools.partial(tokens, handles[2])]
        )
        assert len(first.result(120)) == 4  # at id 0, never moved: it generates
        with pytest.raises(Exception, match="failed"):
            third.result(120)
    assert sessions[0] is not None and sessions[0].state is not SessionState.FAILED
    assert sessions[1] is not None and sessions[1].state is SessionState.FAILED  # idle, moved
    assert sessions[2] is not None and sessions[2].state is SessionState.FAILED
    assert len(tokens(handles[0])) == 4  # the daemon serves on


def test_only_the_admin_may_stop_the_daemon_and_health_says_so_at_once(tmp_path: Path) -> None:
    """The admin's Stop (a drain's last step) asks for the same graceful stop as SIGTERM; a
    tenant's is PERMISSION_DENIED. Once stopping, the HTTP front's /health is 503 (a proxy sends
    no new work) before the listeners close."""
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = Daemon(settings(tmp_path, http=f"127.0.0.1:{port}"))
    d.start()
    d.wait_ready(120)
    try:
        c = Client(d.addresses[0])
        with pytest.raises(grpc.RpcError) as refused:
            c.admin.Stop(pb.StopRequest(), metadata=ALICE)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED and not d.stop_asked
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        c.admin.Stop(pb.StopRequest(), metadata=ADMIN)
        assert d.stop_asked
        assert d.http is not None
        d.http.stopping.set()  # the first thing stop() does, before the listeners close
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 503
        c.close()
    finally:
        d.stop()
