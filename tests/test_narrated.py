"""Narrated streams in the daemon (runtime/narrated.py, store/narrated.py): facts that outlive the
pipe and the daemon, a tenant's own, bounded by folding, and refused writes that count nothing.
On the fake engine: the digest does not depend on the model."""

from __future__ import annotations

import datetime
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from sinkd.daemon import failpoints
from sinkd.daemon.runtime.api import DigestOptions, NarratedInterval, NarrationForgotten
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.daemon.store.narrated import NarratedTables
from sinkd.errors import (
    InvalidInput,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    SessionElsewhere,
)
from sinkd.narration.facts import Digest, DigestConfig, Facts
from sinkd.proto.convert import digest_options_from_pb, digest_options_to_pb
from tests.support.disk import holders
from tests.support.services import fake_service

pytestmark = pytest.mark.unit
ALICE, BOB, ADMIN = Principal("alice"), Principal("bob"), Principal(None, admin=True)
EVERY = DigestOptions(every_lines=100)


def log(n: int, start: int = 0) -> list[str]:
    """A service's log: three INFO templates in turn, an error burst at line 431, a new
    template at line 700."""
    kinds = [
        "2026-12-05T10:00:{s:02d} api INFO request served in {ms} ms",
        "2026-12-05T10:00:{s:02d} db INFO pool at {n}/64",
        "2026-12-05T10:00:{s:02d} worker INFO job {n} done",
    ]
    out = []
    for i in range(start, start + n):
        if 430 <= i < 436:
            out.append(
                f"2026-12-05T10:07:{i % 60:02d} db ERROR write to /var/lib/db/{i % 3} failed"
            )
        elif i >= 700 and i % 7 == 0:
            out.append(f"2026-12-05T10:11:{i % 60:02d} cache WARN eviction of shard {i}")
        else:
            out.append(kinds[i % 3].format(s=i % 60, ms=(i * 7) % 900 + 1, n=(i * 13) % 97))
    return out


def facts_of(intervals: list[NarratedInterval] | tuple[NarratedInterval, ...]) -> list[Facts]:
    return [Facts.from_dict(json.loads(i.record_json)["facts"]) for i in intervals]


def straight(lines: list[str]) -> list[Facts]:
    """One digest in one process, read straight through: what a stream must say."""
    digest = Digest(DigestConfig(every_lines=100), clock=lambda: 0.0)
    cuts = [f for f in map(digest.observe, lines) if f is not None]
    last = digest.cut()
    return [*cuts, *([last] if last else [])]


def without_support(facts: list[Facts]) -> list[Facts]:
    return [Facts.from_dict(f.as_dict()) for f in facts]


def test_a_stream_goes_on_across_restarts_of_the_daemon_as_if_read_at_once(
    tmp_path: Path,
) -> None:
    """Known templates stay known (no NEW again), baselines stay, line numbers continue, and
    the kept timeline is every interval once, with its times, and where each new pipe began
    (the stream's first says none), a pipe begun in an open interval through a restart too."""
    lines = log(900)
    closed: list[NarratedInterval] = []
    for start, end in ((0, 250), (250, 433), (433, 900)):  # a restart inside the error burst
        service = fake_service(tmp_path, durable=True)
        fed = service.narrated.feed(
            ALICE, "web", lines[start:end], end == 900, EVERY, new_pipe=True
        )
        closed += fed.closed
        assert fed.lines == end
        service.stop()
    assert without_support(facts_of(closed)) == without_support(straight(lines))
    assert sum(1 for f in facts_of(closed) for n in f.new if "api INFO" in n.template) == 1
    service = fake_service(tmp_path, durable=True)
    kept = service.narrated.history(ALICE, "web")
    assert [i.number for i in kept] == list(range(1, len(closed) + 1))
    assert [(i.first_line, i.last_line) for i in kept] == [
        (i.first_line, i.last_line) for i in closed
    ]
    assert all(i.started <= i.ended for i in kept) and kept[0].ended <= kept[-1].started
    [stream] = service.narrated.streams(ALICE)
    assert (stream.name, stream.lines, stream.intervals) == ("web", 900, len(closed))
    assert stream.incidents == sum(f.incident for f in facts_of(closed)) >= 1
    began = [(i.first_line, json.loads(i.record_json).get("new_pipe_at")) for i in kept]
    assert [b for b in began if b[1]] == [(201, [251]), (401, [434])]
    service.narrated.feed(ALICE, "web", log(30, 900), new_pipe=True)  # open at the restart
    service.stop()
    service = fake_service(tmp_path, durable=True)
    [last] = service.narrated.feed(ALICE, "web", [], True).closed
    assert json.loads(last.record_json)["new_pipe_at"] == [901]
    service.stop()


