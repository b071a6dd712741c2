"""`sinkd eval narrate`: real logs with labelled incidents, replayed at a fixed rate through a
narrator (`sinkd narrate --json`, or today's narrator loaded from a git ref), scored by what it
printed.

The cases (`cases`):
- `bgl`: loghub's BGL_2k (a Blue Gene/L RAS log, github.com/logpai/loghub), its alert labels
  removed from the lines; an incident is a run of alert lines of one category (a gap of under
  100 lines joins a run).
- `dpkg`, `apt-term`: this machine's /var/log/dpkg.log and /var/log/apt/term.log, with real error
  lines from loghub's Apache_2k and OpenSSH_2k and Linux_2k spliced in at fixed places (each a
  labelled incident).

Per run: an incident is **mentioned** when a narration whose interval ends before
`first line + within` (today's narrator: whose lines read end there) cites a line range holding one
of its lines, or (today's narrator, which cites nothing) its text holds a word of the incident's
lines that the log had not said before. How long after its interval a narration printed is the lag,
reported apart (the model's load and its phrasing). A
narration is **unsupported** when a sentence it printed fails the check against every line of its
interval (all of them, not only the cited ones the narrator kept): a second, wider look than the
narrator's own. Lag is lines read past a narration's last line when it printed.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sinkd.narration.grounding import sentences_of, unsupported_claims, words_of

SPLICES = {  # where each case's spliced incidents go, and which real lines (loghub file, filter)
    "dpkg": [
        (200, "Apache_2k.log", r"\[error\] mod_jk child workerEnv in error state", 6),
        (500, "OpenSSH_2k.log", r"error: Received disconnect", 1),
        (800, "Linux_2k.log", r"authentication failure", 4),
    ],
    "apt-term": [
        (250, "Linux_2k.log", r"authentication failure", 5),
        (550, "Apache_2k.log", r"\[error\] \[client", 3),
        (850, "OpenSSH_2k.log", r"Failed password for invalid user", 8),
    ],
}
BASES = {"dpkg": "/var/log/dpkg.log", "apt-term": "/var/log/apt/term.log"}
_WORD = re.compile(r"[A-Za-z]{4,}")


@dataclass(frozen=True)
class Incident:
    first_line: int
    lines: tuple[int, ...]
    label: str
    words: frozenset[str]  # words of its lines the log had not said before it


@dataclass
class Case:
    name: str
    source: str
    lines: list[str]
    incidents: list[Incident] = field(default_factory=list)


def cases(loghub: Path, max_lines: int) -> list[Case]:
    out = [bgl_case(loghub, max_lines)]
    for name, base in BASES.items():
        if Path(base).exists():
            out.append(spliced_case(name, Path(base), loghub, max_lines))
    return out


def bgl_case(loghub: Path, max_lines: int) -> Case:
    raw = (loghub / "BGL_2k.log").read_text(errors="replace").splitlines()[:max_lines]
    labels = [line.split(" ", 1)[0] for line in raw]
    lines = ["- " + line.split(" ", 1)[1] for line in raw]
    runs: list[tuple[str, list[int]]] = []
    last_of: dict[str, int] = {}
    for i, label in enumerate(labels, 1):
        if label == "-":
            continue
        if label in last_of and i - last_of[label] < 100:
            next(r for r in reversed(runs) if r[0] == label)[1].append(i)
        else:
            runs.append((label, [i]))
        last_of[label] = i
    return Case(
        "bgl", "loghub BGL_2k.log", lines, [_incident(lines, n, label) for label, n in runs]
    )


def spliced_case(name: str, base: Path, loghub: Path, max_lines: int) -> Case:
    lines = base.read_text(errors="replace").splitlines()
    lines = [line for line in lines if line.strip()][: max_lines - 30]
    spliced: list[tuple[int, str, list[str]]] = []
    for at, source, pattern, count in SPLICES[name]:
        real = [
            line
            for line in (loghub / source).read_text(errors="replace").splitlines()
            if re.search(pattern, line)
        ][:count]
        spliced.append((at, f"{source}: {pattern}", real))
    out: list[str] = []
    numbers: list[tuple[str, list[int]]] = []
    for i, line in enumerate(lines):
        for at, label, real in spliced:
            if i == at:
                numbers.append((label, list(range(len(out) + 1, len(out) + 1 + len(real)))))
                out.extend(real)
        out.append(line)
    return Case(
        name,
        f"{base} ({len(lines)} lines) + loghub lines",
        out,
        [_incident(out, n, label) for label, n in numbers],
    )


def _incident(lines: list[str], numbers: list[int], label: str) -> Incident:
    before = {w.lower() for line in lines[: numbers[0] - 1] for w in _WORD.findall(line)}
    words = {w.lower() for n in numbers for w in _WORD.findall(lines[n - 1])} - before
    return Incident(numbers[0], tuple(numbers), label, frozenset(words))


@dataclass
class Run:
    events: list[tuple[int, dict[str, Any]]]  # (lines fed when it arrived, the event)
    seconds: float


def replay(command: list[str], lines: list[str], rate: float, timeout: float) -> Run:
    """Feed `lines` at `rate` lines a second (0: as fast as the pipe takes them) to `command`,
    noting how many were fed when each JSON event arrived."""
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    fed = [0]
    events: list[tuple[int, dict[str, Any]]] = []

    def read(stdout: IO[bytes]) -> None:
        for raw in stdout:
            if raw.startswith(b"{"):
                events.append((fed[0], json.loads(raw)))

    reader = threading.Thread(target=read, args=(proc.stdout,), daemon=True)
    reader.start()
    start = time.monotonic()
    try:
        for i, line in enumerate(lines):
            if rate > 0:
                wait = start + i / rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
            fed[0] = i + 1
        proc.stdin.close()
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    return Run(events, time.monotonic() - start)


def score(case: Case, run: Run, within: int, facts: bool) -> dict[str, Any]:
    narrations = [(fed, e) for fed, e in run.events if e.get("event") == "narration"]
    summary = next((e for _, e in run.events if e.get("event") == "summary"), {})
    mentioned = 0
    for incident in case.incidents:
        for _, e in narrations:
            reached = e["lines"][1] if facts else e["lines_appended"] + e["lines_dropped"]
            if reached > incident.first_line + within:
                break
            cited = facts and any(
                a <= n <= b for a, b in e.get("cites", []) for n in incident.lines
            )
            said = bool(incident.words & {w.lower() for w in _WORD.findall(e.get("text", ""))})
            if cited or said:
                mentioned += 1
                break
    unsupported_after = unsupported_before = 0
    lags: list[int] = []
    covered = 0
    for fed, e in narrations:
        if facts:
            first, last = e["lines"]
        else:  # today's narrator: the lines it read since its last narration
            first, last = covered + 1, e["lines_appended"] + e["lines_dropped"]
        covered = last
        lags.append(fed - last)
        if e.get("quiet"):
            continue
        support = frozenset(
            words_of(" ".join(case.lines[first - 1 : last]) + " " + e.get("facts_text", ""))
            | words_of(f"In lines {first}-{last}, the log shows")
        )
        printed = bool(e["text"]) and any(
            unsupported_claims(s, support) for s in sentences_of(e["text"])
        )
        unsupported_after += printed
        unsupported_before += printed or bool(e.get("unsupported"))
    return {
        "case": case.name,
        "lines": len(case.lines),
        "incidents": len(case.incidents),
        "recall": round(mentioned / len(case.incidents), 3) if case.incidents else None,
        "narrations": len(narrations),
        "phrased": summary.get("phrased", len(narrations)),
        "unsupported_before_check": unsupported_before,
        "unsupported_printed": unsupported_after,
        "lag_median_lines": statistics.median(lags) if lags else None,
        "lag_max_lines": max(lags) if lags else None,
        "seconds": round(run.seconds, 1),
        "rss_mib": round(summary.get("rss_bytes", 0) / 2**20, 1),
    }


def narrator_at(ref: str, folder: Path) -> Path:
    """Today's narrator: `cli/narrate.py` as it was at `ref`, written into `folder`, run as it was
    (it imports only parts of sinkd that are still there)."""
    from sinkd.errors import InvalidInput

    old = subprocess.run(
        ["git", "show", f"{ref}:cli/narrate.py"], capture_output=True, text=True, check=False
    )
    if old.returncode:
        raise InvalidInput(f"--before: {old.stderr.strip()[:200]}")
    path = folder / "narrate_before.py"
    path.write_text(old.stdout)
    return path


def narrate_command(model: str, every_lines: int, before: Path | None) -> list[str]:
    # a short queue: today's narrator drains it at the model's prefill speed before it ends
    args = ["--embedded", "-m", model, "--every-lines", str(every_lines), "--queue-lines", "64"]
    args.append("--json")
    if before is None:
        return [sys.executable, "-m", "sinkd.cli.main", "narrate", *args]
    runner = (
        "import importlib.util, sys, typer;"
        f"spec = importlib.util.spec_from_file_location('narrate_before', {str(before)!r});"
        "m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m);"
        "sys.argv = ['narrate', *sys.argv[1:]]; typer.run(m.narrate)"
    )
    return [sys.executable, "-c", runner, *args]


def throughput(lines: list[str], model: str, every_lines: int, repeat: int) -> dict[str, Any]:
    """Lines a second the narrator sustains unpaced, and its memory after `repeat` copies."""
    command = narrate_command(model, every_lines, None)
    run = replay(command, lines * repeat, 0, 1800)
    summary = next((e for _, e in run.events if e.get("event") == "summary"), {})
    rss = [e["rss_bytes"] for _, e in run.events if "rss_bytes" in e]
    third = max(1, len(rss) // 3)
    return {
        "lines": summary.get("lines_read"),
        "seconds": round(run.seconds, 1),
        "lines_per_second": round(summary.get("lines_read", 0) / run.seconds, 1),
        "narrations": summary.get("narrations"),
        "phrased": summary.get("phrased"),
        "rss_mib_first_third_min": round(min(rss[:third]) / 2**20, 1) if rss else None,
        "rss_mib_last_third_min": round(min(rss[-third:]) / 2**20, 1) if rss else None,
    }
