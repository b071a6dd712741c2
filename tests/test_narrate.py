"""The narrator's facts, incidents, quiet intervals and check, without the model's numbers.

The digest and the check are pure; the narrator runs on a scripted backend whose "model" says what
the test chooses, so a sentence that names a host or a number the lines never held is shown to be
dropped and counted. The real model's runs are in test_cli_daemon.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from sinkd.cli.narrator import Counts, Intake, NarrateConfig, Narration, Narrator
from sinkd.daemon.runtime.api import AppendResult, Done, GenerationOptions, Handle, TokenEvent
from sinkd.narration import facts as facts_module
from sinkd.narration.facts import Digest, DigestConfig, Facts
from sinkd.narration.grounding import REPEATS, SAYS_NOTHING, check, repeats_itself, words_of
from sinkd.narration.severity import Severity, read_severity, severity_of
from sinkd.narration.templates import TemplateMiner
from tests.support.receipts import receipt

pytestmark = pytest.mark.unit


def steady(n: int, start: int = 0) -> list[str]:
    """Three templates in turn, INFO: a log with nothing to say."""
    kinds = [
        "2026-12-05T10:00:{s:02d} api INFO request served in {ms} ms",
        "2026-12-05T10:00:{s:02d} db INFO pool at {n}/64",
        "2026-12-05T10:00:{s:02d} worker INFO job {n} done",
    ]
    return [
        kinds[i % 3].format(s=i % 60, ms=(i * 7) % 900 + 1, n=(i * 13) % 97)
        for i in range(start, start + n)
    ]


def digest_all(lines: list[str], **config: Any) -> list[Facts]:
    digest = Digest(DigestConfig(**config), clock=lambda: 0.0)
    cuts = [f for f in (digest.observe(line) for line in lines) if f is not None]
    last = digest.cut()
    return [*cuts, *([last] if last else [])]


def test_the_miner_groups_lines_by_template_and_keeps_their_values() -> None:
    miner = TemplateMiner()
    a = miner.add("connection from 10.0.0.7 closed after 31 ms", 1)
    b = miner.add("connection from 10.0.0.9 closed after 4 ms", 2)
    c = miner.add("disk /dev/sda1 is full", 3)
    assert a.created and not b.created and c.created
    assert (
        a.template is b.template and b.template.text() == "connection from <*> closed after <*> ms"
    )
    assert b.parameters == ("10.0.0.9", "4")
    assert b.template.count == 2 and len(miner) == 2


def test_the_miner_forgets_the_least_recently_seen_past_its_cap() -> None:
    miner = TemplateMiner(max_templates=2)
    first = miner.add("alpha beta gamma", 1).template.id
    miner.add("one two three four", 2)
    miner.add("one two three four", 3)
    miner.add("x y", 4)  # a third template: "alpha beta gamma" was seen least recently
    assert len(miner) == 2 and miner.get(first) is None
    assert miner.add("alpha beta gamma", 5).created  # back, as a new template


@pytest.mark.parametrize(
    ("line", "severity", "stated"),
    [
        ("<11>Dec  5 10:00:01 host app: oops", Severity.ERROR, True),
        ("<14>Dec  5 10:00:01 host app: hello", Severity.INFO, True),
        (
            "- 1117838570 RAS KERNEL INFO instruction cache parity error corrected",
            Severity.INFO,
            True,
        ),
        ("- 1117838570 RAS KERNEL FATAL data TLB error interrupt", Severity.CRITICAL, True),
        ("[Sun Dec 04 04:47:44 2005] [error] mod_jk child in error state 6", Severity.ERROR, True),
        ("sshd[24200]: error: PAM: Authentication failure", Severity.ERROR, True),
        ("ts=1 level=warn msg=slow", Severity.WARNING, True),
        ("backup of /home failed: no space left", Severity.ERROR, False),
        ("invoke-rc.d: policy-rc.d denied execution of start.", Severity.ERROR, False),
        ("kernel: Out of memory: Killed process 4411 (java)", Severity.CRITICAL, False),
        ("2026-10-16 23:03:59 status installed libc6:amd64 2.36-9", Severity.INFO, False),
    ],
)
def test_a_line_s_severity_is_what_it_states_first(
    line: str, severity: Severity, stated: bool
) -> None:
    assert severity_of(line) is severity
    assert read_severity(line) == (severity, stated)


def test_one_line_whose_words_alone_suggest_an_error_is_a_fact_the_same_again_a_page() -> None:
    """A package install's "policy-rc.d denied execution of start." once is listed, not raised;
    twice in an interval it is raised; seen before, it is raised again only as a burst; a line
    stating ERROR is raised at once."""
    denied = "invoke-rc.d: policy-rc.d denied execution of {}."
    once = digest_all([*steady(150), denied.format("start"), *steady(300, 150)], every_lines=200)
    assert not any(f.incident for f in once)
    assert [e.count for f in once for e in f.errors] == [1]  # still said
    twice = [*steady(150), denied.format("start"), *steady(5, 150), denied.format("reload")]
    cuts = digest_all([*twice, *steady(300, 155)], every_lines=200)
    [raised] = [f for f in cuts if f.incident]
    assert raised.opened[0].first_line == 157 and raised.opened[0].count == 2
    stated = digest_all([*steady(150), "app ERROR denied: start", *steady(300, 150)])
    assert sum(f.incident for f in stated) == 1
    # words that name a crash are as sure as a stated level: one line pages
    oom = "kernel: Out of memory: Killed process 4242 (java) total-vm:8123456kB"
    crashed = digest_all([*steady(150), oom, *steady(300, 150)], every_lines=200)
    assert [(i.first_line, i.severity) for f in crashed for i in f.opened] == [(151, "critical")]
    asked = digest_all([*steady(150), denied.format("start"), *steady(300, 150)], inferred_min=1)
    assert sum(f.incident for f in asked) == 1
    # seen before, twice again four intervals later: listed, not paged; a burst of it pages
    again = [*twice, *steady(800, 155), denied.format("stop"), denied.format("restart")]
    cuts = digest_all([*again, *steady(40, 955)], every_lines=200)
    assert sum(f.incident for f in cuts) == 1
    assert [e.count for f in cuts for e in f.errors] == [2, 2]  # listed both times
    burst = [*twice, *steady(800, 155), *[denied.format(f"s{i}") for i in range(12)]]
    assert sum(f.incident for f in digest_all([*burst, *steady(40, 967)], every_lines=200)) == 2


FALLS_BACK = [  # apt's term.log in a container, each install
    "debconf: unable to initialize frontend: Dialog",
    "debconf: (TERM is not set, so the dialog frontend is not usable.)",
    "debconf: falling back to frontend: Readline",
    "debconf: unable to initialize frontend: Readline",
    "debconf: (This frontend requires a controlling tty.)",
    "debconf: falling back to frontend: Teletype",
]


def test_a_failure_its_program_says_it_carried_past_is_listed_not_paged() -> None:
    """debconf that cannot start a frontend and falls back to another, twice an install: listed as
    it said, never paged. Without the fallback, a fallback of another program, one too far after
    it, or at the rules before, the same failures page."""

    def raised(failures: list[str], **config: Any) -> int:
        cuts = digest_all([*steady(100), *failures, *steady(100, 100)], every_lines=200, **config)
        return sum(f.incident for f in cuts)

    cuts = digest_all([*steady(100), *FALLS_BACK, *FALLS_BACK, *steady(100, 100)], every_lines=200)
    assert not any(f.incident for f in cuts)
    assert [(e.count, e.severity) for f in cuts for e in f.errors] == [(4, "error")]
    assert raised([line for line in FALLS_BACK if "falling back" not in line]) == 1
    other = [line.replace("debconf: falling", "dhclient: falling") for line in FALLS_BACK]
    assert raised(other) == 1
    late = [*FALLS_BACK[:2], *steady(2, 100), *FALLS_BACK[2:5], *steady(2, 102), FALLS_BACK[5]]
    assert raised(late) == 1  # each fallback four lines after its failure
    assert raised(FALLS_BACK * 2, page_handled=True) == 1
    # where the line says so itself, the failure is a warning: listed as one, not paged
    qualify = "Nov  9 12:01:3{} src@eadmin1 sendmail[43{}]: unable to qualify my own domain name"
    said = [qualify.format(i, i) + f" (eadmin{i}) -- using short name" for i in range(4)]
    cuts = digest_all([*steady(100), *said, *steady(100, 100)], every_lines=200)
    assert not any(f.incident for f in cuts) and not any(f.errors for f in cuts)
    assert raised([qualify.format(i, i) + f" (eadmin{i})" for i in range(4)]) == 1


@pytest.mark.parametrize("cut_at", [101, 102, 103])
def test_a_digest_restored_between_a_failure_and_its_fallback_still_pairs_them(
    cut_at: int,
) -> None:
    lines = [*steady(100), *FALLS_BACK, *FALLS_BACK, *steady(100, 100)]
    first = Digest(DigestConfig(every_lines=200), clock=lambda: 0.0)
    before = [f for f in map(first.observe, lines[:cut_at]) if f is not None]
    second = Digest.restored(json.loads(json.dumps(first.state())), first.config, lambda: 0.0)
    after = [f for f in map(second.observe, lines[cut_at:]) if f is not None]
    last = second.cut()
    cuts = [*before, *after, *([last] if last else [])]
    assert cuts == digest_all(lines, every_lines=200) and not any(f.incident for f in cuts)


def test_a_planted_fatal_line_cuts_its_interval_before_the_next_mark() -> None:
    lines = [
        *steady(130),
        "2026-12-05T10:02:10 kernel FATAL machine check on cpu 3",
        *steady(200, 130),
    ]
    cuts = digest_all(lines, every_lines=100, incident_lines=20)
    incident = next(f for f in cuts if f.incident)
    assert (incident.first_line, incident.last_line) == (101, 150)  # 131 + 20 - 1, before 200
    [fatal] = incident.errors
    assert (fatal.severity, fatal.count, fatal.first_line) == ("critical", 1, 131)
    assert fatal.example.endswith("FATAL machine check on cpu 3")
    assert (131, 131) in incident.cites()
    # the intervals still cover every line, once
    assert [(f.first_line, f.last_line) for f in cuts][:3] == [(1, 100), (101, 150), (151, 250)]
    assert sum(f.lines for f in cuts) == len(lines)


def test_an_error_on_the_line_that_fills_the_interval_is_still_an_incident() -> None:
    lines = [*steady(99), "db ERROR write failed", *steady(50, 99)]
    cuts = digest_all(lines, every_lines=100)
    assert (cuts[0].last_line, cuts[0].incident) == (100, True)
    assert cuts[0].errors[0].first_line == 100 and not cuts[1].incident


def test_an_incident_is_cut_after_its_seconds_when_no_more_lines_come() -> None:
    now = [0.0]
    digest = Digest(DigestConfig(every_lines=100, incident_seconds=1.0), clock=lambda: now[0])
    for line in steady(10):
        assert digest.observe(line) is None
    assert digest.observe("worker ERROR job 7 failed: disk full") is None
    assert digest.due() is None
    now[0] = 1.5
    facts = digest.due()
    assert facts is not None and facts.incident and facts.errors[0].count == 1


def test_a_flood_of_identical_errors_is_one_incident_and_counted_exactly() -> None:
    flood = [f"db ERROR write to /var/lib/db/{i % 7} failed: disk full" for i in range(10_000)]
    cuts = digest_all(steady(50) + flood, every_lines=200, incident_lines=20)
    assert sum(f.incident for f in cuts) == 1  # the flood goes on: counted, not raised again
    assert len(cuts) <= 1 + (50 + 10_000) // 200 + 1
    assert sum(e.count for f in cuts for e in f.errors) == 10_000
    assert cuts[-1].errors[0].total == 10_000 and cuts[-1].errors[0].since_line == 51


def test_a_new_template_bursting_is_an_incident_and_a_jump_is_a_burst() -> None:
    base = steady(400)
    burst = [f"cache WARN eviction storm shard {i}" for i in range(30)]
    cuts = digest_all(base + burst + steady(200, 400), every_lines=200, burst_min=10)
    incident = next(f for f in cuts if f.incident)
    assert incident.new and incident.new[0].template.startswith("cache WARN eviction storm")
    # a known template at 4x its baseline rate: a flush every 50 lines, then 60 in 200
    flush = "cache INFO flush done in {} ms"
    rare = [flush.format(i) if i % 50 == 0 else line for i, line in enumerate(steady(600))]
    busy = [flush.format(i) if i % 10 < 3 else line for i, line in enumerate(steady(200, 600))]
    cuts = digest_all(rare + busy, every_lines=200)
    [jump] = [b for f in cuts for b in f.bursts]
    assert jump.template == "cache INFO flush done in <*> ms" and jump.count == 60
    assert jump.usual_per_100 == 2.0 and (jump.first_line, jump.last_line) == (601, 793)


def test_a_burst_of_new_info_lines_is_a_fact_unless_the_operator_asks() -> None:
    """A package manager installing: new INFO templates by the dozen, nothing wrong. Said as NEW
    with its count, not raised; raised only with `info_bursts`."""
    base = steady(400)
    install = [
        f"2026-12-05 10:01:{i % 60:02d} status unpacked libfoo{i % 3}:amd64" for i in range(40)
    ]
    cuts = digest_all(base + install + steady(200, 400), every_lines=200, burst_min=10)
    assert not any(f.incident for f in cuts)
    assert any(f.new and f.new[0].count >= 10 for f in cuts)  # still a fact
    asked = digest_all(base + install + steady(200, 400), every_lines=200, info_bursts=True)
    assert sum(f.incident for f in asked) == 1


def test_a_known_error_at_its_usual_pace_is_listed_not_raised_again() -> None:
    """An error template raised once, then a line of it every interval: listed each time, never
    raised again; back after `recur_intervals` intervals without it, or at four times its rate,
    it is raised again."""
    error = "2026-12-05T10:00:00 disk ERROR sector {} unreadable"
    lines: list[str] = []
    for i in range(6):  # one error an interval, but for the third
        lines += [*steady(99, 100 * i), error.format(i) if i != 2 else steady(1, 250)[0]]
    lines += steady(400, 600)  # four intervals without it, then back
    lines += [error.format(99), *steady(99, 1000)]
    lines += [error.format(i) for i in range(12)] + steady(88, 1100)  # twelve at once
    cuts = digest_all(lines, every_lines=100, recur_intervals=3)

    def holding(cuts: list[Facts], *numbers: int) -> list[bool]:
        return [any(f.first_line <= n <= f.last_line and f.incident for f in cuts) for n in numbers]

    assert sum(f.incident for f in cuts) == 3 and holding(cuts, 100, 1001, 1101) == [True] * 3
    assert sum(bool(f.errors) for f in cuts) == 7  # listed in every interval that has it
    every_time = digest_all(lines, every_lines=100, recur_intervals=1)  # back after one: raised
    assert holding(every_time, 100, 400, 1001, 1101) == [True] * 4


@pytest.mark.parametrize("cut_at", [150, 431, 437, 800])
def test_a_digest_restored_from_its_state_goes_on_as_if_never_stopped(cut_at: int) -> None:
    """Its state through JSON (as the store keeps it), at a quiet line, inside an incident's
    interval and past a forgotten template: the same facts as one digest read straight through."""
    error = "2026-12-05T10:00:00 disk ERROR sector {} unreadable"
    lines = steady(430) + [error.format(i) for i in range(15)] + steady(400, 430)
    lines += [f"tmp INFO scratch file f{i} kept" for i in range(30)] + steady(300, 830)
    config = DigestConfig(every_lines=100)
    straight = digest_all_capped(lines)
    first = Digest(config, TemplateMiner(max_templates=4), clock=lambda: 0.0)
    before = [f for f in map(first.observe, lines[:cut_at]) if f is not None]
    state = json.loads(json.dumps(first.state()))
    second = Digest.restored(state, config, clock=lambda: 0.0)
    after = [f for f in map(second.observe, lines[cut_at:]) if f is not None]
    last = second.cut()
    assert [*before, *after, *([last] if last else [])] == straight
    assert len(straight) > 5 and any(f.incident for f in straight)
    assert len(second.miner) == 4 and second.state()["miner"]["next_id"] > 5  # some forgotten


def test_a_state_written_before_stated_levels_were_kept_still_restores() -> None:
    """A stream's state from an older daemon: its tallies lack the `stated` flag and count as
    stated, so an error it was already counting still raises as it would have."""
    first = Digest(DigestConfig(every_lines=100), clock=lambda: 0.0)
    for line in [*steady(50), "backup of /home failed: no space left"]:
        first.observe(line)
    state = json.loads(json.dumps(first.state()))
    state["tallies"] = [row[:7] for row in state["tallies"]]
    rules = DigestConfig(every_lines=100, inferred_min=3)  # stated: raised at once
    second = Digest.restored(state, rules, clock=lambda: 0.0)
    assert second.observe("backup of /home failed: no space left") is None
    facts = second.cut()
    assert facts is not None and facts.incident and facts.errors[0].count == 2


def digest_all_capped(lines: list[str]) -> list[Facts]:
    digest = Digest(DigestConfig(every_lines=100), TemplateMiner(max_templates=4), lambda: 0.0)
    cuts = [f for f in map(digest.observe, lines) if f is not None]
    last = digest.cut()
    return [*cuts, *([last] if last else [])]


def test_an_incident_is_opened_once_and_over_when_its_template_is_quiet_an_interval() -> None:
    """Opened in the interval that raised it, counted while it goes on, over (with its first
    line, last line and count) in the first interval without a line of it; after a restart too."""
    flood = [f"db ERROR write to /var/lib/db/{i % 7} failed: disk full" for i in range(250)]
    lines = steady(130) + flood + steady(300, 130)
    cuts = digest_all(lines, every_lines=100, incident_lines=20)
    opened = [(f.number, i.first_line) for f in cuts for i in f.opened]
    ended = [(f.number, i) for f in cuts for i in f.ended]
    assert opened == [(2, 131)]
    [(number, over)] = ended
    assert (over.first_line, over.last_line, over.count) == (131, 380, 250)
    assert over.severity == "error" and "disk full" in over.template
    over_interval = next(f for f in cuts if f.number == number)
    assert over_interval.first_line > 380 and "OVER:" in over_interval.render()
    assert not over_interval.quiet
    digest = Digest(DigestConfig(every_lines=100, incident_lines=20), clock=lambda: 0.0)
    before = [f for f in map(digest.observe, lines[:300]) if f is not None]
    again = Digest.restored(json.loads(json.dumps(digest.state())), digest.config, lambda: 0.0)
    after = [f for f in map(again.observe, lines[300:]) if f is not None]
    last = again.cut()
    assert [*before, *after, *([last] if last else [])] == cuts


def test_a_steady_template_that_stops_is_said_once() -> None:
    lines = steady(600) + [f"2026-12-05T10:00:00 db INFO pool at {i}/64" for i in range(400)]
    cuts = digest_all(lines, every_lines=200)
    stopped = [(f.number, s.template) for f in cuts for s in f.stopped]
    assert len({t for _, t in stopped}) == 2 and len(stopped) == 2, stopped  # api and worker, once


def test_a_silence_is_a_gap() -> None:
    now = [0.0]
    digest = Digest(DigestConfig(every_lines=100, gap_seconds=60), clock=lambda: now[0])
    for line in steady(5):
        digest.observe(line)
    now[0] = 90.0
    digest.observe(steady(1)[0])
    facts = digest.cut()
    assert facts is not None and facts.gaps[0].after_line == 5 and facts.gaps[0].seconds == 90.0
    assert not facts.quiet


def test_a_quiet_interval_has_nothing_to_say() -> None:
    cuts = digest_all(steady(600), every_lines=200)
    assert not cuts[0].quiet  # the first interval names what the log is made of
    assert (
        all(f.quiet for f in cuts[1:])
        and cuts[1].steady() == "steady: 3 templates, 200 lines (201-400)"
    )


def test_the_check_wants_every_number_host_and_word_in_the_lines() -> None:
    support = frozenset(
        words_of(
            "db ERROR write to /var/lib/db/3 failed: disk full host db-07 lines 51-250 200 lines"
        )
    )
    ok = "In lines 51-250, the log shows 200 lines of disk full errors on db-07."
    host = "In lines 51-250, the log shows disk full errors on db-09."
    number = "In lines 51-250, the log shows 512 failed writes."
    invented = "In lines 51-250, the log shows the backup crashed."
    nothing = "The log."
    result = check(" ".join([ok, host, number, invented, nothing]), support)
    assert result.kept == (ok,)
    assert [d.unsupported for d in result.dropped] == [
        ("db-09",),
        ("512", "writes"),
        ("backup", "crashed"),
        ("(says nothing of the lines)",),
    ]


def test_a_sentence_that_loops_or_says_nothing_past_sinkd_s_opening_is_dropped() -> None:
    """Seen on dpkg.log: every word of a looping sentence is in the facts, and the opening sinkd
    wrote (its line range) made it look specific."""
    support = frozenset(words_of("Log lines 1-200: 200 lines of 4 kinds. status installed dpkg"))
    lead = "In lines 1-200, the log shows"
    loop = f"{lead} that the log of the log of the log of the log."
    empty = f"{lead} that the log."
    short = f"{lead} 200 installed lines."
    result = check(" ".join([loop, empty, short]), support, lead)
    assert result.kept == (short,)
    assert [d.unsupported for d in result.dropped] == [(REPEATS,), (SAYS_NOTHING,)]
    assert not repeats_itself("Two errors on db-07 and two errors on db-09 in lines 1-200.")
    assert repeats_itself("the log of the log of the log")


@dataclass
class ScriptedBackend:
    """The narrator's backend with a "model" that says what the test chooses."""

    replies: list[str]
    appended: list[str] = field(default_factory=list)
    asked: int = 0

    def append(
        self, handle: Handle, text: str | None = None, tokens: list[int] | None = None
    ) -> AppendResult:
        self.appended.append(text or "")
        return AppendResult(0, receipt())

    def generate(self, handle: Handle, options: GenerationOptions) -> Iterator[Any]:
        reply = self.replies[min(self.asked, len(self.replies) - 1)]
        self.asked += 1
        yield TokenEvent(0, reply, 0, 0.0)
        yield Done("stop", 1, receipt())


