"""Ingestion past the budget: a long append into a default sink session against llama.cpp's raw
prompt processing, by ingest chunk, with what each chunk costs in perplexity; and what a decoding
session sees while another session appends.

    python bench/ingest.py                 -> bench/results/ingest.json
    SINKD_BENCH_SCALE=2 python bench/ingest.py   (longer appends and perplexity runs)

Past its budget a session used to decode E tokens per sub-batch (evict E, decode E): small batches
and one shift each. With an ingest chunk the policy makes the same evictions ahead and decodes up to
that many tokens at once; the first tokens of each sub-batch then see a window shorter by up to the
chunk, which the perplexity column prices (S=4 W=252 E=16, the KJV text as bench/texts.sh fetches
it, or sinkd's sample text where it is missing).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import ROOT, percentile, table, write

from sinkd.cachepolicy import PolicyConfig
from sinkd.daemon.config import Settings
from sinkd.daemon.engine.llama import BatchItem, EngineConfig
from sinkd.daemon.engine.loading import open_engine
from sinkd.daemon.runtime.requests import PolicyRequest
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.evaluation import SAMPLE_TEXT
from sinkd.evaluation.ppl import score_policy

SCALE = float(os.environ.get("SINKD_BENCH_SCALE", "1"))
N_APPEND = int(5000 * SCALE)
N_PPL = int(4096 * SCALE)
CHUNKS = [0, 64, 128]  # 0: E at a time (16)
ME = Principal("local")


def text() -> str:
    kjv = ROOT / "bench" / "texts" / "kjv.txt"
    return kjv.read_text()[:2_000_000] if kjv.exists() else SAMPLE_TEXT * 400


def raw_prompt_processing(tokens: list[int], batch: int, repeats: int = 4) -> float:
    """llama.cpp's prompt processing alone: `batch` tokens per llama_decode into an empty
    sequence, as llama-bench's pp test does; tokens/s over `repeats` decodes."""
    engine = open_engine(None, EngineConfig(n_ctx_seq=512, n_seq_max=1, n_batch=512))
    try:
        engine.decode_batch([BatchItem(0, tokens[:batch], 0, logits=False)])  # warm
        seconds = 0.0
        for r in range(repeats):
            engine.clear(0)
            t0 = time.perf_counter()
            for start in range(0, 512, batch):
                chunk = tokens[r * 512 + start : r * 512 + start + batch]
                engine.decode_batch([BatchItem(0, chunk, start, logits=start + batch >= 512)])
            seconds += time.perf_counter() - t0
        return 512 * repeats / seconds
    finally:
        engine.close()


def daemon(tmp: Path) -> SinkdService:
    """A daemon with the defaults `sinkd serve` has (1,024 cells, 4 sessions, durable)."""
    svc = SinkdService(Settings(socket=tmp / "sinkd.sock", state_dir=tmp / "state"))
    svc.start()
    svc.wait_ready(120)
    return svc


def append_rate(svc: SinkdService, tokens: list[int], ingest: int) -> dict[str, Any]:
    s = svc.create(ME, PolicyRequest("sink", ingest_chunk=ingest), None)
    h = (s.id, s.generation)
    svc.append(ME, h, None, tokens[:256])  # the budget is full from here on
    t0 = time.perf_counter()
    _, receipt = svc.append(ME, h, None, tokens[256 : 256 + N_APPEND])
    seconds = time.perf_counter() - t0
    svc.close(ME, h)
    return {"ingest_chunk": ingest, "tokens": N_APPEND, "tokens_per_s": N_APPEND / seconds,
            "evictions": receipt["evictions"], "shifts": receipt["shifts"]}  # fmt: skip


