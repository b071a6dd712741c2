"""6. Reset latency (p50/p99) through the daemon's service, and the sliding window with re-computation
against `sink` at the same window: per-token speedup.

    python bench/reset_recompute.py [--resets 50] [--tokens 96]   -> bench/results/reset_recompute.json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import daemon_settings, percentile, table, write

from sinkd.cachepolicy import CacheSequence, PolicyConfig
from sinkd.daemon.engine.llama import EngineConfig
from sinkd.daemon.engine.loading import open_engine
from sinkd.daemon.engine.sampler import Sampler, SamplingParams
from sinkd.daemon.node import Daemon
from sinkd.daemon.rpc.client import Client
from sinkd.evaluation import SAMPLE_TEXT as TEXT
from sinkd.proto.v1 import sinkd_pb2 as pb

MD: list[tuple[str, str]] = []  # the daemon has no tenants: its socket's user


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--resets", type=int, default=50)
    p.add_argument("--tokens", type=int, default=96)
    a = p.parse_args()
    d = Daemon(daemon_settings(Path(tempfile.mkdtemp()), max_sessions=1, n_ctx_seq=256))
    d.start()
    d.wait_ready(60)
    client = Client(d.addresses[0])
    ids = d.service.engine.vocab.tokenize(TEXT)[:256]
    h = client.s.Create(
        pb.CreateSessionRequest(policy=pb.Policy(name="sink", sinks=4, window=252)), metadata=MD
    ).handle
    times = []
    for _ in range(a.resets):
        client.s.Append(
            pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=ids)), metadata=MD
        )  # 256 cells
        t = time.perf_counter()
        h = client.s.Reset(pb.HandleRequest(handle=h), metadata=MD).handle
        times.append(1000 * (time.perf_counter() - t))
    d.stop()
    table(
        f"reset of a full session (256 cells freed and verified), {a.resets} resets, over gRPC",
        ["p50 ms", "p99 ms"],
        [[percentile(times, 50), percentile(times, 99)]],
    )

    with open_engine(None, EngineConfig(n_ctx_seq=256, n_seq_max=1)) as engine:
        stream = engine.vocab.tokenize(TEXT * 3)
        sampler = Sampler(SamplingParams(temperature=0.8, seed=5))
        seq = CacheSequence(PolicyConfig.named("sink", sinks=4, window=252, evict_chunk=1))
        logits = engine.feed(0, seq, stream[:256])
        t = time.perf_counter()
        for _ in range(a.tokens):
            logits = engine.feed(0, seq, [sampler.sample_logits(logits)])  # type: ignore[arg-type]
        sink_ms = 1000 * (time.perf_counter() - t) / a.tokens
        window = list(stream[:256])
        t = time.perf_counter()
        for _ in range(a.tokens):  # re-encode the last 256 tokens for every new token
            engine.cells.clear(0)
            logits = engine.feed(
                0, CacheSequence(PolicyConfig.named("full", sinks=0, window=256)), window[-256:]
            )
            window.append(sampler.sample_logits(logits))  # type: ignore[arg-type]
        recompute_ms = 1000 * (time.perf_counter() - t) / a.tokens
    table(
        "per generated token, window 256",
        ["sink ms", "recompute ms", "speedup"],
        [[sink_ms, recompute_ms, recompute_ms / sink_ms]],
    )
    write(
        "reset_recompute",
        {
            "reset_ms": times,
            "reset_p50_ms": percentile(times, 50),
            "reset_p99_ms": percentile(times, 99),
            "sink_ms_per_token": sink_ms,
            "recompute_ms_per_token": recompute_ms,
            "speedup": recompute_ms / sink_ms,
        },
    )


if __name__ == "__main__":
    main()
