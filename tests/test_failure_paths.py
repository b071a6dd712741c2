"""Failure paths a careful reading and an adversarial client found, each triggered deterministically
(failpoints, events, barriers; never this machine's speed): the engine thread dying, waits that must
end, the engine used off its thread during shutdown, one failure touching only its session, leaked
sequences, a reset the journal refused, a finished generation overtaken by a reset, requests bound
to their generation against racing resets and closes, backpressure, bounded error messages, and who
may call what."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from typer.testing import CliRunner

from sinkd.cli.main import app
from sinkd.daemon import failpoints
from sinkd.daemon.node import Daemon
from sinkd.errors import DeadlineExceeded, EngineError, ShuttingDown
from sinkd.evaluation import SAMPLE_TEXT as TEXT
from sinkd.proto.v1 import sinkd_pb2 as pb
from tests.support.clients import Client, code_of
from tests.support.settings import settings
from tests.support.tokens import ADMIN, ALICE, BOB

pytestmark = pytest.mark.model
SENTINEL = "ZEBRAQUARTZ"
WAIT = 30.0  # a bound on waits that must end; the triggers themselves are events, not time


class Threads:
    """Run calls in threads; their errors and results are collected and re-raised in the test."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.results: dict[int, Any] = {}
        self.errors: dict[int, BaseException] = {}

    def start(self, fn: Callable[[], Any]) -> int:
        key = len(self.threads)

        def run() -> None:
            try:
                self.results[key] = fn()
            except BaseException as e:  # collected, re-raised or inspected by the test
                self.errors[key] = e

        t = threading.Thread(target=run, daemon=True)
        self.threads.append(t)
        t.start()
        return key

    def join(self) -> None:
        for t in self.threads:
            t.join(WAIT)
            assert not t.is_alive(), "a call did not end within its bound"

    def code(self, key: int) -> grpc.StatusCode | None:
        e = self.errors.get(key)
        if e is None:
            return None
        assert isinstance(e, grpc.RpcError), repr(e)
        return e.code()


def start_daemon(tmp: Path, **kw: Any) -> Daemon:
    d = Daemon(settings(tmp, **kw))
    d.start()
    d.wait_ready(120)
    return d


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("sinkd"), max_calls_per_session=8)
    yield d
    d.stop()


def health(address: str) -> int:
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(address))
    return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status)


# --- the engine thread ---


def test_engine_thread_death_stops_serving(tmp_path: Path) -> None:
    """A bug outside a step (here: in idle expiry) ends the engine thread: health goes NOT_SERVING
    at once and calls are refused UNAVAILABLE; no zombie that says SERVING."""
    d = start_daemon(tmp_path)
    try:
        c = Client(d.addresses[0])
        h = c.create().handle
        assert health(d.addresses[0]) == health_pb2.HealthCheckResponse.SERVING

        def bug() -> None:
            raise RuntimeError("a bug in expiry")

        with failpoints.armed("expire-idle", bug):
            assert d.died.wait(WAIT)
        assert health(d.addresses[0]) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert code_of(lambda: c.append(h, "more")) == grpc.StatusCode.UNAVAILABLE
        assert not d.service.scheduler.alive()
    finally:
        d.stop()


def test_serve_exits_non_zero_when_the_engine_thread_dies(tmp_path: Path) -> None:
    def bug() -> None:
        raise RuntimeError("a bug in expiry")

    args = ["serve", "--socket", str(tmp_path / "s.sock"), "--state-dir", str(tmp_path / "st")]
    with failpoints.armed("expire-idle", bug):
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 70, result.output
    assert "engine thread died" in result.output


