"""5. Memory: KV bytes per session by formula and as llama.cpp allocated them, resident memory over a
long session (constant), and the sessions admitted for a memory budget.

    python bench/memory.py [--tokens 4096]   -> bench/results/memory.json
"""

from __future__ import annotations

import argparse

from common import table, write

from sinkd.cachepolicy import CacheSequence, PolicyConfig
from sinkd.daemon.engine.llama import EngineConfig
from sinkd.daemon.engine.loading import open_engine
from sinkd.daemon.metrics import rss_bytes
from sinkd.daemon.runtime.loop.residency import admitted_sessions
from sinkd.evaluation import SAMPLE_TEXT as TEXT


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=4096)
    a = p.parse_args()
    rows, per = [], []
    for n_seq in (1, 4, 8):
        with open_engine(None, EngineConfig(n_ctx_seq=256, n_seq_max=n_seq)) as engine:
            formula = 256 * engine.kv_bytes_per_token
            allocated = sum(mib for mib, _ in engine.kv_allocations) * 2**20 / n_seq
            rows.append([n_seq, formula, allocated, allocated / formula])
            per.append(
                {
                    "sessions": n_seq,
                    "formula_bytes": formula,
                    "allocated_bytes_per_session": allocated,
                }
            )
    table(
        "KV bytes per session (256 cells, f16): formula = cells x 30 layers x 3 heads x 64 x 2 x 2",
        ["sessions", "formula", "allocated", "ratio"],
        rows,
    )

    samples = []
    with open_engine(None, EngineConfig(n_ctx_seq=256, n_seq_max=1)) as engine:
        seq = CacheSequence(PolicyConfig.named("sink", sinks=4, window=252, evict_chunk=16))
        ids = engine.vocab.tokenize(TEXT * 40)
        fed = 0
        while fed < a.tokens:
            chunk = ids[fed % 2000 : fed % 2000 + 256]
            engine.feed(0, seq, chunk)
            fed += len(chunk)
            samples.append(
                {
                    "tokens": fed,
                    "rss_bytes": rss_bytes(),
                    "cells": engine.cells.cell_count(0),
                    "retained": seq.retained,
                }
            )
    after_fill = samples[2]["rss_bytes"]
    growth = samples[-1]["rss_bytes"] - after_fill
    table(
        "one session over a long stream",
        ["tokens", "RSS MiB", "cells held"],
        [
            [s["tokens"], s["rss_bytes"] / 2**20, s["cells"]]
            for s in samples[:: max(1, len(samples) // 8)]
        ],
    )
    print(
        f"RSS growth from token {samples[2]['tokens']} to {samples[-1]['tokens']}: {growth / 2**20:.2f} MiB\n"
    )

    budget_rows = []
    for gib in (0.05, 0.25, 1.0):
        admitted = admitted_sessions(256, 256, per[0]["formula_bytes"] / 256, int(gib * 2**30))
        budget_rows.append([f"{gib} GiB", admitted])
    table(
        "sessions admitted for a KV memory budget (256 cells each, 5.6 MiB)",
        ["max_kv_bytes", "sessions"],
        budget_rows,
    )
    write(
        "memory",
        {
            "per_session": per,
            "long_session": samples,
            "rss_growth_bytes": growth,
            "admitted": budget_rows,
        },
    )


if __name__ == "__main__":
    main()
