"""Sessions beyond the cache: restoring a parked session against reading its history again.

    python bench/residency.py                  -> bench/results/residency.json
    SINKD_RESIDENCY_RESTORES=100 python bench/residency.py   (more restores; 40 by default)

A session that took a 1,500-token history (the default model, `sink`, S=4) at the default window
(W=252) and at a chat UI's (W=1,020 of 1,024 cells) is parked (its snapshot brought up to date, its
cells freed) and restored (snapshot read and verified, cells written and checked against the policy)
again and again, through the running daemon's engine thread; with the snapshot file in the page
cache (warm), and with it dropped from the page cache first (cold: `posix_fadvise(DONTNEED)`, what
a session parked long ago costs). Against it, what sinkd did before parking: the history read
again into a fresh session (prefill through the policy, evicting past the window). p50 and p99 of
each, as the caller waits for them (a call to the engine thread) and as the engine thread spends
them; the ratio is re-read p50 / restore p50 (the caller's). Durable state directory, the journal's
default sync; dense recall off (its indexing between steps would delay the calls, not the restore).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, percentile, table, write

from sinkd.daemon.runtime.api import PolicyRequest
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.evaluation import SAMPLE_TEXT

ME = Principal("local")
HISTORY = 1500
RESTORES = int(os.environ.get("SINKD_RESIDENCY_RESTORES", "40"))
REREADS = int(os.environ.get("SINKD_RESIDENCY_REREADS", "3"))
WINDOWS = [("default window", None), ("1,020 cells", 1020)]


def history_tokens(svc: SinkdService) -> list[int]:
    kjv = ROOT / "bench" / "texts" / "kjv.txt"
    text = kjv.read_text()[:200_000] if kjv.exists() else SAMPLE_TEXT * 20
    tokens = svc.engine.vocab.tokenize(text, add_bos=False)
    assert len(tokens) >= HISTORY
    return tokens[:HISTORY]


def drop_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure(svc: SinkdService, window: int | None, tokens: list[int]) -> dict[str, Any]:
    policy = PolicyRequest(name="sink", window=window)
    reread = []
    for _ in range(REREADS):  # what a client coming back cost before: its history read again
        h = svc.create(ME, policy).handle
        t0 = time.perf_counter()
        svc.append(ME, h, None, tokens=tokens)
        reread.append(time.perf_counter() - t0)
        svc.close(ME, h)
    h = svc.create(ME, policy).handle
    receipt = svc.append(ME, h, None, tokens=tokens).receipt
    session = svc.registry.get(h.session_id)
    assert session is not None and svc.durability is not None
    residency = svc.scheduler.residency
    parks: list[float] = []
    restores: dict[str, list[float]] = {"warm": [], "cold": []}  # the caller's round trip
    engine_thread: dict[str, list[float]] = {"warm": [], "cold": []}  # restore() alone
    snapshot_bytes = 0
    for i in range(RESTORES):
        svc.append(ME, h, None, tokens=tokens[i : i + 8])  # a turn: the next park writes anew
        t0 = time.perf_counter()
        assert svc.scheduler.call(lambda e: residency.park(e, session))
        parks.append(time.perf_counter() - t0)
        row = svc.durability.snapshots_of(session)[0]
        snapshot_bytes = row.bytes
        kind = "cold" if i % 2 else "warm"
        if kind == "cold":
            drop_from_page_cache(svc.durability.dir / row.path)
        t0 = time.perf_counter()
        inside = svc.scheduler.call(lambda e: residency.restore(e, session))
        restores[kind].append(time.perf_counter() - t0)
        engine_thread[kind].append(inside / 1000)
    retained = svc.receipt(session).retained
    svc.close(ME, h)
    ms = [1000 * x for x in reread]
    out: dict[str, Any] = {
        "window": receipt.policy.window,
        "retained_cells": retained,
        "history_tokens": len(tokens),
        "snapshot_bytes": snapshot_bytes,
        "reread_ms": {"p50": percentile(ms, 50), "p99": percentile(ms, 99), "n": len(ms)},
        "park_ms": {
            "p50": percentile([1000 * x for x in parks], 50),
            "p99": percentile([1000 * x for x in parks], 99),
        },
    }
    for kind, values in restores.items():
        v = [1000 * x for x in values]
        inner = [1000 * x for x in engine_thread[kind]]
        out[f"restore_{kind}_ms"] = {
            "p50": percentile(v, 50),
            "p99": percentile(v, 99),
            "n": len(v),
        }
        out[f"restore_{kind}_engine_thread_ms"] = {
            "p50": percentile(inner, 50),
            "p99": percentile(inner, 99),
        }
        out[f"reread_over_restore_{kind}"] = out["reread_ms"]["p50"] / percentile(v, 50)
    return out


def main() -> None:
    from common import daemon_settings

    with tempfile.TemporaryDirectory() as tmp:
        # no dense recall: its embedder indexes evicted passages between steps, and a call
        # waits behind that (idle work unrelated to restoring)
        settings = daemon_settings(
            Path(tmp), n_ctx_seq=1024, max_sessions=2, step_tokens=256, recall_dense=False
        )
        svc = SinkdService(settings)
        svc.start()
        svc.wait_ready(120)
        try:
            tokens = history_tokens(svc)
            results = {name: measure(svc, window, tokens) for name, window in WINDOWS}
        finally:
            svc.stop()
    rows = []
    for name, r in results.items():
        rows.append(
            [
                f"{name} (W={r['window']})",
                r["retained_cells"],
                f"{r['snapshot_bytes'] / 2**20:.1f}",
                f"{r['reread_ms']['p50']:.0f} / {r['reread_ms']['p99']:.0f}",
                f"{r['park_ms']['p50']:.1f} / {r['park_ms']['p99']:.1f}",
                f"{r['restore_warm_ms']['p50']:.1f} / {r['restore_warm_ms']['p99']:.1f}",
                f"{r['restore_cold_ms']['p50']:.1f} / {r['restore_cold_ms']['p99']:.1f}",
                f"{r['reread_over_restore_warm']:.0f}x / {r['reread_over_restore_cold']:.0f}x",
            ]
        )
    table(
        f"a {HISTORY}-token history: read again vs parked and restored (ms, p50 / p99)",
        [
            "session",
            "cells",
            "snapshot MiB",
            "re-read",
            "park",
            "restore warm",
            "restore cold",
            "re-read / restore",
        ],
        rows,
    )
    path = write("residency", {"restores": RESTORES, "rereads": REREADS, "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