def test_history_filters_by_severity_template_and_time(tmp_path: Path) -> None:
    service = fake_service(tmp_path, durable=True)
    fed = service.narrated.feed(ALICE, "web", log(900), True, EVERY)
    assert service.narrated.note(ALICE, "web", fed.closed[4].number, "Three writes failed.")
    errors = service.narrated.history(ALICE, "web", severity="error")
    assert [(i.first_line <= 431 <= i.last_line) for i in errors] == [True]
    assert json.loads(errors[0].record_json)["sentence"] == "Three writes failed."
    shards = service.narrated.history(ALICE, "web", template="eviction shard")
    assert shards and all(i.last_line >= 700 for i in shards)
    assert len(service.narrated.history(ALICE, "web", limit=2)) == 2
    assert service.narrated.history(ALICE, "web", since=fed.closed[-1].ended + 1) == []
    with pytest.raises(InvalidInput):
        service.narrated.history(ALICE, "web", severity="loud")
    service.stop()


def test_a_tenant_sees_and_forgets_only_its_own_streams(tmp_path: Path) -> None:
    service = fake_service(tmp_path, durable=True)
    service.narrated.feed(ALICE, "web", log(300), True, EVERY)
    service.narrated.feed(BOB, "db", log(120), True, EVERY)
    with pytest.raises(NotFound):
        service.narrated.history(BOB, "web")
    with pytest.raises(NotFound):
        service.narrated.forget(BOB, "web")
    assert [s.name for s in service.narrated.streams(BOB)] == ["db"]
    with pytest.raises(PermissionDenied):
        service.narrated.streams(Principal(None, admin=True))
    assert service.narrated.forget(ALICE, "web") == NarrationForgotten(3, False)
    with pytest.raises(NotFound):
        service.narrated.history(ALICE, "web")
    fed = service.narrated.feed(ALICE, "web", log(10))
    assert fed.lines == 10  # a new stream: nothing of the forgotten one
    assert [s.name for s in service.narrated.streams(BOB)] == ["db"]
    service.stop()


@pytest.mark.parametrize(
    ("name", "lines", "options"),
    [
        ("", ["a"], None),
        ("../etc", ["a"], None),
        ("x" * 65, ["a"], None),
        ("web", ["a"] * 4097, None),
        ("web", ["a"], DigestOptions(every_lines=2_000_000)),
        ("web", ["a"], DigestOptions(incident_seconds=-1.0)),
    ],
)
def test_bad_input_is_refused_and_nothing_is_counted(
    tmp_path: Path, name: str, lines: list[str], options: DigestOptions | None
) -> None:
    service = fake_service(tmp_path)
    service.narrated.feed(ALICE, "web", ["kept line 1"])
    with pytest.raises(InvalidInput):
        service.narrated.feed(ALICE, name, lines, options=options)
    assert service.narrated.feed(ALICE, "web", []).lines == 1
    service.stop()


