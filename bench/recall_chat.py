"""Recall's chat arm: facts said in passing, asked later in other words, free answers
(evaluation/recall_chat.py). Each cell: the recalled accuracy beside the in-window accuracy of the
same facts, questions and streams.

    python bench/recall_chat.py                                   # both pinned models, their presentations
    SINKD_RC_PRESENTATIONS=system-after,system-before,quoted,user-turn \
    SINKD_RC_DISTANCES=1000 SINKD_RC_SOURCES=conversation python bench/recall_chat.py   # the sweep
    SINKD_RC_MODELS=smollm2-135m-instruct SINKD_RC_DENSE=0 ...    # BM25 alone
    SINKD_RC_FACTS=5 ...                                          # 5 facts a stream (of the 20 kinds)

Writes bench/results/recall/chat_<model>_<presentation>[_<tag>].json; prints the tables.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, daemon_settings, machine, table

OUT = RESULTS / "recall"


def env_list(name: str, default: str) -> list[str]:
    return [v for v in os.environ.get(name, default).split(",") if v]


def main() -> None:
    import json

    from sinkd.daemon.models.registry import load_lock
    from sinkd.daemon.runtime.service import SinkdService
    from sinkd.evaluation.recall_chat import ChatPlan, chat_table, evaluate_chat

    text_path = Path(os.environ.get("SINKD_RC_TEXT", "bench/texts/kjv.txt"))
    if not text_path.is_file():
        sys.exit(f"{text_path}: missing; run bench/texts.sh first")
    text = text_path.read_text(errors="replace")
    lock = load_lock()
    models = env_list("SINKD_RC_MODELS", "smollm2-135m-instruct,gemma3-270m")
    dense = os.environ.get("SINKD_RC_DENSE", "1") != "0"
    tag = os.environ.get("SINKD_RC_TAG", "" if dense else "bm25")
    plan = ChatPlan(
        distances=tuple(int(d) for d in env_list("SINKD_RC_DISTANCES", "1000,4000,16000")),
        sources=tuple(env_list("SINKD_RC_SOURCES", "conversation,document")),
        samplings=tuple(env_list("SINKD_RC_SAMPLINGS", "greedy,chat")),
        facts=int(os.environ.get("SINKD_RC_FACTS", "20")),
    )
    runs = []
    for model in models:
        presentations = env_list("SINKD_RC_PRESENTATIONS", lock.get(model).recall_presentation)
        for presentation in presentations:
            with tempfile.TemporaryDirectory() as tmp:
                settings = daemon_settings(
                    Path(tmp), model=model, durable=False, step_tokens=256, prefill_chunk=256,
                    n_ctx_seq=1024, max_sessions=6, call_timeout_s=7200,
                    recall_presentation=presentation, recall_dense=dense,
                )  # fmt: skip
                service = SinkdService(settings)
                service.start()
                service.wait_ready(120)
                try:
                    t0 = time.monotonic()
                    data = evaluate_chat(service, text, plan, lambda s: print(s, flush=True))
                finally:
                    service.stop(snapshot=False)
            data["machine"], data["dense"] = machine(), dense
            data["command"] = "python " + " ".join(sys.argv)
            data["env"] = {k: v for k, v in os.environ.items() if k.startswith("SINKD_RC_")}
            OUT.mkdir(parents=True, exist_ok=True)
            name = f"chat_{model}_{presentation}" + (f"_{tag}" if tag else "")
            (OUT / f"{name}.json").write_text(json.dumps(data, indent=1))
            print(f"{model} / {presentation}: {time.monotonic() - t0:.0f} s -> {OUT / name}.json")
            runs.append(data)
    title, columns, rows = chat_table(runs)
    table(title, columns, [[f"{v:.2f}" if isinstance(v, float) else v for v in r] for r in rows])


if __name__ == "__main__":
    main()
