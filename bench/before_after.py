"""A benchmark before and after a change, in the same run: this checkout's script (the measurement)
on each tree (what is measured), taking turns, so that the machine's drift (this one is shared)
falls on both alike.

    python bench/before_after.py --ref 8291b85 engine_cpu.py
    python bench/before_after.py --ref 8291b85 --rounds 2 concurrency.py
    python bench/before_after.py --ref 8291b85 overhead.py -- --rounds 3
        -> bench/results/before_after_<script>.json

The "before" side is a git worktree of REF (removed afterwards), imported as `sinkd` through a
folder of links made as the type check's (Makefile: its folders under one name), ahead of the
installed tree on PYTHONPATH; the "after" side is this checkout. Each round runs both (the order
alternating), each writing the script's results JSON (read back at once); every number in them is
reported as
the median over the rounds, before and after, for the keys `--keys` names (dotted paths; all the
numbers by default), with after/before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import table, write

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FOLDERS = ("cachepolicy", "daemon", "evaluation", "cli", "proto")


def importable(tree: Path, into: Path) -> Path:
    """A folder in which `import sinkd` finds `tree` (its `sinkd/` files and its design folders)."""
    pkg = into / "sinkd"
    pkg.mkdir(parents=True)
    for f in (tree / "sinkd").iterdir():
        (pkg / f.name).symlink_to(f)
    for d in FOLDERS:
        (pkg / d).symlink_to(tree / d)
    return into


def run_side(tree: Path, path: Path | None, script: str, args: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = f"{path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    check = "import sinkd, sys; sys.stdout.write(sinkd.__file__)"
    where = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True)
    if not where.stdout.startswith(str(tree)) and not Path(where.stdout).resolve().is_relative_to(
        tree
    ):
        raise SystemExit(f"sinkd imports from {where.stdout!r}, not {tree}")
    subprocess.run([sys.executable, script, *args], cwd=HERE, env=env, check=True)
    name = Path(script).stem
    return dict(json.loads((HERE / "results" / f"{name}.json").read_text()))


def numbers(d: Any, prefix: str = "") -> dict[str, float]:
    """Every number in a results JSON, by dotted path (list items by index)."""
    out: dict[str, float] = {}
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else []
    for k, v in items:
        key = f"{prefix}{k}"
        if isinstance(v, bool):
            continue
        if isinstance(v, int | float):
            out[key] = float(v)
        else:
            out.update(numbers(v, key + "."))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ref", required=True, help="the commit before the change")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--keys", nargs="*", default=[], help="dotted prefixes to report")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    args = [x for x in a.args if x != "--"]
    tmp = Path(tempfile.mkdtemp())
    before = tmp / "before"
    subprocess.run(["git", "worktree", "add", "--detach", str(before), a.ref], cwd=ROOT, check=True)
    try:
        path = importable(before, tmp / "import")
        runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for r in range(a.rounds):
            sides = [("before", before, path), ("after", ROOT, None)]
            for side, tree, imp in sides if r % 2 == 0 else sides[::-1]:
                runs[side].append(numbers(run_side(tree, imp, a.script, args)))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT)
    keys = [k for k in runs["after"][0] if k in runs["before"][0]]
    if a.keys:
        keys = [k for k in keys if any(k.startswith(p) for p in a.keys)]
    rows, report = [], {}
    for k in keys:
        b = statistics.median(r[k] for r in runs["before"])
        f = statistics.median(r[k] for r in runs["after"])
        ratio = f / b if b else float("nan")
        rows.append([k, b, f, ratio])
        report[k] = {"before": b, "after": f, "after_over_before": ratio}
    table(f"{a.script} before ({a.ref}) and after, medians of {a.rounds} rounds each",
          ["key", "before", "after", "after/before"], rows)  # fmt: skip
    write(f"before_after_{Path(a.script).stem}",
          {"ref": a.ref, "script": a.script, "args": args, "rounds": a.rounds, "results": report,
           "runs": runs})  # fmt: skip


if __name__ == "__main__":
    main()