def test_every_wait_on_the_engine_ends(daemon: Daemon, client: Client) -> None:
    """A call the engine cannot answer in time ends with DeadlineExceeded; a job whose engine is
    gone ends too (ShuttingDown / CANCELLED), never a wait forever."""
    scheduler = daemon.service.scheduler
    release = threading.Event()
    held = Threads()
    held.start(lambda: scheduler.call(lambda e: release.wait(WAIT)))
    try:
        with pytest.raises(DeadlineExceeded):
            scheduler.call(lambda e: None, timeout=0.5)
    finally:
        release.set()
        held.join()
    assert scheduler.call(lambda e: 42) == 42  # the engine serves on


def test_calls_racing_a_stop_are_all_answered(tmp_path: Path) -> None:
    """Calls enqueued while the engine stops: each gets its answer or ShuttingDown."""
    d = start_daemon(tmp_path)
    scheduler = d.service.scheduler
    entered = threading.Event()
    go = threading.Event()

    def on_enqueue() -> None:
        entered.set()
        go.wait(WAIT)

    calls = Threads()
    with failpoints.armed("call-enqueued", on_enqueue):
        key = calls.start(lambda: scheduler.call(lambda e: "answered"))
        assert entered.wait(WAIT)
        stopper = threading.Thread(target=d.stop, daemon=True)
        stopper.start()
        go.set()
        calls.join()
        stopper.join(WAIT)
    assert calls.results.get(key) == "answered" or isinstance(calls.errors[key], ShuttingDown)
    with pytest.raises(ShuttingDown):
        scheduler.call(lambda e: None)


def test_tokenizing_holds_off_the_engine_close(tmp_path: Path) -> None:
    """Text is tokenized on the RPC thread; a stop waits for it before freeing the model, and a
    tokenize after the close is refused (UNAVAILABLE) rather than touch freed memory."""
    d = start_daemon(tmp_path)
    c = Client(d.addresses[0])
    h = c.create().handle
    engine = d.service.engine
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        release.wait(WAIT)

    calls = Threads()
    with failpoints.armed("tokenize", hold):
        key = calls.start(lambda: c.append(h, TEXT))
        assert inside.wait(WAIT)
        stopper = threading.Thread(target=d.stop, daemon=True)
        stopper.start()
        with engine.vocab._text_cond:  # the close has begun and waits for the tokenizer
            assert engine.vocab._text_cond.wait_for(lambda: engine.vocab._text_closed, WAIT)
            assert engine.vocab._text_users == 1
        assert stopper.is_alive()
        release.set()
        calls.join()
        stopper.join(WAIT)
    assert calls.code(key) == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(ShuttingDown):
        engine.vocab.tokenize("after the close")


# --- one failure touches only what it concerns ---


def test_a_refused_packing_fails_only_its_session(daemon: Daemon, client: Client) -> None:
    bystander = client.create(window=250).handle
    client.append(bystander, "A bystander, generating while another session fails.")
    victim = client.create(window=30).handle
    client.append(victim, "short")
    fired = threading.Event()
    bystander_queued: list[bool] = []
    queues = daemon.service.scheduler.queues

    def refuse() -> None:
        if not fired.is_set():
            fired.set()
            bystander_queued.append(queues.busy(bystander.session_id))
            raise EngineError("llama.cpp refused to take the packed image")

    calls = Threads()
    with failpoints.armed("before-compact", refuse):
        stream = client.s.Generate(
            pb.GenerateRequest(handle=bystander, max_tokens=150), metadata=ALICE
        )
        first = next(stream)  # the bystander is generating: its job is queued through the failure
        app_ = calls.start(lambda: client.append(victim, TEXT))  # evicts, then packs
        rest = list(stream)
        calls.join()
    assert fired.is_set() and bystander_queued == [True]
    assert calls.code(app_) == grpc.StatusCode.FAILED_PRECONDITION
    tokens = [first, *rest][:-1]
    assert len(tokens) == 150 and rest[-1].done.reason == "max_tokens"
    assert client.inspect(victim).receipt.state == "failed"
    client.s.Reset(pb.HandleRequest(handle=victim), metadata=ALICE)  # reset recovers it


