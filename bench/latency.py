"""1. Inter-token latency by session age: `sink` decodes 20x past its budget; `full` as far as it can.

python bench/latency.py [--tokens 5200] [--full-tokens 4096]   -> bench/results/latency.{json,png}
"""

from __future__ import annotations

import argparse
import time

from common import RESULTS, percentile, table, write

from sinkd.cachepolicy import CacheSequence, PolicyConfig
from sinkd.daemon.engine.llama import EngineConfig
from sinkd.daemon.engine.loading import open_engine
from sinkd.daemon.engine.sampler import Sampler, SamplingParams
from sinkd.evaluation import SAMPLE_TEXT as TEXT


def decode_run(policy: PolicyConfig, n_ctx: int, tokens: int) -> list[float]:
    """Greedy decoding one token per step; returns each step's seconds (sample + policy + decode)."""
    with open_engine(None, EngineConfig(n_ctx_seq=n_ctx, n_seq_max=1)) as engine:
        seq = CacheSequence(policy)
        logits = engine.feed(0, seq, engine.vocab.tokenize(TEXT)[:64])
        sampler = Sampler(
            SamplingParams(temperature=0.8, seed=1)
        )  # sampled: no greedy loop collapse
        times = []
        for _ in range(tokens):
            t = time.perf_counter()
            tok = sampler.sample_logits(logits)  # type: ignore[arg-type]
            logits = engine.feed(0, seq, [tok])
            times.append(time.perf_counter() - t)
        return times


def by_age(times: list[float], bucket: int) -> list[dict[str, float]]:
    return [
        {
            "start": i,
            "p50_ms": 1000 * percentile(times[i : i + bucket], 50),
            "mean_ms": 1000 * sum(times[i : i + bucket]) / len(times[i : i + bucket]),
        }
        for i in range(0, len(times), bucket)
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=5200)
    p.add_argument("--full-tokens", type=int, default=4096)
    p.add_argument("--bucket", type=int, default=256)
    a = p.parse_args()
    sink = decode_run(
        PolicyConfig.named("sink", sinks=4, window=252, evict_chunk=1, compact_interval=64),
        256,
        a.tokens,
    )
    full = decode_run(
        PolicyConfig.named("full", sinks=0, window=a.full_tokens + 64),
        a.full_tokens + 64,
        a.full_tokens,
    )
    rows, data = [], {}
    for name, times in (("sink S=4 W=252 E=1 K=64", sink), ("full", full)):
        ages = by_age(times, a.bucket)
        early = sum(t["mean_ms"] for t in ages[1:3]) / 2  # past warm-up, after the budget fills
        late = sum(t["mean_ms"] for t in ages[-2:]) / 2
        rows.append([name, len(times), early, late, late / early])
        data[name] = {
            "tokens": len(times),
            "early_ms": early,
            "late_ms": late,
            "late_over_early": late / early,
            "by_age": ages,
        }
    table(
        "inter-token latency by session age (ms per token, mean of two 256-token buckets)",
        ["policy", "tokens", "early", "late", "late/early"],
        rows,
    )
    write("latency", {"budget": 256, "results": data})
    from sinkd.evaluation.plotting import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(8, 4), dpi=110)
    for name, d in data.items():
        ax.plot(
            [b["start"] for b in d["by_age"]],
            [b["mean_ms"] for b in d["by_age"]],
            marker=".",
            label=name,
        )
    ax.axvline(256, color="grey", linestyle=":", label="budget 256")
    ax.set_xlabel("session age (generated tokens)")
    ax.set_ylabel("ms per token (mean per 256)")
    ax.set_title("SmolLM2-135M, 2 CPU cores: per-token latency vs session age")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / "latency.png")


if __name__ == "__main__":
    main()
