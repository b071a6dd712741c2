"""kill -9 the daemon during appends, recalls, generations and inside snapshot writes, many times.

A reference daemon that never crashes runs the same scripted workload first and records each
session's next-token logits at every acknowledgement. Then `sinkd serve` runs it as a subprocess
and is killed again and again; after each restart, for every session: every acknowledged token is
there, the session sits exactly at one of the reference's acknowledgement points, and its logits
equal the reference's there, bit for bit, and so does its memory of evicted text (the sink
sessions keep one, and the first recalls from it every round once it can). The clients then carry
on from where the daemon stands.

SINKD_CRASH_KILLS sets how many kills (default 8, plus the two snapshot crash points) and
SINKD_CRASH_ROUNDS how long the script is (default 8 rounds of an append and 6 generated tokens per
session); a run stops killing once the script is done.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from sinkd.daemon.node import Daemon
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc
from tests.support.daemons import serve_subprocess
from tests.support.settings import settings
from tests.support.texts import TEXT
from tests.support.tokens import ALICE

pytestmark = pytest.mark.model

POLICIES = [
    pb.Policy(name="sink", sinks=4, window=60, evict_chunk=16),
    pb.Policy(name="window", window=64, evict_chunk=8),
    pb.Policy(name="sink", sinks=4, window=60, evict_chunk=4, compact_interval=12),
]
ROUNDS, GEN = int(os.environ.get("SINKD_CRASH_ROUNDS", "8")), 6
SELF_KILLS = ("snapshot-before-rename", "snapshot-before-journal", "append-tokenized")
ENGINE = {"n_ctx_seq": 256, "max_sessions": 4, "step_tokens": 64, "snapshot_every_tokens": 24}


def text_of(i: int, rnd: int) -> str:
    start = (i * 7 + rnd * 3) * 37 % (len(TEXT) - 240)
    return TEXT[start : start + 240]


@dataclass
class Point:
    """One acknowledgement in the reference run: where the session stands after it."""

    rnd: int
    generated: int  # tokens generated in this round so far (0: just after the append)
    done: bool  # this round's generation is over (max tokens or end of generation)
    token: int | None = None  # the token acknowledged here, if it was a generated one
    recalled: bool = False  # just after this round's recall


@dataclass
class Reference:
    logits: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    points: dict[tuple[int, int], Point] = field(default_factory=dict)
    start: dict[int, int] = field(default_factory=dict)  # n_seen after create
    memory: dict[tuple[int, int], list[tuple[int, int, str]]] = field(default_factory=dict)
    recall_rounds: set[tuple[int, int]] = field(default_factory=set)  # (session, round)


RECALLER = 0  # the session that recalls every round (a sink session)
QUERY = "What did Ishmael say about the sea, the ships and the world?"


def memory_of(s: Any, h: pb.Handle) -> list[tuple[int, int, str]]:
    found = s.Memory(pb.MemoryRequest(handle=h, limit=10_000), metadata=ALICE).passages
    return [(p.logical.start, p.logical.end, p.text) for p in found]


def run_reference(tmp: Path) -> Reference:
    ref = Reference()
    d = Daemon(settings(tmp, **ENGINE))
    d.start()
    d.wait_ready(120)
    s = pb_grpc.SessionsStub(grpc.insecure_channel(d.addresses[0]))

    def logits(h: pb.Handle) -> np.ndarray:
        r = s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE)
        return np.frombuffer(r.logits, dtype="<f4").copy()

    for i, policy in enumerate(POLICIES):
        h = s.Create(pb.CreateSessionRequest(policy=policy), metadata=ALICE).handle
        seen = s.Inspect(pb.InspectRequest(handle=h), metadata=ALICE).receipt.n_seen
        ref.start[i] = seen
        for rnd in range(ROUNDS):
            seen = s.Append(pb.AppendRequest(handle=h, text=text_of(i, rnd)), metadata=ALICE)
            seen = seen.receipt.n_seen
            ref.points[i, seen] = Point(rnd, 0, False)
            ref.logits[i, seen] = logits(h)
            ref.memory[i, seen] = memory_of(s, h)
            if i == RECALLER:
                r = s.Recall(pb.RecallRequest(handle=h, query=QUERY), metadata=ALICE)
                if r.receipt.n_seen != seen:  # something came back: the script recalls here
                    seen = r.receipt.n_seen
                    ref.recall_rounds.add((i, rnd))
                    ref.points[i, seen] = Point(rnd, 0, False, recalled=True)
                    ref.logits[i, seen] = logits(h)
                    ref.memory[i, seen] = memory_of(s, h)
            for g in range(1, GEN + 1):  # one token per call: the same sub-batches as one call
                events = list(
                    s.Generate(pb.GenerateRequest(handle=h, max_tokens=1), metadata=ALICE)
                )
                token, done = events[0].token.id, events[-1].done
                seen += 1
                eog = done.reason == "eog"
                ref.points[i, seen] = Point(rnd, g, g == GEN or eog, token)
                ref.logits[i, seen] = logits(h)
                ref.memory[i, seen] = memory_of(s, h)
                if eog:
                    break
    d.stop()
    return ref


class Daemonproc:
    def __init__(self, tmp: Path) -> None:
        self.sock = tmp / "d.sock"
        self.env = dict(
            os.environ,
            SINKD_STATE_DIR=str(tmp / "state"),
            **{f"SINKD_{k.upper()}": str(v) for k, v in ENGINE.items()},
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, failpoint: str = "") -> None:
        self.proc = serve_subprocess(self.sock, dict(self.env, SINKD_FAILPOINT=failpoint))

    def kill(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stub(self) -> Any:
        return pb_grpc.SessionsStub(grpc.insecure_channel(f"unix:{self.sock}"))


class Killer:
    """Kills the daemon from a client thread the moment that thread is inside a generation (it has
    a token, and more are coming): a kill inside a generate that no machine's speed can miss."""

    def __init__(self, daemon: Daemonproc) -> None:
        self.daemon = daemon
        self.armed = False
        self.fired = threading.Event()
        self.lock = threading.Lock()

    def token(self, more_coming: bool) -> None:
        with self.lock:
            if self.armed and more_coming and not self.fired.is_set():
                self.daemon.kill()
                self.fired.set()


