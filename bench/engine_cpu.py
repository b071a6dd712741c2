"""sinkd's own CPU per engine step, outside `llama_decode`: what a GPU would wait for.

    python bench/engine_cpu.py                 -> bench/results/engine_cpu.json
    SINKD_ENGINE_CPU_ROUNDS=5 python bench/engine_cpu.py   (3 rounds by default)

The engine thread's CPU clock (`time.thread_time`), not a profiler (cProfile inflates Python):
each step's CPU, less the CPU the engine thread spends inside `llama_decode`, per step, at 1, 4
and 8 sessions generating greedily over gRPC (the daemon and its clients in this process, as in
bench/concurrency.py), with durability off and on. The parts are the engine thread's CPU in named
functions, each counted exclusive of the parts it calls (sampling without the journal write it
makes, ...): sampling, logits (the batch's rows copied out of llama.cpp), planning and eviction
bookkeeping, journal, invariant checks (the audit that reads llama.cpp's cells), receipts and
replies, and the rest. The functions are wrapped in this process only; the daemon's code is as it
ships. The headline (outside `llama_decode`) comes from a run with `llama_decode` alone wrapped;
the parts from a second run (a child process) with every part's functions wrapped, whose clock
reads add their own microseconds (to "rest" mostly). Medians over the rounds. The last line is a JSON object: `outside_decode_ms` maps "1",
"4", "8" to the durable median.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp
from common import daemon_settings, table, together, write
from concurrency import MD, generate, session

from sinkd.daemon.engine.decoding import Decoder
from sinkd.daemon.node import Daemon
from sinkd.daemon.rpc.client import Client
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.loop import scheduler as scheduler_module
from sinkd.daemon.runtime.loop.audit import Auditor
from sinkd.daemon.runtime.loop.executor import Executor
from sinkd.daemon.runtime.loop.gate import ReplyGate
from sinkd.daemon.runtime.loop.scheduler import Scheduler
from sinkd.evaluation import SAMPLE_TEXT as TEXT
from sinkd.proto.v1 import sinkd_pb2 as pb

ROUNDS = int(os.environ.get("SINKD_ENGINE_CPU_ROUNDS", "3"))
TOKENS = 48
SESSIONS = (1, 4, 8)
# part -> the functions whose own CPU (less the parts they call) it counts
PARTS: dict[str, list[tuple[Any, str]]] = {
    "llama_decode": [(llama_cpp, "llama_decode")],
    "sampling": [(Executor, "_sample")],
    "logits": [(Decoder, "_decode_items"), (Decoder, "logits")],
    "planning and eviction": [
        (scheduler_module, "plan_step"), (Executor, "apply"), (Executor, "absorb"),
        (Executor, "_build"), (Executor, "_place"),
    ],
    "journal": [
        (Durability, "log"), (Durability, "flush"), (Durability, "commit"),
        (ReplyGate, "release"),
    ],
    "invariant checks": [(Auditor, "check")],
    "receipts and replies": [(Executor, "end")],
}  # fmt: skip


class Meter:
    """Exclusive CPU per part on the engine thread: a part's time stops while a part it calls
    runs."""

    def __init__(self) -> None:
        self.engine_thread: int | None = None
        self.own: dict[str, float] = defaultdict(float)
        self.steps = 0
        self.step_cpu = 0.0
        self._stack: list[list[Any]] = []  # [part, started, child time]

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def metered(*args: Any, **kw: Any) -> Any:
            if threading.get_ident() != self.engine_thread:
                return fn(*args, **kw)
            frame = [part, time.thread_time(), 0.0]
            self._stack.append(frame)
            try:
                return fn(*args, **kw)
            finally:
                self._stack.pop()
                spent = time.thread_time() - frame[1]
                self.own[part] += spent - frame[2]
                if self._stack:
                    self._stack[-1][2] += spent

        return metered

    def reset(self) -> None:
        self.own.clear()
        self.steps, self.step_cpu = 0, 0.0


METER = Meter()


def install(parts: bool) -> None:
    """Wrap `llama_decode` and the step; with `parts`, every part's functions too (those a tree
    lacks are skipped: before_after.py runs this script on an older tree)."""
    for part, places in PARTS.items():
        if part != "llama_decode" and not parts:
            continue
        for owner, name in places:
            if hasattr(owner, name):
                setattr(owner, name, METER.wrap(part, getattr(owner, name)))
    guarded = Scheduler._guarded_step

    def step(self: Scheduler) -> None:
        METER.engine_thread = threading.get_ident()
        t0 = time.thread_time()
        before = sum(METER.own.values())
        guarded(self)
        spent = time.thread_time() - t0
        if sum(METER.own.values()) > before or spent > 0:  # a step that did something
            METER.steps += 1
            METER.step_cpu += spent

    Scheduler._guarded_step = step  # type: ignore[method-assign]


def measure(n: int, durable: bool) -> list[dict[str, float]]:
    """Per round: each part's CPU per step, and the step's outside llama_decode, in ms."""
    tmp = Path(tempfile.mkdtemp())
    d = Daemon(daemon_settings(tmp, max_sessions=8, n_ctx_seq=256, durable=durable))
    d.start()
    d.wait_ready(60)
    client = Client(d.addresses[0])
    pool = d.service.engine.vocab.tokenize(TEXT * 8)
    rounds = []
    try:
        for rnd in range(ROUNDS + 1):
            handles = [session(client, pool[i * 20 : i * 20 + 40]) for i in range(n)]
            METER.reset()
            lat: list[list[float]] = [[] for _ in handles]
            together([functools.partial(generate, client, h, TOKENS, lat[i])
                      for i, h in enumerate(handles)])  # fmt: skip
            steps = max(METER.steps, 1)
            row = {part: 1000 * METER.own.get(part, 0.0) / steps for part in PARTS}
            outside = 1000 * (METER.step_cpu - METER.own.get("llama_decode", 0.0)) / steps
            row["rest"] = outside - sum(v for k, v in row.items() if k != "llama_decode")
            row["outside llama_decode"] = outside
            row["steps"] = METER.steps
            for h in handles:
                client.s.Close(pb.HandleRequest(handle=h), metadata=MD)
            if rnd:  # the first round warms up
                rounds.append(row)
    finally:
        d.stop()
    return rounds


def main() -> None:
    """Each configuration runs twice: `llama_decode` alone wrapped (the headline: the wrappers'
    own clock reads, ~1 us each, are not the daemon's), then every part wrapped (where it goes)."""
    parts_mode = os.environ.get("SINKD_ENGINE_CPU_PASS") == "parts"
    install(parts=parts_mode)
    results: dict[str, dict[str, float]] = {}
    for durable in (False, True):
        for n in SESSIONS:
            rounds = measure(n, durable)
            key = f"{n} {'durable' if durable else 'not durable'}"
            results[key] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    if parts_mode:
        print(json.dumps(results))
        return
    env = dict(os.environ, SINKD_ENGINE_CPU_PASS="parts")
    run = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(run.stderr[-2000:])
    by_part: dict[str, dict[str, float]] = json.loads(run.stdout.strip().splitlines()[-1])
    parts = [*PARTS, "rest", "outside llama_decode"]
    rows = [[key, int(r["steps"]), r["llama_decode"], r["outside llama_decode"],
             *(by_part[key][p] for p in parts)] for key, r in results.items()]  # fmt: skip
    table(f"engine thread CPU ms per step, median of {ROUNDS} rounds, {TOKENS} tokens a session;"
          " the parts from a second run with every part's functions wrapped",
          ["sessions", "steps", "llama_decode", "OUTSIDE llama_decode",
           *(f"{p} (wrapped)" for p in parts)], rows)  # fmt: skip
    summary = {str(n): results[f"{n} durable"]["outside llama_decode"] for n in SESSIONS}
    write("engine_cpu", {"rounds": ROUNDS, "tokens": TOKENS, "results": results,
                         "parts": by_part, "outside_decode_ms": summary})  # fmt: skip
    print(json.dumps({"outside_decode_ms": summary}))


if __name__ == "__main__":
    main()
