"""What a shift costs as the context grows: llama.cpp re-rotates every cell of every sequence of the
context at each `llama_memory_seq_add` (its shift graph spans the whole cache), so a sink session
ingesting past its budget slows with the context's size, not its own.

    python bench/shift_cost.py        -> bench/results/shift_cost.json

One session appends 2,048 tokens into S=4 W=252 (it evicts and shifts every E tokens) in daemons
whose contexts differ only in sequences x cells per sequence.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from common import start_service, table, write

from sinkd.daemon.runtime.api import PolicyRequest
from sinkd.daemon.runtime.sessions import Principal
from sinkd.evaluation import SAMPLE_TEXT

ME = Principal("local")
SHAPES = [(1, 512, 16), (13, 256, 16), (13, 512, 16), (13, 512, 64)]  # sequences, cells, E


def ingest(tmp: Path, sequences: int, cells: int, evict: int, n: int = 2048) -> dict[str, Any]:
    svc = start_service(tmp, n_ctx_seq=cells, max_sessions=sequences)
    try:
        tokens = svc.engine.vocab.tokenize(SAMPLE_TEXT * 60, add_bos=False)[:n]
        policy = PolicyRequest("sink", sinks=4, window=252, evict_chunk=evict)
        h = svc.create(ME, policy, None).handle
        t0 = time.perf_counter()
        for i in range(0, n, 1024):
            svc.append(ME, h, None, tokens[i : i + 1024])
        seconds = time.perf_counter() - t0
        return {
            "sequences": sequences,
            "cells_per_sequence": svc.engine.n_ctx_seq,
            "context_cells": svc.engine.n_ctx_seq * sequences,
            "evict_chunk": evict,
            "tokens": n,
            "tokens_per_s": n / seconds,
        }
    finally:
        svc.stop()


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    rows = [ingest(tmp / f"{q}-{c}-{e}", q, c, e) for q, c, e in SHAPES]
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["vs_first"] = r["tokens_per_s"] / base
    table(
        "One session ingesting 2,048 tokens past its budget (S=4 W=252), by context size",
        ["sequences", "cells each", "context cells", "E", "tok/s", "vs first"],
        [[r["sequences"], r["cells_per_sequence"], r["context_cells"], r["evict_chunk"],
          r["tokens_per_s"], r["vs_first"]] for r in rows],
    )  # fmt: skip
    print(f"wrote {write('shift_cost', {'rows': rows})}")


if __name__ == "__main__":
    main()