def test_a_write_the_store_refuses_counts_nothing_and_the_lines_may_be_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = fake_service(tmp_path, durable=True)
    lines = log(300)
    service.narrated.feed(ALICE, "web", lines[:150], options=EVERY)

    def full(self: NarratedTables, *args: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    with monkeypatch.context() as m:
        m.setattr(NarratedTables, "put_state", full)
        with pytest.raises(ResourceExhausted):
            service.narrated.feed(ALICE, "web", lines[150:250])
    again = service.narrated.feed(ALICE, "web", lines[150:], close=True)
    assert again.lines == 300
    kept = service.narrated.history(ALICE, "web")
    assert without_support(facts_of(kept)) == without_support(straight(lines))
    service.stop()


def test_past_its_bounds_a_tenant_s_oldest_intervals_are_folded_never_dropped(
    tmp_path: Path,
) -> None:
    service = fake_service(tmp_path, durable=True, narrate_keep_bytes=1 << 16)
    lines = log(900) * 8
    written = 0
    for k in range(0, len(lines), 500):
        fed = service.narrated.feed(
            ALICE, "web", lines[k : k + 500], options=DigestOptions(every_lines=10)
        )
        written += sum(len(i.record_json) for i in fed.closed)
    assert written > 2 * (1 << 16)  # what was written: twice the bound
    kept = service.narrated.history(ALICE, "web")
    folded = [i for i in kept if i.last_number > i.number]
    assert folded and kept[0] in folded  # the oldest went first
    assert [i.first_line for i in kept[1:]] == [i.last_line + 1 for i in kept[:-1]]
    assert kept[0].first_line == 1 and kept[-1].last_line <= len(lines)
    errors = sum(i.errors for i in kept)
    assert errors == 8 * 6  # the error burst's lines, each of the eight times, folded or not
    assert json.loads(folded[0].record_json)["error_templates"]
    assert service.durability is not None
    used = service.scheduler.call(lambda e: service.durability.narrated_tables().bytes_of("alice"))  # type: ignore[union-attr]
    assert used <= (1 << 16) + 8192  # within a fold of the bound
    service.stop()


def test_a_call_past_the_edge_when_its_tenant_is_marked_moving_writes_nothing(
    tmp_path: Path,
) -> None:
    """A call digested its lines (the edge let it in) when the admin marks the tenant leaving:
    its write is refused on the engine thread (UNAVAILABLE: retry), so the move's export misses
    nothing; once the mark is cleared the same lines continue the stream as if never sent."""
    service = fake_service(tmp_path, durable=True)
    service.narrated.feed(ALICE, "web", log(150), options=EVERY)
    reached, go = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    def hold() -> None:
        reached.set()
        assert go.wait(30)

    def feeding() -> None:
        try:
            service.narrated.feed(ALICE, "web", log(100, 150))
            outcome.append(None)
        except BaseException as e:  # collected, looked at below
            outcome.append(e)

    with failpoints.armed("narrate-digested", hold):
        t = threading.Thread(target=feeding)
        t.start()
        assert reached.wait(30)
        service.tenants.mark(ADMIN, "alice", "leaving", "m1", "b")
        go.set()
        t.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], SessionElsewhere), outcome
    service.tenants.mark(ADMIN, "alice", "", "", "")
    assert [i.last_line for i in service.narrated.history(ALICE, "web")] == [100]
    fed = service.narrated.feed(ALICE, "web", log(100, 150), True)
    assert fed.lines == 250
    assert without_support(facts_of(fed.closed)) == without_support(straight(log(250))[1:])
    service.stop()


def forget_beside_a_call_in_flight(
    service: SinkdService, since: float | None = None
) -> list[NarrationForgotten]:
    """A call feeding lines 151-250 of "web" held after its digest, before its write, while a
    forget (of the stream, or from `since`) starts; the forget must wait (it has not ended 0.2 s
    on, and it cannot end before the call goes on). What the forget said."""
    reached, go = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        reached.set()
        assert go.wait(30)

    def run(fn: Any) -> threading.Thread:
        def body() -> None:
            try:
                fn()
            except BaseException as e:  # collected, re-raised below
                errors.append(e)

        t = threading.Thread(target=body)
        t.start()
        return t

    with failpoints.armed("narrate-digested", hold):
        feeding = run(lambda: service.narrated.feed(ALICE, "web", log(100, 150)))
        assert reached.wait(30)
        forgot: list[NarrationForgotten] = []
        forgetting = run(lambda: forgot.append(service.narrated.forget(ALICE, "web", since)))
        forgetting.join(0.2)
        assert not forgot  # it waits on the call in flight (never done before `go`)
        go.set()
        feeding.join(30)
        forgetting.join(30)
    if errors:
        raise errors[0]
    return forgot


def test_a_period_forget_waits_for_a_call_in_flight_and_takes_what_it_wrote(
    tmp_path: Path,
) -> None:
    """The call's lines are written first; the period's forget then takes its closed interval
    and its open one; the stream goes on after them."""
    now = [1000.0]
    service = fake_service(tmp_path, durable=True)
    service.narrated.clock = lambda: now[0]
    service.narrated.feed(ALICE, "web", log(150), options=EVERY)
    now[0] = 2000.0
    forgot = forget_beside_a_call_in_flight(service, since=1500.0)
    assert [f.intervals for f in forgot] == [2]  # 101-200 written by the call, 201-250 open
    assert [(i.first_line, i.last_line) for i in service.narrated.history(ALICE, "web")] == [
        (1, 100)
    ]
    assert service.narrated.feed(ALICE, "web", log(5, 250)).lines == 255
    service.stop()