def test_a_failed_fork_or_create_leaks_no_sequence(daemon: Daemon, client: Client) -> None:
    parent = client.create().handle
    client.append(parent, "a parent to fork")

    def refuse() -> None:
        raise EngineError("the copy failed")

    req = pb.HandleRequest(handle=parent)
    with failpoints.armed("engine-copy", refuse):
        for _ in range(8):  # more failures than the context has sequences
            assert code_of(lambda: client.s.Fork(req, metadata=ALICE)) == grpc.StatusCode.INTERNAL
    with failpoints.armed("sequence-acquired", refuse):
        for _ in range(8):  # a create whose fresh sequence cannot be cleared
            assert code_of(lambda: client.create()) == grpc.StatusCode.INTERNAL
    limit = daemon.service.max_sessions()
    handles = [client.create().handle for _ in range(limit - 1)]
    assert len(handles) == limit - 1
    assert daemon.service.registry.parked() == []  # every sequence was free: none leaked
    client.s.Fork(req, metadata=ALICE)  # past them, an idle session is parked for the fork
    assert len(daemon.service.registry.parked()) == 1


@contextlib.contextmanager
def _next_commit_refused(durability: Any) -> Iterator[None]:
    """The journal's next commit fails as a full or broken disk makes it fail (once)."""
    original = durability.commit

    def refuse() -> None:
        durability.commit = original
        raise sqlite3.OperationalError("disk I/O error")

    durability.commit = refuse
    try:
        yield
    finally:
        durability.commit = original


def test_a_reset_the_journal_refuses_changes_nothing(daemon: Daemon, client: Client) -> None:
    h = client.create().handle
    client.append(h, TEXT[:300])
    before = client.s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE)
    durability = daemon.service.durability
    assert durability is not None
    with _next_commit_refused(durability):
        req = pb.HandleRequest(handle=h)
        assert code_of(lambda: client.s.Reset(req, metadata=ALICE)) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED
        )
    after = client.s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE)
    assert after.receipt == before.receipt  # the old handle still works, nothing moved
    assert np.array_equal(np.frombuffer(after.logits, "<f4"), np.frombuffer(before.logits, "<f4"))
    assert client.s.Reset(pb.HandleRequest(handle=h), metadata=ALICE).receipt.reset_count == 1


def test_a_close_the_journal_refuses_is_refused_and_the_session_stays(
    daemon: Daemon, client: Client
) -> None:
    """Answered OK, an unrecorded close would bring the session back at the next start."""
    h = client.create().handle
    client.append(h, TEXT[:300])
    before = client.s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE)
    durability = daemon.service.durability
    assert durability is not None
    with _next_commit_refused(durability):
        req = pb.HandleRequest(handle=h)
        assert code_of(lambda: client.s.Close(req, metadata=ALICE)) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED
        )
    after = client.s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE)
    assert after.receipt == before.receipt
    assert np.array_equal(np.frombuffer(after.logits, "<f4"), np.frombuffer(before.logits, "<f4"))
    assert h.session_id in [s.id for s in durability.stored()]
    client.s.Close(pb.HandleRequest(handle=h), metadata=ALICE)  # and a close that is recorded
    assert h.session_id not in [s.id for s in durability.stored()]


def test_a_finished_generation_survives_a_reset_before_its_done(
    daemon: Daemon, client: Client
) -> None:
    h = client.create().handle
    client.append(h, "Count with me: one, two,")

    def reset_now() -> None:
        client.s.Reset(pb.HandleRequest(handle=h), metadata=ALICE)

    with failpoints.armed("generation-done", reset_now):
        ids, done = client.generate(h, n=5)
    assert len(ids) == 5 and done.reason == "max_tokens"
    assert done.receipt.generation == h.generation  # the receipt as the generation left it
    assert done.receipt.n_seen > 0


# --- requests stay bound to their generation ---


