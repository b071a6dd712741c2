"""Ingestion past the budget: a long append into a default sink session against llama.cpp's raw
prompt processing, by ingest chunk, with what each chunk costs in perplexity; and what a decoding
session sees while another session appends.

    python bench/ingest.py                 -> bench/results/ingest.json
    SINKD_BENCH_SCALE=2 python bench/ingest.py   (longer appends and perplexity runs)
    SINKD_INGEST_ROUNDS=5 python bench/ingest.py (more rounds; 3 by default)

Past its budget a session used to decode E tokens per sub-batch (evict E, decode E): small batches
and one shift each. With an ingest chunk the policy makes the same evictions ahead and decodes up to
that many tokens at once; the first tokens of each sub-batch then see a window shorter by up to the
chunk, which the perplexity column prices (S=4 W=252 E=16, the KJV text as bench/texts.sh fetches
it, or sinkd's sample text where it is missing).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import ROOT, in_child, percentile, session_default_k, table, write

from sinkd.cachepolicy import PolicyConfig
from sinkd.daemon.config import Settings
from sinkd.daemon.engine.decoding import BatchItem
from sinkd.daemon.engine.llama import EngineConfig
from sinkd.daemon.engine.loading import open_engine
from sinkd.daemon.runtime.api import GenerationOptions, PolicyRequest, TokenEvent
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.evaluation import SAMPLE_TEXT
from sinkd.evaluation.ppl import score_policy

SCALE = float(os.environ.get("SINKD_BENCH_SCALE", "1"))
N_APPEND = int(5000 * SCALE)
N_PPL = int(4096 * SCALE)
CHUNKS = [0, 64, 128]  # 0: E at a time (16)
ROUNDS = int(os.environ.get("SINKD_INGEST_ROUNDS", "3"))
ME = Principal("local")


def text() -> str:
    kjv = ROOT / "bench" / "texts" / "kjv.txt"
    return kjv.read_text()[:2_000_000] if kjv.exists() else SAMPLE_TEXT * 400


def raw_prompt_processing(
    tokens: list[int], batch: int, repeats: int = 4, flash: bool = False
) -> float:
    """llama.cpp's prompt processing alone: `batch` tokens per llama_decode into an empty
    sequence, as llama-bench's pp test does; tokens/s over `repeats` decodes. Without flash
    attention (the plain kernel); `flash`: llama.cpp's default, in one 512-row piece (the daemon's
    256-cell session runs it in pieces of 63 rows, the engine's NOTE)."""
    config = EngineConfig(
        n_ctx_seq=512, n_seq_max=1, n_batch=512, flash_attn="on" if flash else "off"
    )
    engine = open_engine(None, config)
    try:
        engine.decode_batch([BatchItem(0, tokens[:batch], 0, logits=False)])  # warm
        seconds = 0.0
        for r in range(repeats):
            engine.cells.clear(0)
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
    h = svc.create(ME, PolicyRequest("sink", ingest_chunk=ingest), None).handle
    svc.append(ME, h, None, tokens[:256])  # the budget is full from here on
    t0 = time.perf_counter()
    receipt = svc.append(ME, h, None, tokens[256 : 256 + N_APPEND]).receipt
    seconds = time.perf_counter() - t0
    svc.close(ME, h)
    return {"ingest_chunk": ingest, "tokens": N_APPEND, "tokens_per_s": N_APPEND / seconds,
            "evictions": receipt.evictions, "shifts": receipt.shifts}  # fmt: skip


def decoding_beside(svc: SinkdService, tokens: list[int], ingest: int | None) -> dict[str, Any]:
    """A session generating 24 tokens alone, or while another appends N_APPEND tokens."""
    h = svc.create(ME, PolicyRequest("sink"), None).handle
    svc.append(ME, h, None, tokens[:40])
    other = None
    if ingest is not None:
        other = svc.create(ME, PolicyRequest("sink", ingest_chunk=ingest), None).handle
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
    for p in svc.generate(ME, h, GenerationOptions(24)):
        if isinstance(p, TokenEvent):
            if p.index == 0:
                ttft = 1000 * (time.perf_counter() - t0)
            else:
                lat.append(p.latency_ms)
    if other is not None:
        bg.join()
        svc.close(ME, other)
    svc.close(ME, h)
    return {"beside": "alone" if ingest is None else f"append, ingest {ingest}", "ttft_ms": ttft,
            "itl_p50_ms": percentile(lat, 50), "itl_p99_ms": percentile(lat, 99)}  # fmt: skip


