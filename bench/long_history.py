"""A stateless client arrives with a very long history (a conversation from another server, an
exported chat): sinkd ingests it once, through the session's policy, at prefill speed and constant
memory, then continues it turn by turn reading only the new turns.

    python bench/long_history.py        -> bench/results/long_history.json

SINKD_LONG_HISTORY_TOKENS (100000): about how many tokens the history holds (turns of ~250 tokens
of prose); the daemon's call timeout is raised to 3600 s for the ingest (the default, 600 s, bounds
a turn: at ~200 tokens/s here that is ~120,000 tokens). Reported: the first request's wall time and
ingest tokens/s, the receipt (tokens seen, cells retained, evicted), the daemon's resident memory
before and after, and the next turn's time to first token and prompt tokens (the new turn alone).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from common import table, write
from long_chat import SinkdHttp, rss_mib

TOKENS = int(os.environ.get("SINKD_LONG_HISTORY_TOKENS", "100000"))


def history(n_tokens: int) -> list[dict[str, str]]:
    from sinkd.evaluation import SAMPLE_TEXT

    words = SAMPLE_TEXT.split()
    turns, i, total = [], 0, 0
    while total < n_tokens:
        chunk = " ".join(words[(i * 170 + k) % len(words)] for k in range(190))  # ~250 tokens
        role = "user" if len(turns) % 2 == 0 else "assistant"
        turns.append({"role": role, "content": f"({len(turns)}) {chunk}"})
        total += 250
        i += 1
    if turns[-1]["role"] == "user":
        turns.append({"role": "assistant", "content": "Noted."})
    return turns


def main() -> None:
    import openai

    os.environ["SINKD_CALL_TIMEOUT_S"] = "3600"
    server = SinkdHttp()
    try:
        assert server.proc is not None
        rss0, _ = rss_mib(server.proc.pid)
        client = openai.OpenAI(base_url=server.base_url, api_key=server.key, max_retries=0,
                               timeout=3600)  # fmt: skip
        turns = [{"role": "system", "content": "You are a helpful assistant."}, *history(TOKENS)]
        turns.append({"role": "user", "content": "Summarise the last thing I said in one line."})
        t0 = time.perf_counter()
        first = client.chat.completions.create(
            model="smollm2-135m-instruct", messages=turns, max_tokens=32, temperature=0
        )
        ingest_s = time.perf_counter() - t0
        ext: dict[str, Any] = (first.model_extra or {})["sinkd"]
        rss1, peak1 = rss_mib(server.proc.pid)
        turns += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                  {"role": "user", "content": "Thank you."}]  # fmt: skip
        t1, ttft = time.perf_counter(), None
        stream = client.chat.completions.create(
            model="smollm2-135m-instruct", messages=turns, max_tokens=16, temperature=0,
            stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        usage, how = None, None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and ttft is None:
                ttft = time.perf_counter() - t1
            usage = chunk.usage or usage
            how = ((chunk.model_extra or {}).get("sinkd") or {}).get("continuation") or how
        rss2, peak2 = rss_mib(server.proc.pid)
    finally:
        server.stop()
    receipt = ext["receipt"]
    out = {
        "history_turns": len(turns) - 4,
        "ingested_tokens": first.usage.prompt_tokens if first.usage else None,
        "ingest_s": ingest_s,
        "ingest_tok_s": (first.usage.prompt_tokens / ingest_s) if first.usage else None,
        "receipt": receipt,
        "continuation": ext["continuation"],
        "next_turn": {
            "continuation": how,
            "ttft_s": ttft,
            "prompt_tokens": usage.prompt_tokens if usage else None,
        },  # fmt: skip
        "rss_mib": {
            "before": rss0,
            "after_ingest": rss1,
            "after_next_turn": rss2,
            "peak": max(peak1, peak2),
        },  # fmt: skip
    }
    table(
        f"a stateless history of ~{TOKENS} tokens, ingested once, then continued",
        ["turns", "ingested tok", "ingest s", "tok/s", "seen", "retained", "evicted",
         "next turn", "next TTFT s", "next prompt tok", "RSS MiB before/after/peak"],
        [[out["history_turns"], out["ingested_tokens"], ingest_s, out["ingest_tok_s"],
          receipt["n_seen"], receipt["retained"], receipt["evicted_tokens"], how, ttft or "-",
          out["next_turn"]["prompt_tokens"], f"{rss0:.0f}/{rss1:.0f}/{max(peak1, peak2):.0f}"]],
    )  # fmt: skip
    print(write("long_history", out), file=sys.stdout)


if __name__ == "__main__":
    main()