def decoding_beside(svc: SinkdService, tokens: list[int], ingest: int | None) -> dict[str, Any]:
    """A session generating 24 tokens alone, or while another appends N_APPEND tokens."""
    s = svc.create(ME, PolicyRequest("sink"), None)
    h = (s.id, s.generation)
    svc.append(ME, h, None, tokens[:40])
    other = None
    if ingest is not None:
        o = svc.create(ME, PolicyRequest("sink", ingest_chunk=ingest), None)
        other = (o.id, o.generation)
        svc.append(ME, other, None, tokens[:256])
        started = threading.Event()
        bg = threading.Thread(
            target=lambda: (
                started.set(),
                svc.append(ME, other, None, tokens[256 : 256 + N_APPEND]),
            )
        )
        bg.start()
        started.wait()
        time.sleep(1.0)  # the append is under way (its length dwarfs this wait)
    t0 = time.perf_counter()
    ttft, lat = 0.0, []
    for kind, p in svc.generate(ME, h, 24, [], None):
        if kind == "token":
            if p["index"] == 0:
                ttft = 1000 * (time.perf_counter() - t0)
            else:
                lat.append(p["latency_ms"])
    if other is not None:
        bg.join()
        svc.close(ME, other)
    svc.close(ME, h)
    return {"beside": "alone" if ingest is None else f"append, ingest {ingest}", "ttft_ms": ttft,
            "itl_p50_ms": percentile(lat, 50), "itl_p99_ms": percentile(lat, 99)}  # fmt: skip


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    body = text()
    svc = daemon(tmp)
    tokens = svc.engine.tokenize(body[:400_000], add_bos=False)
    svc.stop()
    before = {b: raw_prompt_processing(tokens, b) for b in (512, 64)}
    svc = daemon(tmp / "again")
    try:
        rows = [append_rate(svc, tokens, c) for c in CHUNKS]
        defaults = svc.settings.default_ingest_chunk
        beside = [decoding_beside(svc, tokens, None), decoding_beside(svc, tokens, defaults)]
        prefill = svc.settings.prefill_chunk
    finally:
        svc.stop()
    after = {b: raw_prompt_processing(tokens, b) for b in (512, 64)}
    raw = {b: (before[b] + after[b]) / 2 for b in before}  # the machine's speed drifts
    with open_engine(None, EngineConfig(n_ctx_seq=256, n_seq_max=1, n_batch=256)) as engine:
        for r in rows:
            policy = PolicyConfig.named(
                "sink", sinks=4, window=252, evict_chunk=16, ingest_chunk=r["ingest_chunk"]
            )
            r["perplexity"] = score_policy(engine, tokens[:N_PPL], policy).perplexity
    base = rows[0]["perplexity"]
    for r in rows:
        r["vs_raw_pp512"] = r["tokens_per_s"] / raw[512]
        r["ppl_vs_e_at_a_time"] = r["perplexity"] / base
    table(
        f"appending {N_APPEND:,} tokens past the budget of a sink session (S=4 W=252 E=16, daemon"
        f" defaults: prefill chunk {prefill}, ingest chunk {defaults}); raw pp (mean of before and after): {raw[512]:.1f} tok/s at batch 512,"
        f" {raw[64]:.1f} at 64",
        ["ingest chunk", "tok/s", "vs raw pp512", "evictions", "shifts",
         f"ppl ({N_PPL:,} tokens)", "ppl vs E at a time"],
        [[r["ingest_chunk"] or "0 (E)", r["tokens_per_s"], r["vs_raw_pp512"], r["evictions"],
          r["shifts"], r["perplexity"], r["ppl_vs_e_at_a_time"]] for r in rows],
    )  # fmt: skip
    table(
        "a session generating 24 tokens, alone or while another appends",
        ["beside", "TTFT ms", "ITL p50 ms", "ITL p99 ms"],
        [[b["beside"], b["ttft_ms"], b["itl_p50_ms"], b["itl_p99_ms"]] for b in beside],
    )
    out = write("ingest", {"raw_pp_tok_s": raw, "default_ingest_chunk": defaults,
                           "prefill_chunk": prefill,
                           "appends": rows, "decoding_beside_an_append": beside})  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
