"""Isolation under load and fuzzing against a live daemon.

Budgets: short in CI; longer on demand with SINKD_STRESS_SECONDS (default 30) and
SINKD_FUZZ_EXAMPLES (default 8), e.g. `SINKD_STRESS_SECONDS=300 SINKD_FUZZ_EXAMPLES=200 pytest tests/test_stress.py`.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from sinkd.daemon.node import Daemon
from sinkd.proto.v1 import sinkd_pb2 as pb
from tests.support.clients import Client
from tests.support.daemons import stop_without_snapshots
from tests.support.settings import settings as daemon_settings
from tests.support.texts import TEXT
from tests.support.tokens import ADMIN, ALICE, BOB

pytestmark = pytest.mark.model
STRESS_SECONDS = float(os.environ.get("SINKD_STRESS_SECONDS", "30"))
FUZZ_EXAMPLES = int(os.environ.get("SINKD_FUZZ_EXAMPLES", "8"))
TENANTS = {"alice": ALICE, "bob": BOB}


def start_daemon(tmp: Path) -> Daemon:
    d = Daemon(daemon_settings(tmp, max_sessions=8, step_tokens=64, prefill_chunk=32))
    d.start()
    d.wait_ready(60)
    return d


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("stress"))
    yield d
    d.stop()


@dataclass
class Tracked:
    tenant: str
    owner: int  # the one worker thread that drives it: its history is in execution order
    handle: pb.Handle
    history: list[tuple[str, Any]] = field(
        default_factory=list
    )  # ("append", ids) / ("gen", n, ids)


def receipt_ok(r: pb.Receipt) -> None:
    budget = r.policy.sinks + r.policy.window
    assert r.retained <= budget
    assert r.retained + r.evicted_tokens == r.n_seen
    assert (r.anchors_logical.start, r.anchors_logical.end) == (0, min(r.policy.sinks, r.n_seen))
    if r.retained > r.anchors_logical.end:
        assert r.recent_logical.end == r.n_seen


def cells_match(daemon: Daemon) -> None:
    """Between two steps: what llama.cpp holds, sequence by sequence, is what the policies retain."""

    def check(engine: Any) -> tuple[int, int]:
        sessions = daemon.service.registry.resident()  # a parked one holds none: its snapshot
        held = sum(engine.cells.cell_count(s.seq_id) for s in sessions)
        return held, sum(s.seq.retained for s in sessions)

    held, retained = daemon.service.scheduler.call(check)
    assert held == retained, (held, retained)


def test_isolation_under_load(tmp_path: Path) -> None:
    """Several tenants, many sessions, random appends, generates, resets, forks and cancellations.

    Throughout: receipts stay consistent, other tenants' sessions do not exist, stale handles are
    refused, cells in use equal the retained counts, and a sentinel planted before a reset is never
    produced after it. Then the daemon stops as if killed and restarts on its state directory:
    every session resumes with its receipt and next-token logits unchanged, bit for bit. At the end
    every live session's greedy output equals a solo replay."""
    daemon = start_daemon(tmp_path)
    client = Client(daemon.addresses[0])
    pool = daemon.service.engine.vocab.tokenize(TEXT)
    lock = threading.Lock()
    live: dict[str, Tracked] = {}
    errors: list[BaseException] = []
    stats = {"ops": 0, "resets": 0, "forks": 0, "cancels": 0, "sentinel_checks": 0}
    deadline = time.monotonic() + STRESS_SECONDS

    def mine(owner: int) -> list[Tracked]:
        with lock:
            return [t for t in live.values() if t.owner == owner]

    def worker(tenant: str, seed: int) -> None:
        rng = random.Random(seed)
        md = TENANTS[tenant]
        other = TENANTS["bob" if tenant == "alice" else "alice"]
        try:
            while time.monotonic() < deadline:
                stats["ops"] += 1
                sessions = mine(seed)
                op = rng.choice(
                    [
                        "create",
                        "append",
                        "append",
                        "gen",
                        "gen",
                        "reset",
                        "fork",
                        "cancel",
                        "close",
                        "peek",
                    ]
                )
                if op == "create" or not sessions:
                    try:
                        h = client.s.Create(
                            pb.CreateSessionRequest(
                                policy=pb.Policy(
                                    name="sink",
                                    sinks=4,
                                    window=60,
                                    evict_chunk=rng.choice([1, 8, 16]),
                                )
                            ),
                            metadata=md,
                        ).handle
                    except grpc.RpcError as e:
                        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                        continue
                    with lock:
                        live[h.session_id] = Tracked(tenant, seed, h)
                    continue
                t = rng.choice(sessions)
                if op == "append":
                    start = rng.randrange(len(pool) - 160)
                    ids = pool[start : start + rng.randint(1, 150)]
                    r = client.s.Append(
                        pb.AppendRequest(handle=t.handle, tokens=pb.TokenList(ids=ids)), metadata=md
                    )
                    t.history.append(("append", ids))
                    receipt_ok(r.receipt)
                elif op == "gen" and t.history:
                    n = rng.randint(1, 6)
                    ids = [
                        ev.token.id
                        for ev in client.s.Generate(
                            pb.GenerateRequest(handle=t.handle, max_tokens=n), metadata=md
                        )
                        if ev.HasField("token")
                    ]
                    t.history.append(("gen", n, ids))
                elif op == "reset":
                    sentinel = f" The vault phrase is ZEBRA{rng.randint(1000, 9999)}."
                    client.s.Append(pb.AppendRequest(handle=t.handle, text=sentinel), metadata=md)
                    old = t.handle
                    t.handle = client.s.Reset(pb.HandleRequest(handle=old), metadata=md).handle
                    t.history = []
                    stats["resets"] += 1
                    with pytest.raises(grpc.RpcError) as err:
                        client.s.Inspect(pb.InspectRequest(handle=old), metadata=md)
                    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                    probe = daemon.service.engine.vocab.tokenize(" The vault phrase is")
                    client.s.Append(
                        pb.AppendRequest(handle=t.handle, tokens=pb.TokenList(ids=probe)),
                        metadata=md,
                    )
                    request = pb.GenerateRequest(handle=t.handle, max_tokens=6)
                    got = [
                        ev.token
                        for ev in client.s.Generate(request, metadata=md)
                        if ev.HasField("token")
                    ]
                    assert sentinel.split()[-1].rstrip(".") not in "".join(g.text for g in got)
                    t.history = [("append", probe), ("gen", 6, [g.id for g in got])]
                    stats["sentinel_checks"] += 1
                elif op == "fork":
                    try:
                        child = client.s.Fork(pb.HandleRequest(handle=t.handle), metadata=md).handle
                    except grpc.RpcError as e:
                        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                        continue
                    with lock:
                        live[child.session_id] = Tracked(tenant, seed, child, list(t.history))
                    stats["forks"] += 1
                elif op == "cancel" and t.history:
                    call = client.s.Generate(
                        pb.GenerateRequest(handle=t.handle, max_tokens=100), metadata=md
                    )
                    for ev in call:
                        if ev.HasField("token") and ev.token.index >= 1:
                            call.cancel()
                            break
                    # what a cancelled generate left is in the receipt, not in our history: start over
                    t.handle = client.s.Reset(pb.HandleRequest(handle=t.handle), metadata=md).handle
                    t.history = []
                    stats["cancels"] += 1
                elif op == "close":
                    client.s.Close(pb.HandleRequest(handle=t.handle), metadata=md)
                    with lock:
                        live.pop(t.handle.session_id, None)
                elif op == "peek":
                    receipt_ok(
                        client.s.Inspect(pb.InspectRequest(handle=t.handle), metadata=md).receipt
                    )
                    with pytest.raises(grpc.RpcError) as err:  # the other tenant cannot see it
                        client.s.Inspect(pb.InspectRequest(handle=t.handle), metadata=other)
                    assert err.value.code() == grpc.StatusCode.NOT_FOUND
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [
        threading.Thread(target=worker, args=(tenant, seed))
        for seed, tenant in enumerate(["alice", "alice", "bob", "bob"])
    ]
    for th in threads:
        th.start()
    while any(th.is_alive() for th in threads):
        cells_match(daemon)
        time.sleep(0.5)
    for th in threads:
        th.join()
    assert not errors, errors[0]
    cells_match(daemon)
    assert stats["ops"] > 20 and daemon.service.metrics.count("invariant_violations") == 0

    # a crash and a restart change nothing of any session
    def state_of(t: Tracked) -> tuple[Any, ...]:
        md = TENANTS[t.tenant]
        r = client.s.Inspect(pb.InspectRequest(handle=t.handle, include_logits=True), metadata=md)
        rc = r.receipt
        return (rc.n_seen, rc.retained, rc.evictions, rc.shifts, rc.state, r.logits)

    before = {sid: state_of(t) for sid, t in live.items()}
    stop_without_snapshots(daemon)
    daemon = start_daemon(tmp_path)
    client = Client(daemon.addresses[0])
    for sid, t in live.items():
        assert state_of(t) == before[sid], sid
    assert len(client.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions) + len(
        client.s.List(pb.ListSessionsRequest(), metadata=BOB).sessions
    ) == len(live)  # closed sessions stayed closed

    # every live session's greedy output equals a solo replay of its own history
    replayed = 0
    for t in list(live.values()):
        md = TENANTS[t.tenant]
        if not t.history:
            client.s.Close(pb.HandleRequest(handle=t.handle), metadata=md)
            continue
        r = client.s.Inspect(pb.InspectRequest(handle=t.handle), metadata=md).receipt
        client.s.Close(pb.HandleRequest(handle=t.handle), metadata=md)
        solo = client.s.Create(pb.CreateSessionRequest(policy=r.policy), metadata=md).handle
        for op in t.history:
            if op[0] == "append":
                client.s.Append(
                    pb.AppendRequest(handle=solo, tokens=pb.TokenList(ids=op[1])), metadata=md
                )
            else:
                ids = [
                    ev.token.id
                    for ev in client.s.Generate(
                        pb.GenerateRequest(handle=solo, max_tokens=op[1]), metadata=md
                    )
                    if ev.HasField("token")
                ]
                assert ids == op[2], (t.handle.session_id, op)
        client.s.Close(pb.HandleRequest(handle=solo), metadata=md)
        replayed += 1
    print(f"stress: {stats}, {replayed} sessions resumed and replayed solo")
    assert replayed > 0
    daemon.stop()


