"""The narrator's incidents, missed and false, from its facts alone: the digest decides what is
raised (narration/facts.py), the model only phrases it, so no model is needed here.

Three kinds of log:
- labelled (`narrate.cases`: loghub's BGL with its alert labels, this machine's dpkg.log and apt
  term.log with real error lines spliced in): of the labelled incidents, how many a narration cites
  within `WITHIN` lines, how many are raised as an incident, and the incidents that cite no
  labelled line (false ones);
- unlabelled: every other loghub 2k sample, and this machine's package logs: incidents per 1,000
  lines, and how many a burst alone raised (no error in them);
- no labelled trouble (`QUIET_LOGS`; the lines of BGL and Thunderbird that loghub labels as no
  alert; and their normal segments, runs of 200 lines or more with no alert label): every incident
  there is a false one, per 10,000 lines; beside each, how many of its lines
  state ERROR or worse themselves (a level token or a syslog priority), which the narrator pages on
  by design.

Each at today's rules and at the rules before issue 73 (`RULES`), so a table shows what they changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sinkd.evaluation import narrate as ev
from sinkd.narration.facts import Digest, DigestConfig, Facts
from sinkd.narration.severity import ERROR_OR_WORSE, read_severity

RULES = {
    "today": DigestConfig(),
    # an error back after one interval raised again; a new INFO template reaching 10 lines raised;
    # one line whose words alone suggest an error raised, and again as a stated one would be,
    # though its program said it carried on past it
    "before": DigestConfig(
        recur_intervals=1,
        info_bursts=True,
        inferred_min=1,
        inferred_weaker=False,
        page_handled=True,
    ),
}
WITHIN = 200  # lines after an incident's first line in which a narration must cite it
PACKAGE_LOGS = ("/var/log/dpkg.log", "/var/log/apt/term.log")
# no labelled trouble: this machine's package logs whole, and a web server's ordinary traffic
# (nginx's access log after `bench/web_traffic.py`), where present
QUIET_LOGS = (
    "/var/log/dpkg.log",
    "/var/log/apt/term.log",
    "/var/log/alternatives.log",
    "/var/log/nginx/access.log",
)
QUIET_SAMPLES = ("BGL_2k.log", "Thunderbird_2k.log")  # lines starting "- ": no alert
SEGMENT_MIN = 200  # a normal segment: this many lines in a row, none labelled an alert


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
        "per_10000_lines": round(10_000 * len(raised) / max(1, len(lines)), 1),
        "by_bursts_alone": sum(not f.errors for f in raised),
    }


def stating_errors(lines: list[str]) -> int:
    """Lines that state ERROR or worse themselves, not by their words alone."""
    return sum(s >= ERROR_OR_WORSE and said for s, said in map(read_severity, lines))


def _read(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()


def quiet_logs(loghub: Path, machine_logs: tuple[str, ...] = QUIET_LOGS) -> dict[str, list[str]]:
    """The logs with no labelled trouble that this machine has, by name."""
    quiet = {name: _read(Path(name)) for name in machine_logs if Path(name).exists()}
    for name in QUIET_SAMPLES:
        if (loghub / name).exists():
            raw = _read(loghub / name)
            quiet[f"{name}, no-alert lines"] = [line[2:] for line in raw if line.startswith("- ")]
            segments = normal_segments(raw)
            if segments and len(segments) < len(raw):
                quiet[f"{name}, normal segments"] = segments
    return quiet


def normal_segments(raw: list[str]) -> list[str]:
    """The runs of at least SEGMENT_MIN lines with no alert label (loghub's "- "), labels cut,
    one after another: the stretches of the sample where nothing was labelled, whole."""
    out: list[str] = []
    run: list[str] = []
    for line in [*raw, ""]:  # "" ends the last run
        if line.startswith("- "):
            run.append(line[2:])
            continue
        if len(run) >= SEGMENT_MIN:
            out += run
        run = []
    return out


def evaluate(
    loghub: Path, max_lines: int = 2000, machine_logs: tuple[str, ...] = QUIET_LOGS
) -> dict[str, Any]:
    """`labelled`, `unlabelled` and `no_trouble`, each log at both `RULES`; `pooled`: the false
    incidents per 10,000 lines over the logs with no trouble whose lines state no error.
    `machine_logs`: this machine's logs with no trouble."""
    results: dict[str, Any] = {"labelled": {}, "unlabelled": {}, "no_trouble": {}}
    for case in ev.cases(loghub, max_lines):
        results["labelled"][case.name] = {r: labelled(case, c) for r, c in RULES.items()}
    plain = {p.name: _read(p) for p in sorted(loghub.glob("*_2k.log")) if p.name != "BGL_2k.log"}
    for base in PACKAGE_LOGS:
        if Path(base).exists():
            plain[base] = _read(Path(base))[:max_lines]
    for name, lines in plain.items():
        results["unlabelled"][name] = {r: unlabelled(lines, c) for r, c in RULES.items()}
    lines_, incidents = 0, 0
    for name, lines in quiet_logs(loghub, machine_logs).items():
        got: dict[str, Any] = {r: unlabelled(lines, c) for r, c in RULES.items()}
        got["lines_stating_errors"] = stating = stating_errors(lines)
        results["no_trouble"][name] = got
        if stating == 0:
            lines_ += len(lines)
            incidents += got["today"]["incidents"]
    results["pooled"] = {
        "logs_stating_no_error_lines": lines_,
        "incidents": incidents,
        "per_10000_lines": round(10_000 * incidents / max(1, lines_), 2),
    }
    return results


def tables(results: dict[str, Any]) -> list[tuple[str, list[str], list[list[Any]]]]:
    """The results as (title, columns, rows) tables: labelled, unlabelled, no trouble."""

    def both(got: dict[str, Any], key: str) -> str:
        return f"{got['today'][key]} / {got['before'][key]}"

    labelled_rows = [
        [name, g["today"]["lines"], g["today"]["labelled"], both(g, "cited"), both(g, "raised"),
         both(g, "incidents"), both(g, "false")]
        for name, g in results["labelled"].items()
    ]  # fmt: skip
    unlabelled_rows = [
        [name, g["today"]["lines"], both(g, "incidents"), both(g, "per_1000_lines"),
         both(g, "by_bursts_alone")]
        for name, g in results["unlabelled"].items()
    ]  # fmt: skip
    quiet_rows = [
        [name, g["today"]["lines"], g["lines_stating_errors"], both(g, "incidents"),
         both(g, "per_10000_lines")]
        for name, g in results["no_trouble"].items()
    ]  # fmt: skip
    pooled = results["pooled"]
    quiet_rows.append(
        ["pooled: the logs whose lines state no error", pooled["logs_stating_no_error_lines"], 0,
         pooled["incidents"], pooled["per_10000_lines"]]
    )  # fmt: skip
    return [
        (
            "labelled incidents (today / before)",
            ["log", "lines", "labelled", "cited", "raised", "incidents", "false incidents"],
            labelled_rows,
        ),
        (
            "logs without labels (today / before)",
            ["log", "lines", "incidents", "per 1,000 lines", "by a burst alone"],
            unlabelled_rows,
        ),
        (
            "no labelled trouble: false incidents (today / before)",
            ["log", "lines", "stating ERROR or worse", "incidents", "per 10,000 lines"],
            quiet_rows,
        ),
    ]