class Client:
    """One session's scripted workload; `acked` is the n_seen every acknowledgement vouches for.

    It runs in a thread: whatever it raises is kept in `error` and re-raised by the test."""

    def __init__(
        self, i: int, handle: pb.Handle, ref: Reference, acked: int, killer: Killer
    ) -> None:
        self.i, self.handle, self.ref = i, handle, ref
        self.acked = acked
        self.killer = killer
        self.in_append = threading.Event()
        self.in_generate = threading.Event()
        self.finished = False
        self.error: BaseException | None = None

    def next_op(self, seen: int) -> tuple[str, int, int]:
        """Where the script goes from n_seen: ("append", round, 0) or ("generate", round, n)."""
        if seen == self.ref.start[self.i]:
            return "append", 0, 0
        p = self.ref.points[self.i, seen]
        if p.generated == 0 and not p.recalled and (self.i, p.rnd) in self.ref.recall_rounds:
            return "recall", p.rnd, 0
        if p.done:
            return ("append", p.rnd + 1, 0) if p.rnd + 1 < ROUNDS else ("end", ROUNDS, 0)
        return "generate", p.rnd, GEN - p.generated

    def run(self, stub: Any, seen: int) -> None:
        try:
            self._run(stub, seen)
        except BaseException as e:  # re-raised by the test thread
            self.error = e

    def _run(self, stub: Any, seen: int) -> None:
        self.in_append.clear()
        self.in_generate.clear()
        try:
            while True:
                op, rnd, n = self.next_op(seen)
                if op == "end":
                    self.finished = True
                    return
                if op == "append":
                    self.in_append.set()
                    r = stub.Append(pb.AppendRequest(handle=self.handle, text=text_of(self.i, rnd)))
                    self.in_append.clear()
                    seen = self.acked = r.receipt.n_seen
                    assert (self.i, seen) in self.ref.points
                elif op == "recall":
                    self.in_append.set()
                    r = stub.Recall(pb.RecallRequest(handle=self.handle, query=QUERY))
                    self.in_append.clear()
                    seen = self.acked = r.receipt.n_seen
                    assert self.ref.points[self.i, seen].recalled
                else:
                    req = pb.GenerateRequest(handle=self.handle, max_tokens=n)
                    for k, ev in enumerate(stub.Generate(req)):
                        if ev.HasField("token"):
                            self.in_generate.set()
                            seen += 1
                            assert ev.token.id == self.ref.points[self.i, seen].token
                            self.acked = seen
                            self.killer.token(more_coming=k + 1 < n)
                    self.in_generate.clear()
        except grpc.RpcError as e:
            self.in_append.clear()
            self.in_generate.clear()
            assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), e


