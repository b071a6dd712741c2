"""4. 1, 2, 4 and 8 concurrent sessions through the daemon: aggregate tokens/s, per-session
inter-token latency p50/p99, batched against one at a time; time to first token while another
session prefills a long append. In the same run, the raw ceiling: llama-cpp-python decoding the
same number of sequences batched against solo steps (bench/batching.py's measure), before and
after, each in a child process (`common.in_child`: beside the engine thread both run throttled).

    python bench/concurrency.py [--tokens 48]   -> bench/results/concurrency.json
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import threading
import time
from pathlib import Path

from batching import run as raw_batching
from common import daemon_settings, in_child, percentile, table, together, write

from sinkd.daemon.node import Daemon
from sinkd.daemon.rpc.client import Client
from sinkd.evaluation import SAMPLE_TEXT as TEXT
from sinkd.proto.v1 import sinkd_pb2 as pb

MD: list[tuple[str, str]] = []  # the daemon has no tenants: its socket's user


def session(client: Client, prompt: list[int]) -> pb.Handle:
    h = client.s.Create(
        pb.CreateSessionRequest(policy=pb.Policy(name="sink", sinks=4, window=252)), metadata=MD
    ).handle
    client.s.Append(pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=prompt)), metadata=MD)
    return h


def generate(client: Client, h: pb.Handle, n: int, out: list[float]) -> None:
    for ev in client.s.Generate(pb.GenerateRequest(handle=h, max_tokens=n), metadata=MD):
        if ev.HasField("token") and ev.token.index > 0:
            out.append(ev.token.latency_ms)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=48)
    a = p.parse_args()
    raw = [in_child(raw_batching, False, 8, 20)]
    d = Daemon(daemon_settings(Path(tempfile.mkdtemp()), max_sessions=9, n_ctx_seq=256))
    d.start()
    d.wait_ready(60)
    client = Client(d.addresses[0])
    pool = d.service.engine.vocab.tokenize(TEXT * 8)
    rows, results = [], []
    for n in (1, 2, 4, 8):
        handles = [session(client, pool[i * 20 : i * 20 + 40]) for i in range(n)]
        lat: list[list[float]] = [[] for _ in range(n)]
        wall = together(
            [
                functools.partial(generate, client, h, a.tokens, lat[i])
                for i, h in enumerate(handles)
            ]
        )
        batched = n * a.tokens / wall
        t0 = time.perf_counter()
        serial_lat: list[float] = []
        for h in handles:  # the same sessions, one at a time
            generate(client, h, a.tokens, serial_lat)
        serial = n * a.tokens / (time.perf_counter() - t0)
        flat = [x for per in lat for x in per]
        results.append(
            {
                "sessions": n,
                "batched_tok_s": batched,
                "serial_tok_s": serial,
                "itl_p50_ms": percentile(flat, 50),
                "itl_p99_ms": percentile(flat, 99),
            }
        )
        rows.append(
            [n, batched, serial, batched / serial, percentile(flat, 50), percentile(flat, 99)]
        )
        for h in handles:
            client.s.Close(pb.HandleRequest(handle=h), metadata=MD)
    table(
        f"{a.tokens} tokens per session, greedy",
        ["sessions", "batched tok/s", "one at a time tok/s", "speedup", "ITL p50 ms", "ITL p99 ms"],
        rows,
    )

    # time to first token while another session prefills a long append
    ttft = {}
    for label, busy in (("idle daemon", False), ("during a 2,000-token append", True)):
        h = session(client, pool[:40])
        other = session(client, pool[:8]) if busy else None
        if other is not None:
            bg = threading.Thread(
                target=client.s.Append,
                args=(pb.AppendRequest(handle=other, tokens=pb.TokenList(ids=pool[:2000])),),
                kwargs={"metadata": MD},
            )
            bg.start()
            time.sleep(0.3)
        t0 = time.perf_counter()
        first = next(
            ev
            for ev in client.s.Generate(pb.GenerateRequest(handle=h, max_tokens=1), metadata=MD)
            if ev.HasField("token")
        )
        ttft[label] = 1000 * (time.perf_counter() - t0)
        del first
        if other is not None:
            bg.join()
        client.s.Close(pb.HandleRequest(handle=h), metadata=MD)
    table("time to first token", ["situation", "ms"], [[k, v] for k, v in ttft.items()])
    d.stop()
    raw.append(in_child(raw_batching, False, 8, 20))
    raw_speedup = sum(float(r["speedup"]) for r in raw) / len(raw)
    raw_step_ms = sum(float(r["batched_step_ms"]) for r in raw) / len(raw)
    eight = next(r for r in results if r["sessions"] == 8)
    eight_speedup = eight["batched_tok_s"] / eight["serial_tok_s"]
    table(
        "8 sessions against the raw ceiling (llama-cpp-python, same shapes, mean of before/after)",
        ["measure", "daemon", "raw", "daemon/raw"],
        [
            ["batched / one at a time", eight_speedup, raw_speedup, eight_speedup / raw_speedup],
            ["ITL p99 vs batched step ms", eight["itl_p99_ms"], raw_step_ms,
             eight["itl_p99_ms"] / raw_step_ms],
        ],
    )  # fmt: skip
    write(
        "concurrency",
        {
            "tokens": a.tokens,
            "results": results,
            "ttft_ms": ttft,
            "raw": raw,
            "eight_vs_raw": {
                "speedup": eight_speedup,
                "raw_speedup": raw_speedup,
                "ratio": eight_speedup / raw_speedup,
                "itl_p99_ms": eight["itl_p99_ms"],
                "raw_batched_step_ms": raw_step_ms,
                "itl_p99_vs_raw_step": eight["itl_p99_ms"] / raw_step_ms,
            },
        },
    )


if __name__ == "__main__":
    main()
