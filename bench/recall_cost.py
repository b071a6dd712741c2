"""What recall costs: retrieval latency with 100k and 1M tokens stored, bytes stored per 1,000
evicted tokens, decode speed with recall idle vs off and the time a chat turn's recall adds (same
run, alternating), and perplexity by stream position with and without recalls in the stream.

    python bench/recall_cost.py            # SINKD_BENCH_SCALE=2 doubles the decode and ppl runs
    SINKD_COST_PARTS=decode,ttft,ppl python bench/recall_cost.py   # the parts named; the rest kept
    SINKD_COST_ROUNDS=8 ...                                        # decode: rounds of each mode (3)

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
        GenerationOptions,
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
    rounds = int(os.environ.get("SINKD_COST_ROUNDS", "3"))
    try:
        for _ in range(rounds):
            for mode in ("off", "manual"):
                s = svc.create(p, PolicyRequest("sink"), None, recall=RecallRequest(mode=mode))
                h = s.handle
                svc.append(p, h, text, None)
                t0 = time.perf_counter()
                sampled = GenerationOptions(n, sampling=SamplingRequest(temperature=0.8, seed=7))
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


def chat_ttft(tmp: Path, pause_s: float) -> dict[str, Any]:
    """Time to first token of chat turns, recall auto vs off, the same script in both, rounds
    alternating. Per fact: it is said, ~700 tokens of reading evict it, it is asked (a first
    recall: its passage re-decoded), ~60 tokens on it is asked again in the other wording (its
    recalled copy is still in the window: nothing recalled). Each asked turn's TTFT beside the
    same turn's with recall off. `pause_s`: the user's pause between the text and the question
    (0: asked at once, so the search embeds every passage the text evicted; with a pause the
    daemon has made their vectors while idle, as between the turns of a chat)."""
    from sinkd.daemon.runtime.api import (
        ChatRequest,
        Done,
        GenerationOptions,
        PolicyRequest,
        RecallRequest,
        SamplingRequest,
        TokenEvent,
        Turn,
    )
    from sinkd.daemon.runtime.sessions import Principal
    from sinkd.evaluation.facts import draw

    p = Principal("local")
    svc = service(tmp / f"ttft{pause_s}")
    text = KJV.read_text()[500_000:]
    facts = draw(random.Random(5))[: int(6 * SCALE)]
    asks = [("first", "paraphrase"), ("again", "lexical")]
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "auto": []}
    try:
        for _ in range(2):
            for mode in ("off", "auto"):
                h = svc.create(
                    p, PolicyRequest("sink"), None, recall=RecallRequest(mode=mode)
                ).handle
                at = 0
                for fi, fact in enumerate(facts):
                    svc.turns.history(
                        p, h, [Turn("user", fact.statement), Turn("assistant", "Noted.")]
                    )
                    for kind, wording in asks:
                        n = 2800 if kind == "first" else 240  # characters, ~4 per token
                        svc.append(p, h, text[at : at + n], None)
                        at += n
                        time.sleep(pause_s)  # the user reading and typing (the daemon idles)
                        t0 = time.perf_counter()
                        first, done = None, None
                        turn = ChatRequest(
                            fact.question(wording),
                            GenerationOptions(8, sampling=SamplingRequest(temperature=0.0)),
                        )
                        for e in svc.chat(p, h, turn):
                            if isinstance(e, TokenEvent) and first is None:
                                first = time.perf_counter() - t0
                            elif isinstance(e, Done):
                                done = e
                        report = done.recall if done is not None else None
                        rec = report.recalled if report is not None else ()
                        runs[mode].append({
                            "fact": fi, "ask": kind, "ttft_ms": 1000 * (first or 0.0),
                            "recalled_tokens": sum(r.stream[1] - r.stream[0] for r in rec),
                            "in_window": report is not None and "still in the window" in report.note,
                        })  # fmt: skip
                svc.close(p, h)
    finally:
        svc.stop()
    rows = []
    for kind, _ in asks:
        off = [r["ttft_ms"] for r in runs["off"] if r["ask"] == kind]
        auto = [r for r in runs["auto"] if r["ask"] == kind]
        rows.append({
            "ask": kind, "turns": len(auto),
            "off_median_ms": statistics.median(off),
            "auto_median_ms": statistics.median(r["ttft_ms"] for r in auto),
            "added_median_ms": statistics.median(a["ttft_ms"] - o for a, o in zip(auto, off, strict=False)),
            "added_max_ms": max(a["ttft_ms"] - o for a, o in zip(auto, off, strict=False)),
            "recalled_turns": sum(r["recalled_tokens"] > 0 for r in auto),
            "in_window_turns": sum(r["in_window"] for r in auto),
            "mean_recalled_tokens": statistics.mean(r["recalled_tokens"] for r in auto),
        })  # fmt: skip
    return {"pause_s": pause_s, "rows": rows, "turns": runs}


FRAMES = {  # how recalled text sits in a plain stream: bare (the Recall RPC's default), or marked
    "bare": ("", "\n"),
    "marked": ("\n(recalled from earlier) ", "\n(end of recalled text)\n"),
}


def perplexity() -> list[dict[str, Any]]:
    from sinkd.cachepolicy import PolicyConfig
    from sinkd.cachepolicy.recall_plan import RecallConfig
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
        pauses = (0.0, 1.5)
        data["chat_ttft"] = c = (
            [chat_ttft(Path(tmp), pause) for pause in pauses]
            if "ttft" in parts
            else [last["chat_ttft"]]
            if isinstance(last["chat_ttft"], dict)
            else last["chat_ttft"]
        )
        table(
            "Chat turn time to first token, recall auto vs off (first: the fact's first recall; "
            "again: asked again while its recalled copy is in the window)",
            ["pause s", "ask", "turns", "off ms", "auto ms", "added ms (median)", "added ms (max)",
             "recalled turns", "in-window turns", "recalled tokens"],
            [[run.get("pause_s", 0.0), r["ask"], r["turns"], r["off_median_ms"], r["auto_median_ms"],
              r["added_median_ms"], r["added_max_ms"], r["recalled_turns"], r["in_window_turns"],
              r["mean_recalled_tokens"]] for run in c for r in run["rows"]],
        )  # fmt: skip
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
