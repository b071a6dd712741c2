"""Constrained decoding's cost per token against free decoding, in the same run.

    python bench/constrained.py                 -> bench/results/constrained.json
    SINKD_CONSTRAINED_ROUNDS=10 python bench/constrained.py   (5 rounds by default)

One chat turn at a time, each in a new session, through the running daemon's turns (the layer
beneath the HTTP front's conversations), the default model, greedy, 96 tokens at most, in four kinds interleaved round by round
(each round runs every kind once, so the machine's noise falls on all alike): free text, `json_object`,
a `json_schema` (an object with a bounded string, a boolean, an enum and a list), and a tool call
(`tool_choice: required`, one tool, sinkd's generic format: its system prompt and reply schema).
Per kind: the engine's time per generated token after the first (each token's latency as the
engine stamps it; the first carries the turn's prefill), p50 over the turns, and its ratio to free text's p50. The grammar's work is the mask: the token chosen freely
is kept when the grammar allows it, else the whole vocabulary (49,152 tokens) is checked.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from common import percentile, start_service, table, write

from sinkd.daemon.runtime.api import (
    ChatRequest,
    GenerationOptions,
    OutputFormat,
    PolicyRequest,
    SamplingRequest,
    TokenEvent,
    Tool,
    ToolUse,
)
from sinkd.daemon.runtime.conversations import tool_format
from sinkd.daemon.runtime.sessions import Principal

ME = Principal("local")
ROUNDS = int(os.environ.get("SINKD_CONSTRAINED_ROUNDS", "5"))
MAX_TOKENS = 96
CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "coastal": {"type": "boolean"},
        "size": {"enum": ["village", "town", "city"]},
        "rivers": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 3},
    },
    "required": ["name", "coastal", "size", "rivers"],
}
WEATHER = Tool(
    "get_weather",
    "The current weather in a city.",
    json.dumps(
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ),
)
KINDS: dict[str, dict[str, Any]] = {
    "free text": {},
    "json_object": {"output": OutputFormat()},
    "json_schema": {"output": OutputFormat(json.dumps(CITY))},
    "tool call": {"tools": ToolUse((WEATHER,), "required", parallel=False)},
}


def one_turn(svc: Any, kind: str, rnd: int) -> tuple[int, float]:
    """(tokens generated, seconds the engine spent on the tokens after the first): each token's
    own latency as the engine stamped it, beneath the tool format's reader (which holds a call's
    tokens back until its name is whole)."""
    spec = KINDS[kind]
    output, system = spec.get("output"), ""
    if "tools" in spec:  # what the conversation layer asks of the engine for a tool call
        use = spec["tools"]
        output = OutputFormat(json.dumps(tool_format.reply_schema(use, None)))
        system = tool_format.tools_prompt("", use.tools)
    options = GenerationOptions(
        MAX_TOKENS, sampling=SamplingRequest(temperature=0.0), output=output
    )
    receipt = svc.create(ME, PolicyRequest(name="sink", fill_window=True), None, system)
    question = f"Round {rnd}: describe a city by a river, and its weather."
    latencies = [
        e.latency_ms
        for e in svc.turns.chat(ME, receipt.handle, ChatRequest(question, options))
        if isinstance(e, TokenEvent)
    ]
    svc.close(ME, receipt.handle)
    return len(latencies), sum(latencies[1:]) / 1000


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        svc = start_service(Path(tmp), n_ctx_seq=1024, max_sessions=4)
        try:
            per_token: dict[str, list[float]] = {k: [] for k in KINDS}
            tokens: dict[str, list[int]] = {k: [] for k in KINDS}
            for rnd in range(ROUNDS + 1):
                for kind in KINDS:
                    n, seconds = one_turn(svc, kind, rnd)
                    if rnd == 0 or n < 2:  # a warm-up round: the grammar's first compile
                        continue
                    per_token[kind].append(1000 * seconds / (n - 1))
                    tokens[kind].append(n)
        finally:
            svc.stop()
    free = percentile(per_token["free text"], 50)
    rows, data = [], {}
    for kind in KINDS:
        p50 = percentile(per_token[kind], 50)
        ratio = p50 / free
        rows.append([kind, len(per_token[kind]), sum(tokens[kind]), p50,
                     percentile(per_token[kind], 90), ratio])  # fmt: skip
        data[kind] = {"turns": len(per_token[kind]), "tokens": tokens[kind],
                      "ms_per_token": per_token[kind], "p50_ms": p50, "ratio_to_free": ratio}  # fmt: skip
    table("decode ms per token (after the first), greedy, SmolLM2-135M Q4_1, 2 cores",
          ["kind", "turns", "tokens", "p50 ms", "p90 ms", "x free"], rows)  # fmt: skip
    print(write("constrained", {"rounds": ROUNDS, "max_tokens": MAX_TOKENS, "kinds": data}))


if __name__ == "__main__":
    main()