def perplexities(tokens: list[int]) -> list[float]:
    """Each ingest chunk's perplexity, fed in pieces of that chunk (the daemon's prefill
    sub-batches past the budget), 64 for E at a time, with the K a daemon session gets when it
    leaves K unset (`evictions_per_shift` x E, at most W)."""
    out = []
    with open_engine(None, EngineConfig(n_ctx_seq=256, n_seq_max=1, n_batch=256)) as engine:
        for c in CHUNKS:
            policy = session_default_k(
                PolicyConfig.named("sink", sinks=4, window=252, evict_chunk=16, ingest_chunk=c)
            )
            out.append(score_policy(engine, tokens[:N_PPL], policy, chunk=max(c, 64)).perplexity)
    return out


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    body = text()
    svc = daemon(tmp)
    tokens = svc.engine.vocab.tokenize(body[:400_000], add_bos=False)
    svc.stop()
    # each append between two raw pp512 runs, its ratio to their mean, the median over rounds:
    # this machine's speed drifts by 10-20% within minutes
    runs: dict[int, list[dict[str, Any]]] = {c: [] for c in CHUNKS}
    raws: list[float] = []
    raws_flash: list[float] = []
    for rnd in range(ROUNDS):
        for c in CHUNKS:
            before = in_child(raw_prompt_processing, tokens, 512, 2)
            before_flash = in_child(raw_prompt_processing, tokens, 512, 2, True)
            svc = daemon(tmp / f"r{rnd}-{c}")
            try:
                r = append_rate(svc, tokens, c)
            finally:
                svc.stop()
            after_flash = in_child(raw_prompt_processing, tokens, 512, 2, True)
            after = in_child(raw_prompt_processing, tokens, 512, 2)
            r["raw_pp512_tok_s"] = (before + after) / 2
            r["vs_raw_pp512"] = r["tokens_per_s"] / r["raw_pp512_tok_s"]
            r["raw_pp512_flash_tok_s"] = (before_flash + after_flash) / 2
            r["vs_raw_pp512_flash"] = r["tokens_per_s"] / r["raw_pp512_flash_tok_s"]
            runs[c].append(r)
            raws += [before, after]
            raws_flash += [before_flash, after_flash]
    rows = []
    for c in CHUNKS:
        mine = sorted(runs[c], key=lambda r: r["vs_raw_pp512"])
        rows.append({**mine[len(mine) // 2], "ratios": [r["vs_raw_pp512"] for r in runs[c]],
                     "vs_raw_pp512_flash_median": statistics.median(
                         r["vs_raw_pp512_flash"] for r in runs[c])})  # fmt: skip
    raw = {512: statistics.median(raws), 64: in_child(raw_prompt_processing, tokens, 64),
           "512_flash": statistics.median(raws_flash)}  # fmt: skip
    svc = daemon(tmp / "beside")
    try:
        defaults = svc.settings.default_ingest_chunk
        beside = [decoding_beside(svc, tokens, None), decoding_beside(svc, tokens, defaults)]
        prefill = svc.settings.prefill_chunk
    finally:
        svc.stop()
    for r, ppl in zip(rows, perplexities(tokens), strict=True):
        r["perplexity"] = ppl
    base = rows[0]["perplexity"]
    for r in rows:
        r["ppl_vs_e_at_a_time"] = r["perplexity"] / base
    table(
        f"appending {N_APPEND:,} tokens past the budget of a sink session (S=4 W=252 E=16, daemon"
        f" defaults: prefill chunk {prefill}, ingest chunk {defaults}); each append between two raw"
        f" pp512 runs, the median of {ROUNDS} rounds; raw pp512 median {raw[512]:.1f} tok/s"
        f" (with flash attention, llama.cpp's default: {raw['512_flash']:.1f}), pp64 {raw[64]:.1f}",
        ["ingest chunk", "tok/s (median round)", "vs raw pp512 (median)", "each round",
         "vs raw pp512 with flash", "evictions", "shifts", f"ppl ({N_PPL:,} tokens)",
         "ppl vs E at a time"],
        [[r["ingest_chunk"] or "0 (E)", r["tokens_per_s"], r["vs_raw_pp512"],
          " ".join(f"{x:.2f}" for x in r["ratios"]), r["vs_raw_pp512_flash_median"],
          r["evictions"], r["shifts"], r["perplexity"], r["ppl_vs_e_at_a_time"]] for r in rows],
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
    if os.environ.get("SINKD_INGEST_ONLY") == "ppl":  # the perplexity column alone
        with open_engine(None, EngineConfig(n_ctx_seq=256, n_seq_max=1)) as e:
            ids = e.vocab.tokenize(text()[:400_000], add_bos=False)
        ppl = dict(zip(CHUNKS, perplexities(ids), strict=True))
        table(f"perplexity by ingest chunk ({N_PPL:,} tokens)", ["ingest chunk", "perplexity"],
              [[c, p] for c, p in ppl.items()])  # fmt: skip
        print(f"wrote {write('ingest_ppl', {'tokens': N_PPL, 'perplexity': ppl})}")
    else:
        main()