class DaemonMachine(RuleBasedStateMachine):
    """Random request sequences; the invariants are checked after every step."""

    daemon: Daemon

    def __init__(self) -> None:
        super().__init__()
        self.client = Client(self.daemon.addresses[0])
        self.expected: dict[str, tuple[str, pb.Handle]] = {}
        self.stale: list[tuple[str, pb.Handle]] = []

    sessions = Bundle("sessions")

    @rule(
        target=sessions,
        tenant=st.sampled_from(["alice", "bob"]),
        window=st.integers(1, 120),
        sinks=st.integers(0, 8),
        chunk=st.integers(1, 16),
    )
    def create(self, tenant: str, window: int, sinks: int, chunk: int) -> Any:
        try:
            h = self.client.s.Create(
                pb.CreateSessionRequest(
                    policy=pb.Policy(
                        name="sink", sinks=sinks, window=window, evict_chunk=min(chunk, window)
                    )
                ),
                metadata=TENANTS[tenant],
            ).handle
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            return None
        self.expected[h.session_id] = (tenant, h)
        return h.session_id

    @rule(sid=sessions, n=st.integers(0, 200), text=st.text(max_size=60))
    def append(self, sid: str | None, n: int, text: str) -> None:
        if sid not in self.expected:
            return
        tenant, h = self.expected[sid]
        ids = list(range(1000, 1000 + n))
        self.client.s.Append(
            pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=ids)), metadata=TENANTS[tenant]
        )
        self.client.s.Append(pb.AppendRequest(handle=h, text=text), metadata=TENANTS[tenant])

    @rule(sid=sessions, n=st.integers(1, 4))
    def generate(self, sid: str | None, n: int) -> None:
        if sid not in self.expected:
            return
        tenant, h = self.expected[sid]
        try:
            list(
                self.client.s.Generate(
                    pb.GenerateRequest(handle=h, max_tokens=n), metadata=TENANTS[tenant]
                )
            )
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "append text" in (
                e.details() or ""
            )

    @rule(sid=sessions)
    def reset(self, sid: str | None) -> None:
        if sid not in self.expected:
            return
        tenant, h = self.expected[sid]
        new = self.client.s.Reset(pb.HandleRequest(handle=h), metadata=TENANTS[tenant])
        assert new.receipt.retained == 0
        self.stale.append((tenant, h))
        self.expected[sid] = (tenant, new.handle)

    @rule(target=sessions, sid=sessions)
    def fork(self, sid: str | None) -> Any:
        if sid not in self.expected:
            return None
        tenant, h = self.expected[sid]
        try:
            child = self.client.s.Fork(pb.HandleRequest(handle=h), metadata=TENANTS[tenant]).handle
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            return None
        self.expected[child.session_id] = (tenant, child)
        return child.session_id

    @rule(sid=consumes(sessions))
    def close(self, sid: str | None) -> None:
        if sid not in self.expected:
            return
        tenant, h = self.expected.pop(sid)
        self.client.s.Close(pb.HandleRequest(handle=h), metadata=TENANTS[tenant])

    @invariant()
    def receipts_isolation_and_cells(self) -> None:
        for tenant, md in TENANTS.items():
            listed = {
                r.session_id: r
                for r in self.client.s.List(pb.ListSessionsRequest(), metadata=md).sessions
            }
            mine = {sid for sid, (t, _) in self.expected.items() if t == tenant}
            assert set(listed) == mine
            for r in listed.values():
                receipt_ok(r)
        for tenant, h in self.expected.values():
            other = BOB if tenant == "alice" else ALICE
            with pytest.raises(grpc.RpcError) as err:
                self.client.s.Inspect(pb.InspectRequest(handle=h), metadata=other)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        for tenant, h in self.stale[-3:]:
            if h.session_id in self.expected:
                with pytest.raises(grpc.RpcError) as err:
                    self.client.s.Inspect(pb.InspectRequest(handle=h), metadata=TENANTS[tenant])
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        cells_match(self.daemon)
        total = sum(
            r.retained
            for r in self.client.admin.ListAllSessions(
                pb.ListSessionsRequest(), metadata=ADMIN
            ).sessions
        )
        assert total == self.client.admin.Stats(pb.StatsRequest(), metadata=ADMIN).cells_in_use

    def teardown(self) -> None:
        for tenant, h in self.expected.values():
            self.client.s.Close(pb.HandleRequest(handle=h), metadata=TENANTS[tenant])