def test_a_forget_waits_for_a_call_in_flight_and_what_follows_starts_anew(tmp_path: Path) -> None:
    """A call digested its lines and is about to write them when the owner forgets the stream:
    the forget waits for that write, then deletes it all; the next call starts at line 1."""
    service = fake_service(tmp_path, durable=True)
    service.narrated.feed(ALICE, "web", log(150), options=EVERY)
    forgot = forget_beside_a_call_in_flight(service)
    assert [f.intervals for f in forgot] == [2]  # 250 lines: the second written by the call
    with pytest.raises(NotFound):
        service.narrated.history(ALICE, "web")
    assert service.narrated.feed(ALICE, "web", log(5)).lines == 5
    service.stop()


def test_without_a_state_directory_streams_live_in_memory(tmp_path: Path) -> None:
    service: SinkdService = fake_service(tmp_path)  # durable=False
    fed = service.narrated.feed(ALICE, "web", log(250), options=EVERY)
    assert [i.number for i in fed.closed] == [1, 2] and fed.pending == 50
    assert len(service.narrated.history(ALICE, "web")) == 2
    service.stop()


def interval(
    number: int, started: float, text: str, errors: int = 0, incidents: int = 0
) -> NarratedInterval:
    record = {"facts": {}, "text": text, "sentence": ""}
    first = 100 * (number - 1) + 1
    return NarratedInterval(
        "web", number, number, first, first + 99, started, started + 600, incidents, errors,
        json.dumps(record),
    )  # fmt: skip


def test_a_question_finds_the_intervals_its_times_severities_and_words_name() -> None:
    from sinkd.daemon.runtime.narrated_ask import select

    day = datetime.datetime(2026, 12, 7, 0, 0).astimezone()
    at = [(day + datetime.timedelta(hours=1, minutes=10 * k)).timestamp() for k in range(8)]
    kept = [
        interval(
            1, at[0], 'Log lines 1-100: 100 lines of 3 kinds.\nNEW: 40 lines "api request served".'
        ),
        interval(2, at[1], "Log lines 101-200: steady."),
        interval(
            3, at[2], 'ERROR: 3 lines "sshd Failed password for * from *".', errors=3, incidents=1
        ),
        interval(4, at[3], 'ERROR: 9 lines "sshd Failed password for * from *".', errors=9),
        interval(5, at[4], 'MORE THAN USUAL: 30 lines "cache eviction of shard *".'),
        interval(6, at[5], "Log lines 501-600: steady."),
        interval(7, at[6], 'CRITICAL: 1 line "kernel panic on cpu *".', errors=1, incidents=1),
        interval(8, at[7], "Log lines 701-800: steady."),
    ]
    now = at[7] + 120

    def numbers(question: str) -> list[int]:
        return [i.number for i in select(kept, question, now)]

    assert numbers("When did the sshd failures start?") == [3, 4]
    assert numbers("Has the cache eviction been seen before?") == [5]
    assert numbers("What happened between 01:15 and 01:35?") == [2, 3, 4]
    assert numbers("Any incidents?") == [3, 7]
    assert numbers("Was there a kernel panic since 01:45?") == [7]
    assert numbers("Anything about kubernetes?") == []
    assert numbers("What happened around line 450?") == [5]
    assert numbers("How many sshd failures between lines 150 and 320?") == [3, 4]
    assert numbers("How many sshd failures in lines 450-800?") == []


def test_an_answer_rests_on_the_kept_facts_or_says_they_hold_none(tmp_path: Path) -> None:
    service = fake_service(tmp_path)
    service.narrated.feed(ALICE, "web", log(900), True, EVERY)
    answer = service.questions.ask(ALICE, "web", "When did the db write errors start?")
    assert answer.held and answer.cites
    assert any(i.first_line <= 431 <= i.last_line for i in answer.cites)
    assert "ERROR" in answer.facts_text and "failed" in answer.facts_text
    for sentence in (answer.text, *answer.dropped):
        assert not sentence or sentence.startswith("According to the facts,")
    assert service.reads.list_sessions(ALICE) == []  # the question's session is closed
    steps = service.metrics.count("steps")
    none = service.questions.ask(ALICE, "web", "Anything about kubernetes?")
    assert not none.held and none.cites == () and none.text == ""
    assert service.metrics.count("steps") == steps  # the model was not asked
    with pytest.raises(NotFound):
        service.questions.ask(BOB, "web", "When did the db write errors start?")
    with pytest.raises(InvalidInput):
        service.questions.ask(ALICE, "web", "x" * 501)
    service.stop()


