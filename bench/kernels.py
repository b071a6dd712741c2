"""18. What sinkd's per-row weight kernels cost: Gemma 3 270M (Q4_K, Q6_K, Q5_0, Q8_0), whose weights
llama.cpp would repack (a gemm from 4 rows of a batch), loaded as llama.cpp's defaults have it
against as the engine loads it (unrepacked; docs/determinism.md). The tiled kernel is off in both:
it takes no repacked weight. Prefill of eight sequences in 128-token chunks, then 40 steps of eight
decoding sequences, each engine in a child process of its own, interleaved rounds. SmolLM2 (Q4_1)
takes neither kernel: nothing to measure.

    python bench/kernels.py [--rounds 3]   -> bench/results/kernels.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from common import table, write

MODEL = "gemma3-270m"


def measure(stock: bool) -> dict[str, float]:
    """In this process: one engine, weights as llama.cpp's defaults load them (`stock`) or as sinkd
    does; prefill and 8-session decode tokens/s."""
    import llama_cpp

    from sinkd.daemon.engine import llama as adapter

    default_params = llama_cpp.llama_model_default_params

    def params() -> llama_cpp.llama_model_params:
        p = default_params()
        p.use_extra_bufts = stock
        return p

    adapter.llama.llama_model_default_params = params  # type: ignore[attr-defined]
    from sinkd.daemon.engine.decoding import BatchItem
    from sinkd.daemon.engine.llama import EngineConfig
    from sinkd.daemon.engine.loading import open_engine
    from sinkd.evaluation import SAMPLE_TEXT as TEXT

    engine = open_engine(MODEL, EngineConfig(n_ctx_seq=512, n_seq_max=8, n_batch=256))
    toks = engine.vocab.tokenize(TEXT * 6)
    t0 = time.perf_counter()
    for q in range(8):
        for at in (0, 128):
            engine.decode_batch([BatchItem(q, toks[q * 50 + at :][:128], at, logits=False)])
    prefill = 8 * 256 / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(40):
        engine.decode_batch([BatchItem(q, [toks[600 + i + q]], 256 + i) for q in range(8)])
    decode = 8 * 40 / (time.perf_counter() - t0)
    engine.close()
    return {"prefill_tok_s": prefill, "decode8_tok_s": decode}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", choices=["stock", "sinkd"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(measure(a.child == "stock")))
        return
    runs: dict[str, list[dict[str, float]]] = {"stock": [], "sinkd": []}
    for _ in range(a.rounds):
        for mode in runs:
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
    table(
        f"{MODEL}, medians of {a.rounds} interleaved rounds",
        ["measure", "llama.cpp's defaults", "sinkd (per-row)", "sinkd / defaults"],
        [
            [k, med["stock"][k], med["sinkd"][k], med["sinkd"][k] / med["stock"][k]]
            for k in ("prefill_tok_s", "decode8_tok_s")
        ],
    )
    write("kernels", {"model": MODEL, "runs": runs, "medians": med})


if __name__ == "__main__":
    main()