def narrate(
    lines: list[str], backend: ScriptedBackend, **config: Any
) -> tuple[list[Narration], Counts]:
    cfg = NarrateConfig(recall=False, every_seconds=3600, incident_seconds=3600, **config)
    counts = Counts()
    intake = Intake(cfg, counts, clock=lambda: 0.0)
    for line in lines:
        intake.add(line)
    intake.close()
    out: list[Narration] = []
    Narrator(backend, Handle("s", "g"), cfg, counts, out.append).run(intake)  # type: ignore[arg-type]
    return out, counts


def test_a_sentence_naming_a_host_or_number_not_in_the_lines_is_dropped_and_counted() -> None:
    lines = [*steady(100), "db ERROR write to /var/lib/db/3 failed: disk full", *steady(30, 100)]
    backend = ScriptedBackend([" host db-09 lost 512 writes.", " the disk full error on db."])
    items, counts = narrate(lines, backend, every_lines=100)
    incident = next(i for i in items if i.facts.incident)
    first = next(i for i in items if i.phrased)
    assert incident.phrased and incident.text == ""  # the facts stand alone
    assert [d.unsupported for d in incident.dropped] == [("host", "db-09", "lost", "512", "writes")]
    assert counts.unsupported_dropped == 1 + len(first.dropped) - (first is incident)
    # the facts were printed whatever the model said
    assert incident.facts.errors[0].first_line == 101
    assert all("the log shows" in a for a in backend.appended if a.startswith("\nLog facts"))


