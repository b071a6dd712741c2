"""What a row's bits depend on, on the backend this llama.cpp runs (the CPU, or every layer
offloaded to a GPU: Vulkan, CUDA, Metal), through sinkd's engine: the facts every exactness claim
of docs/determinism.md rests on, measured at sizes a software GPU (Mesa's lavapipe, ~3 tokens/s)
allows.

    python bench/backend_rows.py [--gpu-layers N] [--model NAME]
        -> bench/results/backend_rows_<backend>.json

Each probe compares a row's logits, bit for bit, decoded one way and another from the same cells:
- company: a sequence's lone token beside 1, 3 and 7 other sequences' lone tokens (one pass), and a
  16-token chunk beside another sequence's 16-token chunk (batched against alone);
- own rows: a token and its 4 drafts in one pass, each row against the token decoded alone
  (speculative decoding's premise);
- cuts: a 32-token chunk whole against cut 1+31, 2+30, 8+24, 9+23, 16+16, 31+1 (its last row and
  the next token's): a prefix restored mid-read, a replay cut otherwise;
- state: the cells saved and restored (a snapshot, a park), then the next token;
- shift: an eviction and a position shift (`llama_memory_seq_add`) applied twice from the same
  cells: the same next-token row both times;
- the greedy ids of 24 steps against the CPU's (another backend computes other bits: how soon
  they part, for the record).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np
from common import machine, table, write

CELLS = 256
HISTORY = 120


def probe(gpu_layers: int, model: str | None) -> dict[str, Any]:
    from sinkd.cachepolicy import CacheSequence, PolicyConfig
    from sinkd.daemon.engine.decoding import BatchItem
    from sinkd.daemon.engine.llama import EngineConfig
    from sinkd.daemon.engine.loading import open_engine

    os.environ.setdefault("SINKD_ALLOW_UNCHECKED", "1")
    config = EngineConfig(
        n_ctx_seq=CELLS, n_seq_max=8, n_batch=256, n_gpu_layers=gpu_layers, flash_attn="auto"
    )
    t0 = time.monotonic()
    engine = open_engine(model, config)
    text = "The quick brown fox jumps over the lazy dog. Logs: disk /dev/sda1 at 91%. " * 20
    toks = engine.vocab.tokenize(text)
    for s in range(8):  # a history per sequence
        engine.decode_batch([BatchItem(s, toks[s : s + (HISTORY if s == 0 else 40)], 0)])
    saved = [engine.cells.save_seq(s) for s in range(8)]
    loaded_s = time.monotonic() - t0

    def restore() -> None:
        for s in range(8):
            engine.cells.restore_seq(s, saved[s])

    def row(items: list[BatchItem]) -> np.ndarray:
        restore()
        r = engine.decode_batch(items)[0]
        assert r is not None
        return r.copy()

    nxt = toks[HISTORY : HISTORY + 40]
    results: dict[str, bool] = {}
    alone = row([BatchItem(0, [nxt[0]], HISTORY)])
    chunk_alone = row([BatchItem(0, nxt[:16], HISTORY)])
    solo = engine.decoder.solo
    for passes in (False, True):  # llama.cpp's own batching, then sinkd's (solo where needed)
        engine.decoder.solo = passes and solo
        how = " (sinkd's passes)" if passes else ""
        if passes and not solo:
            continue  # the same passes as llama.cpp's here
        for k in (1, 3, 7):
            others = [BatchItem(s, [toks[100 + s]], 40) for s in range(1, k + 1)]
            results[f"a lone token beside {k} others{how}"] = np.array_equal(
                row([BatchItem(0, [nxt[0]], HISTORY), *others]), alone
            )
        results[f"a 16-token chunk beside another's{how}"] = np.array_equal(
            row([BatchItem(0, nxt[:16], HISTORY), BatchItem(1, toks[200:216], 40)]), chunk_alone
        )
    engine.decoder.solo = solo
    restore()
    one_at_a_time = []
    for j, t in enumerate(nxt[:5]):
        r = engine.decode_batch([BatchItem(0, [t], HISTORY + j)])[0]
        assert r is not None
        one_at_a_time.append(r.copy())
    restore()
    rows = engine.decode_rows([BatchItem(0, nxt[:5], HISTORY)])[0]
    same = [np.array_equal(a, r.logits) for a, r in zip(one_at_a_time, rows, strict=True)]
    results["a token and 4 drafts in one pass, each row as alone"] = all(same)

    def cut(sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
        restore()
        pos, last = HISTORY, None
        for n in sizes:
            last = engine.decode_batch([BatchItem(0, nxt[pos - HISTORY :][:n], pos)])[0]
            pos += n
        after = engine.decode_batch([BatchItem(0, [nxt[pos - HISTORY]], pos)])[0]
        assert last is not None and after is not None
        return last.copy(), after.copy()

    whole = cut([32])
    for sizes in (
        [1, 31],
        [2, 30],
        [8, 24],
        [24, 8],
        [9, 23],
        [12, 20],
        [23, 9],
        [9, 9, 14],
        [16, 16],
        [31, 1],
    ):
        got = cut(sizes)
        results[f"a 32-token chunk cut {'+'.join(map(str, sizes))}"] = all(
            np.array_equal(g, w) for g, w in zip(got, whole, strict=True)
        )
    restore()
    state = engine.cells.save_seq(0)
    engine.cells.clear(0)
    engine.cells.restore_seq(0, state)
    r = engine.decode_batch([BatchItem(0, [nxt[0]], HISTORY)])[0]
    results["cells saved and restored, then the next token"] = r is not None and np.array_equal(
        r, alone
    )

    def shifted() -> np.ndarray:
        """80 tokens through a sink policy of 4 + 40 cells, 16 at a time: evictions and shifts."""
        engine.cells.clear(7)
        seq = CacheSequence(PolicyConfig.named("sink", sinks=4, window=40, evict_chunk=8))
        out = None
        for at in range(0, 80, 16):
            out = engine.feed(7, seq, toks[300 + at : 316 + at], outputs="last")
        assert out is not None and seq.trace, "the policy evicted"
        return out.copy()

    results["an eviction and shift, done twice from the same cells"] = np.array_equal(
        shifted(), shifted()
    )
    restore()
    greedy, token = [], nxt[0]
    for j in range(24):
        r = engine.decode_batch([BatchItem(0, [token], HISTORY + j)])[0]
        assert r is not None
        token = int(np.argmax(r))
        greedy.append(token)
    engine.close()
    return {
        "backend": engine.backend,
        "solo_passes": engine.solo_passes,
        "min_piece": engine.min_piece,
        "load_and_history_s": round(loaded_s, 1),
        "holds": results,
        "greedy": [int(t) for t in greedy],
        "probe_s": round(time.monotonic() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    r = probe(args.gpu_layers, args.model)
    table(
        f"what a row's bits depend on: {r['backend']}",
        ["equal bit for bit", "holds"],
        [[k, "yes" if v else "NO"] for k, v in r["holds"].items()],
    )
    print(f"greedy ids: {r['greedy']}")
    print(
        f"sinkd's passes: one sequence each: {r['solo_passes']}; pieces alike from {r['min_piece']} rows"
    )
    kind = "cpu" if r["backend"] == "cpu" else r["backend"].split()[0].rstrip("0123456789").lower()
    print(f"wrote {write(f'backend_rows_{kind}', {'machine': machine(), **r})}")
    sys.exit(0)


if __name__ == "__main__":
    main()
