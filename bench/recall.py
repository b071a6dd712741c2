"""Recall, measured: passkey accuracy by distance (sink, sink+recall, window, full), multi-key,
facts asked many turns into a chat, and where recalled text should sit in the cache.

    python bench/recall.py                    # 10 trials to 2k, 3 to 8k (about 25 min here)
    SINKD_RECALL_FULL=1 python bench/recall.py   # the issue's run: 10 trials to 16k, 3 to 64k
    SINKD_RECALL_ONLY=segmenting python bench/recall.py   # passages at text boundaries vs fixed
    SINKD_RECALL_ONLY=conversation python bench/recall.py # the chat part again (N=6 per mode),
                                                          # into the last run's JSON

Writes bench/results/recall/passkey.json and passkey.png; prints the tables.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, ROOT, daemon_settings, machine, table

OUT = RESULTS / "recall"


def make_service(tmp: Path) -> Any:
    from sinkd.daemon.runtime.service import SinkdService

    count = iter(range(1000))

    def make(**kw: Any) -> Any:
        base = {
            "durable": False,
            "step_tokens": 256,
            "prefill_chunk": 256,
            "n_batch": 256,
            "call_timeout_s": 7200,
        }
        base.update(kw)
        svc = SinkdService(daemon_settings(tmp / f"d{next(count)}", **base))
        svc.start()
        svc.wait_ready(120)
        return svc

    return make


def plan_for(full: bool) -> Any:
    from sinkd.evaluation.recall_trials import Plan

    if full:  # the sizes; about 5 hours on this 2-core machine
        return Plan(
            distances=[126, 1000, 2000, 4000, 8000, 16000],
            trials=10,
            long_distances=[64000],
            long_trials=3,
            multi_distances=[2000],
            multi_trials=10,
            control_trials=5,
            conversation_turns=8,
            conversations=3,
        )
    return Plan(
        distances=[126, 1000, 2000],
        trials=10,
        long_distances=[4000, 8000],
        long_trials=3,
        multi_distances=[1000],
        multi_trials=6,
        control_trials=3,
        conversation_turns=6,
        conversations=2,
        placement_trials=6,
        full_max_distance=2000,
        parallel=6,
    )


def segmenting_only() -> None:
    """Passages cut at text boundaries vs every 48 tokens: passkey with recall, 10 trials."""
    import json

    from sinkd.evaluation.recall_trials import segmenting

    text = (ROOT / "bench" / "texts" / "kjv.txt").read_text()[100_000:]
    with tempfile.TemporaryDirectory() as tmp:
        rows = segmenting(make_service(Path(tmp)), text, [1000, 4000], 10)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "segmenting.json").write_text(json.dumps({"rows": rows, "machine": machine()}, indent=1))
    table(
        "Passage boundaries: text (lines, sentences) vs fixed 48 tokens",
        ["arm", "distance", "trials", "accuracy"],
        [[r["arm"], r["distance"], r["trials"], r["accuracy"]] for r in rows],
    )


def conversation_only(full: bool) -> None:
    """Facts from a chat's first message asked many turns later, recall off vs auto, merged into
    the last run's JSON (the passkey part takes an hour; this a few minutes)."""
    import json

    from sinkd.evaluation.recall_trials import conversation, report_tables

    name = "passkey-full" if full else "passkey"
    path = OUT / f"{name}.json"
    data = json.loads(path.read_text())
    n = int(os.environ.get("SINKD_RECALL_CONVERSATIONS", "6"))
    with tempfile.TemporaryDirectory() as tmp:
        svc = make_service(Path(tmp))(n_ctx_seq=256, max_sessions=4)
        try:
            data["conversation"] = [
                conversation(svc, mode, 8, seed) for seed in range(n) for mode in ("off", "auto")
            ]
        finally:
            svc.stop()
    data["conversation_rerun"] = {"machine": machine(), "conversations_per_mode": n}
    path.write_text(json.dumps(data, indent=1))
    for title, columns, rows in report_tables(data):
        if title.startswith("Conversation"):
            table(title, columns, rows)
    print(f"wrote {path}")


def main() -> None:
    from sinkd.evaluation.recall_trials import evaluate, plot, report_tables

    if os.environ.get("SINKD_RECALL_ONLY") == "segmenting":
        segmenting_only()
        return
    if os.environ.get("SINKD_RECALL_ONLY") == "conversation":
        conversation_only(bool(os.environ.get("SINKD_RECALL_FULL")))
        return
    full = bool(os.environ.get("SINKD_RECALL_FULL"))
    text = (ROOT / "bench" / "texts" / "kjv.txt").read_text()[100_000:]
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        data = evaluate(make_service(Path(tmp)), text, plan_for(full), progress=print)
    data["machine"] = machine()
    data["seconds"] = round(time.time() - t0)
    name = "passkey-full" if full else "passkey"
    import json

    (OUT / f"{name}.json").write_text(json.dumps(data, indent=1))
    plot(data, OUT / f"{name}.png")
    for title, columns, rows in report_tables(data):
        table(title, columns, rows)
    print(f"wrote {OUT / name}.json and .png in {data['seconds']} s")


if __name__ == "__main__":
    main()