def test_a_supported_sentence_is_kept_with_the_lines_it_cites() -> None:
    lines = (
        steady(100) + ["db ERROR write to /var/lib/db/3 failed: disk full"] * 3 + steady(30, 100)
    )
    backend = ScriptedBackend([" 3 lines of disk full errors from db."])
    items, counts = narrate(lines, backend, every_lines=100)
    incident = next(i for i in items if i.facts.incident)
    assert incident.text == "In lines 101-120, the log shows 3 lines of disk full errors from db."
    assert (101, 103) in incident.facts.cites() and counts.unsupported_dropped == 0


def test_quiet_intervals_never_ask_the_model() -> None:
    backend = ScriptedBackend([" steady."])
    items, counts = narrate(steady(1000), backend, every_lines=200)
    assert backend.asked == 1  # the first interval only: what the log is made of
    assert counts.quiet_intervals == 4 and all(not i.phrased for i in items[1:])


def test_behind_the_model_only_the_newest_incident_is_phrased() -> None:
    lines = [*steady(300), "kernel FATAL machine check on cpu 3", *steady(300, 300)]
    backend = ScriptedBackend([" a machine check."])
    items, counts = narrate(lines, backend, every_lines=100)  # every cut waits: one batch
    assert backend.asked == 1 and [i.facts.incident for i in items if i.phrased] == [True]
    assert counts.behind == sum(1 for i in items if not i.facts.quiet) - 1
    assert counts.narrations == len(items) and sum(i.facts.lines for i in items) == 601


