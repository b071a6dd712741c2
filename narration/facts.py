"""What a stretch of log says, computed from its lines and never invented.

`Digest` reads every line (a template and its severity each), and cuts the stream into intervals:
every `every_lines` lines, and early for an incident. An incident is a template at error or worse
that is new or back after quiet intervals (where only its words say error, not its stated level,
and they name no crash: when it comes twice, not counting lines its program said it carried past,
and once known only as a burst), or a template new
since the first interval whose count reaches `burst_min`; its interval closes `incident_lines`
lines (or `incident_seconds`) after its first line, so a flood becomes one interval with a count,
not an interval per line. A template already in the previous interval starts no incident: a flood that
goes on is counted, not re-raised.

Each cut gives a `Facts`: the templates new since the start, every error-or-worse template, rates
that jumped against their own baseline, templates that were steady and stopped, and silences in the
stream, each with counts and line numbers, and the words of the lines they cite (`support`), which
is what a model's sentence about them is checked against.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import astuple, dataclass, field, replace
from typing import Any

from sinkd.narration.grounding import words_of
from sinkd.narration.severity import (
    ERROR_OR_WORSE,
    Severity,
    carries_on,
    program_of,
    read_severity,
)
from sinkd.narration.templates import MASK, TemplateMiner

RATE_WEIGHT = 0.3  # each interval's weight in a template's baseline rate (per line)
MAX_MUTED = 256  # templates a stream may have muted
MAX_INCIDENTS = 50  # incidents opened or ended listed per interval (all are tracked)
SHOWN_CHARS = 120  # a template as printed and given to the model
HANDLED_WITHIN = 3  # lines after a failure in which its program may say it carried on


@dataclass(frozen=True)
class DigestConfig:
    every_lines: int = 200
    incident_lines: int = 20
    incident_seconds: float = 1.0
    gap_seconds: float = 60.0
    burst_min: int = 10  # lines in one interval before a rate jump counts
    recur_intervals: int = 3  # an error template back after this many intervals without it
    inferred_min: int = 2  # lines of an error its words suggest (no stated level) before a page
    inferred_weaker: bool = True  # such an error, once known, pages only as a burst (False: the
    # rules before issue 73, for bench/narrate_incidents.py's comparison)
    info_bursts: bool = False  # a new INFO template bursting is an incident too (else a fact)
    page_handled: bool = False  # a failure its program says it carried past ("falling back to",
    # "deferred", "-- using"), where only words say it, pages as any (else it is listed only)
    burst_factor: float = 4.0  # this many times the template's baseline rate
    steady_intervals: int = 3  # present in this many intervals in a row before "stopped" can say so
    stop_min_expected: float = 5.0  # and expected at least this many times in the interval
    max_listed: int = 5  # per kind of fact; the rest are counted in `omitted`
    example_chars: int = 200
    support_tokens: int = 256  # words kept per template per interval for the check


@dataclass(frozen=True)
class TemplateFact:
    template_id: int
    template: str  # `<*>` where its lines differ
    severity: str
    count: int  # lines in this interval (0 for a template that stopped)
    first_line: int  # its first and last line in this interval (stopped: the last line it had)
    last_line: int
    total: int  # lines since the start
    since_line: int  # the first line it had since the start
    example: str  # its first line in this interval, cut to `example_chars`
    usual_per_100: float = 0.0  # its baseline rate, lines per 100 (bursts and stops)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def shown(self) -> str:
        """The template as a reader sees it: runs of values as one `*`, no leading values."""
        words: list[str] = []
        for token in self.template.split():
            if token == MASK:
                if words and words[-1] != "*":
                    words.append("*")
            elif token not in "-|:":
                words.append(token)
        shown = " ".join(words) or self.example
        return shown if len(shown) <= SHOWN_CHARS else shown[: SHOWN_CHARS - 3] + "..."


@dataclass(frozen=True)
class Gap:
    after_line: int
    seconds: float


@dataclass(frozen=True)
class Incident:
    """A template that raised an incident (`opened`), or whose incident ended: the template had
    no line in a whole interval (`ended`). What an operator is paged for, and told is over."""

    template_id: int
    template: str  # as shown (`TemplateFact.shown`)
    severity: str
    first_line: int  # the line that raised it
    last_line: int  # its latest line (opened: in the raising interval)
    count: int  # its lines in the intervals since (the raising one whole)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Facts:
    number: int  # 1 for the first interval
    first_line: int
    last_line: int
    templates: int  # distinct templates in this interval
    known: int  # templates known so far
    new: tuple[TemplateFact, ...]
    errors: tuple[TemplateFact, ...]
    bursts: tuple[TemplateFact, ...]
    stopped: tuple[TemplateFact, ...]
    gaps: tuple[Gap, ...]
    incident: bool
    omitted: int
    support: frozenset[str] = field(repr=False)
    opened: tuple[Incident, ...] = ()  # incidents raised in this interval
    ended: tuple[Incident, ...] = ()  # incidents whose template had no line in it

    @property
    def lines(self) -> int:
        return self.last_line - self.first_line + 1

    @property
    def quiet(self) -> bool:
        """Nothing an operator would act on: no incident, nothing new (the first interval names
        what the log is made of), no errors, no jumps, nothing stopped, no silence."""
        return not (
            self.incident
            or self.new
            or self.errors
            or self.bursts
            or self.stopped
            or self.gaps
            or self.ended
        )

    def listed(self) -> list[TemplateFact]:
        seen: dict[int, TemplateFact] = {}
        for fact in (*self.errors, *self.new, *self.bursts, *self.stopped):
            seen.setdefault(fact.template_id, fact)
        return list(seen.values())

    def cites(self) -> list[tuple[int, int]]:
        """The line ranges the facts rest on, merged."""
        spans = sorted((f.first_line, f.last_line) for f in self.listed())
        spans += [(g.after_line, g.after_line + 1) for g in self.gaps]
        merged: list[tuple[int, int]] = []
        for a, b in sorted(spans):
            if merged and a <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
            else:
                merged.append((a, b))
        return merged

    def steady(self) -> str:
        return f"steady: {self.templates} templates, {self.lines} lines ({self.first_line}-{self.last_line})"

    def render(self) -> str:
        """The facts as plain lines: what is printed, and what the model is given to phrase."""
        kinds = "1 kind" if self.templates == 1 else f"{self.templates} kinds"
        out = [f"Log lines {self.first_line}-{self.last_line}: {_lines(self.lines)} of {kinds}."]
        for fact in self.errors:
            out.append(
                f'{fact.severity.upper()}: {_lines(fact.count)} "{fact.shown()}"'
                f" ({_span(fact)}; {fact.total} since line {fact.since_line})."
            )
        for fact in self.new:
            if fact.severity in ("error", "critical"):
                continue  # said above
            out.append(f'NEW: {_lines(fact.count)} "{fact.shown()}" ({_span(fact)}).')
        for fact in self.bursts:
            out.append(
                f'MORE THAN USUAL: {_lines(fact.count)} "{fact.shown()}" ({_span(fact)}),'
                f" usually {fact.usual_per_100:.1f} per 100 lines."
            )
        for fact in self.stopped:
            out.append(f'STOPPED: "{fact.shown()}" (last at line {fact.last_line}).')
        for gap in self.gaps:
            out.append(f"SILENT: no lines for {gap.seconds:.0f} s after line {gap.after_line}.")
        for over in self.ended:
            out.append(
                f'OVER: "{over.template}" ({_lines(over.count)} from line {over.first_line},'
                f" the last at line {over.last_line})."
            )
        if self.omitted:
            out.append(f"({self.omitted} more facts not listed.)")
        return "\n".join(out)

    @classmethod
    def from_dict(cls, d: dict[str, Any], support: frozenset[str] = frozenset()) -> Facts:
        """The facts `as_dict` gave (a narrated stream's, kept by the daemon)."""

        def facts(kind: str) -> tuple[TemplateFact, ...]:
            return tuple(TemplateFact(**f) for f in d[kind])

        return cls(
            number=d["number"],
            first_line=d["first_line"],
            last_line=d["last_line"],
            templates=d["templates"],
            known=d["known_templates"],
            new=facts("new"),
            errors=facts("errors"),
            bursts=facts("bursts"),
            stopped=facts("stopped"),
            gaps=tuple(Gap(**g) for g in d["gaps"]),
            incident=d["incident"],
            omitted=d["omitted"],
            support=support,
            opened=tuple(Incident(**i) for i in d.get("opened", [])),
            ended=tuple(Incident(**i) for i in d.get("ended", [])),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "first_line": self.first_line,
            "last_line": self.last_line,
            "lines": self.lines,
            "templates": self.templates,
            "known_templates": self.known,
            "incident": self.incident,
            "quiet": self.quiet,
            "new": [f.as_dict() for f in self.new],
            "errors": [f.as_dict() for f in self.errors],
            "bursts": [f.as_dict() for f in self.bursts],
            "stopped": [f.as_dict() for f in self.stopped],
            "gaps": [g.__dict__ for g in self.gaps],
            "omitted": self.omitted,
            "cites": [list(c) for c in self.cites()],
            "opened": [i.as_dict() for i in self.opened],
            "ended": [i.as_dict() for i in self.ended],
        }


@dataclass
class _Tally:
    """One template within the interval being read."""

    count: int = 0
    first_line: int = 0
    last_line: int = 0
    severity: Severity = Severity.INFO
    example: str = ""
    words: set[str] = field(default_factory=set)
    # a line of it stated error or worse, or its words named a crash (panic, segfault, out of
    # memory): not only words a routine line says too ("denied", "unable to")
    sure: bool = False
    handled: int = 0  # lines of it its program said it carried past (unless `page_handled`)


@dataclass
class _Known:
    """One template across intervals."""

    total: int = 0
    since_line: int = 0
    last_line: int = 0
    rate: float = 0.0  # baseline lines per line, weighted over intervals
    streak: int = 0  # intervals in a row it was present in
    intervals: int = 0  # intervals since it was first seen
    present_in: int = 0  # the last closed interval it was present in (0: none)


class Digest:
    """Not thread-safe: the narrator holds a lock around it."""

    def __init__(
        self,
        config: DigestConfig | None = None,
        miner: TemplateMiner | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or DigestConfig()
        self.miner = miner if miner is not None else TemplateMiner()  # an empty one is falsy
        self.clock = clock
        self.lines = 0  # lines read since the start
        self._number = 0
        self._first = 1  # the first line of the interval being read
        self._tallies: dict[int, _Tally] = {}
        self._known: dict[int, _Known] = {}
        self._raised: dict[int, int] = {}  # templates that raised an incident here: the line
        self._open: dict[int, Incident] = {}  # raised and not yet over, by template
        self._incident_at: int | None = None  # the line that closes the incident's interval
        self._incident_since = 0.0
        self._gaps: list[Gap] = []
        self.muted: set[int] = set()  # templates the operator muted: listed, never paged
        self._last_time: float | None = None
        # the last few lines whose words alone said error: line, template, program
        self._unhandled: list[tuple[int, int, str]] = []

    def observe(self, line: str) -> Facts | None:
        """Read one line; the interval it closes, if it closes one."""
        cfg = self.config
        now = self.clock()
        self.lines += 1
        n = self.lines
        if self._last_time is not None and now - self._last_time >= cfg.gap_seconds:
            self._gaps.append(Gap(n - 1, round(now - self._last_time, 1)))
        self._last_time = now
        severity, stated = read_severity(line)
        inferred = severity == Severity.ERROR and not stated
        if self._unhandled and n - self._unhandled[-1][0] > HANDLED_WITHIN:
            self._unhandled = []  # no failure left that a line may still say was handled
        carried_on = (
            not cfg.page_handled and (inferred or bool(self._unhandled)) and carries_on(line)
        )
        if carried_on and inferred:
            # "unable to qualify my own domain name -- using short name": handled, a warning
            severity = Severity.WARNING
        match = self.miner.add(line, n, severity.label)
        tid = match.template.id
        known = self._known.get(tid)
        if known is None:
            known = self._known[tid] = _Known(since_line=n)
        known.total += 1
        known.last_line = n
        tally = self._tallies.get(tid)
        if tally is None:
            tally = self._tallies[tid] = _Tally(
                first_line=n, example=line[: cfg.example_chars].rstrip()
            )
        tally.count += 1
        tally.last_line = n
        tally.severity = max(tally.severity, severity)
        tally.sure = (
            tally.sure or severity >= Severity.CRITICAL or (stated and severity >= ERROR_OR_WORSE)
        )
        if len(tally.words) < cfg.support_tokens:
            tally.words.update(line.split()[: cfg.support_tokens - len(tally.words)])
        if carried_on or (inferred and not cfg.page_handled):
            self._note_handling(line, n, tid, carried_on)
        if tid not in self._raised and self._starts_incident(tid, severity, tally, known):
            self._raised[tid] = n
            if self._incident_at is None:
                self._incident_at = n + cfg.incident_lines - 1
                self._incident_since = now
        if self._incident_at is not None and n >= self._incident_at:
            return self._cut(incident=True)
        if n - self._first + 1 >= cfg.every_lines:  # an incident that began here closes with it
            return self._cut(incident=self._incident_at is not None)
        return None

    def due(self) -> Facts | None:
        """The incident's interval, once `incident_seconds` have passed since its first line."""
        if (
            self._incident_at is not None
            and self.clock() - self._incident_since >= self.config.incident_seconds
        ):
            return self._cut(incident=True)
        return None

    def cut(self) -> Facts | None:
        """The interval read so far (a time bound, or the end of the stream); None if empty."""
        if self.lines < self._first:
            return None
        return self._cut(incident=self._incident_at is not None)

    def state(self) -> dict[str, Any]:
        """Everything the digest knows, as JSON-ready values (the miner's templates, each
        template's baseline, the interval being read): `restored` continues from it as if the
        lines had never stopped, but for silences, which a restart does not claim."""
        now = self.clock()
        return {
            "miner": self.miner.state(),
            "lines": self.lines,
            "number": self._number,
            "first": self._first,
            "tallies": [
                [
                    tid,
                    t.count,
                    t.first_line,
                    t.last_line,
                    int(t.severity),
                    t.example,
                    sorted(t.words),
                    t.sure,
                    t.handled,
                ]
                for tid, t in self._tallies.items()
            ],
            "unhandled": [list(u) for u in self._unhandled],
            "known": [[tid, *astuple(k)] for tid, k in self._known.items()],
            "raised": sorted(self._raised.items()),
            "open": [i.as_dict() for i in self._open.values()],
            "incident_at": self._incident_at,
            "incident_for": now - self._incident_since if self._incident_at is not None else 0.0,
            "gaps": [[g.after_line, g.seconds] for g in self._gaps],
            "muted": sorted(self.muted),
        }

    @classmethod
    def restored(
        cls,
        state: dict[str, Any],
        config: DigestConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> Digest:
        digest = cls(config, TemplateMiner.restored(state["miner"]), clock)
        digest.lines = state["lines"]
        digest._number = state["number"]
        digest._first = state["first"]
        for tid, count, first, last, severity, example, words, *later in state["tallies"]:
            sure = later[0] if later else True  # a state from before `sure` counts as sure
            handled = later[1] if len(later) > 1 else 0
            digest._tallies[tid] = _Tally(
                count, first, last, Severity(severity), example, set(words), sure, handled
            )
        digest._unhandled = [(at, tid, program) for at, tid, program in state.get("unhandled", [])]
        for tid, *known in state["known"]:
            digest._known[tid] = _Known(*known)
        digest._raised = {tid: line for tid, line in state["raised"]}
        digest._open = {i["template_id"]: Incident(**i) for i in state.get("open", [])}
        digest._incident_at = state["incident_at"]
        digest._incident_since = clock() - state["incident_for"]
        digest._gaps = [Gap(after, seconds) for after, seconds in state["gaps"]]
        digest.muted = set(state.get("muted", []))
        return digest

    @property
    def open_incidents(self) -> list[Incident]:
        """Raised and not over yet."""
        return list(self._open.values())

    @property
    def pending(self) -> int:
        """Lines read since the last cut."""
        return self.lines - self._first + 1

    def mute(self, template_id: int, muted: bool = True) -> str:
        """Mute a template (or unmute it): its lines are still read, counted and listed, its
        facts the same, but it raises no incident (an incident already open ends as any does).
        What an operator does with a page that is noise on this log, as Alertmanager's silences
        do; the template's text (values as `<*>`) is returned. LookupError: no such template
        here; OverflowError: MAX_MUTED already muted."""
        template = self.miner.get(template_id)
        if template is None:
            raise LookupError(template_id)
        if not muted:
            self.muted.discard(template_id)
        elif template_id not in self.muted:
            self.muted = {t for t in self.muted if self.miner.get(t)}  # the miner forgot some
            if len(self.muted) >= MAX_MUTED:
                raise OverflowError(MAX_MUTED)
            self.muted.add(template_id)
        return template.text()

    def _starts_incident(self, tid: int, severity: Severity, tally: _Tally, known: _Known) -> bool:
        """An error template never seen, back after `recur_intervals` intervals without it, or
        at `burst_factor` times its usual rate; where only a line's words say error (no stated
        level, no crash named), not before `inferred_min` lines of it, and once seen only at that
        rate; a new template of warnings bursting (of INFO lines only with `info_bursts`: a
        package manager's install is a burst of new lines, a fact to print, not a page). A known
        error at its usual pace is a fact, not an incident."""
        cfg = self.config
        if tid in self.muted:
            return False
        if severity >= ERROR_OR_WORSE:
            usual = cfg.burst_factor * known.rate * cfg.every_lines
            if not tally.sure:  # its words alone say trouble: weaker news than a stated level
                unhandled = tally.count - tally.handled
                if unhandled < cfg.inferred_min:
                    return False  # one "denied" or "unable to" is a fact; the same again a page
                if known.intervals > 0 and cfg.inferred_weaker:  # seen before: news as a burst
                    return unhandled >= max(cfg.burst_min, usual)
            quiet = self._number - known.present_in  # closed intervals without it
            if known.intervals == 0 or quiet >= cfg.recur_intervals:
                return True
            return tally.count >= max(cfg.burst_min, usual)
        new_since_start = self._number >= 1 and known.since_line >= self._first
        if not (new_since_start and tally.count >= cfg.burst_min):
            return False
        return cfg.info_bursts or tally.severity >= Severity.WARNING

    def _note_handling(self, line: str, n: int, tid: int, carried_on: bool) -> None:
        """A line that says its program carried on ("debconf: falling back to frontend: Readline")
        marks that program's failure just before it ("debconf: unable to initialize frontend")
        handled: a fallback taken is not a page. One failure per such line; a failure whose
        words alone say it is noted for the next lines."""
        program = program_of(line)
        self._unhandled = [u for u in self._unhandled if n - u[0] <= HANDLED_WITHIN]
        if not carried_on:
            self._unhandled.append((n, tid, program))
            return
        for i in reversed(range(len(self._unhandled))):
            at, failed, by = self._unhandled[i]
            if by == program:
                del self._unhandled[i]
                tally = self._tallies.get(failed)
                if tally is not None and tally.first_line <= at:  # in this interval
                    tally.handled += 1
                return

    def _cut(self, incident: bool) -> Facts:
        cfg = self.config
        self._number += 1
        first, last = self._first, self.lines
        lines = last - first + 1
        new, errors, bursts, stopped = [], [], [], []
        for tid, tally in self._tallies.items():
            known = self._known[tid]
            fact = self._fact(tid, tally, known)
            if known.since_line >= first:
                new.append(fact)
            if tally.severity >= ERROR_OR_WORSE:
                errors.append(fact)
            elif (
                known.intervals > 0
                and tally.count >= cfg.burst_min
                and tally.count / lines >= cfg.burst_factor * known.rate
            ):
                bursts.append(fact)
        for tid, known in self._known.items():
            if (
                tid not in self._tallies
                and known.streak >= cfg.steady_intervals
                and known.rate * lines >= cfg.stop_min_expected
            ):
                stopped.append(self._stopped(tid, known))
        new.sort(key=lambda f: (-_rank(f), -f.count if self._number == 1 else f.first_line))
        errors.sort(key=lambda f: (-_rank(f), -f.count))
        bursts.sort(key=lambda f: -f.count / max(f.usual_per_100, 0.01))
        m = cfg.max_listed
        omitted = sum(max(0, len(x) - m) for x in (new, errors, bursts, stopped))
        opened, ended = self._incidents()
        facts = Facts(
            number=self._number,
            first_line=first,
            last_line=last,
            templates=len(self._tallies),
            known=len(self.miner),
            new=tuple(new[:m]),
            errors=tuple(errors[:m]),
            bursts=tuple(bursts[:m]),
            stopped=tuple(stopped[:m]),
            gaps=tuple(self._gaps[:m]),
            incident=incident,
            omitted=omitted + max(0, len(self._gaps) - m),
            support=frozenset(),
            opened=opened[:MAX_INCIDENTS],
            ended=ended[:MAX_INCIDENTS],
        )
        support: set[str] = set()
        for fact in facts.listed():
            listed = self._tallies.get(fact.template_id)
            if listed is not None:
                support.update(listed.words)
        facts = _with_support(facts, support)
        self._roll(lines)
        return facts

    def _incidents(self) -> tuple[tuple[Incident, ...], tuple[Incident, ...]]:
        """The incidents raised in the interval now closing, and the open ones it ends: their
        template had no line in it (or was forgotten). The others go on, counted."""
        opened: list[Incident] = []
        for tid, line in self._raised.items():
            tally = self._tallies[tid]
            shown = self._fact(tid, tally, self._known[tid]).shown()
            incident = Incident(
                tid, shown, tally.severity.label, line, tally.last_line, tally.count
            )
            opened.append(incident)
        ended: list[Incident] = []
        for tid, incident in list(self._open.items()):
            present = self._tallies.get(tid)
            if present is None:
                ended.append(self._open.pop(tid))
            elif tid not in self._raised:
                self._open[tid] = replace(
                    incident, last_line=present.last_line, count=incident.count + present.count
                )
        for incident in opened:
            self._open[incident.template_id] = incident
        return tuple(opened), tuple(ended)

    def _fact(self, tid: int, tally: _Tally, known: _Known) -> TemplateFact:
        template = self.miner.get(tid)
        return TemplateFact(
            template_id=tid,
            template=template.text() if template else tally.example,
            severity=tally.severity.label,
            count=tally.count,
            first_line=tally.first_line,
            last_line=tally.last_line,
            total=known.total,
            since_line=known.since_line,
            example=tally.example,
            usual_per_100=round(known.rate * 100, 2),
        )

    def _stopped(self, tid: int, known: _Known) -> TemplateFact:
        template = self.miner.get(tid)
        text = template.text() if template else ""
        known.streak = 0  # said once, until it is back and steady again
        return TemplateFact(
            template_id=tid,
            template=text,
            severity=Severity.INFO.label,
            count=0,
            first_line=known.last_line,
            last_line=known.last_line,
            total=known.total,
            since_line=known.since_line,
            example="",
            usual_per_100=round(known.rate * 100, 2),
        )

    def _roll(self, lines: int) -> None:
        """Close the interval: baselines move, forgotten templates go, the next interval starts."""
        for tid in [t for t in self._known if self.miner.get(t) is None]:
            del self._known[tid]
        for tid, known in self._known.items():
            tally = self._tallies.get(tid)
            share = (tally.count if tally else 0) / lines
            known.rate = (
                share
                if known.intervals == 0
                else ((1 - RATE_WEIGHT) * known.rate + RATE_WEIGHT * share)
            )
            known.intervals += 1
            known.streak = known.streak + 1 if tally else 0
            if tally:
                known.present_in = self._number
        self._tallies = {}
        self._raised = {}
        self._incident_at = None
        self._gaps = []
        self._first = self.lines + 1


def _lines(n: int) -> str:
    return "1 line" if n == 1 else f"{n} lines"


def _span(fact: TemplateFact) -> str:
    if fact.first_line == fact.last_line:
        return f"line {fact.first_line}"
    return f"lines {fact.first_line}-{fact.last_line}"


def _rank(fact: TemplateFact) -> int:
    return Severity[fact.severity.upper()].value


def _with_support(facts: Facts, lines_words: set[str]) -> Facts:
    support = words_of(" ".join(lines_words))
    support.update(words_of(facts.render()))
    for fact in facts.listed():
        support.update(words_of(fact.template))
        support.update(words_of(fact.example))
    return replace(facts, support=frozenset(support))
