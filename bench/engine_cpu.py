"""sinkd's own CPU per engine step, outside `llama_decode`: what a GPU would wait for.

    python bench/engine_cpu.py                 -> bench/results/engine_cpu.json
    SINKD_ENGINE_CPU_ROUNDS=5 python bench/engine_cpu.py   (3 rounds by default)

The engine thread's CPU clock (`time.thread_time`), not a profiler (cProfile inflates Python):
the engine thread's CPU in its scheduler passes, less what it spends inside `llama_decode`, per
`llama_decode` (a step), at 1, 4 and 8 sessions generating greedily over gRPC (the daemon and its
clients in this process, as in bench/concurrency.py), with durability off and on, each token its
own pass (decode_run 1, the CPU's default) and in the GPU's default decode runs (16 decodes a pass,
runtime/loop/runahead.py). The parts are the engine thread's CPU in named functions, each counted
exclusive of the parts it calls (sampling without the journal write it makes, ...): sampling,
logits (the batch built, the rows or tokens read from llama.cpp), planning and eviction
bookkeeping, journal, invariant checks (the audit that reads llama.cpp's cells), receipts and
replies, the decode runs' loop and bookkeeping, and the rest. The functions are wrapped in this
process only; the daemon's code is as it ships. The headline (outside `llama_decode`) comes from a
run with `llama_decode` alone wrapped; the parts from a second run (a child process) with every
part's functions wrapped, whose clock reads add their own microseconds (to "rest" mostly).
Medians over the rounds. The table's title says how much slower the same Python runs right after
a CPU decode than again (`cold_python`): most of what is left on this machine. The last line is a
JSON object: `outside_decode_ms` maps "1", "4", "8" to the durable median a token a pass,
`outside_decode_ms_runs` in decode runs.
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

from sinkd.daemon.engine.decoding import BatchItem, Decoder
from sinkd.daemon.engine.llama import EngineConfig
from sinkd.daemon.engine.loading import open_engine
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

try:
    from sinkd.daemon.runtime.loop.runahead import RunAhead
except ImportError:  # a tree before decode runs (before_after.py)
    RunAhead = None

ROUNDS = int(os.environ.get("SINKD_ENGINE_CPU_ROUNDS", "3"))
GPU_RUN = 16  # decode_run's default with GPU layers (daemon/config.py)
TOKENS = 48
SESSIONS = (1, 4, 8)
# part -> the functions whose own CPU (less the parts they call) it counts
PARTS: dict[str, list[tuple[Any, str]]] = {
    "llama_decode": [(llama_cpp, "llama_decode")],
    "sampling": [(Executor, "sample")],
    "logits": [(Decoder, "_decode_items"), (Decoder, "logits"), (Decoder, "decode_greedy"),
               (Decoder, "row_at")],
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
    "decode runs": [(RunAhead, "run"), (RunAhead, "_record")],
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
            if owner is not None and hasattr(owner, name):
                setattr(owner, name, METER.wrap(part, getattr(owner, name)))
    guarded = Scheduler._guarded_step

    def step(self: Scheduler) -> None:
        METER.engine_thread = threading.get_ident()
        t0 = time.thread_time()
        guarded(self)
        METER.step_cpu += time.thread_time() - t0

    decode = llama_cpp.llama_decode  # wrapped above: each call on the engine thread is a step

    def counted(*args: Any) -> Any:
        if threading.get_ident() == METER.engine_thread:
            METER.steps += 1
        return decode(*args)

    llama_cpp.llama_decode = counted

    Scheduler._guarded_step = step  # type: ignore[method-assign]


def measure(n: int, durable: bool, run: int = 1) -> list[dict[str, float]]:
    """Per round: each part's CPU per step (a `llama_decode`), and the step's outside
    llama_decode, in ms; `run`: the daemon's decode_run."""
    tmp = Path(tempfile.mkdtemp())
    settings = daemon_settings(tmp, max_sessions=8, n_ctx_seq=256, durable=durable)
    if has_runs():  # an older tree (before_after.py) has none
        settings = settings.model_copy(update={"decode_run": run, "decode_run_ms": 0.0})
    d = Daemon(settings)
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