@contextlib.contextmanager
def append_held_after_tokenizing(
    client: Client, h: pb.Handle, text: str
) -> Iterator[Callable[[], grpc.StatusCode | None]]:
    """An append of `text`, in a thread, held just after it was tokenized while the block runs
    (what overtakes it); then released and joined. Yields what gives the append's status code."""
    tokenized, release = threading.Event(), threading.Event()

    def hold() -> None:
        tokenized.set()
        release.wait(WAIT)

    calls = Threads()
    with failpoints.armed("append-tokenized", hold):
        key = calls.start(lambda: client.append(h, text))
        assert tokenized.wait(WAIT)
        try:
            yield lambda: calls.code(key)
        finally:
            release.set()
            calls.join()


def test_a_release_overtaking_an_append_leaves_nothing_of_it(
    daemon: Daemon, client: Client
) -> None:
    """A drain's Release while an append of the session is being tokenized: the append lands
    nowhere (it answers CANCELLED, or its session is gone), the session is closed here, and from
    then on this node answers UNAVAILABLE for it (it moved), not NOT_FOUND."""
    h = client.create().handle
    with append_held_after_tokenizing(client, h, f"{TEXT} {SENTINEL}") as append_code:
        client.s.Release(pb.HandleRequest(handle=h), metadata=ALICE)
    assert append_code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    assert code_of(lambda: client.inspect(h)) == grpc.StatusCode.UNAVAILABLE
    assert daemon.service.registry.get(h.session_id) is None
    durability = daemon.service.durability
    assert durability is not None and h.session_id not in [s.id for s in durability.stored()]


def test_a_reset_cancels_an_append_still_being_tokenized(daemon: Daemon, client: Client) -> None:
    """The adversarial client's finding: a reset while a large append was being tokenized let the
    append land in the NEW generation. Now it is dropped unapplied."""
    h = client.create().handle
    with append_held_after_tokenizing(client, h, f"{TEXT} {SENTINEL} {TEXT}") as append_code:
        fresh = client.s.Reset(pb.HandleRequest(handle=h), metadata=ALICE).handle
    assert append_code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.CANCELLED)
    r = client.inspect(fresh, text=True)
    assert r.receipt.n_seen == 0 and SENTINEL not in r.retained_text


MUTATIONS: dict[str, Callable[[Client, pb.Handle], Any]] = {
    "append": lambda c, h: c.append(h, f"{SENTINEL} more text"),
    "generate": lambda c, h: c.generate(h, n=4),
    "chat": lambda c, h: list(c.s.Chat(pb.ChatRequest(handle=h, message=SENTINEL), metadata=ALICE)),
    "fork": lambda c, h: c.s.Fork(pb.HandleRequest(handle=h), metadata=ALICE),
}


@pytest.mark.parametrize("overtaken_by", ["reset", "close"])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_every_mutation_races_reset_and_close(
    daemon: Daemon, client: Client, mutation: str, overtaken_by: str
) -> None:
    h = client.create().handle
    client.append(h, "Some words before the race.")
    checked, release = threading.Event(), threading.Event()

    def hold() -> None:
        if not checked.is_set():
            checked.set()
            release.wait(WAIT)

    calls = Threads()
    with failpoints.armed("handle-checked", hold):
        key = calls.start(lambda: MUTATIONS[mutation](client, h))
        assert checked.wait(WAIT)
    req = pb.HandleRequest(handle=h)
    fresh = None
    if overtaken_by == "reset":
        fresh = client.s.Reset(req, metadata=ALICE).handle
    else:
        client.s.Close(req, metadata=ALICE)
    release.set()
    calls.join()
    assert calls.code(key) in (
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.NOT_FOUND,
    ), calls.results.get(key)
    sessions = client.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions
    if fresh is not None:
        r = client.inspect(fresh, text=True)
        assert r.receipt.n_seen == 0 and SENTINEL not in r.retained_text
        assert len(sessions) == 1  # no fork of the old generation was made
    else:
        assert len(sessions) == 0


