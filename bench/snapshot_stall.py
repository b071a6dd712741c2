"""What periodic snapshots cost the other sessions' tokens: written on the engine thread, or beside.

    python bench/snapshot_stall.py        -> bench/results/snapshot_stall.json
    SINKD_BENCH_ROUNDS=5 python bench/snapshot_stall.py   (3 rounds by default)

One durable daemon in this process (SmolLM2, sync=full, 256 cells a session, drafts off: a step is
a token), SESSIONS sessions generating TOKENS tokens each at once, a snapshot every EVERY tokens.
Each round runs it twice, who goes first alternating: "beside", the daemon's way (while steps
wait, a periodic snapshot's file is sealed and written by a thread of its own and recorded between
two later steps: daemon/runtime/durable/snapshot_writer.py), and "engine thread", the way before
it (`take_behind` replaced by `take`: copy, checksum, write, fsyncs and row, all between two
steps). Measured: the engine thread's wall time in `Snapshotter.due` over the run per snapshot
written (what every decoding session's next token waits for; `due` runs between every two steps,
its few microseconds when nothing is due count alike in both), the sessions' inter-token latency
p50/p99/max and the aggregate tok/s. The last line is a JSON object of the medians.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import daemon_settings, percentile, table, together, write
from concurrency import MD, generate

from sinkd.daemon.node import Daemon
from sinkd.daemon.rpc.client import Client
from sinkd.evaluation import SAMPLE_TEXT as TEXT
from sinkd.proto.v1 import sinkd_pb2 as pb

ROUNDS = int(os.environ.get("SINKD_BENCH_ROUNDS", "3"))
SESSIONS, TOKENS, EVERY = 4, 300, 32
MODES = ("beside", "engine thread")


def run(mode: str) -> dict[str, Any]:
    d = Daemon(
        daemon_settings(
            Path(tempfile.mkdtemp()),
            max_sessions=SESSIONS,
            snapshot_every_tokens=EVERY,
            speculative="off",
        )
    )
    d.start()
    d.wait_ready(120)
    snapshotter = d.service.scheduler.snapshotter
    assert snapshotter is not None
    if mode == "engine thread":
        snapshotter.take_behind = snapshotter.take  # type: ignore[method-assign, assignment]
    in_due: list[float] = []
    due = snapshotter.due

    def timed(*args: Any) -> None:
        t0 = time.perf_counter()
        try:
            due(*args)
        finally:
            in_due.append(time.perf_counter() - t0)

    client = Client(d.addresses[0])
    try:
        pool = d.service.engine.vocab.tokenize(TEXT * 8)
        handles = []
        for i in range(SESSIONS):
            policy = pb.Policy(name="sink", sinks=4, window=252)
            h = client.s.Create(pb.CreateSessionRequest(policy=policy), metadata=MD).handle
            prompt = pb.TokenList(ids=pool[i * 100 : i * 100 + 100])
            client.s.Append(pb.AppendRequest(handle=h, tokens=prompt), metadata=MD)
            handles.append(h)
        d.service.scheduler.call(lambda e: None)  # the appends' snapshots are behind us
        snapshotter.due = timed  # type: ignore[method-assign]
        before = d.service.metrics.count("snapshots")
        lat: list[list[float]] = [[] for _ in handles]
        wall = together(
            [functools.partial(generate, client, h, TOKENS, lat[i]) for i, h in enumerate(handles)]
        )
        d.service.scheduler.call(lambda e: None)
        snapshotter.due = due  # type: ignore[method-assign]
        taken = d.service.metrics.count("snapshots") - before
    finally:
        client.channel.close()
        d.stop()
    gaps = [x for one in lat for x in one]
    return {
        "mode": mode,
        "snapshots": taken,
        "due_ms_per_snapshot": 1000 * sum(in_due) / max(1, taken),
        "due_calls_over_1ms": sum(t > 0.001 for t in in_due),
        "itl_p50_ms": percentile(gaps, 50),
        "itl_p99_ms": percentile(gaps, 99),
        "itl_max_ms": max(gaps),
        "aggregate_tok_s": SESSIONS * TOKENS / wall,
    }


def main() -> None:
    runs = []
    for rnd in range(ROUNDS):
        for mode in MODES if rnd % 2 == 0 else MODES[::-1]:
            r = {"round": rnd, **run(mode)}
            runs.append(r)
            print(json.dumps(r), flush=True)
    fields = [
        "snapshots",
        "due_ms_per_snapshot",
        "due_calls_over_1ms",
        "itl_p50_ms",
        "itl_p99_ms",
        "itl_max_ms",
        "aggregate_tok_s",
    ]
    medians = {
        mode: {f: statistics.median(r[f] for r in runs if r["mode"] == mode) for f in fields}
        for mode in MODES
    }
    table(
        f"{SESSIONS} sessions x {TOKENS} tokens, a snapshot every {EVERY} (medians of {ROUNDS}"
        " rounds)",
        ["where the file is written", *fields],
        [[mode, *(round(medians[mode][f], 2) for f in fields)] for mode in MODES],
    )
    ratios = [
        a["aggregate_tok_s"] / b["aggregate_tok_s"]
        for a, b in zip(
            (r for r in runs if r["mode"] == "beside"),
            (r for r in runs if r["mode"] == "engine thread"),
            strict=True,
        )
    ]
    out = {"runs": runs, "medians": medians, "aggregate_beside_over_engine_thread": ratios}
    print(f"wrote {write('snapshot_stall', out)}")
    print(json.dumps({"medians": medians, "aggregate_ratio_rounds": ratios}))


if __name__ == "__main__":
    main()
