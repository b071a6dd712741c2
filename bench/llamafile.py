"""sinkd's llama.cpp build against the others of the same llama.cpp, in the same run: what the build
sinkd installs (llamafile's sgemm, patched so that a lone row of floats takes it too:
deploy/llama.cpp/sgemm-float-rows.patch) costs or saves against llamafile as shipped (the fastest
prefill) and against a build without llamafile (sinkd's before).

    python bench/llamafile.py NAME=PYTHON ...   -> bench/results/llamafile.json
    python bench/llamafile.py --prefill-only NAME=PYTHON ... -> bench/results/llamafile_prefill.json
    python bench/llamafile.py --gpu             -> bench/results/llamafile_gpu.json (layers
                                                   offloaded: whether a pass's rows equal alone)

Each PYTHON is an interpreter whose llama-cpp-python (the same version) was built otherwise, e.g.
`stock=/tmp/stock/bin/python` (`CMAKE_ARGS="-DLLAVA_BUILD=OFF" pip install llama-cpp-python==0.3.36
numpy`) and `no-llamafile=...` (`-DGGML_LLAMAFILE=OFF`); this interpreter is sinkd's. Each round
runs the same measurement in a subprocess of each build, the order turned round every round, on
both pinned models: at 1,024 cells a sequence on the plain attention path (flash attention off, as
sinkd runs past 512 cells) and at 256 (flash attention, as it runs below): prefill tokens/s in
128-token chunks (the best of three reads: this machine is shared); one sequence's pass of 1, 2,
3, 5 and 9 rows (a token and its drafts), in ms; eight sequences' pass of one row each; and
whether each row of a 6-row pass equals the same token decoded alone, bit for bit.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import table, write

ROUNDS = int(os.environ.get("SINKD_BENCH_ROUNDS", "3"))

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
prefill = 0.0
for _ in range(3):
    llama.llama_memory_seq_rm(mem, 0, -1, -1)
    start = time.perf_counter()
    for at in range(0, history, 128):
        decode([(0, toks[at:at + 128], at)], False)
    prefill = max(prefill, history / (time.perf_counter() - start))
if len(sys.argv) > 5 and sys.argv[5] == "1":  # prefill alone
    info = llama.llama_print_system_info().decode()
    print(json.dumps({"llamafile": "LLAMAFILE = 1" in info, "prefill_tok_s": prefill}))
    sys.exit(0)
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


MODELS = ("smollm2-135m-instruct", "gemma3-270m")


def model_file(name: str | None = None) -> Path:
    from sinkd.daemon.models.registry import load_lock, locate

    return locate(load_lock().get(name))


def measure(
    python: str,
    cells: int,
    flash: bool,
    gpu_layers: int = 0,
    model: str | None = None,
    prefill_only: bool = False,
) -> dict[str, Any]:
    run = subprocess.run(
        [python, "-c", MEASURE, str(model_file(model)), str(cells), "1" if flash else "0",
         str(gpu_layers), "1" if prefill_only else "0"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def main(others: dict[str, str]) -> None:
    pythons = {"sinkd's build": sys.executable, **others}
    runs = []
    for rnd in range(ROUNDS):
        for model in MODELS:
            for name, python in pythons.items() if rnd % 2 == 0 else reversed(pythons.items()):
                for cells, flash in ((1024, False), (256, True)):
                    r = measure(python, cells, flash, model=model)
                    runs.append({"build": name, "model": model, "round": rnd, "cells": cells,
                                 "flash": flash, **r})  # fmt: skip
                    print(f"{model} {name} {cells} cells: prefill {r['prefill_tok_s']:.0f} tok/s,"
                          f" a row {r['pass_ms']['1']:.1f} ms", flush=True)  # fmt: skip
    rows, summary = [], {}
    for model in MODELS:
        for cells in (1024, 256):

            def med(f: Any, name: str, model: str = model, cells: int = cells) -> float:
                mine = [
                    r for r in runs if (r["build"], r["model"], r["cells"]) == (name, model, cells)
                ]
                return statistics.median(f(r) for r in mine)

            fastest = max(med(lambda r: r["prefill_tok_s"], name) for name in pythons)
            for name in pythons:
                mine = [
                    r for r in runs if (r["build"], r["model"], r["cells"]) == (name, model, cells)
                ]
                prefill = med(lambda r: r["prefill_tok_s"], name)
                one = med(lambda r: r["pass_ms"]["1"], name)
                rows.append([
                    model, cells, f"{name} ({'llamafile' if mine[0]['llamafile'] else 'no llamafile'})",
                    prefill, prefill / fastest, one,
                    *(med(lambda r, k=k: r["pass_ms"][k], name) / one for k in ("2", "3", "5", "9")),
                    med(lambda r: r["eight_sequences_ms"], name),
                    all(all(r["rows_equal"]) for r in mine),
                ])  # fmt: skip
                summary[f"{model} {cells} {name}"] = {
                    "prefill_of_fastest": prefill / fastest,
                    "row_ms": one,
                    "rows_equal": all(all(r["rows_equal"]) for r in mine),
                }
    table(
        f"llama.cpp builds, same run ({ROUNDS} rounds, medians; 2 threads; plain attention at 1,024"
        " cells, flash attention at 256)",
        ["model", "cells", "build", "prefill tok/s", "of the fastest", "1 row ms", "2 rows / 1",
         "3 / 1", "5 / 1", "9 / 1", "8 sequences x 1 row ms", "rows of a pass = alone"],
        rows,
    )  # fmt: skip
    print(f"wrote {write('llamafile', {'rounds': ROUNDS, 'runs': runs, 'summary': summary})}")
    print(json.dumps(summary))


def prefill_only(others: dict[str, str]) -> None:
    """Prefill alone at 1,024 cells (the plain path), more rounds (SINKD_BENCH_ROUNDS, default
    7): the builds' prefill kernels are the same code but for sinkd's lone rows, so what parts
    them is this machine's drift, which rounds wash out."""
    rounds = int(os.environ.get("SINKD_BENCH_ROUNDS", "7"))
    pythons = {"sinkd's build": sys.executable, **others}
    runs = []
    for rnd in range(rounds):
        for model in MODELS:
            for name, python in pythons.items() if rnd % 2 == 0 else reversed(pythons.items()):
                r = measure(python, 1024, False, model=model, prefill_only=True)
                runs.append({"build": name, "model": model, "round": rnd, **r})
                print(f"{model} {name}: prefill {r['prefill_tok_s']:.0f} tok/s", flush=True)
    rows, summary = [], {}
    for model in MODELS:
        med = {
            name: statistics.median(
                r["prefill_tok_s"] for r in runs if (r["build"], r["model"]) == (name, model)
            )
            for name in pythons
        }
        fastest = max(med.values())
        for name in pythons:
            rows.append([model, name, med[name], med[name] / fastest])
            summary[f"{model} {name}"] = med[name] / fastest
    table(
        f"prefill at 1,024 cells, plain path ({rounds} rounds, medians)",
        ["model", "build", "prefill tok/s", "of the fastest"],
        rows,
    )
    print(f"wrote {write('llamafile_prefill', {'rounds': rounds, 'runs': runs})}")
    print(json.dumps(summary))


def gpu() -> None:
    """Layers offloaded (SINKD_GPU_LAYERS, default 99), this build alone: whether a pass's rows
    equal the same tokens decoded alone there (bench/gpu_check.sh). sinkd drafts on a GPU only
    once this holds for its kernels (docs/speculative.md)."""

    layers = int(os.environ.get("SINKD_GPU_LAYERS", "99"))
    r = measure(sys.executable, 1024, False, layers)
    print(json.dumps({"gpu_layers": layers, **r}))
    print(f"wrote {write('llamafile_gpu', r)}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--gpu"]:
        gpu()
    elif sys.argv[1:2] == ["--prefill-only"]:
        prefill_only(dict(a.split("=", 1) for a in sys.argv[2:]))
    elif len(sys.argv) < 2 or not all("=" in a for a in sys.argv[1:]):
        sys.exit(f"usage: {sys.argv[0]} NAME=PYTHON ... | --gpu")
    else:
        main(dict(a.split("=", 1) for a in sys.argv[1:]))