def test_a_stream_s_timeline_is_drawn_with_its_incidents_marked(tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    from sinkd.cli.narration_plot import plot

    service = fake_service(tmp_path)
    kept = service.narrated.feed(ALICE, "web", log(900), True, EVERY).closed
    service.stop()
    raising = [i.number for i in kept if i.incidents]
    assert raising
    svg = tmp_path / "web.svg"
    plot(list(kept), svg, "web")
    ids = [e.get("id") for e in ET.parse(svg).iter() if (e.get("id") or "").startswith("incident-")]
    assert sorted(ids) == sorted(f"incident-{n}" for n in raising for _ in range(2))
    with pytest.raises(InvalidInput):
        plot(list(kept), tmp_path / "web.txt", "web")
    with pytest.raises(InvalidInput):
        plot([], tmp_path / "none.svg", "web")


def test_forgetting_a_stream_leaves_no_file_holding_its_facts(tmp_path: Path) -> None:
    """Its templates, example lines and sentences are gone from the journal, its write-ahead log
    and every other file of the state directory once the forget is answered."""
    service = fake_service(tmp_path, durable=True, purge_interval_s=0)
    secret = [f"2026-12-07 vault ERROR zanzibarquux key {i} rejected" for i in range(30)]
    lines = log(200) + secret + log(200, 200)
    fed = service.narrated.feed(ALICE, "web", lines, True, EVERY)
    service.narrated.note(ALICE, "web", fed.closed[2].number, "The vault rejected keys.")
    service.narrated.feed(BOB, "db", log(150), True, EVERY)
    state = service.settings.state_dir
    assert holders(state, ["zanzibarquux"]) and holders(state, ["vault rejected"])
    service.narrated.forget(ALICE, "web")
    assert holders(state, ["zanzibarquux", "vault rejected"]) == []
    assert service.narrated.history(BOB, "db")  # another tenant's stream stays
    service.stop()


def test_a_tenant_s_streams_are_bounded_in_number_and_another_tenant_is_not_held(
    tmp_path: Path,
) -> None:
    from sinkd.daemon.runtime.narrated import MAX_STREAMS

    service = fake_service(tmp_path)
    for k in range(MAX_STREAMS):
        service.narrated.feed(ALICE, f"s{k}", ["a line"])
    with pytest.raises(ResourceExhausted, match="forget one"):
        service.narrated.feed(ALICE, "one-more", ["a line"])
    assert service.narrated.feed(ALICE, "s0", ["another"]).lines == 2  # its own go on
    assert service.narrated.feed(BOB, "web", ["a line"]).lines == 1
    service.narrated.forget(ALICE, "s1")
    assert service.narrated.feed(ALICE, "one-more", ["a line"]).lines == 1
    service.stop()


def test_forgetting_a_period_takes_its_intervals_and_open_lines_and_the_stream_goes_on(
    tmp_path: Path,
) -> None:
    """`forget(since=...)`: the intervals that overlap the period go, the open interval with its
    kept raw lines too (closed first), out of every file; the rest of the history stays, and the
    stream goes on with its templates and line numbers."""
    now = [1000.0]
    service = fake_service(tmp_path, durable=True)
    service.narrated.clock = lambda: now[0]
    keeping = DigestOptions(every_lines=100, keep_lines=True)
    service.narrated.feed(ALICE, "web", log(300), True, keeping)
    now[0] = 2000.0
    secret = [
        f"2026-12-05T11:00:{i:02d} payroll INFO row customer-98{i:03d} exported" for i in range(30)
    ]
    service.narrated.feed(ALICE, "web", [*log(170, 300), *secret], True)
    now[0] = 3000.0
    service.narrated.feed(ALICE, "web", [*log(20, 500), *secret[:5]])  # open: not closed
    assert holders(tmp_path, ["customer-98003"]), "the period's lines were in the files"
    with pytest.raises(InvalidInput):
        service.narrated.forget(ALICE, "web", since=3000.0, until=2000.0)
    with pytest.raises(NotFound):
        service.narrated.forget(BOB, "web", since=1500.0)
    later = [i for i in service.narrated.history(ALICE, "web") if i.started >= 2000.0]
    assert len(later) >= 2 and later[-1].last_line == 500
    gone = service.narrated.forget(ALICE, "web", since=1500.0)
    assert gone == NarrationForgotten(len(later) + 1, False)  # and the open one, 501-525
    kept = service.narrated.history(ALICE, "web")
    assert [(i.first_line, i.last_line) for i in kept] == [(1, 100), (101, 200), (201, 300)]
    fed = service.narrated.feed(ALICE, "web", log(10, 525), True)
    assert fed.lines == 535 and not facts_of(fed.closed)[0].new  # known templates, numbers go on
    assert service.narrated.forget(ALICE, "web", until=999.0) == NarrationForgotten(0, False)
    service.stop()
    assert not holders(tmp_path, ["customer-98003"]), "a forgotten period's lines remain"


def test_raw_lines_are_kept_only_when_asked_each_with_its_interval_across_restarts(
    tmp_path: Path,
) -> None:
    """`keep_lines`: each interval keeps exactly its lines, the open interval's wait in the
    stream's state through a restart; a stream that does not ask keeps none, nor one that stops
    asking; forgetting the stream leaves no file holding them."""
    lines = log(450)
    keeping = DigestOptions(every_lines=100, keep_lines=True)
    closed: list[NarratedInterval] = []
    for start, end in ((0, 150), (150, 450)):  # a restart inside the second interval
        service = fake_service(tmp_path, durable=True)
        closed += service.narrated.feed(ALICE, "kept", lines[start:end], end == 450, keeping).closed
        service.stop()
    service = fake_service(tmp_path, durable=True)
    for i in service.narrated.history(ALICE, "kept"):
        record = json.loads(i.record_json)
        assert record["lines"] == lines[i.first_line - 1 : i.last_line]
        assert record["lines_left_out"] == 0
    assert len(closed) >= 4
    service.narrated.feed(ALICE, "bare", lines[:150], True, EVERY)
    assert all("lines" not in json.loads(i.record_json)
               for i in service.narrated.history(ALICE, "bare"))  # fmt: skip
    service.narrated.feed(ALICE, "kept", lines[:50], True, DigestOptions(every_lines=100))
    assert "lines" not in json.loads(service.narrated.history(ALICE, "kept")[-1].record_json)
    service.narrated.forget(ALICE, "kept")
    service.narrated.forget(ALICE, "bare")
    service.stop()
    assert not holders(tmp_path, ["/var/lib/db/1 failed"]), "a forgotten stream's lines remain"


def test_one_call_across_several_intervals_keeps_each_interval_s_own_first_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound on kept lines is each interval's, however many intervals one call closes; what
    an interval did not keep is counted in its own row."""
    from sinkd.daemon.runtime import narrated

    monkeypatch.setattr(narrated, "KEEP_LINES", 30)
    lines = log(300)
    service = fake_service(tmp_path)
    keeping = DigestOptions(every_lines=100, keep_lines=True)
    fed = service.narrated.feed(ALICE, "kept", lines, True, keeping)
    assert len(fed.closed) >= 3
    for i in fed.closed:
        record = json.loads(i.record_json)
        assert record["lines"] == lines[i.first_line - 1 : i.first_line - 1 + 30]
        assert record["lines_left_out"] == i.last_line - i.first_line + 1 - 30
    service.stop()


def test_keep_lines_alone_changes_nothing_else_of_the_stream_s_rules(tmp_path: Path) -> None:
    """What an HTTP client sends (`keep_lines` without rules): the stream's rules stay."""
    lines = log(200)
    service = fake_service(tmp_path)
    service.narrated.feed(ALICE, "web", lines[:50], False, DigestOptions(every_lines=40))
    fed = service.narrated.feed(ALICE, "web", lines[50:200], True, keep_lines=True)
    assert [i.last_line - i.first_line + 1 for i in fed.closed][:3] == [40, 40, 40]
    assert "lines" in json.loads(fed.closed[-1].record_json)
    service.stop()


def test_a_muted_template_is_listed_never_paged_across_a_restart_and_unmuted_pages_again(
    tmp_path: Path,
) -> None:
    """An operator mutes the template a page was for: back after quiet intervals it is read,
    counted and listed as an error, and raises nothing, through a restart of the daemon, where a
    twin stream fed the same lines pages; unmuted, it pages again. Only the stream's owner can
    mute, and only a template the stream has."""
    service = fake_service(tmp_path, durable=True)
    first = log(450)
    for name in ("web", "twin"):
        service.narrated.feed(ALICE, name, first, True, EVERY)
    [raised] = [i for i in service.narrated.history(ALICE, "web") if i.incidents]
    [incident] = json.loads(raised.record_json)["facts"]["opened"]
    tid = incident["template_id"]
    done = service.narrated.mute(ALICE, "web", tid)
    assert (done.template_id, done.muted) == (tid, (tid,)) and "ERROR" in done.template
    for who, name, template in ((BOB, "web", tid), (ALICE, "web", 10_000), (ALICE, "nope", tid)):
        with pytest.raises(NotFound):
            service.narrated.mute(who, name, template)
    service.stop()

    again = [*log(400, 450), first[431], *log(30, 850)]  # quiet four intervals, then back
    service = fake_service(tmp_path, durable=True)
    muted = facts_of(service.narrated.feed(ALICE, "web", again, True).closed)
    twin = facts_of(service.narrated.feed(ALICE, "twin", again, True).closed)
    assert [e.template_id for f in muted for e in f.errors] == [tid]  # still listed
    assert [i.template_id for f in twin for i in f.opened] == [tid]
    assert not any(f.incident for f in muted)
    assert service.narrated.mute(ALICE, "web", tid, muted=False).muted == ()
    back = facts_of(service.narrated.feed(ALICE, "web", again, True).closed)
    assert [i.template_id for f in back for i in f.opened] == [tid]
    service.stop()


def test_a_mute_that_finds_its_stream_forgotten_before_it_holds_it_says_so_and_makes_none(
    tmp_path: Path,
) -> None:
    """A mute found the stream, then the owner forgot it before the mute held it: the mute is
    NotFound for the stream (not for its template), and no stream is made anew in its place;
    the next call starts at line 1 with nothing muted."""
    service = fake_service(tmp_path, durable=True)
    service.narrated.feed(ALICE, "web", log(450), True, EVERY)
    [raised] = [i for i in service.narrated.history(ALICE, "web") if i.incidents]
    tid = json.loads(raised.record_json)["facts"]["opened"][0]["template_id"]
    reached, go = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        reached.set()
        assert go.wait(30)

    def mute() -> None:
        try:
            service.narrated.mute(ALICE, "web", tid)
        except BaseException as e:  # collected, re-raised below
            errors.append(e)

    with failpoints.armed("narrate-found", hold):
        muting = threading.Thread(target=mute)
        muting.start()
        assert reached.wait(30)
        service.narrated.forget(ALICE, "web")
        go.set()
        muting.join(30)
    assert not muting.is_alive()
    [error] = errors
    assert isinstance(error, NotFound) and "no narrated stream" in str(error)
    with pytest.raises(NotFound):
        service.narrated.muted(ALICE, "web")
    assert service.narrated.feed(ALICE, "web", log(5)).lines == 5
    assert service.narrated.muted(ALICE, "web") == []
    service.stop()


def test_a_stream_pages_a_failure_its_program_carried_past_only_where_asked(
    tmp_path: Path,
) -> None:
    """debconf failing to start a frontend and falling back, through the daemon and through the
    gRPC message: listed, not paged, through a restart between a failure and its fallback; a
    stream asked to (`page_handled`) pages it."""
    falls_back = [
        "debconf: unable to initialize frontend: Dialog",
        "debconf: falling back to frontend: Readline",
        "debconf: unable to initialize frontend: Readline",
        "debconf: falling back to frontend: Teletype",
    ]
    lines = [*log(50), *falls_back, *log(50, 50)]
    paging = digest_options_from_pb(digest_options_to_pb(DigestOptions(100, page_handled=True)))
    service = fake_service(tmp_path, durable=True)
    service.narrated.feed(ALICE, "apt", lines[:51], False, EVERY)  # a failure, not its fallback
    service.narrated.feed(ALICE, "asked", lines, True, paging)
    service.stop()
    service = fake_service(tmp_path, durable=True)
    quiet = facts_of(service.narrated.feed(ALICE, "apt", lines[51:], True).closed)
    assert [(e.count, e.severity) for f in quiet for e in f.errors] == [(2, "error")]
    assert not any(f.incident for f in quiet)
    asked = facts_of(service.narrated.history(ALICE, "asked"))
    assert [i.count for f in asked for i in f.opened] == [2]
    service.stop()
