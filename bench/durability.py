"""7. What durability costs: append and generate throughput with it off and on (fsync per commit,
fsyncs at most every 20 ms that the commits meanwhile share, or only a process-crash guarantee), the
snapshot size and time per session, and the restart time
with 8 live sessions (after a clean stop: snapshots only; after a crash: snapshots plus replay).

Modes run interleaved, round by round, and are compared as ratios to "off" in the same round.

    python bench/durability.py [--rounds 5]   -> bench/results/durability.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import daemon_settings, percentile, table, write

from sinkd.daemon.node import Daemon
from sinkd.daemon.rpc.client import Client
from sinkd.evaluation import SAMPLE_TEXT as TEXT
from sinkd.proto.v1 import sinkd_pb2 as pb

MODES: dict[str, dict[str, Any]] = {
    "off": {"durable": False},
    "on, sync=full": {"durable": True, "sync": "full"},
    "on, sync=full, 20 ms interval": {"durable": True, "sync": "full", "sync_interval_ms": 20},
    "on, sync=normal": {"durable": True, "sync": "normal"},
}
POLICY = pb.Policy(name="sink", sinks=4, window=252)


def start(tmp: Path, **kw: Any) -> tuple[Daemon, Client, float]:
    t0 = time.perf_counter()
    d = Daemon(daemon_settings(tmp, n_ctx_seq=256, max_sessions=8, **kw))
    d.start()
    d.wait_ready(300)
    return d, Client(d.addresses[0]), time.perf_counter() - t0


def create(c: Client) -> pb.Handle:
    return c.s.Create(pb.CreateSessionRequest(policy=POLICY), metadata=[]).handle


def append_rate(c: Client, pool: list[int], n_appends: int, size: int) -> float:
    h = create(c)
    t0 = time.perf_counter()
    for i in range(n_appends):
        ids = pool[(i * size) % (len(pool) - size) :][:size]
        c.s.Append(pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=ids)), metadata=[])
    return n_appends * size / (time.perf_counter() - t0)


def generate_rate(c: Client, pool: list[int], sessions: int, tokens: int) -> float:
    handles = []
    for i in range(sessions):
        h = create(c)
        c.s.Append(
            pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=pool[i * 30 : i * 30 + 200])),
            metadata=[],
        )
        handles.append(h)

    def gen(h: pb.Handle) -> None:
        for _ in c.s.Generate(pb.GenerateRequest(handle=h, max_tokens=tokens), metadata=[]):
            pass

    threads = [threading.Thread(target=gen, args=(h,)) for h in handles]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sessions * tokens / (time.perf_counter() - t0)


def throughput(rounds: int) -> list[dict[str, Any]]:
    samples: dict[str, dict[str, list[float]]] = {
        m: {"append": [], "gen1": [], "gen4": [], "commit_ms": []} for m in MODES
    }
    names = list(MODES)
    for r in range(rounds):
        for mode in (
            names[r % len(names) :] + names[: r % len(names)]
        ):  # a different mode goes first each round
            kw = MODES[mode]
            d, c, _ = start(Path(tempfile.mkdtemp()), **kw)
            pool = d.service.engine.vocab.tokenize(TEXT * 6)
            samples[mode]["append"].append(append_rate(c, pool, 24, 32))
            samples[mode]["gen1"].append(generate_rate(c, pool, 1, 300))
            samples[mode]["gen4"].append(generate_rate(c, pool, 4, 48))
            reg = d.service.metrics.registry
            n = reg.get_sample_value("sinkd_journal_commit_seconds_count") or 0
            total = reg.get_sample_value("sinkd_journal_commit_seconds_sum") or 0.0
            samples[mode]["commit_ms"].append(1000 * total / n if n else 0.0)
            d.stop()
    out = []
    base = {k: statistics.median(v) for k, v in samples["off"].items()}
    for mode in MODES:
        med = {k: statistics.median(v) for k, v in samples[mode].items()}
        ratios = {f"{k}_vs_off": med[k] / base[k] for k in med if k != "commit_ms"}
        out.append({"mode": mode, **med, **ratios})
    return out


def snapshot_cost(repeats: int) -> list[dict[str, Any]]:
    d, c, _ = start(Path(tempfile.mkdtemp()), snapshot_every_tokens=10**9)
    pool = d.service.engine.vocab.tokenize(TEXT * 6)
    scheduler = d.service.scheduler
    rows = []
    for cells in (64, 256):
        h = create(c)
        c.s.Append(pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=pool[:cells])), metadata=[])
        session = d.service.registry.get(h.session_id)
        assert session is not None
        times = []
        for i in range(repeats):
            c.s.Append(pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=[pool[i]])), metadata=[])
            t0 = time.perf_counter()
            assert scheduler.call(lambda e, s=session: scheduler.snapshotter.take(s))
            times.append((time.perf_counter() - t0) * 1000)
        size = max(p.stat().st_size for p in (d.settings.state_dir / "snapshots").rglob("*.snap"))
        rows.append(
            {
                "retained_cells": session.seq.retained,
                "snapshot_bytes": size,
                "p50_ms": percentile(times, 50),
                "p99_ms": percentile(times, 99),
            }
        )
        c.s.Close(pb.HandleRequest(handle=h), metadata=[])
    d.stop()
    return rows


def restart_time() -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp())
    d, c, load = start(tmp / "empty")  # the model load alone, nothing to resume
    d.stop()
    rows: list[dict[str, Any]] = [{"restart": "no sessions (model load)", "seconds": load}]
    cases = (("clean stop", 40), ("crash", 40), ("crash", 250))
    for n, (how, generated) in enumerate(cases):
        state = tmp / f"case{n}"
        d, c, _ = start(state)
        pool = d.service.engine.vocab.tokenize(TEXT * 6)
        handles = []
        for i in range(8):
            h = create(c)
            c.s.Append(
                pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=pool[i * 10 : i * 10 + 400])),
                metadata=[],
            )  # a snapshot falls due here (256 tokens logged)
            handles.append(h)

        def gen(h: pb.Handle, n: int = generated, c: Client = c) -> None:
            for _ in c.s.Generate(pb.GenerateRequest(handle=h, max_tokens=n), metadata=[]):
                pass

        threads = [threading.Thread(target=gen, args=(h,)) for h in handles]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if how == "crash":  # no shutdown snapshots: resume replays the journal's tail
            d.stop(snapshot=False)
        else:
            d.stop()
        d, c, seconds = start(state)
        listed = c.s.List(pb.ListSessionsRequest(), metadata=[]).sessions
        assert len(listed) == 8 and all(r.state == "idle" for r in listed)
        rows.append(
            {
                "restart": f"8 sessions after a {how}, {generated} tokens generated after the snapshot",
                "seconds": seconds,
                "over_load_s": seconds - load,
                "resume": listed[0].resume,
            }
        )
        d.stop()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--snapshots", type=int, default=10)
    a = p.parse_args()
    thr = throughput(a.rounds)
    table(
        "throughput (tokens/s, median of rounds; ratio to off in brackets)",
        ["mode", "append", "generate x1", "generate x4", "commit ms (mean)"],
        [
            [
                r["mode"],
                f"{r['append']:.0f} ({r['append_vs_off']:.2f})",
                f"{r['gen1']:.1f} ({r['gen1_vs_off']:.2f})",
                f"{r['gen4']:.1f} ({r['gen4_vs_off']:.2f})",
                f"{r['commit_ms']:.2f}",
            ]
            for r in thr
        ],
    )
    snaps = snapshot_cost(a.snapshots)
    table(
        "snapshot per session (engine thread: cells read, file written, fsync, rename, journal)",
        ["retained cells", "bytes", "p50 ms", "p99 ms"],
        [[r["retained_cells"], r["snapshot_bytes"], r["p50_ms"], r["p99_ms"]] for r in snaps],
    )
    restarts = restart_time()
    table(
        "restart to serving",
        ["restart", "seconds", "resume of the first session"],
        [[r["restart"], r["seconds"], r.get("resume", "")] for r in restarts],
    )
    path = write(
        "durability",
        {"throughput": thr, "snapshots": snaps, "restart": restarts, "rounds": a.rounds},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