def test_state_machine(daemon: Daemon) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    DaemonMachine.daemon = daemon
    run_state_machine_as_test(
        DaemonMachine,
        settings=settings(
            max_examples=FUZZ_EXAMPLES,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@settings(max_examples=FUZZ_EXAMPLES * 5, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    name=st.sampled_from(["sink", "window", "full", "sink-noshift", "", "lru", "SINK"]),
    sinks=st.integers(0, 2**32 - 1),
    window=st.integers(0, 2**32 - 1),
    evict=st.integers(0, 2**32 - 1),
    compact=st.integers(0, 2**32 - 1),
    temperature=st.floats(allow_nan=True, allow_infinity=True, width=32),
    top_k=st.integers(0, 2**32 - 1),
    top_p=st.floats(allow_nan=True, width=32),
    system=st.text(max_size=200),
    ids=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=20),
    max_tokens=st.integers(0, 2**32 - 1),
    stops=st.lists(st.text(max_size=300), max_size=20),
)
def test_fuzz_request_fields(
    daemon: Daemon,
    name: str,
    sinks: int,
    window: int,
    evict: int,
    compact: int,
    temperature: float,
    top_k: int,
    top_p: float,
    system: str,
    ids: list[int],
    max_tokens: int,
    stops: list[str],
) -> None:
    """Any field values: an allowed status with a message, never INTERNAL or UNKNOWN, daemon alive."""
    client = Client(daemon.addresses[0])
    policy = pb.Policy(
        name=name, sinks=sinks, window=window, evict_chunk=evict, compact_interval=compact
    )
    sampling = pb.Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    handle = None
    try:
        handle = client.s.Create(
            pb.CreateSessionRequest(policy=policy, sampling=sampling, system_prompt=system),
            metadata=ALICE,
        ).handle
        client.s.Append(
            pb.AppendRequest(handle=handle, tokens=pb.TokenList(ids=ids)), metadata=ALICE
        )
        list(
            client.s.Generate(
                pb.GenerateRequest(handle=handle, max_tokens=max_tokens % 8, stop=stops),
                metadata=ALICE,
            )
        )
    except grpc.RpcError as e:
        assert e.code() in ALLOWED, (e.code(), e.details())
        assert e.details()
    finally:
        if handle is not None:
            client.s.Close(pb.HandleRequest(handle=handle), metadata=ALICE)
    assert client.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions == []
