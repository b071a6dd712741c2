"""Texts the tests feed: the sample text, a long one, and a fact for recall to find."""

from __future__ import annotations

from sinkd.evaluation import SAMPLE_TEXT as TEXT

__all__ = ["FACT", "LONG", "RECALL_POLICY", "SENTINEL", "TEXT"]

SENTINEL = "zebraquartz"
FACT = f"\nNote: the sentinel word is {SENTINEL} and the code is 4711.\n"
RECALL_POLICY = {"sinks": 4, "window": 120, "evict_chunk": 16}
LONG = (TEXT + "\n") * 4
