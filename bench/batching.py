"""Batched decoding vs solo steps, with per-sequence KV streams and with a unified cache.

Eight sessions prefill different prompts, then decode one token each for several steps: once as one
batch of eight, once as eight solo decodes on a twin context. Reports the largest logit difference
and the time per step. Usage: python bench/batching.py [--sessions 8] [--steps 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
from common import default_threads

from sinkd.daemon.engine.decoding import BatchItem
from sinkd.daemon.engine.llama import EngineConfig
from sinkd.daemon.engine.loading import open_engine
from sinkd.evaluation import SAMPLE_TEXT as TEXT


def run(unified: bool, sessions: int, steps: int) -> dict[str, float | bool]:
    # both engines stay open: with no thread count given they would count each other for the
    # shared cores (daemon/engine/cores.py) and run on half of them
    cfg = EngineConfig(
        n_ctx_seq=256,
        n_seq_max=sessions,
        n_batch=256,
        kv_unified=unified,
        n_threads=default_threads(),
    )
    batched, solo = open_engine(None, cfg), open_engine(None, cfg)
    tokens = batched.vocab.tokenize(TEXT * 2)
    for k in range(sessions):
        prompt = tokens[k * 10 : k * 10 + 40]
        for engine in (batched, solo):
            engine.decode_batch([BatchItem(k, prompt, 0, logits=False)])
    max_diff, t_batched, t_solo = 0.0, 0.0, 0.0
    for step in range(steps):
        items = [BatchItem(k, [tokens[100 + step + k]], 40 + step) for k in range(sessions)]
        t = time.perf_counter()
        rows = batched.decode_batch(items)
        t_batched += time.perf_counter() - t
        t = time.perf_counter()
        solo_rows = [solo.decode_batch([item])[0] for item in items]
        t_solo += time.perf_counter() - t
        max_diff = max(
            max_diff, max(float(np.abs(a - b).max()) for a, b in zip(rows, solo_rows, strict=False))
        )  # type: ignore[operator]
    batched.close()
    solo.close()
    return {
        "kv_unified": unified,
        "max_abs_logit_diff": max_diff,
        "bit_identical": max_diff == 0.0,
        "batched_step_ms": 1000 * t_batched / steps,
        "solo_steps_ms": 1000 * t_solo / steps,
        "speedup": t_solo / t_batched,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", type=Path, default=Path("bench/results/batching.json"))
    args = parser.parse_args()
    results = [run(unified, args.sessions, args.steps) for unified in (False, True)]
    print(
        f"{'kv cache':<16}{'max |dlogit|':>14}{'bit-identical':>15}{'batched ms':>12}{'solo ms':>10}{'speedup':>9}"
    )
    for r in results:
        name = "unified" if r["kv_unified"] else "per-sequence"
        print(
            f"{name:<16}{r['max_abs_logit_diff']:>14.4g}{r['bit_identical']!s:>15}"
            f"{r['batched_step_ms']:>12.1f}{r['solo_steps_ms']:>10.1f}{r['speedup']:>8.2f}x"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "sessions": args.sessions,
                "steps": args.steps,
                "machine": platform.platform(),
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