def test_a_backlog_keeps_the_check_s_words_only_where_the_model_may_still_be_asked() -> None:
    """Behind the model, cut intervals wait: each would hold up to 256 words of each listed
    template's lines. Only the newest incident and the newest loud interval can still be phrased;
    the others keep their facts and lose those words, so a backlog's memory stays small."""
    cfg = NarrateConfig(every_lines=50, every_seconds=3600, incident_seconds=3600)
    intake = Intake(cfg, Counts(), clock=lambda: 0.0)
    lines = [*steady(100), "kernel FATAL machine check on cpu 3", *steady(100, 100)]
    lines += [f"cache WARN shard {i} moved to node{i % 5}" for i in range(150)]
    for line in lines:
        intake.add(line)
    cuts, ended = intake.take(0)
    assert not ended and len(cuts) == 7
    kept = [(f.first_line, f.incident, f.quiet) for f in cuts if f.support]
    incident = max(i for i, f in enumerate(cuts) if f.incident)
    loud = max(i for i, f in enumerate(cuts) if not f.quiet)
    assert kept == [
        (cuts[i].first_line, cuts[i].incident, cuts[i].quiet) for i in sorted({incident, loud})
    ]
    assert incident != loud  # both kept: the narrator asks about the incident


def test_muting_names_a_template_the_stream_has_and_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A template the miner does not hold cannot be muted; past MAX_MUTED a mute is refused,
    but unmuting, and muting again what is muted, always work; the set outlives a restore."""
    monkeypatch.setattr(facts_module, "MAX_MUTED", 2)
    digest = Digest(DigestConfig(), clock=lambda: 0.0)
    for line in steady(3):
        digest.observe(line)
    ids = sorted({digest.miner.add(line).template.id for line in steady(3)})
    with pytest.raises(LookupError):
        digest.mute(999)
    assert "api INFO" in digest.mute(ids[0]) and digest.mute(ids[1])
    with pytest.raises(OverflowError):
        digest.mute(ids[2])
    digest.mute(ids[1])  # already muted: no room needed
    digest.mute(ids[0], muted=False)
    digest.mute(ids[2])
    assert Digest.restored(digest.state()).muted == {ids[1], ids[2]}
