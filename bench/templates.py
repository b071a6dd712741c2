"""The narrator's template miner against loghub's hand-labelled templates, beside drain3.

    python bench/templates.py --loghub DIR [--drain3 PYTHON]

DIR holds loghub's `<System>_2k.log` and `<System>_2k.log_structured.csv` (github.com/logpai/loghub;
not shipped here). Each whole line goes to the miner, as `sinkd narrate` reads it (no per-system
log format). Grouping accuracy (Zhu et al., ICSE-SEIP 2019): the share of lines whose template
holds exactly the lines of their labelled event. With `--drain3 PYTHON` (an interpreter with
`drain3` installed; it is not a sinkd dependency) drain3's default miner reads the same lines.
Prints a table; the last line is JSON.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from sinkd.narration.templates import TemplateMiner

DRAIN3 = """
import json, sys
from drain3 import TemplateMiner
m = TemplateMiner()
print(json.dumps([m.add_log_message(l.rstrip("\\n"))["cluster_id"] for l in open(sys.argv[1])]))
"""


def grouping_accuracy(predicted: list[int], truth: list[str]) -> float:
    by_pred: dict[int, set[int]] = defaultdict(set)
    by_true: dict[str, set[int]] = defaultdict(set)
    for i, (p, t) in enumerate(zip(predicted, truth, strict=True)):
        by_pred[p].add(i)
        by_true[t].add(i)
    right = sum(1 for i, p in enumerate(predicted) if by_pred[p] == by_true[truth[i]])
    return right / len(truth)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loghub", type=Path, required=True)
    ap.add_argument("--drain3", help="a Python with drain3 installed")
    args = ap.parse_args()
    rows = []
    for structured in sorted(args.loghub.glob("*_2k.log_structured.csv")):
        log = structured.with_name(structured.name.replace("_structured.csv", ""))
        with structured.open(newline="") as f:
            truth = [r["EventId"] for r in csv.DictReader(f)]
        lines = log.read_text(errors="replace").splitlines()
        if len(lines) != len(truth):
            continue
        miner = TemplateMiner()
        t0 = time.perf_counter()
        ours = [miner.add(line).template.id for line in lines]
        per_line_us = (time.perf_counter() - t0) / len(lines) * 1e6
        row = {
            "system": log.name.split("_")[0],
            "sinkd": round(grouping_accuracy(ours, truth), 3),
            "sinkd_templates": len(set(ours)),
            "truth_templates": len(set(truth)),
            "sinkd_us_per_line": round(per_line_us, 1),
        }
        if args.drain3:
            out = subprocess.run(
                [args.drain3, "-c", DRAIN3, str(log)], capture_output=True, text=True, check=True
            )
            theirs = json.loads(out.stdout)
            row["drain3"] = round(grouping_accuracy(theirs, truth), 3)
            row["drain3_templates"] = len(set(theirs))
        rows.append(row)
    cols = list(rows[0]) if rows else []
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    mean = {
        c: round(sum(r[c] for r in rows) / len(rows), 3)
        for c in ("sinkd", "drain3")
        if rows and c in rows[0]
    }
    print("mean grouping accuracy:", mean)
    print(json.dumps({"rows": rows, "mean": mean}))


if __name__ == "__main__":
    sys.exit(main())