def check_resumed(stub: Any, clients: list[Client], ref: Reference) -> list[int]:
    seen_now = []
    for c in clients:
        r = stub.Inspect(pb.InspectRequest(handle=c.handle, include_logits=True))
        seen = r.receipt.n_seen
        assert seen >= c.acked, f"session {c.i}: acknowledged {c.acked}, resumed at {seen}"
        if seen != ref.start[c.i]:
            assert (c.i, seen) in ref.points, f"session {c.i} resumed between acknowledgements"
            got = np.frombuffer(r.logits, dtype="<f4")
            assert np.array_equal(got, ref.logits[c.i, seen]), f"session {c.i} at {seen}"
            memory = [
                (p.logical.start, p.logical.end, p.text)
                for p in stub.Memory(pb.MemoryRequest(handle=c.handle, limit=10_000)).passages
            ]
            assert memory == ref.memory[c.i, seen], f"session {c.i}'s memory at {seen}"
        c.acked = seen
        seen_now.append(seen)
    return seen_now


def test_kill_minus_nine_at_random_points_loses_nothing_acknowledged(tmp_path: Path) -> None:
    ref = run_reference(tmp_path / "reference")
    rng = random.Random(int(os.environ.get("SINKD_CRASH_SEED", "20261129")))
    kills = int(os.environ.get("SINKD_CRASH_KILLS", "8"))
    daemon = Daemonproc(tmp_path)
    daemon.start()
    stub = daemon.stub()
    killer = Killer(daemon)
    clients = []
    for i, policy in enumerate(POLICIES):
        h = stub.Create(pb.CreateSessionRequest(policy=policy)).handle
        clients.append(Client(i, h, ref, ref.start[i], killer))
    # crash points the daemon reaches itself (inside snapshot writes, inside an append), one kill
    # from inside a generation, then kills at random points of appends and generations
    plan = [*SELF_KILLS, "generate"] + [rng.choice(["append", "generate"]) for _ in range(kills)]
    happened: dict[str, int] = {}
    kills = 0
    seen = [c.acked for c in clients]
    for attempt in [*plan, "finish"]:
        if all(c.finished for c in clients):
            break
        if attempt in SELF_KILLS:
            daemon.kill()
            daemon.start(failpoint=attempt)  # it kills itself at that point, the first time
            stub = daemon.stub()
            seen = check_resumed(stub, clients, ref)
        threads = [
            threading.Thread(target=c.run, args=(stub, s))
            for c, s in zip(clients, seen, strict=True)
        ]
        for t in threads:
            t.start()
        if attempt == "generate" and not killer.fired.is_set():
            killer.armed = True  # the first generate kill is made from inside a generation
            assert killer.fired.wait(120), "no generation streamed a token"
            killer.armed = False
            happened["generate"] = happened.get("generate", 0) + 1
        elif attempt in ("append", "generate"):  # a random point, counted if inside that call
            flags = [c.in_append if attempt == "append" else c.in_generate for c in clients]
            time.sleep(rng.uniform(0.05, 1.5))
            deadline = time.monotonic() + 30
            while not any(f.is_set() for f in flags) and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(rng.uniform(0, 0.05))
            if any(f.is_set() for f in flags):
                happened[attempt] = happened.get(attempt, 0) + 1
            daemon.kill()
        elif attempt in SELF_KILLS:
            assert daemon.proc is not None and daemon.proc.wait(60) == -signal.SIGKILL
            happened[attempt] = 1
        for t in threads:
            t.join(120)
            assert not t.is_alive(), "a client did not finish within 120 s of the kill"
        for c in clients:
            if c.error is not None:
                raise c.error
        print(attempt, "acked", [c.acked for c in clients])
        kills += attempt != "finish"
        if attempt != "finish":
            daemon.kill()
            daemon.start()
            stub = daemon.stub()
            seen = check_resumed(stub, clients, ref)
    assert all(c.finished for c in clients)
    daemon.kill()
    daemon.start()
    seen = check_resumed(daemon.stub(), clients, ref)  # the end of the script, as the reference's
    assert all(
        ref.points[c.i, s].rnd == ROUNDS - 1 and ref.points[c.i, s].done
        for c, s in zip(clients, seen, strict=True)
    )
    daemon.kill()
    assert any(i == RECALLER for i, _ in ref.recall_rounds), "the script never recalled"
    print(f"killed {kills} times, {happened}")
    assert happened.get("generate", 0) >= 1, happened
    assert all(happened.get(point) for point in SELF_KILLS), happened
