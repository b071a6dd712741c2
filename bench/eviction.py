"""3. What eviction costs: decode speed and one shift's cost for E = 1, 4, 16, 64, W/2 and K = 0, 16,
64, 256, and E=16 with K = 48 (the default until 2026-11-30) and a session's default K (the daemon's
`evictions_per_shift` x E, at most W), beside the perplexity each gives. E=1/K=0 is the paper's
per-token eviction; E=W/2 is what llama.cpp's own server does (discard half the window at once).
Decoding runs in a context of 1 x 256 cells and in the daemon's default of 4 x 1,024: llama.cpp
re-rotates every cell of the context at each shift. `--k-sweep` adds what K costs in perplexity at
E=16 for a chat's W=1,020 and for W=252 (the data behind the default K).

    python bench/eviction.py [--decode 768] [--ppl-tokens 2048] [--k-sweep]
        -> bench/results/eviction.json
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

from common import ROOT, session_default_k, table, write

from sinkd.cachepolicy import CacheSequence, PolicyConfig, Shift
from sinkd.daemon.engine.llama import EngineConfig
from sinkd.daemon.engine.loading import open_engine
from sinkd.daemon.engine.sampler import Sampler, SamplingParams
from sinkd.evaluation import SAMPLE_TEXT as TEXT
from sinkd.evaluation.ppl import score_policy

S, W = 4, 252


CONTEXTS = ((1, 256), (4, 1024))  # (sequences, cells each): the smallest, and the daemon's default


def decode_cost(
    policy: PolicyConfig, tokens: int, n_seq_max: int, n_ctx_seq: int
) -> dict[str, float]:
    """Decode past the budget one token per step; split step times by whether a shift preceded them."""
    with open_engine(None, EngineConfig(n_ctx_seq=n_ctx_seq, n_seq_max=n_seq_max)) as engine:
        seq = CacheSequence(policy)
        logits = engine.feed(0, seq, engine.vocab.tokenize(TEXT * 2)[:256])
        sampler = Sampler(SamplingParams(temperature=0.8, seed=3))
        with_shift, without = [], []
        t0 = time.perf_counter()
        for _ in range(tokens):
            tok = sampler.sample_logits(logits)  # type: ignore[arg-type]
            shifted = any(isinstance(op, Shift) for op in seq.plan(1).ops)
            t = time.perf_counter()
            logits = engine.feed(0, seq, [tok])
            (with_shift if shifted else without).append(time.perf_counter() - t)
        total = time.perf_counter() - t0
    plain = statistics.median(without) if without else float("nan")
    shift = statistics.median(with_shift) if with_shift else float("nan")
    return {
        "tok_s": tokens / total,
        "step_ms": 1000 * plain,
        "shift_step_ms": 1000 * shift,
        "shift_cost_ms": 1000 * (shift - plain) if without and with_shift else float("nan"),
        "shifts": len(with_shift),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--decode", type=int, default=768)
    p.add_argument("--ppl-tokens", type=int, default=2048)
    p.add_argument("--k-sweep", action="store_true", help="perplexity by K at W=1,020 and 252")
    a = p.parse_args()
    text_path = ROOT / "bench" / "texts" / "kjv.txt"
    text = (
        text_path.read_text()[300_000:]
        if text_path.exists()
        else Path("/usr/share/common-licenses/GPL-3").read_text()
    )
    with open_engine(None, EngineConfig(n_ctx_seq=256, n_seq_max=1)) as engine:
        ids = engine.vocab.tokenize(text)[: a.ppl_tokens]
    settings = [(e, 0) for e in (1, 4, 16, 64, W // 2)] + [(1, k) for k in (16, 64, 256)]
    default_k = session_default_k(PolicyConfig.named("sink", sinks=S, window=W, evict_chunk=16))
    settings += [(16, 48), (16, default_k.compact_interval)]
    rows, results = [], []
    for e, k in settings:
        policy = PolicyConfig.named("sink", sinks=S, window=W, evict_chunk=e, compact_interval=k)
        cost = decode_cost(policy, a.decode, *CONTEXTS[0])
        wide = decode_cost(policy, a.decode, *CONTEXTS[1])
        with open_engine(None, EngineConfig(n_ctx_seq=policy.budget, n_seq_max=1)) as engine:
            run = score_policy(engine, ids, policy)
        ppl_after = math.exp(float(run.nll[S + W :].mean()))
        label = {(1, 0): " (paper)", (W // 2, 0): " (llama.cpp server)",
                 (16, 48): " (the default until 2026-11-30)",
                 (16, default_k.compact_interval): " (session default)"}.get((e, k), "")  # fmt: skip
        results.append(
            {
                "evict_chunk": e,
                "compact_interval": k,
                **cost,
                "context_4x1024": wide,
                "ppl": run.perplexity,
                "ppl_after_budget": ppl_after,
                "prefill_tok_s": run.tokens_per_s,
            }
        )
        rows.append(
            [
                f"E={e} K={k}{label}",
                cost["tok_s"],
                cost["step_ms"],
                cost["shift_cost_ms"],
                cost["shifts"],
                wide["tok_s"],
                wide["shift_cost_ms"],
                ppl_after,
                run.tokens_per_s,
            ]
        )
    table(f"sink S={S} W={W}: decode ({a.decode} tokens past the budget) and perplexity ({a.ppl_tokens} tokens of the KJV)",
          ["setting", "decode tok/s", "step ms", "shift cost ms", "shifts", "tok/s 4x1024",
           "shift cost ms 4x1024", "ppl", "prefill tok/s"], rows)  # fmt: skip
    sweep = k_sweep(text, 2 * a.ppl_tokens) if a.k_sweep else []
    write(
        "eviction",
        {
            "sinks": S,
            "window": W,
            "decode_tokens": a.decode,
            "ppl_tokens": len(ids),
            "results": results,
            "k_sweep": sweep,
        },
    )


def k_sweep(text: str, n_tokens: int) -> list[dict[str, float]]:
    """Perplexity by K at E=16: a gap of K positions between the sinks and the window while it
    waits for its shift (a chat's W=1,020 in 1,024 cells, and W=252)."""
    out = []
    for window, ks in ((1020, (0, 48, 256, 512, 1020, 2048)), (252, (0, 48, 252, 1024))):
        with open_engine(None, EngineConfig(n_ctx_seq=S + window, n_seq_max=1)) as engine:
            ids = engine.vocab.tokenize(text)[:n_tokens]
            for k in ks:
                policy = PolicyConfig.named(
                    "sink", sinks=S, window=window, evict_chunk=16, compact_interval=k
                )
                run = score_policy(engine, ids, policy)
                out.append({"window": window, "compact_interval": k, "ppl": run.perplexity,
                            "shifts": run.receipt.get("shifts", -1)})  # fmt: skip
    base = {r["window"]: r["ppl"] for r in out if r["compact_interval"] == 0}
    table(
        f"perplexity by K (sink S={S} E=16, {n_tokens:,} tokens of the KJV)",
        ["W", "K", "ppl", "vs K=0", "shifts"],
        [[r["window"], r["compact_interval"], r["ppl"], r["ppl"] / base[r["window"]], r["shifts"]]
         for r in out],
    )  # fmt: skip
    return out


if __name__ == "__main__":
    main()
