"""llama.cpp with and without llamafile's sgemm, in the same run: what the build sinkd installs
(`-DGGML_LLAMAFILE=OFF`, so that speculative decoding is exact: docs/determinism.md) costs.

    python bench/llamafile.py OTHER_PYTHON   -> bench/results/llamafile.json
    python bench/llamafile.py --gpu          -> bench/results/llamafile_gpu.json (layers offloaded:
                                                whether a pass's rows equal alone on the GPU)

OTHER_PYTHON is an interpreter whose llama-cpp-python (the same version) was built with llamafile,
e.g. a venv made with `CMAKE_ARGS="-DLLAVA_BUILD=OFF" pip install llama-cpp-python==0.3.36 numpy`.
Each round runs the same measurement in a subprocess of each build, alternating who goes first:
the default model at 1,024 cells a sequence, on the plain attention path (flash attention off, as
sinkd runs past 512 cells) and at 256 (flash attention, as it runs below): prefill tokens/s in
128-token chunks; one sequence's pass of 1, 2, 3, 5 and 9 rows (a token and its drafts), in ms;
eight sequences' pass of one row each; and whether each row of a 6-row pass equals the same token
decoded alone, bit for bit.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import table, write

ROUNDS = 3

MEASURE = r"""
import ctypes, json, sys, time
import llama_cpp as llama
import numpy as np

path, cells, flash = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
llama.llama_backend_init()
mp = llama.llama_model_default_params()
mp.use_extra_bufts = False  # sinkd's weights: unrepacked
mp.n_gpu_layers = int(sys.argv[4]) if len(sys.argv) > 4 else 0
model = llama.llama_model_load_from_file(path.encode(), mp)
vocab = llama.llama_model_get_vocab(model)
n_vocab = llama.llama_vocab_n_tokens(vocab)
cp = llama.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = cells * 8, 256, 256, 8
cp.n_threads = cp.n_threads_batch = 2
cp.kv_unified = False
cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
ctx = llama.llama_init_from_model(model, cp)
mem = llama.llama_get_memory(ctx)
text = b"The quick brown fox jumps over the lazy dog. Logs: " * 400
buf = (llama.llama_token * 8192)()
n = llama.llama_tokenize(vocab, text, len(text), buf, 8192, False, False)
toks = [buf[i] % n_vocab for i in range(n)]
batch = llama.llama_batch_init(256, 0, 1)

def decode(items, all_rows):
    i = 0
    for seq, tokens, pos0 in items:
        for j, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos0 + j, 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = all_rows or j == len(tokens) - 1
            i += 1
    batch.n_tokens = i
    assert llama.llama_decode(ctx, batch) == 0

history = cells - 128
start = time.perf_counter()
for at in range(0, history, 128):
    decode([(0, toks[at:at + 128], at)], False)
prefill = history / (time.perf_counter() - start)
for seq in range(1, 8):
    for at in range(0, 128, 128):
        decode([(seq, toks[at:at + 128], at)], False)
passes = {}
for rows in (1, 2, 3, 5, 9):
    times = []
    for _ in range(9):
        t = time.perf_counter()
        decode([(0, toks[history:history + rows], history)], True)
        times.append(time.perf_counter() - t)
        llama.llama_memory_seq_rm(mem, 0, history, -1)
    passes[rows] = 1000 * sorted(times)[4]
times = []
for _ in range(9):
    t = time.perf_counter()
    decode([(seq, [toks[128]], history if seq == 0 else 128) for seq in range(8)], True)
    times.append(time.perf_counter() - t)
    for seq in range(8):
        llama.llama_memory_seq_rm(mem, seq, history if seq == 0 else 128, -1)
eight = 1000 * sorted(times)[4]

def row(i):
    return np.ctypeslib.as_array(llama.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()

alone = []
for j in range(6):
    decode([(0, [toks[history + j]], history + j)], True)
    alone.append(row(0))
llama.llama_memory_seq_rm(mem, 0, history, -1)
decode([(0, toks[history:history + 6], history)], True)
together = [row(j) for j in range(6)]
equal = [bool(np.array_equal(a, b)) for a, b in zip(alone, together)]
info = llama.llama_print_system_info().decode()
print(json.dumps({"llamafile": "LLAMAFILE = 1" in info, "prefill_tok_s": prefill,
                  "pass_ms": passes, "eight_sequences_ms": eight, "rows_equal": equal}))
"""


def model_file() -> Path:
    from sinkd.daemon.models.registry import load_lock, locate

    return locate(load_lock().get(None))


def measure(python: str, cells: int, flash: bool, gpu_layers: int = 0) -> dict[str, Any]:
    run = subprocess.run(
        [python, "-c", MEASURE, str(model_file()), str(cells), "1" if flash else "0",
         str(gpu_layers)],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def main(other: str) -> None:
    pythons = {"sinkd's build": sys.executable, "other build": other}
    runs = []
    for rnd in range(ROUNDS):
        for name, python in pythons.items() if rnd % 2 == 0 else reversed(pythons.items()):
            for cells, flash in ((1024, False), (256, True)):
                r = measure(python, cells, flash)
                runs.append({"build": name, "round": rnd, "cells": cells, "flash": flash, **r})
                print(f"{name} ({'llamafile' if r['llamafile'] else 'no llamafile'}) {cells} "
                      f"cells: prefill {r['prefill_tok_s']:.0f} tok/s", flush=True)  # fmt: skip
    rows = []
    for name in pythons:
        for cells in (1024, 256):
            mine = [r for r in runs if r["build"] == name and r["cells"] == cells]

            def med(f: Any, mine: list[dict[str, Any]] = mine) -> float:
                return statistics.median(f(r) for r in mine)

            one = med(lambda r: r["pass_ms"]["1"])
            rows.append([
                f"{name} ({'llamafile' if mine[0]['llamafile'] else 'no llamafile'})", cells,
                med(lambda r: r["prefill_tok_s"]), one,
                *(med(lambda r, k=k: r["pass_ms"][k]) / one for k in ("2", "3", "5", "9")),
                med(lambda r: r["eight_sequences_ms"]),
                all(all(r["rows_equal"]) for r in mine),
            ])  # fmt: skip
    table(
        f"llama.cpp with and without llamafile, same run ({ROUNDS} rounds, medians; the default"
        " model, 2 threads; plain attention at 1,024 cells, flash attention at 256)",
        ["build", "cells", "prefill tok/s", "1 row ms", "2 rows / 1", "3 / 1", "5 / 1", "9 / 1",
         "8 sequences x 1 row ms", "rows of a pass = alone"],
        rows,
    )  # fmt: skip
    print(f"wrote {write('llamafile', {'rounds': ROUNDS, 'runs': runs})}")


def gpu() -> None:
    """Layers offloaded (SINKD_GPU_LAYERS, default 99), this build alone: whether a pass's rows
    equal the same tokens decoded alone there (bench/gpu_check.sh). sinkd drafts on a GPU only
    once this holds for its kernels (docs/speculative.md)."""
    import os

    layers = int(os.environ.get("SINKD_GPU_LAYERS", "99"))
    r = measure(sys.executable, 1024, False, layers)
    print(json.dumps({"gpu_layers": layers, **r}))
    print(f"wrote {write('llamafile_gpu', r)}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--gpu"]:
        gpu()
    elif len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OTHER_PYTHON | --gpu")
    else:
        main(sys.argv[1])
