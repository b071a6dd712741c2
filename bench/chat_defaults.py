"""Chat defaults, measured: replies that loop under the old defaults (greedy, no repetition
penalty) vs the model's recommended sampling (models.lock), on 20 fixed prompts in the same run;
and inter-token latency and KV memory per session by window size (what a chat budget costs).

    python bench/chat_defaults.py     -> bench/results/chat_defaults.json
    SINKD_BENCH_SCALE=2 ...           -> longer replies and latency runs

A reply "loops" when some 8-gram of its tokens occurs at least 3 times (a phrase said over and
over); the 2-times count is printed too.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from common import percentile, start_service, table, write

from sinkd.daemon.runtime.api import (
    ChatRequest,
    GenerationOptions,
    PolicyRequest,
    SamplingRequest,
    TokenEvent,
)
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.evaluation import SAMPLE_TEXT
from sinkd.evaluation.recall_trials import run_parallel

SCALE = float(os.environ.get("SINKD_BENCH_SCALE", "1"))
ME = Principal("local")
PROMPTS = [
    "Hi! How are you today?",
    "Can you help me plan a small business selling handmade candles?",
    "Explain what a hash table is.",
    "Write a short poem about the sea.",
    "What should I cook for dinner tonight?",
    "Give me three tips for learning a new language.",
    "Why is the sky blue?",
    "Tell me a story about a brave little robot.",
    "How do I stay focused when working from home?",
    "What are the benefits of regular exercise?",
    "Summarize the plot of a detective novel you like.",
    "How does a bicycle stay upright?",
    "Write an email asking my landlord to fix the heating.",
    "What is the difference between weather and climate?",
    "Suggest a name for my new cat.",
    "How can I save money on groceries?",
    "Describe a perfect weekend.",
    "What is machine learning, in simple words?",
    "Give me advice for my first job interview.",
    "Tell me about the history of bread.",
]
OLD = SamplingRequest(temperature=0.0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0)


def loops(tokens: list[int], n: int = 8, times: int = 3) -> bool:
    grams = Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return any(c >= times for c in grams.values())


def replies(
    svc: SinkdService, sampling: SamplingRequest | None, max_tokens: int
) -> list[list[int]]:
    """One fresh chat session per prompt, all at once (batched); the reply's token ids."""
    out: list[list[int]] = [[] for _ in PROMPTS]

    def one(i: int) -> None:
        h = svc.create(ME, PolicyRequest("sink", window=1020), sampling).handle
        for ev in svc.chat(ME, h, ChatRequest(PROMPTS[i], GenerationOptions(max_tokens))):
            if isinstance(ev, TokenEvent):
                out[i].append(ev.id)
        svc.close(ME, h)

    run_parallel([functools.partial(one, i) for i in range(len(PROMPTS))], 8)
    return out


def itl_by_window(tmp: Path, shapes: list[tuple[int, int]], tokens: int) -> list[dict[str, Any]]:
    """One session generating past its budget (so evictions and shifts happen), for each (window,
    n_ctx_seq) in a daemon of the default 4 sessions: the window's own cost, and the context's
    (llama.cpp re-rotates every cell of every sequence at each shift)."""
    rows = []
    for w, n_ctx_seq in shapes:
        cells = w + 4
        svc = start_service(tmp / f"w{w}-{n_ctx_seq}", n_ctx_seq=n_ctx_seq, max_sessions=4)
        try:
            text = svc.engine.vocab.tokenize(SAMPLE_TEXT * 40, add_bos=False)
            h = svc.create(ME, PolicyRequest("sink", window=w), None).handle
            for i in range(0, cells, 1024):
                svc.append(ME, h, None, text[i : min(i + 1024, cells)])  # the window full
            lat = [
                ev.latency_ms
                for ev in svc.generate(ME, h, GenerationOptions(tokens))
                if isinstance(ev, TokenEvent) and ev.index > 0
            ]
            rows.append(
                {
                    "window": w,
                    "cells": cells,
                    "n_ctx_seq": n_ctx_seq,
                    "context_cells": svc.engine.n_ctx_seq * 4,
                    "itl_p50_ms": percentile(lat, 50),
                    "itl_p99_ms": percentile(lat, 99),
                    "itl_mean_ms": sum(lat) / len(lat),
                    "kv_mib_per_session": cells * svc.engine.kv_bytes_per_token / 2**20,
                }
            )
        finally:
            svc.stop()
    base = rows[0]["itl_mean_ms"]
    for r in rows:
        r["mean_itl_vs_smallest"] = r["itl_mean_ms"] / base
    return rows


def main() -> None:
    max_tokens = int(200 * SCALE)
    tmp = Path(tempfile.mkdtemp())
    svc = start_service(tmp, n_ctx_seq=1024, max_sessions=8)
    try:
        recommended = svc.entry.sampling
        old = replies(svc, OLD, max_tokens)
        new = replies(svc, None, max_tokens)  # Chat's default: the model's recommended sampling
        loop_rows = []
        for name, got in (("old: greedy, no penalty", old), ("new: models.lock sampling", new)):
            loop_rows.append(
                {
                    "defaults": name,
                    "replies": len(got),
                    "mean_tokens": sum(map(len, got)) / len(got),
                    "looping_3x": sum(loops(r) for r in got) / len(got),
                    "repeated_2x": sum(loops(r, times=2) for r in got) / len(got),
                }
            )
    finally:
        svc.stop()
    shapes = [(252, 256), (252, 512), (252, 1024), (1020, 1024), (2044, 2048)]
    itl = itl_by_window(tmp, shapes, int(160 * SCALE))
    table(
        "Replies that loop (an 8-gram of tokens 3+ times), 20 prompts, same run",
        ["defaults", "replies", "mean tokens", "looping (3x)", "an 8-gram twice"],
        [[r["defaults"], r["replies"], r["mean_tokens"], r["looping_3x"], r["repeated_2x"]]
         for r in loop_rows],
    )  # fmt: skip
    table(
        "Inter-token latency past the budget, by window and cells per sequence (4 sequences)",
        ["window", "n_ctx_seq", "context cells", "ITL p50 ms", "ITL p99 ms", "mean ITL",
         "vs first", "KV MiB/session"],
        [[r["window"], r["n_ctx_seq"], r["context_cells"], r["itl_p50_ms"], r["itl_p99_ms"],
          r["itl_mean_ms"], r["mean_itl_vs_smallest"], r["kv_mib_per_session"]] for r in itl],
    )  # fmt: skip
    path = write(
        "chat_defaults",
        {"recommended": recommended, "max_tokens": max_tokens, "loops": loop_rows, "itl": itl},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
