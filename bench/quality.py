"""Quality sweeps, other kinds of stream, and recall probes (the long runs: bench/quality_long.sh).

    python bench/quality.py sweep    # S = 0,1,2,4,8 at budget 256 (the paper's Table 2 form); W sweep at S=4
    python bench/quality.py kinds    # code, JSON lines, a repeated template, adversarial filler
    python bench/quality.py probes   # a fact inside / outside the window; a pinned / unpinned instruction

Each prints a table and writes bench/results/quality/<section>.json.
"""

from __future__ import annotations

import json
import math
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

from sinkd.cachepolicy import CacheSequence, PolicyConfig
from sinkd.daemon.engine.llama import Engine, EngineConfig
from sinkd.daemon.engine.loading import open_engine
from sinkd.daemon.engine.sampler import Sampler, SamplingParams
from sinkd.evaluation.ppl import run_ppl

OUT = Path("bench/results/quality")
TEXTS = Path("bench/texts")


def factory(config: EngineConfig) -> Engine:
    return open_engine(None, config)


def tokenize(text: str, n: int) -> list[int]:
    with factory(EngineConfig(n_ctx_seq=256, n_seq_max=1)) as engine:
        return engine.vocab.tokenize(text, add_bos=True)[:n]


def write(section: str, data: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    data.update(machine=platform.platform(), command=f"python bench/quality.py {section}")
    (OUT / f"{section}.json").write_text(json.dumps(data, indent=1))


def sweep() -> None:
    ids = tokenize((TEXTS / "kjv.txt").read_text()[200_000:], 3072)
    rows = []
    for sinks in (0, 1, 2, 4, 8):
        policy = "window" if sinks == 0 else "sink"
        (run,) = run_ppl(factory, ids, [policy], sinks, 256 - sinks, evict=1)
        rows.append(
            {
                "sinks": sinks,
                "window": 256 - sinks,
                "ppl": run.perplexity,
                "ppl_after_budget": math.exp(float(run.nll[256:].mean())),
            }
        )
    wrows = []
    for window in (60, 124, 252, 508):
        (run,) = run_ppl(factory, ids, ["sink"], 4, window, evict=1)
        wrows.append({"sinks": 4, "window": window, "ppl": run.perplexity})
    print("sink sweep, budget 256 (S+W), 3,072 tokens of the KJV, E=1 (cf. StreamingLLM Table 2)")
    print("  " + "".join(f"{r['sinks']}+{r['window']:<8}" for r in rows))
    print("  " + "".join(f"{r['ppl']:<10.2f}" for r in rows))
    print("window sweep at S=4")
    for r in wrows:
        print(f"  4+{r['window']:<5} ppl {r['ppl']:.2f}")
    write(
        "sweep",
        {
            "tokens": len(ids),
            "text": "kjv (from character 200,000)",
            "evict_chunk": 1,
            "sinks": rows,
            "windows": wrows,
        },
    )


def stream_kinds() -> dict[str, str]:
    rng = random.Random(11)
    code_files = sorted(
        Path(
            sys.base_prefix, "lib", f"python{sys.version_info.major}.{sys.version_info.minor}"
        ).glob("[a-m]*.py")
    )
    code = "\n".join(p.read_text(errors="replace") for p in code_files[:12])
    tools = ["search", "read_file", "run_tests", "open_url"]
    jsonl = "\n".join(
        json.dumps(
            {
                "id": i,
                "tool": rng.choice(tools),
                "args": {"q": f"item {rng.randint(1, 999)}", "limit": rng.randint(1, 50)},
                "ok": rng.random() > 0.1,
            }
        )
        for i in range(3000)
    )
    template = "\n".join(
        f"Dear customer {i}, your order #{1000 + i} has shipped and will arrive on day {i % 28 + 1}."
        for i in range(2000)
    )
    words = (TEXTS / "jargon.txt").read_text().split()
    filler = " ".join(
        rng.choice(words) for _ in range(20000)
    )  # real words in random order: no structure
    return {"code": code, "jsonl": jsonl, "template": template, "filler": filler}


def kinds() -> None:
    results = []
    for kind, text in stream_kinds().items():
        ids = tokenize(text, 3072)
        runs = run_ppl(
            factory,
            ids,
            ["full", "window", "sink", "recompute"],
            4,
            252,
            evict=16,
            stride=128,
            full_context=len(ids),
        )
        row = {"kind": kind, "tokens": len(ids)}
        row.update({r.name: r.perplexity for r in runs})
        row.update({f"{r.name}_after_budget": math.exp(float(r.nll[256:].mean())) for r in runs})
        results.append(row)
    print(
        f"{'stream':<10}"
        + "".join(f"{p:>12}" for p in ("full", "window", "sink", "recompute"))
        + "   (ppl after position 256)"
    )
    for r in results:
        print(
            f"{r['kind']:<10}"
            + "".join(
                f"{r[p + '_after_budget']:>12.2f}" for p in ("full", "window", "sink", "recompute")
            )
        )
    write("kinds", {"budget": "S=4 W=252 E=16", "results": results})


def greedy(engine: Engine, seq: CacheSequence, prompt: list[int], n: int) -> tuple[str, list[int]]:
    logits = engine.feed(0, seq, prompt)
    sampler = Sampler(SamplingParams())
    out = []
    for _ in range(n):
        assert logits is not None
        tok = sampler.sample_logits(logits)
        if engine.vocab.is_eog(tok):
            break
        out.append(tok)
        logits = engine.feed(0, seq, [tok])
    return engine.vocab.detokenize(out), out


def probes() -> None:
    """What eviction means: the same fact just inside and just outside the window."""
    filler_words = (TEXTS / "kjv.txt").read_text()[50_000:80_000]
    results: list[dict[str, Any]] = []
    with factory(EngineConfig(n_ctx_seq=256, n_seq_max=1)) as engine:
        filler = engine.vocab.tokenize(filler_words)
        fact = engine.vocab.tokenize("\nRemember this: the secret code is 7316.\n")
        question = engine.vocab.tokenize(
            "\nQuestion: what is the secret code? Answer: the secret code is"
        )
        for label, distance in (
            ("inside the window (100 tokens back)", 100),
            ("just inside (230 back)", 230),
            ("just outside (300 back)", 300),
            ("far outside (1,000 back)", 1000),
        ):
            seq = CacheSequence(PolicyConfig.named("sink", sinks=4, window=252, evict_chunk=1))
            engine.cells.clear(0)
            stream = filler[:600] + fact + filler[600 : 600 + distance]
            engine.feed(0, seq, stream)
            kept = seq.receipt()
            answer, _ = greedy(engine, seq, question, 6)
            visible = kept.recent_logical[0] <= 600 < kept.recent_logical[1]
            results.append(
                {
                    "probe": "fact",
                    "placement": label,
                    "fact_in_cache": visible,
                    "answer": answer.strip(),
                    "correct": "7316" in answer,
                }
            )
        instruction = "Always answer with exactly one word: BANANA."
        for pinned in (True, False):
            system = engine.vocab.tokenize(
                engine.vocab.render_chat([("system", instruction)], add_assistant=False)
            )
            sinks = len(system) if pinned else 4  # the same budget of 256 either way
            seq = CacheSequence(
                PolicyConfig.named("sink", sinks=sinks, window=256 - sinks, evict_chunk=1)
            )
            engine.cells.clear(0)
            engine.feed(0, seq, system + filler[:1500])
            user = engine.vocab.tokenize(
                "\n"
                + engine.vocab.render_chat(
                    [("user", "What fruit should I eat?")], add_assistant=True
                )
            )
            answer, _ = greedy(engine, seq, user, 12)
            results.append(
                {
                    "probe": "instruction",
                    "placement": "pinned in the sinks" if pinned else "evicted (S=4)",
                    "in_cache": pinned,
                    "answer": answer.strip(),
                    "followed": "banana" in answer.lower(),
                }
            )
    for r in results:
        ok = r.get("correct", r.get("followed"))
        print(
            f"{r['probe']:<12} {r['placement']:<40} {'kept' if r.get('fact_in_cache', r.get('in_cache')) else 'evicted':<8} answered {r['answer']!r:<40} {'yes' if ok else 'no'}"
        )
    write("probes", {"budget": "S=4 W=252 E=1", "results": results})


if __name__ == "__main__":
    sections = {"sweep": sweep, "kinds": kinds, "probes": probes}
    for name in sys.argv[1:] or list(sections):
        t = time.time()
        sections[name]()
        print(f"({name}: {time.time() - t:.0f} s)\n")
