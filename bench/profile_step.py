"""Where the engine thread's time goes while 8 sessions generate: cProfile of that thread alone.

    python bench/profile_step.py [--sessions 8] [--tokens 64] [--top 25]
        -> bench/results/profile_step.json (+ .prof for snakeviz / pstats)

The daemon and its gRPC clients run in this process, as in bench/concurrency.py. The table splits a
step into llama_decode (the engine's own work) and the rest (sinkd's Python on the engine thread),
then lists the functions with the most time of their own.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import tempfile
from pathlib import Path

from common import RESULTS, daemon_settings, table, together, write
from concurrency import MD, generate, session

from sinkd.daemon.node import Daemon
from sinkd.daemon.rpc.client import Client
from sinkd.daemon.runtime.loop.scheduler import Scheduler
from sinkd.evaluation import SAMPLE_TEXT as TEXT
from sinkd.proto.v1 import sinkd_pb2 as pb

PROFILE = cProfile.Profile()
_run = Scheduler._run


def _profiled_run(self: Scheduler) -> None:
    """The engine thread's loop with the profiler on (cProfile follows the thread that enables it)."""
    PROFILE.enable()
    try:
        _run(self)
    finally:
        PROFILE.disable()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    Scheduler._run = _profiled_run  # type: ignore[method-assign]
    d = Daemon(daemon_settings(Path(tempfile.mkdtemp()), max_sessions=a.sessions, n_ctx_seq=256))
    d.start()
    d.wait_ready(60)
    client = Client(d.addresses[0])
    pool = d.service.engine.vocab.tokenize(TEXT * 8)
    handles = [session(client, pool[i * 20 : i * 20 + 40]) for i in range(a.sessions)]
    steps0 = d.service.metrics.steps._value.get()
    PROFILE.create_stats()  # drop what loading and the prompts cost
    PROFILE.clear()
    lat: list[list[float]] = [[] for _ in handles]
    wall = together(
        [functools.partial(generate, client, h, a.tokens, lat[i]) for i, h in enumerate(handles)]
    )
    steps = d.service.metrics.steps._value.get() - steps0
    for h in handles:
        client.s.Close(pb.HandleRequest(handle=h), metadata=MD)
    d.stop()

    RESULTS.mkdir(parents=True, exist_ok=True)
    PROFILE.dump_stats(RESULTS / "profile_step.prof")
    stats = pstats.Stats(PROFILE)
    raw = stats.stats  # type: ignore[attr-defined]
    decode_s = sum(v[3] for k, v in raw.items() if "llama_decode" in k[2])
    idle_s = sum(v[3] for k, v in raw.items() if k[2] in ("_drain",))
    total_s = wall
    own = sorted(((v[2], v[1], k) for k, v in raw.items()), reverse=True)[: a.top]
    per_step = lambda s: 1000 * s / max(steps, 1)  # noqa: E731
    table(
        f"{a.sessions} sessions x {a.tokens} tokens, greedy: {steps} steps in {wall:.2f} s",
        ["part", "ms per step"],
        [
            ["wall", per_step(total_s)],
            ["llama_decode", per_step(decode_s)],
            ["waiting for work (_drain)", per_step(idle_s)],
            ["the rest of the engine thread", per_step(total_s - decode_s - idle_s)],
        ],
    )
    rows = [[f"{Path(k[0]).name}:{k[1]}({k[2]})", calls, per_step(tt)] for tt, calls, k in own]
    table("own time on the engine thread", ["function", "calls", "ms per step"], rows)
    write(
        "profile_step",
        {
            "sessions": a.sessions,
            "tokens": a.tokens,
            "steps": steps,
            "wall_s": wall,
            "tok_s": a.sessions * a.tokens / wall,
            "ms_per_step": {
                "wall": per_step(total_s),
                "llama_decode": per_step(decode_s),
                "drain": per_step(idle_s),
            },
            "own_time_ms_per_step": [{"function": r[0], "calls": r[1], "ms": r[2]} for r in rows],
        },
    )


if __name__ == "__main__":
    main()
