"""What recall costs: retrieval latency with 100k and 1M tokens stored, bytes stored per 1,000
evicted tokens, decode speed with recall idle vs off and the time a chat turn's recall adds (same
run, alternating), and perplexity by stream position with and without recalls in the stream.

    python bench/recall_cost.py            # SINKD_BENCH_SCALE=2 doubles the decode and ppl runs
    SINKD_COST_PARTS=decode,ttft,ppl python bench/recall_cost.py   # the parts named; the rest kept

Writes bench/results/recall/cost.json; prints the tables.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, ROOT, daemon_settings, in_child, machine, table

OUT = RESULTS / "recall"
SCALE = float(os.environ.get("SINKD_BENCH_SCALE", "1"))
KJV = ROOT / "bench" / "texts" / "kjv.txt"
JARGON = ROOT / "bench" / "texts" / "jargon.txt"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def retrieval_with_engine(tmp: Path) -> list[dict[str, Any]]:
    from sinkd.daemon.engine.llama import EngineConfig
    from sinkd.daemon.engine.loading import open_engine

    with open_engine(None, EngineConfig(n_ctx_seq=64, n_seq_max=1)) as engine:
        return retrieval(engine, tmp)


def retrieval(engine: Any, tmp: Path) -> list[dict[str, Any]]:
    """Fill a store the way the daemon does (16 evicted tokens at a time, a commit every 256, in
    the journal's database) and time the searches a Recall makes."""
    from sinkd.daemon.store.journal import Journal
    from sinkd.daemon.store.memory import MemoryStore, SessionKey

    text = KJV.read_text()
    tokens = engine.vocab.tokenize(text, add_bos=False)
    words = text.split()
    rng = random.Random(0)
    out = []
    for target in (100_000, 1_000_000):
        toks = (tokens * (target // len(tokens) + 1))[:target]
        journal = Journal(tmp / f"j{target}.db", "normal")
        store = MemoryStore(journal.db)
        t0 = time.perf_counter()
        for i in range(0, len(toks), 16):
            store.add_evicted(
                SessionKey("s", 0), i, toks[i : i + 16], [False] * 16, engine.vocab.piece
            )
            if i % 256 == 0:
                journal.commit()
        journal.commit()
        fill_s = time.perf_counter() - t0
        n, stored, size = store.stats(SessionKey("s", 0))
        latencies = []
        for _ in range(300):
            k = rng.randrange(len(words) - 8)
            query = " ".join(words[k : k + 6])
            t1 = time.perf_counter()
            found = store.search(SessionKey("s", 0), query, 16)
            store.passages(SessionKey("s", 0), [c.passage_id for c in found])
            latencies.append(time.perf_counter() - t1)
        journal.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        file_bytes = (tmp / f"j{target}.db").stat().st_size
        out.append(
            {
                "tokens_stored": stored,
                "passages": n,
                "search_p50_ms": 1000 * statistics.median(latencies),
                "search_p99_ms": 1000 * pct(latencies, 0.99),
                "store_us_per_evicted_token": 1e6 * fill_s / len(toks),
                "row_bytes_per_1k_tokens": 1000 * size / stored,
                "file_bytes_per_1k_tokens": 1000 * file_bytes / stored,
            }
        )
        journal.close()
    return out


def service(tmp: Path, **kw: Any) -> Any:
    from sinkd.daemon.runtime.service import SinkdService

    s = SinkdService(
        daemon_settings(tmp, durable=False, n_ctx_seq=512, step_tokens=256, prefill_chunk=256, **kw)
    )
    s.start()
    s.wait_ready(120)
    return s


def decode_speed(tmp: Path) -> dict[str, Any]:
    """Decode tok/s, one session at a time, recall idle (memory kept, nothing recalled) vs off,
    alternating rounds in one process; the window is full, so every 16 tokens evict."""
    from sinkd.daemon.runtime.api import (
        GenerateRequest,
        PolicyRequest,
        RecallRequest,
        SamplingRequest,
        TokenEvent,
    )
    from sinkd.daemon.runtime.sessions import Principal

    p = Principal("local")
    svc = service(tmp / "decode")
    text = KJV.read_text()[300_000:303_000]
    speeds: dict[str, list[float]] = {"off": [], "manual": []}
    n = int(384 * SCALE)
    try:
        for _ in range(3):
            for mode in ("off", "manual"):
                s = svc.create(p, PolicyRequest("sink"), None, recall=RecallRequest(mode=mode))
                h = s.handle
                svc.append(p, h, text, None)
                t0 = time.perf_counter()
                sampled = GenerateRequest(n, sampling=SamplingRequest(temperature=0.8, seed=7))
                got = sum(1 for e in svc.generate(p, h, sampled) if isinstance(e, TokenEvent))
                speeds[mode].append(got / (time.perf_counter() - t0))
                svc.close(p, h)
    finally:
        svc.stop()
    off, idle = statistics.median(speeds["off"]), statistics.median(speeds["manual"])
    return {
        "tokens_per_round": n,
        "off_tok_s": off,
        "idle_tok_s": idle,
        "idle_vs_off": idle / off,
        "rounds": speeds,
    }


def chat_ttft(tmp: Path) -> dict[str, Any]:
    """Time to first token of chat turns, recall auto vs off, the same script in both."""
    from sinkd.daemon.runtime.api import (
        ChatRequest,
        Done,
        PolicyRequest,
        RecallRequest,
        SamplingRequest,
        TokenEvent,
    )
    from sinkd.daemon.runtime.sessions import Principal

    p = Principal("local")
    svc = service(tmp / "ttft")
    filler = KJV.read_text()[500_000:503_000]
    turns = [
        "My name is Ada and I keep bees in Lisbon.",
        "What do bees eat in winter?",
        "How many eggs does a queen lay?",
        "Remind me, where do I keep my bees?",
        "What is my name?",
        "How do I harvest honey safely?",
    ]
    out: dict[str, Any] = {}
    try:
        for mode in ("off", "auto"):
            h = svc.create(p, PolicyRequest("sink"), None, recall=RecallRequest(mode=mode)).handle
            ttft, recalled = [], []
            for i, msg in enumerate(turns):
                if i:
                    svc.append(p, h, filler[i * 400 : i * 400 + 400], None)
                t0 = time.perf_counter()
                first = None
                done: Done | None = None
                turn = ChatRequest(msg, 16, sampling=SamplingRequest(temperature=0.0))
                for e in svc.chat(p, h, turn):
                    if isinstance(e, TokenEvent) and first is None:
                        first = time.perf_counter() - t0
                    if isinstance(e, Done):
                        done = e
                if i:  # the first turn has nothing evicted yet
                    ttft.append(first or 0.0)
                    rec = done.recall.recalled if done is not None and done.recall else ()
                    recalled.append(sum(r.stream[1] - r.stream[0] for r in rec))
            out[mode] = {
                "ttft_ms": [1000 * t for t in ttft],
                "mean_ttft_ms": 1000 * statistics.mean(ttft),
                "mean_recalled_tokens": statistics.mean(recalled) if recalled else 0,
            }
            svc.close(p, h)
    finally:
        svc.stop()
    out["added_ms_per_turn"] = out["auto"]["mean_ttft_ms"] - out["off"]["mean_ttft_ms"]
    return out


FRAMES = {  # how recalled text sits in a plain stream: bare (the Recall RPC's default), or marked
    "bare": ("", "\n"),
    "marked": ("\n(recalled from earlier) ", "\n(end of recalled text)\n"),
}


def perplexity() -> list[dict[str, Any]]:
    from sinkd.cachepolicy import PolicyConfig
    from sinkd.cachepolicy.recall import RecallConfig
    from sinkd.daemon.engine.llama import EngineConfig
    from sinkd.daemon.engine.loading import open_engine
    from sinkd.evaluation.ppl import buckets, score_policy, score_recall

    n = int(3072 * SCALE)
    policy = PolicyConfig.named("sink", sinks=4, window=252, evict_chunk=16)
    recall = RecallConfig(budget=96, passages=2, threshold=1.0)
    out = []
    with open_engine(None, EngineConfig(n_ctx_seq=256, n_seq_max=1)) as engine:
        for name, path, start in (("kjv", KJV, 200_000), ("jargon", JARGON, 100_000)):
            tokens = engine.vocab.tokenize(path.read_text()[start : start + n * 6], add_bos=False)[
                :n
            ]
            off = score_policy(engine, tokens, policy)
            for frame_name, frame in FRAMES.items():
                on = score_recall(engine, tokens, policy, recall, every=512, frame=frame)
                out.append(
                    {
                        "text": name,
                        "frame": frame_name,
                        "tokens": len(tokens),
                        "ppl_off": off.perplexity,
                        "ppl_recall": on.perplexity,
                        "ratio": on.perplexity / off.perplexity,
                        "note": on.note,
                        "buckets_off": buckets(off.nll, 512),
                        "buckets_recall": buckets(on.nll, 512),
                    }
                )
    return out


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {"machine": machine()}
    parts = os.environ.get("SINKD_COST_PARTS", "retrieval,decode,ttft,ppl").split(",")
    with tempfile.TemporaryDirectory() as tmp:
        if "retrieval" in parts:  # its engine in a child: no OpenMP team beside the daemons here
            data["retrieval"] = in_child(retrieval_with_engine, Path(tmp))
        else:  # kept from the last run
            data["retrieval"] = json.loads((OUT / "cost.json").read_text())["retrieval"]
        table(
            "Memory: search latency and size",
            ["stored", "passages", "p50 ms", "p99 ms", "store us/tok", "bytes/1k (rows)",
             "bytes/1k (file)"],
            [[r["tokens_stored"], r["passages"], r["search_p50_ms"], r["search_p99_ms"],
              r["store_us_per_evicted_token"], r["row_bytes_per_1k_tokens"],
              r["file_bytes_per_1k_tokens"]] for r in data["retrieval"]],
        )  # fmt: skip
        last = json.loads((OUT / "cost.json").read_text()) if (OUT / "cost.json").exists() else {}
        data["decode"] = d = decode_speed(Path(tmp)) if "decode" in parts else last["decode"]
        table(
            "Decode with recall idle vs off (same run, alternating)",
            ["off tok/s", "idle tok/s", "idle/off"],
            [[d["off_tok_s"], d["idle_tok_s"], d["idle_vs_off"]]],
        )
        data["chat_ttft"] = c = chat_ttft(Path(tmp)) if "ttft" in parts else last["chat_ttft"]
        table(
            "Chat turn time to first token, recall auto vs off",
            ["recall", "mean TTFT ms", "mean recalled tokens"],
            [[m, c[m]["mean_ttft_ms"], c[m]["mean_recalled_tokens"]] for m in ("off", "auto")],
        )
    data["perplexity"] = perplexity() if "ppl" in parts else last["perplexity"]
    table(
        "Perplexity with a Recall every 512 tokens vs none",
        ["text", "frame", "tokens", "ppl off", "ppl recall", "ratio", "note"],
        [[r["text"], r["frame"], r["tokens"], r["ppl_off"], r["ppl_recall"], r["ratio"], r["note"]]
         for r in data["perplexity"]],
    )  # fmt: skip
    (OUT / "cost.json").write_text(json.dumps(data, indent=1))
    print(f"wrote {OUT / 'cost.json'}")


if __name__ == "__main__":
    main()
