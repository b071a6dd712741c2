"""The narrator's incidents, missed and false, from its facts alone (no model: the digest decides
what is raised, the model only phrases it).

    python bench/narrate_incidents.py --loghub DIR   -> bench/results/narrate_incidents.json

DIR holds loghub's 2k samples (github.com/logpai/loghub: `<System>/<System>_2k.log`, any folder
layout; not shipped). Two kinds of log:
- labelled: `sinkd eval narrate`'s cases (loghub's BGL with its alert labels, this machine's
  dpkg.log and apt term.log with real error lines spliced in): of the labelled incidents, how
  many a narration cites within 200 lines, and how many are raised as an incident; and the
  incidents raised that cite no labelled line (false ones);
- unlabelled: every other loghub 2k sample and this machine's package logs as they are: incidents
  per 1,000 lines, and how many of them were raised by a burst alone (no error in them);
- no labelled trouble: this machine's package logs whole, a web server's ordinary traffic
  (nginx's access log after `bench/web_traffic.py`, where present), and the lines of BGL and
  Thunderbird that loghub labels as no alert: every incident there is a false one, per 10,000
  lines. Beside each, how many of its lines state ERROR or worse themselves (a level token or a
  syslog priority): loghub's no-alert lines hold hundreds (BGL: `FATAL ciod: Error loading ...`,
  Thunderbird: `sshd: error: Bind to port 22 ... failed`), which the narrator pages on by design.

Each at today's defaults and at the rules before issue 73 (an error template back after one
interval without it was raised again; a new template of INFO lines reaching 10 lines was raised;
one line whose words alone suggest an error was raised, and again like a stated error), so the table shows what the rules changed. Its last line is a JSON object: `labelled` and
`unlabelled` per log, for both.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from common import table, write

from sinkd.evaluation import narrate as ev
from sinkd.narration.facts import Digest, DigestConfig, Facts
from sinkd.narration.severity import ERROR_OR_WORSE, read_severity

RULES = {
    "today": DigestConfig(),
    "before": DigestConfig(
        recur_intervals=1, info_bursts=True, inferred_min=1, inferred_weaker=False
    ),
}
WITHIN = 200  # lines after an incident's first line in which a narration must cite it
PACKAGE_LOGS = ("/var/log/dpkg.log", "/var/log/apt/term.log")
# no labelled trouble: this machine's package logs whole, and the lines loghub labels as no alert
QUIET_LOGS = (
    "/var/log/dpkg.log",
    "/var/log/apt/term.log",
    "/var/log/alternatives.log",
    "/var/log/nginx/access.log",
)
QUIET_SEGMENTS = ("BGL_2k.log", "Thunderbird_2k.log")  # lines starting "- ": no alert


def digest(lines: list[str], config: DigestConfig) -> list[Facts]:
    d = Digest(config, clock=lambda: 0.0)  # a replay: no silences
    cuts = [f for f in map(d.observe, lines) if f is not None]
    last = d.cut()
    return [*cuts, *([last] if last else [])]


def cites(facts: Facts, numbers: set[int] | tuple[int, ...]) -> bool:
    return any(a <= n <= b for a, b in facts.cites() for n in numbers)


def labelled(case: ev.Case, config: DigestConfig) -> dict[str, Any]:
    cuts = digest(case.lines, config)
    cited = raised = 0
    for incident in case.incidents:
        early = [f for f in cuts if f.last_line <= incident.first_line + WITHIN]
        cited += any(cites(f, incident.lines) for f in early)
        raised += any(f.incident and cites(f, incident.lines) for f in early)
    marked = {n for incident in case.incidents for n in incident.lines}
    return {
        "lines": len(case.lines),
        "labelled": len(case.incidents),
        "cited": cited,
        "raised": raised,
        "incidents": sum(f.incident for f in cuts),
        "false": sum(f.incident and not cites(f, marked) for f in cuts),
    }


def unlabelled(lines: list[str], config: DigestConfig) -> dict[str, Any]:
    cuts = digest(lines, config)
    raised = [f for f in cuts if f.incident]
    return {
        "lines": len(lines),
        "intervals": len(cuts),
        "incidents": len(raised),
        "per_1000_lines": round(1000 * len(raised) / max(1, len(lines)), 2),
        "by_bursts_alone": sum(not f.errors for f in raised),
    }


def stating_errors(lines: list[str]) -> int:
    """Lines that state ERROR or worse themselves, not by their words alone."""
    return sum(s >= ERROR_OR_WORSE and said for s, said in map(read_severity, lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loghub", type=Path, required=True)
    args = parser.parse_args()
    samples = {p.name: p for p in sorted(args.loghub.rglob("*_2k.log"))}
    folder = Path(tempfile.mkdtemp())  # `ev.cases` reads the samples by name from one folder
    for name, path in samples.items():
        (folder / name).write_bytes(path.read_bytes())
    cases = ev.cases(folder, 2000)
    used = {"BGL_2k.log"}  # the labelled case's; the spliced ones take a few lines each
    plain = {
        n: p.read_text(errors="replace").splitlines() for n, p in samples.items() if n not in used
    }
    for base in PACKAGE_LOGS:
        if Path(base).exists():
            plain[base] = Path(base).read_text(errors="replace").splitlines()[:2000]
    results: dict[str, Any] = {"labelled": {}, "unlabelled": {}, "no_trouble": {}}
    quiet = {
        b: Path(b).read_text(errors="replace").splitlines() for b in QUIET_LOGS if Path(b).exists()
    }
    for name in QUIET_SEGMENTS:
        if name in samples:
            raw = samples[name].read_text(errors="replace").splitlines()
            quiet[f"{name}, no-alert lines"] = [line[2:] for line in raw if line.startswith("- ")]
    rows_q = []
    for name, lines in quiet.items():
        got = {rule: unlabelled(lines, cfg) for rule, cfg in RULES.items()}
        for g in got.values():
            g["per_10000_lines"] = round(10_000 * g["incidents"] / max(1, len(lines)), 1)
        stating = stating_errors(lines)
        results["no_trouble"][name] = {**got, "lines_stating_errors": stating}
        t, b = got["today"], got["before"]
        rows_q.append([name, t["lines"], stating, f"{t['incidents']} / {b['incidents']}",
                       f"{t['per_10000_lines']} / {b['per_10000_lines']}"])  # fmt: skip
    rows_l, rows_u = [], []
    for case in cases:
        got = {rule: labelled(case, cfg) for rule, cfg in RULES.items()}
        results["labelled"][case.name] = got
        t, b = got["today"], got["before"]
        rows_l.append([case.name, t["lines"], t["labelled"], f"{t['cited']} / {b['cited']}",
                       f"{t['raised']} / {b['raised']}", f"{t['incidents']} / {b['incidents']}",
                       f"{t['false']} / {b['false']}"])  # fmt: skip
    for name, lines in plain.items():
        got = {rule: unlabelled(lines, cfg) for rule, cfg in RULES.items()}
        results["unlabelled"][name] = got
        t, b = got["today"], got["before"]
        rows_u.append([name, t["lines"], f"{t['incidents']} / {b['incidents']}",
                       f"{t['per_1000_lines']} / {b['per_1000_lines']}",
                       f"{t['by_bursts_alone']} / {b['by_bursts_alone']}"])  # fmt: skip
    table(
        "labelled incidents (today / before)",
        ["log", "lines", "labelled", "cited", "raised", "incidents", "false incidents"],
        rows_l,
    )
    table(
        "logs without labels (today / before)",
        ["log", "lines", "incidents", "per 1,000 lines", "by a burst alone"],
        rows_u,
    )
    table(
        "no labelled trouble: false incidents (today / before)",
        ["log", "lines", "stating ERROR or worse", "incidents", "per 10,000 lines"],
        rows_q,
    )
    print(f"wrote {write('narrate_incidents', results)}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
