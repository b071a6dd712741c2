"""What the HTTP front costs per streamed token, beside gRPC's, on the real daemon.

    python bench/http_edge.py [--tokens 300] [--rounds 3]   -> bench/results/http_edge.json

One `sinkd serve` process; the same greedy chat turn (a fresh session each time, so the same tokens)
streamed through gRPC's `Chat` and through `/v1/chat/completions` (the openai SDK), alternating,
`--rounds` times each. The server's CPU is counted by thread from /proc: its two busiest threads
are llama.cpp's decode (the engine thread and its helper), the rest is the edges, the journal and
the scheduler's waits; the client's own CPU (this process) is counted apart. Per streamed token,
the "other threads" difference between the two edges is what HTTP (uvicorn, Starlette, the SSE
framing, a thread pool hop per token) adds over grpcio's stream.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import table, write
from peer import cpu_split, free_port, thread_cpu

QUESTION = "Tell me a long story about a lighthouse keeper and the sea, in many sentences."


class Daemon:
    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp())
        self.sock = self.tmp / "run" / "sinkd.sock"
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sinkd.cli.main", "serve", "--socket", str(self.sock),
             "--ctx", "1024", "--max-sessions", "8", "--threads", "2", "--no-durable",
             "--state-dir", str(self.tmp / "state"), "--http", f"127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.3)
        self.key = (self.sock.parent / "http-token").read_text().strip()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def over_grpc(d: Daemon, n: int) -> int:
    from sinkd.daemon.rpc.client import Client
    from sinkd.daemon.runtime.api import (
        ChatRequest,
        GenerationOptions,
        PolicyRequest,
        SamplingRequest,
        TokenEvent,
    )

    c = Client(f"unix:{d.sock}")
    h = c.create(PolicyRequest(name="sink"), "You are a storyteller.").handle
    greedy = SamplingRequest(temperature=0.0, top_p=1.0, seed=0)
    tokens = sum(
        isinstance(e, TokenEvent)
        for e in c.chat(h, ChatRequest(QUESTION, GenerationOptions(n, (), greedy)))
    )
    c.close(h)
    return tokens


def over_http(d: Daemon, n: int) -> int:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{d.port}/v1", api_key=d.key, max_retries=0)
    stream = client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[{"role": "system", "content": "You are a storyteller."},
                  {"role": "user", "content": QUESTION}],
        max_tokens=n, temperature=0, stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    tokens = 0
    for chunk in stream:
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return tokens


def one(d: Daemon, edge: str, n: int) -> dict[str, float]:
    run = over_grpc if edge == "grpc" else over_http
    before, client0, t0 = thread_cpu(d.proc.pid), os.times(), time.perf_counter()
    tokens = run(d, n)
    after, client1, wall = thread_cpu(d.proc.pid), os.times(), time.perf_counter() - t0
    decoding, others = cpu_split(before, after)
    client = sum(client1[:2]) - sum(client0[:2])
    return {
        "tokens": tokens,
        "wall_s": wall,
        "decode_ms_per_token": 1000 * decoding / tokens,
        "other_server_ms_per_token": 1000 * others / tokens,
        "client_ms_per_token": 1000 * client / tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    d = Daemon()
    runs: dict[str, list[dict[str, float]]] = {"grpc": [], "http": []}
    try:
        one(d, "grpc", 16)  # warm both paths: first-call imports and pools are not the edge's cost
        one(d, "http", 16)
        for _ in range(args.rounds):
            for edge in ("grpc", "http"):
                runs[edge].append(one(d, edge, args.tokens))
    finally:
        d.stop()
    rows, summary = [], {}
    for edge, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        summary[edge] = med
        rows.append([edge, int(med["tokens"]), med["decode_ms_per_token"],
                     med["other_server_ms_per_token"], med["client_ms_per_token"],
                     med["tokens"] / med["wall_s"]])  # fmt: skip
    extra = (
        summary["http"]["other_server_ms_per_token"] - summary["grpc"]["other_server_ms_per_token"]
    )
    table(
        f"CPU per streamed token, median of {args.rounds} (the same greedy chat turn each time)",
        ["edge", "tokens", "decode threads ms", "other server threads ms", "client ms", "tok/s"],
        rows,
    )
    print(f"HTTP adds {extra:.3f} ms of server CPU per streamed token over gRPC")
    out: dict[str, Any] = {"runs": runs, "median": summary, "http_extra_server_ms": extra}
    print(write("http_edge", out))


if __name__ == "__main__":
    main()