def cold_python() -> float:
    """How much slower the same Python runs right after a CPU `llama_decode` than run again
    straight after: the decode streams the weights through the caches, so the first Python after
    it (sinkd's step) finds its code and objects evicted. A GPU's decode leaves them in place."""
    engine = open_engine(None, EngineConfig(n_ctx_seq=256, n_seq_max=1, n_batch=64))
    objects = [{"a": i, "b": [i], "c": str(i)} for i in range(300)]

    def walk() -> int:
        return sum(o["a"] + o["b"][0] + len(o["c"]) for o in objects)

    tokens = engine.vocab.tokenize(TEXT)[:120]
    cold, warm = [], []
    try:
        for pos, token in enumerate(tokens):
            engine.decode_batch([BatchItem(0, [token], pos, logits=False)])
            t0 = time.thread_time()
            walk()
            t1 = time.thread_time()
            walk()
            cold.append(t1 - t0)
            warm.append(time.thread_time() - t1)
    finally:
        engine.close()
    return statistics.median(cold) / statistics.median(warm)


def main() -> None:
    """Each configuration runs twice: `llama_decode` alone wrapped (the headline: the wrappers'
    own clock reads, ~1 us each, are not the daemon's), then every part wrapped (where it goes).
    Each with every token its own scheduler pass (decode_run 1, the CPU's default) and with the
    GPU's default decode runs (16 decodes a pass, their time bound off: 16 SmolLM2 steps on a GPU
    take about the 50 ms it allows); a tree without decode runs (before_after.py) runs the first
    alone."""
    parts_mode = os.environ.get("SINKD_ENGINE_CPU_PASS") == "parts"
    install(parts=parts_mode)
    runs = (1, GPU_RUN) if has_runs() else (1,)
    results: dict[str, dict[str, float]] = {}
    for run in runs:
        for durable in (False, True):
            for n in SESSIONS:
                rounds = measure(n, durable, run)
                key = config_key(n, durable, run)
                results[key] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    if parts_mode:
        print(json.dumps(results))
        return
    env = dict(os.environ, SINKD_ENGINE_CPU_PASS="parts")
    run = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(run.stderr[-2000:])
    by_part: dict[str, dict[str, float]] = json.loads(run.stdout.strip().splitlines()[-1])
    cold = cold_python()
    parts = [*PARTS, "rest", "outside llama_decode"]
    rows = [[key, int(r["steps"]), r["llama_decode"], r["outside llama_decode"],
             *(by_part[key][p] for p in parts)] for key, r in results.items()]  # fmt: skip
    table(f"engine thread CPU ms per step (a llama_decode), median of {ROUNDS} rounds, {TOKENS}"
          " tokens a session; the parts from a second run with every part's functions wrapped;"
          f" Python right after a CPU decode runs {cold:.1f}x its time run again",
          ["configuration", "steps", "llama_decode", "OUTSIDE llama_decode",
           *(f"{p} (wrapped)" for p in parts)], rows)  # fmt: skip
    summary = {str(n): results[config_key(n, True, 1)]["outside llama_decode"] for n in SESSIONS}
    out: dict[str, Any] = {"outside_decode_ms": summary}
    if GPU_RUN in runs:
        out["outside_decode_ms_runs"] = {
            str(n): results[config_key(n, True, GPU_RUN)]["outside llama_decode"] for n in SESSIONS
        }
    write("engine_cpu", {"rounds": ROUNDS, "tokens": TOKENS, "results": results,
                         "parts": by_part, "python_after_decode_x": cold, **out})  # fmt: skip
    print(json.dumps(out))


def has_runs() -> bool:
    from sinkd.daemon.config import Settings

    return "decode_run" in Settings.model_fields


def config_key(n: int, durable: bool, run: int) -> str:
    key = f"{n} {'durable' if durable else 'not durable'}"
    return key if run == 1 else f"{key}, runs of {run}"


if __name__ == "__main__":
    main()