def test_concurrent_resets_with_one_handle_one_wins(daemon: Daemon, client: Client) -> None:
    h = client.create().handle
    client.append(h, "one handle, six resets")
    barrier = threading.Barrier(6, timeout=WAIT)
    calls = Threads()
    with failpoints.armed("handle-checked", barrier.wait):  # all six pass the lookup first
        keys = [
            calls.start(lambda: client.s.Reset(pb.HandleRequest(handle=h), metadata=ALICE))
            for _ in range(6)
        ]
        calls.join()
    codes = [calls.code(k) for k in keys]
    assert codes.count(None) == 1, codes
    assert codes.count(grpc.StatusCode.FAILED_PRECONDITION) == 5, codes
    winner = next(calls.results[k] for k in keys if k in calls.results)
    assert winner.receipt.reset_count == 1


# --- backpressure ---


def test_a_flood_from_one_tenant_leaves_the_daemon_to_the_others(
    daemon: Daemon, client: Client
) -> None:
    """40 generations queued by alice on one session: eight are admitted (max_calls_per_tenant and
    _per_session), the rest refused at once; health, admin and bob's calls are answered meanwhile."""
    h = client.create().handle
    client.append(h, TEXT[:200])
    bob = client.create(md=BOB).handle
    calls = Threads()
    held = [0]
    lock = threading.Lock()
    release = threading.Event()

    def hold() -> None:  # each admitted generation waits here until the test has looked
        with lock:
            held[0] += 1
        release.wait(WAIT)

    with failpoints.armed("handle-checked", hold):
        keys = [calls.start(lambda: client.generate(h, n=8)) for _ in range(40)]
        deadline = time.monotonic() + WAIT  # every call admitted (held) or refused: a bounded poll
        while held[0] + len(calls.errors) < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held[0] == 8 and len(calls.errors) == 32, (held, calls.errors)
        assert health(daemon.addresses[0]) == health_pb2.HealthCheckResponse.SERVING
        stats = client.admin.Stats(pb.StatsRequest(), metadata=ADMIN, timeout=5)
        assert stats.sessions >= 2
        release.set()
        calls.join()
    # bob's calls pass the same failpoint: it is disarmed now
    assert client.append(bob, "bob still works", md=BOB, timeout=WAIT).appended > 0
    codes = [calls.code(k) for k in keys]
    assert codes.count(None) == 8, codes
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 32, codes
    refused = next(e for e in calls.errors.values() if isinstance(e, grpc.RpcError))
    assert "max_calls_per_" in refused.details()


def test_an_exhausted_pool_still_answers_health(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, rpc_workers=6, rpc_reserved_workers=2, max_calls_per_tenant=8)
    try:
        c = Client(d.addresses[0])
        handles = [c.create().handle for _ in range(4)]
        release = threading.Event()
        entered = threading.Semaphore(0)

        def hold() -> None:
            entered.release()
            release.wait(WAIT)

        calls = Threads()
        with failpoints.armed("handle-checked", hold):
            keys = [calls.start(lambda h=h: c.append(h, "x")) for h in handles]
            for _ in handles:
                assert entered.acquire(timeout=WAIT)  # four workers held: the engine-call cap
            assert code_of(lambda: c.append(handles[0], "y")) == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert health(d.addresses[0]) == health_pb2.HealthCheckResponse.SERVING
            release.set()
            calls.join()
        assert [calls.code(k) for k in keys] == [None] * 4
    finally:
        d.stop()


