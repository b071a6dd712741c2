"""llama.cpp's two attention kernels on sinkd's build, raw: flash attention against the plain path.

    python bench/attention.py        -> bench/results/attention.json
    SINKD_BENCH_ROUNDS=5 python bench/attention.py   (3 rounds by default)

llama-cpp-python's low-level API alone (no daemon), each configuration in a child process of its
own (one context at a time), the weights loaded as the engine loads them (unrepacked, tiled off),
2 threads: one sequence decoded a token at a time from position 100 of a 1,024-cell context
(tok/s over positions 100-256, 256-356 and 356-956: the 256-cell sessions' span and a chat's),
and 8 sequences of 256 cells, each prefilled with 200 tokens (flash attention in pieces of 63 rows,
as the engine runs it where exact; the plain path in one piece) then decoded together, a token
each a step, 50 steps. Both pinned models. Who goes first alternates by round. The engine's
choice (`flash_attn = "auto"`, daemon/engine/llama.py's NOTE) rests on this table.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from common import table, write

ROUNDS = int(os.environ.get("SINKD_BENCH_ROUNDS", "3"))
KERNELS = {"flash": 1, "plain": 0}  # llama.cpp's LLAMA_FLASH_ATTN_TYPE_ENABLED / _DISABLED


def measure(model_path: str, flash: int) -> dict[str, float]:
    """One configuration, in this process (the child's job)."""
    import llama_cpp as llama

    llama.llama_backend_init()
    mparams = llama.llama_model_default_params()
    mparams.use_extra_bufts = False  # unrepacked, as the engine loads them
    model = llama.llama_model_load_from_file(model_path.encode(), mparams)
    out: dict[str, float] = {}

    def context(cells: int, seqs: int) -> Any:
        cparams = llama.llama_context_default_params()
        cparams.n_ctx, cparams.n_seq_max, cparams.kv_unified = cells * seqs, seqs, False
        cparams.n_batch = cparams.n_ubatch = 512
        cparams.n_threads = cparams.n_threads_batch = 2
        cparams.flash_attn_type = flash
        return llama.llama_init_from_model(model, cparams)

    batch = llama.llama_batch_init(512, 0, 1)

    def decode(ctx: Any, items: list[tuple[int, list[int], int]]) -> None:
        n = 0
        for seq, tokens, pos in items:
            for i, token in enumerate(tokens):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = token, pos + i, 1
                batch.seq_id[n][0], batch.logits[n] = seq, i == len(tokens) - 1
                n += 1
        batch.n_tokens = n
        if llama.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    ctx = context(1024, 1)
    decode(ctx, [(0, [1 + i for i in range(100)], 0)])
    pos = 100
    for until in (256, 356, 956):
        t0 = time.perf_counter()
        for k in range(until - pos):
            decode(ctx, [(0, [200 + k % 50], pos + k)])
        out[f"decode to {until}"] = (until - pos) / (time.perf_counter() - t0)
        pos = until
    llama.llama_free(ctx)
    ctx = context(256, 8)
    piece = 63 if flash else 512
    t0 = time.perf_counter()
    for seq in range(8):
        tokens = [100 + (i * 7 + seq) % 3000 for i in range(200)]
        for at in range(0, 200, piece):
            decode(ctx, [(seq, tokens[at : at + piece], at)])
    out["prefill, 8 x 200"] = 1600 / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for k in range(50):
        decode(ctx, [(seq, [300 + k + seq], 200 + k) for seq in range(8)])
    out["8 sequences decoding"] = 400 / (time.perf_counter() - t0)
    llama.llama_free(ctx)
    return out


def main() -> None:
    from sinkd.daemon.models.registry import load_lock, model_path

    env = {**os.environ, "GGML_CPU_TILED_MM": "0"}  # the tiled kernel off, as the engine has it
    models = {name: str(model_path(entry)) for name, entry in load_lock().models.items()}
    runs: list[dict[str, Any]] = []
    for rnd in range(ROUNDS):
        order = list(KERNELS.items()) if rnd % 2 == 0 else list(KERNELS.items())[::-1]
        for name, path in models.items():
            for kernel, flash in order:
                child = subprocess.run(
                    [sys.executable, __file__, "--child", path, str(flash)],
                    env=env, capture_output=True, text=True, check=True,
                )  # fmt: skip
                result = json.loads(child.stdout.strip().splitlines()[-1])
                runs.append({"round": rnd, "model": name, "kernel": kernel, **result})
                print(json.dumps(runs[-1]), flush=True)
    fields = [k for k in runs[0] if k not in ("round", "model", "kernel")]
    rows = []
    for name in models:
        med = {
            kernel: {
                f: statistics.median(
                    r[f] for r in runs if r["model"] == name and r["kernel"] == kernel
                )
                for f in fields
            }
            for kernel in KERNELS
        }
        rows.append([name, "flash", *(round(med["flash"][f], 1) for f in fields)])
        rows.append([name, "plain", *(round(med["plain"][f], 1) for f in fields)])
        rows.append(
            [name, "plain / flash", *(round(med["plain"][f] / med["flash"][f], 2) for f in fields)]
        )
    table(
        f"tok/s, medians of {ROUNDS} rounds (2 threads; llama.cpp as sinkd builds and loads it)",
        ["model", "kernel", *fields],
        rows,
    )
    print(f"wrote {write('attention', {'runs': runs})}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(measure(sys.argv[2], int(sys.argv[3]))))
    else:
        main()
