#!/usr/bin/env bash
# Long quality runs: 16,384 tokens (twice SmolLM2's trained context) of two public-domain texts,
# every policy, S=4 W=252 E=16; recompute strided by 128. About 15 minutes per text on 2 cores.
set -euo pipefail
bash bench/texts.sh >/dev/null
for text in kjv jargon; do
  sinkd eval ppl --text "bench/texts/$text.txt" --tokens 16384 --sinks 4 --window 252 --evict 16 \
    --stride 128 --bucket 1024 --out bench/results/quality --name "long-$text"
done