def test_a_tenant_flooding_a_full_pool_leaves_another_tenant_answered(tmp_path: Path) -> None:
    """Alice holds the whole pool (four engine calls held at a failpoint) and floods it with more:
    refused at once. Bob's call, below his fair share, waits for a slot instead of being refused,
    and is answered as soon as one of alice's calls ends."""
    d = start_daemon(tmp_path, rpc_workers=6, rpc_reserved_workers=2, max_calls_per_tenant=8)
    try:
        c = Client(d.addresses[0])
        mine = [c.create().handle for _ in range(4)]
        theirs = c.create(md=BOB).handle
        release = threading.Event()
        entered = threading.Semaphore(0)
        holding = iter(range(4))  # alice's four calls are held; any call after passes

        def hold() -> None:
            if next(holding, None) is not None:
                entered.release()
                release.wait(WAIT)

        calls = Threads()
        with failpoints.armed("handle-checked", hold):
            keys = [calls.start(lambda h=h: c.append(h, "x")) for h in mine]
            for _ in mine:
                assert entered.acquire(timeout=WAIT)  # the pool's four engine slots: alice's
            flood = [code_of(lambda: c.append(mine[0], "y")) for _ in range(10)]
            assert flood == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 10
            bob = calls.start(lambda: c.append(theirs, "z", md=BOB))
            assert d.limits.await_waiting(1, WAIT)  # bob waits for a slot, not refused
            release.set()
            calls.join()
        assert calls.code(bob) is None  # answered
        assert [calls.code(k) for k in keys] == [None] * 4
    finally:
        d.stop()


# --- bounded messages, and who may call what ---


def test_error_messages_quote_at_most_a_short_prefix(daemon: Daemon, client: Client) -> None:
    huge_id = pb.Handle(session_id="s" * 1_000_000, generation="g")
    with pytest.raises(grpc.RpcError) as err:
        client.inspect(huge_id)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(err.value.details()) < 300
    with pytest.raises(grpc.RpcError) as err:
        client.create(name="p" * 65_536)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(err.value.details()) < 300 and "known:" in err.value.details()


def test_admin_and_tenants_reach_what_the_readme_says(daemon: Daemon, client: Client) -> None:
    h = client.create().handle
    client.append(h, "the admin may count these tokens, never read them")
    for md in (ALICE, BOB):
        with pytest.raises(grpc.RpcError) as err:
            client.admin.ListModels(pb.ListModelsRequest(), metadata=md)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert client.admin.ListModels(pb.ListModelsRequest(), metadata=ADMIN).models
    seen = client.inspect(h, md=ADMIN)
    assert seen.receipt.n_seen == client.inspect(h).receipt.n_seen and not seen.retained_text
    trace = client.s.Trace(pb.HandleRequest(handle=h), metadata=ADMIN)
    assert list(trace.events) == list(
        client.s.Trace(pb.HandleRequest(handle=h), metadata=ALICE).events
    )
    with pytest.raises(grpc.RpcError) as err:
        client.inspect(h, md=ADMIN, text=True)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_narrate_falls_back_to_plain_continuation_without_a_chat_template() -> None:
    """gemma3-270m's GGUF carries no chat template: narrate continues the text instead of exiting 5."""
    lines = "\n".join(f"job {i} finished in {i * 3} ms" for i in range(12)) + "\n"
    result = CliRunner().invoke(
        app,
        ["narrate", "-m", "gemma3-270m", "--window", "60", "--sinks", "4", "--every-lines", "6",
         "--max-tokens", "6", "--json"],
        input=lines,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert '"event": "narration"' in result.output


def test_health_goes_serving_after_the_load_and_back_at_stop(tmp_path: Path) -> None:
    d = Daemon(settings(tmp_path))
    req = health_pb2.HealthCheckRequest()
    d.start()  # listening; the model loads in the engine thread
    try:
        assert health(d.addresses[0]) == health_pb2.HealthCheckResponse.NOT_SERVING
        d.wait_ready(120)
        assert health(d.addresses[0]) == health_pb2.HealthCheckResponse.SERVING
    finally:
        d.stop()
    assert d.grpc.health.Check(req, None).status == health_pb2.HealthCheckResponse.NOT_SERVING
