"""Two sinkd processes on one machine: each one's speed beside the other, against itself alone.

llama.cpp's CPU threads (OpenMP here) spin at every barrier while they wait for each other; with two
processes on the same cores a spinning thread holds a core its peer's partner needs. Each setting
runs one worker alone, then two at once, each worker a real engine doing a prefill and a decode.

    python bench/two_processes.py                  -> bench/results/two_processes.json
    python bench/two_processes.py --beside-daemon  -> bench/results/two_processes_daemon.json
        (`sinkd serve` generating over gRPC while `sinkd stream` runs a text in its own process)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import default_threads, table, write

CORES = default_threads()
HALF = max(1, CORES // 2)
SETTINGS: list[tuple[str, dict[str, str], int | None]] = [
    (f"all the cores each ({CORES}), fixed: OpenMP spins", {}, CORES),
    ("OMP_WAIT_POLICY=passive, all the cores (the CLI's choice until 2026-12-01)",
     {"OMP_WAIT_POLICY": "passive"}, CORES),
    ("GOMP_SPINCOUNT=10000, all the cores", {"GOMP_SPINCOUNT": "10000"}, CORES),
    (f"half the cores each ({HALF}), fixed", {}, HALF),
    ("shared (the default: the cores split between the engines decoding)", {}, None),
]  # fmt: skip


def worker(threads: int | None) -> None:
    from sinkd.cachepolicy import CacheSequence, PolicyConfig
    from sinkd.daemon.engine.llama import EngineConfig
    from sinkd.daemon.engine.loading import open_engine
    from sinkd.evaluation import SAMPLE_TEXT

    kw: dict[str, Any] = {"n_ctx_seq": 256, "n_seq_max": 1, "n_batch": 256}
    if threads:
        kw["n_threads"] = threads
    with open_engine(None, EngineConfig(**kw)) as engine:
        seq = CacheSequence(PolicyConfig.named("sink", sinks=4, window=252))
        tokens = engine.vocab.tokenize(SAMPLE_TEXT * 20, add_bos=False)
        print("ready", flush=True)
        sys.stdin.readline()  # the parent starts every worker at once
        t0 = time.perf_counter()
        for i in range(0, 512, 64):
            engine.feed(0, seq, tokens[i : i + 64])
        t1 = time.perf_counter()
        logits = engine.feed(0, seq, tokens[512:513])
        n = 192
        for _ in range(n):
            logits = engine.feed(0, seq, [int(logits.argmax())])  # type: ignore[union-attr]
        t2 = time.perf_counter()
        print(json.dumps({"prefill_tps": 512 / (t1 - t0), "decode_tps": n / (t2 - t1)}))


def run(n: int, env: dict[str, str], threads: int | None) -> list[dict[str, float]]:
    cmd = [sys.executable, __file__, "--worker"] + ([str(threads)] if threads else [])
    procs = [
        subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        for _ in range(n)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=900)
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def main() -> None:
    rows = []
    for name, env, threads in SETTINGS:
        alone = run(1, env, threads)[0]
        pair = run(2, env, threads)
        rows.append(
            {
                "setting": name,
                "alone_decode_tps": alone["decode_tps"],
                "pair_decode_tps": [p["decode_tps"] for p in pair],
                "decode_ratio": min(p["decode_tps"] for p in pair) / alone["decode_tps"],
                "alone_prefill_tps": alone["prefill_tps"],
                "prefill_ratio": min(p["prefill_tps"] for p in pair) / alone["prefill_tps"],
            }
        )
        print(rows[-1], flush=True)
    fastest = max(r["alone_decode_tps"] for r in rows)  # what a user would call "alone"
    for r in rows:
        r["pair_vs_fastest_alone"] = min(r["pair_decode_tps"]) / fastest
    table(
        "Two processes at once, each against itself alone (the slower of the two)",
        ["setting", "alone decode tok/s", "pair decode (each)", "decode ratio", "prefill ratio",
         "pair vs the fastest alone"],
        [[r["setting"], r["alone_decode_tps"],
          " / ".join(f"{x:.0f}" for x in r["pair_decode_tps"]), r["decode_ratio"],
          r["prefill_ratio"], r["pair_vs_fastest_alone"]] for r in rows],
    )  # fmt: skip
    print(f"wrote {write('two_processes', {'rows': rows})}")


def beside_daemon(fixed: int | None) -> dict[str, Any]:
    """A daemon generating (one session, 300 tokens a request, over and over) while `sinkd stream`
    runs 20,000 characters of text embedded, each against itself alone. `fixed`: both processes
    on that many threads ($SINKD_N_THREADS); None: the default, shared."""
    import tempfile
    import threading

    from peer import Sinkd, prompts

    from sinkd.daemon.config import THREADS_ENV
    from sinkd.evaluation import SAMPLE_TEXT

    root = Path(__file__).resolve().parent
    kjv = root / "texts" / "kjv.txt"
    text_file = Path(tempfile.mkdtemp()) / "text.txt"
    text_file.write_text(kjv.read_text()[:20_000] if kjv.exists() else SAMPLE_TEXT * 20)
    env = {**os.environ}
    env.pop(THREADS_ENV, None)
    if fixed:
        env[THREADS_ENV] = str(fixed)

    def stream_seconds() -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sinkd.cli.main", "stream", str(text_file), "--json"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)  # fmt: skip
        return time.perf_counter() - t0

    prompt = prompts(1)[0]
    daemon = Sinkd(1, threads=None, env=env)
    try:

        def generate(until: Callable[[], bool]) -> float:
            tokens, t0 = 0, time.perf_counter()
            while not until():
                tokens += daemon.stream(prompt, 300).tokens
            return tokens / (time.perf_counter() - t0)

        daemon.stream(prompt, 50)
        time.sleep(1.5)  # idle for a second: the daemon stops counting
        t_end = time.perf_counter() + 10
        alone_gen = generate(lambda: time.perf_counter() > t_end)
        time.sleep(1.5)
        alone_stream = stream_seconds()
        time.sleep(1.5)
        done = threading.Event()
        rate: list[float] = []
        gen = threading.Thread(target=lambda: rate.append(generate(done.is_set)))
        gen.start()
        both_stream = stream_seconds()
        done.set()
        gen.join()
    finally:
        daemon.stop()
    return {
        "threads": fixed or "shared",
        "generate_alone_tok_s": alone_gen,
        "generate_beside_tok_s": rate[0],
        "generate_ratio": rate[0] / alone_gen,
        "stream_alone_s": alone_stream,
        "stream_beside_s": both_stream,
        "stream_ratio": alone_stream / both_stream,
    }


def main_beside_daemon() -> None:
    rows = [beside_daemon(None), beside_daemon(default_threads())]
    table(
        "`sinkd serve` generating beside `sinkd stream` (embedded), each against itself alone",
        ["threads", "generate alone tok/s", "beside", "ratio", "stream alone s", "beside s", "ratio"],
        [[r["threads"], r["generate_alone_tok_s"], r["generate_beside_tok_s"], r["generate_ratio"],
          r["stream_alone_s"], r["stream_beside_s"], r["stream_ratio"]] for r in rows],
    )  # fmt: skip
    print(f"wrote {write('two_processes_daemon', {'rows': rows})}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]) if len(sys.argv) > 2 else None)
    elif sys.argv[1:] == ["--beside-daemon"]:
        main_beside_daemon()
    else:
        main()
