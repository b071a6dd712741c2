"""N sessions generating together through the daemon, repeated: tokens/s and llama_decode calls
per generated token (1/N: they share every decode; 1.0: they take turns). concurrency.py measures
each session count once, one after another in one daemon; this repeats one count, to tell a
change from the machine's noise (`before_after.py ... repeat_batched.py -- --sessions 2`).

    python bench/repeat_batched.py [--sessions 2] [--reps 5] [--tokens 48]
        -> bench/results/repeat_batched.json
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
from pathlib import Path

from common import daemon_settings, table, together, write
from concurrency import MD, generate, session

from sinkd.daemon.node import Daemon
from sinkd.daemon.rpc.client import Client
from sinkd.evaluation import SAMPLE_TEXT as TEXT
from sinkd.proto.v1 import sinkd_pb2 as pb


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sessions", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tokens", type=int, default=48)
    a = p.parse_args()
    d = Daemon(daemon_settings(Path(tempfile.mkdtemp()), max_sessions=9, n_ctx_seq=256))
    d.start()
    d.wait_ready(60)
    try:
        client = Client(d.addresses[0])
        pool = d.service.engine.vocab.tokenize(TEXT * 8)
        metrics = d.service.metrics
        rows = []
        for rep in range(a.reps):
            handles = [session(client, pool[i * 20 : i * 20 + 40]) for i in range(a.sessions)]
            steps, tokens = metrics.steps._value.get(), metrics.decode_tokens._value.get()
            lat: list[list[float]] = [[] for _ in handles]
            calls = [
                functools.partial(generate, client, h, a.tokens, lat[i])
                for i, h in enumerate(handles)
            ]
            wall = together(calls)
            made = metrics.decode_tokens._value.get() - tokens
            rows.append(
                [rep, a.sessions * a.tokens / wall, (metrics.steps._value.get() - steps) / made]
            )
            for h in handles:
                client.s.Close(pb.HandleRequest(handle=h), metadata=MD)
    finally:
        d.stop()
    table(
        f"{a.sessions} sessions, {a.tokens} tokens each, greedy",
        ["rep", "tok/s", "decodes a token"],
        rows,
    )
    result = {
        "sessions": a.sessions,
        "tok_s": statistics.median(r[1] for r in rows),
        "decodes_per_token": statistics.median(r[2] for r in rows),
        "reps": [{"tok_s": r[1], "decodes_per_token": r[2]} for r in rows],
    }
    print(write("repeat_batched", result))


if __name__ == "__main__":
    main()
