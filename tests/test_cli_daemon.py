"""CLI commands against a live daemon on a temporary socket, and `sinkd narrate` fed by a pipe."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sinkd.cli.main import app
from sinkd.cli.narrator import MAX_PENDING
from sinkd.daemon.node import Daemon
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.proto.v1 import sinkd_pb2 as pb
from tests.support.cli import runner, sinkd
from tests.support.clients import Client
from tests.support.settings import settings
from tests.support.tokens import ALICE

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = Daemon(settings(tmp_path_factory.mktemp("cli")))
    d.start()
    d.wait_ready(60)
    yield d.addresses[0]
    d.stop()


def test_chat_then_sessions_commands(address: str) -> None:
    conn = ["--connect", address, "--token", "alice-token"]
    code, out, err = sinkd("chat", *conn, "--window", "60", "--max-tokens", "8",
                           input="Hello there\n/receipt\n/trace\n/quit\n")  # fmt: skip
    assert code == 0, err
    assert "retained" in err and "receipt" in err  # status line and the /receipt table
    code, out, _ = sinkd("sessions", "list", *conn, "--json")
    assert code == 0
    (session,) = json.loads(out)
    sid = session["session_id"]
    code, out, _ = sinkd("sessions", "inspect", sid, *conn, "--json")
    receipt = json.loads(out)["receipt"]
    assert receipt["n_seen"] > 0 and "retained_text" not in json.loads(out)
    code, out, _ = sinkd("sessions", "inspect", sid, *conn, "--json", "--text")
    assert "Hello there" in json.loads(out)["retained_text"]  # the owner may ask for the text
    code, out, _ = sinkd("sessions", "inspect", sid, *conn)
    assert code == 0 and "anchors" in out and "logical [0, 4)" in out
    code, out, _ = sinkd("sessions", "trace", sid, *conn, "--json")
    assert code == 0 and json.loads(out) == []
    old_generation = receipt["generation"]
    code, out, _ = sinkd("sessions", "reset", sid, *conn, "--json")
    assert code == 0 and json.loads(out)["receipt"]["retained"] == 0
    code, _, err = sinkd("sessions", "inspect", sid, *conn, "--generation", old_generation)
    assert code == 12 and "stale" in err and len(err.strip().splitlines()) == 1
    code, _, err = sinkd("sessions", "inspect", sid, "--connect", address, "--token", "bob-token")
    assert code == 11 and "no session" in err  # another tenant's session does not exist for bob
    code, out, _ = sinkd("sessions", "close", sid, *conn)
    assert code == 0 and "closed" in out
    assert json.loads(sinkd("sessions", "list", *conn, "--json")[1]) == []


def test_sessions_list_shows_snapshot_journal_and_resume_state(address: str) -> None:
    conn = ["--connect", address, "--token", "alice-token"]
    c = Client(address)
    h = c.create().handle
    c.append(h, "A line for the journal.")
    code, out, _ = sinkd("sessions", "list", *conn, "--json")
    (row,) = json.loads(out)
    assert row["resume"] == "new" and row["snapshot_n_seen"] == -1  # no snapshot due yet
    assert row["journal_chunks"] >= 1 and row["journal_tokens"] == row["n_seen"] > 0
    code, out, _ = sinkd("sessions", "list", *conn)
    assert code == 0 and "journal" in out and "resume" in out and "none" in out
    assert row["residency"] == "resident"
    others = [c.create().handle for _ in range(6)]  # past the six resident: the oldest parks
    for other in others:  # (each with a history: an empty one would park first, needing no write)
        c.append(other, "Another line.")
    code, out, _ = sinkd("sessions", "list", *conn, "--json")
    assert {r["session_id"]: r["residency"] for r in json.loads(out)}[h.session_id] == "parked"
    code, out, _ = sinkd("sessions", "list", *conn)
    assert code == 0 and "parked" in out
    c.append(h, " It comes back.")
    code, out, _ = sinkd("sessions", "list", *conn)
    assert code == 0 and "resident, restored 1x" in out
    for handle in [h, *others]:
        c.s.Close(pb.HandleRequest(handle=handle), metadata=ALICE)


def test_serve_refuses_a_state_directory_another_daemon_holds(tmp_path: Path) -> None:
    held = Durability(tmp_path / "state")
    held.open({})
    try:
        code, _, err = sinkd("serve", "--socket", str(tmp_path / "s.sock"), "--state-dir",
                             str(tmp_path / "state"), "--ctx", "256")  # fmt: skip
    finally:
        held.close()
    assert code == 9 and "in use by another sinkd" in err
    (tmp_path / "state" / "journal.db").write_bytes(b"not a database" * 100)
    code, _, err = sinkd("serve", "--socket", str(tmp_path / "s.sock"), "--state-dir",
                         str(tmp_path / "state"), "--ctx", "256")  # fmt: skip
    assert code == 9 and "journal.db" in err and "not a database" in err


def test_cli_errors_are_one_line(address: str, tmp_path: Path) -> None:
    code, _, err = sinkd("sessions", "list", "--connect", f"unix:{tmp_path}/none.sock")
    assert code == 10 and "sinkd serve" in err and len(err.strip().splitlines()) == 1
    code, _, err = sinkd("sessions", "list", "--connect", address, "--token", "wrong")
    assert code == 13 and "unknown bearer token" in err
    code, _, err = sinkd(
        "chat", "--connect", address, "--token", "alice-token", "--window", "0", input=""
    )
    assert code == 2 and "window" in err
    code, _, err = sinkd("narrate", "--on-full", "sometimes", input="")
    assert code == 2 and "--on-full" in err


def test_narrate_and_chat_use_the_daemon_that_answers(address: str) -> None:
    """No --connect, no --embedded: a daemon at the default address is used, and the first line
    says so (a second llama.cpp process on the same cores would slow both: bench/two_processes)."""
    env = {"COLUMNS": "120", "SINKD_ADDRESS": address, "SINKD_TOKEN": "alice-token"}
    lines = "".join(f"service started, worker {i} ready\n" for i in range(8))
    result = runner.invoke(
        app,
        ["narrate", "--window", "60", "--every-lines", "4", "--max-tokens", "4", "--json"],
        input=lines,
        env=env,
    )
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines()[0] == f"using the daemon at {address}"
    assert any('"narration"' in line for line in result.stdout.splitlines())
    result = runner.invoke(
        app, ["chat", "--window", "60", "--max-tokens", "4"], input="Hello\n", env=env
    )
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines()[0] == f"using the daemon at {address}"


def test_chat_embedded_runs_without_a_daemon() -> None:
    code, out, err = sinkd("chat", "--embedded", "--window", "60", "--max-tokens", "6",
                           input="Say one word.\n/fork\nAnother.\n/reset\n")  # fmt: skip
    assert code == 0, err
    assert "forked" in err and "reset: a new generation" in err
    assert out.count("\n") >= 2  # two streamed replies


def test_narrate_tails_a_growing_file_for_100000_lines_at_flat_memory(tmp_path: Path) -> None:
    """`tail -F` of a file a writer grows to 100,000 lines in bursts of 10,000 (5,000-byte lines,
    invalid UTF-8, an error every 25,000 lines), through S=4, W=60 with the raw lines fed too.

    Every line is in the facts (their intervals add up to 100,000) and counted as appended to the
    session or dropped; each planted error is an incident cut at its own line. Lag: the reader is
    never more than 2 x MAX_PENDING + 1 intervals ahead of what was printed (a backlog of cuts,
    then the reader waits; it refills while the narrator prints the one it took; on this machine
    the writer outruns the model, so that bound is what holds; it is the claim, not a time that a
    loaded machine stretches). Recall off: its embedder's working memory steps
    up with each phrasing (docs/narrate.md), which is not the narrator's. Memory: from the first
    narration after the
    first eviction, the floor of resident memory rises by less than 48 MiB overall and 12 MiB over
    the last third (its floor, not a sample: it swings by ~30 MiB between narrations)."""
    log = tmp_path / "app.log"
    with log.open("wb") as sink:
        writer = subprocess.Popen(
            [sys.executable, "tests/loggen.py", "100000", "10000", "0.3", "7", "25000"],
            stdout=sink,
        )
    tail = subprocess.Popen(
        ["tail", "-n", "+1", "-F", "--pid", str(writer.pid), str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "sinkd.cli.main", "narrate", "--window", "60", "--sinks", "4",
         "--feed-lines", "--chunk-lines", "8", "--every-lines", "200", "--every-seconds", "600",
         "--incident-seconds", "600", "--queue-lines", "200", "--max-tokens", "16", "--no-recall",
         "--json"],
        stdin=tail.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert tail.stdout is not None
    tail.stdout.close()  # the narrator holds the pipe now
    # reaped at once: `tail --pid` polls it with kill(pid, 0), which a zombie still answers
    writer.wait(600)
    try:
        stdout, stderr = proc.communicate(timeout=900)  # a deadline, not a speed claim
    finally:
        tail.kill()
        proc.kill()
    tail.wait(10)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    events = [json.loads(line) for line in stdout.decode().splitlines() if line.startswith("{")]
    narrations = [e for e in events if e["event"] == "narration"]
    summary = events[-1]
    assert summary["event"] == "summary" and not summary["interrupted"]
    assert summary["lines_read"] == 100_000
    assert sum(n["facts"]["lines"] for n in narrations) == 100_000
    assert summary["lines_appended"] + summary["lines_dropped"] == summary["lines_read"]
    assert summary["lines_truncated"] == len(range(0, 100_000, 997))
    incidents = [n for n in narrations if n["incident"]]
    planted = [e["first_line"] for n in incidents for e in n["facts"]["errors"]]
    assert planted == [25_000, 50_000, 75_000, 100_000], planted
    lags = [n["lines_read_at_print"] - n["lines"][1] for n in narrations]
    assert max(lags) <= (2 * MAX_PENDING + 1) * 200, max(lags)
    assert summary["narrations"] == len(narrations) and summary["phrased"] >= 4
    assert "running the model in this process" in stderr.decode().splitlines()[0]
    assert summary["retained"] <= 64 and summary["evicted_tokens"] > 0
    assert summary["retained"] + summary["evicted_tokens"] == summary["tokens_seen"]
    rss = [n["rss_bytes"] for n in narrations if n["evictions"] > 0]
    third = len(rss) // 3
    assert third >= 2, rss  # two samples a third at least: the swing's low phase is in each
    # the allocator's floor may step up once (~30 MiB, seen at random points of a run); a leak
    # keeps climbing: the floor of the last third against the middle one's, and a bound overall
    late = min(rss[2 * third :]) - min(rss[third : 2 * third])
    overall = min(rss[2 * third :]) - min(rss[:third])
    assert late < 12 * 2**20, f"RSS floor still rising {late / 2**20:.1f} MiB: {rss}"
    assert overall < 48 * 2**20, f"RSS floor rose {overall / 2**20:.1f} MiB: {rss}"


def test_the_facts_are_the_same_through_the_daemon_and_embedded(address: str) -> None:
    """The facts come from the lines alone: the same log gives the same intervals, templates,
    counts and line numbers whichever backend phrases them."""
    lines = [f"2026-12-05T10:00:{i % 60:02d} api INFO request {i} served" for i in range(120)]
    lines[70] = "2026-12-05T10:01:10 kernel FATAL machine check on cpu 3"
    text = "".join(line + "\n" for line in lines)
    args = ["narrate", "--window", "60", "--every-lines", "50", "--every-seconds", "600",
            "--incident-seconds", "600", "--max-tokens", "8", "--no-recall", "--json"]  # fmt: skip
    code, remote, err = sinkd(*args, "--connect", address, "--token", "alice-token", input=text)
    assert code == 0, err
    code, embedded, err = sinkd(*args, "--embedded", input=text)
    assert code == 0, err

    def facts(out: str) -> list[dict[str, object]]:
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return [e["facts"] for e in events if e["event"] == "narration"]

    assert facts(remote) == facts(embedded)
    shape = [(f["first_line"], f["last_line"], f["incident"]) for f in facts(remote)]
    assert shape == [(1, 50, False), (51, 90, True), (91, 120, False)], shape


def test_a_narrated_stream_goes_on_across_pipes_and_answers_its_history(
    address: str, tmp_path: Path
) -> None:
    """`--stream`: two pipes, one stream kept by the daemon: the second pipe's line numbers
    continue the first's and its templates are known (not NEW again); `history` lists both
    pipes' intervals, by severity too, says where the second began, and the raw lines of the pipe that asked to keep them;
    another tenant has no such stream; `mute` mutes the template an incident named; `forget`
    deletes it."""
    conn = ["--connect", address, "--token", "alice-token"]
    args = ["narrate", "--stream", "web", "--window", "60", "--every-lines", "50",
            "--every-seconds", "600", "--incident-seconds", "600", "--max-tokens", "8",
            "--no-recall", "--json", *conn]  # fmt: skip
    lines = [f"2026-12-05T10:00:{i % 60:02d} api INFO request {i} served" for i in range(200)]
    lines[130] = "2026-12-05T10:02:10 kernel FATAL machine check on cpu 3"

    def facts(out: str) -> list[dict[str, Any]]:
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return [e["facts"] for e in events if e["event"] == "narration"]

    code, first, err = sinkd(*args, input="".join(line + "\n" for line in lines[:100]))
    assert code == 0, err
    lines[150] = "2026-12-05T10:02:30 api INFO request [bold]150[/bold] served"
    kept = [*args, "--keep-lines"]  # the second pipe keeps its raw lines
    code, second, err = sinkd(*kept, input="".join(line + "\n" for line in lines[100:]))
    assert code == 0, err
    code, out, err = sinkd("narrate", "history", "web", *conn, "--lines")
    assert code == 0, err
    assert "[bold]150[/bold]" in out and "request 99 served" not in out  # as text; pipe 1: none
    assert "(a new pipe at line 101)" in out and "new pipe at line 1)" not in out
    assert any(line.split()[:1] == ["151"] for line in out.splitlines())
    one, two = facts(first), facts(second)
    assert [(f["first_line"], f["last_line"]) for f in one] == [(1, 50), (51, 100)]
    assert two[0]["first_line"] == 101 and two[-1]["last_line"] == 200
    assert not any("api INFO" in n["template"] for f in two for n in f["new"])  # known
    code, out, err = sinkd("narrate", "history", "web", *conn, "--json")
    assert code == 0, err
    kept = [json.loads(line) for line in out.splitlines()]
    assert [k["number"] for k in kept] == list(range(1, len(one) + len(two) + 1))
    code, out, _ = sinkd("narrate", "history", "web", *conn, "--json", "--severity", "critical")
    [fatal] = [json.loads(line) for line in out.splitlines()]
    assert fatal["first_line"] <= 131 <= fatal["last_line"] and fatal["incidents"] == 1
    tid = str(fatal["record"]["facts"]["opened"][0]["template_id"])
    code, out, err = sinkd("narrate", "mute", "web", tid, *conn)
    assert code == 0 and f"muted template {tid} of web" in out and "FATAL" in out, err
    code, out, err = sinkd("narrate", "mute", "web", "9999", *conn)
    assert code == 11 and "no template 9999" in err
    code, out, err = sinkd("narrate", "mute", "web", *conn)  # no id: what is muted
    assert code == 0 and out.split()[0] == tid and "FATAL" in out, err
    code, out, err = sinkd("narrate", "mute", "web", "--unmute", *conn)
    assert code == 2 and "template" in err
    picture = tmp_path / "web.png"
    code, _, err = sinkd("narrate", "history", "web", *conn, "--plot", str(picture))
    assert code == 0 and picture.read_bytes()[:4] == b"\x89PNG", err
    code, out, _ = sinkd("narrate", "list", *conn, "--json")
    assert [(s["name"], s["lines"]) for s in map(json.loads, out.splitlines())] == [("web", 200)]
    code, out, err = sinkd("narrate", "ask", "web", "When was the machine check?", *conn, "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["held"] and any(c["number"] == fatal["number"] for c in answer["cites"])
    assert "FATAL" in answer["facts_text"] and "machine check" in answer["facts_text"]
    code, out, _ = sinkd("narrate", "ask", "web", "Anything about kubernetes?", *conn)
    assert code == 0 and "do not hold an answer" in out
    code, _, err = sinkd("narrate", "history", "web", "--connect", address, "--token", "bob-token")
    assert code == 11 and "no narrated stream" in err
    code, out, err = sinkd("narrate", "forget", "web", "--since", "2999-01-01", "--yes", *conn)
    assert code == 0 and "forgot web: 0 intervals" in out, err  # the period: none of it yet
    code, out, err = sinkd("narrate", "forget", "web", "--since", "yesterday", "--yes", *conn)
    assert code == 2 and "--since" in err
    code, out, err = sinkd("narrate", "forget", "web", "--yes", *conn)
    assert code == 0 and "forgot web" in out, err
    code, _, _ = sinkd("narrate", "history", "web", *conn)
    assert code == 11


@pytest.mark.unit
def test_a_full_queue_drops_the_oldest_lines() -> None:
    """A burst of 2,000 lines into a 200-line queue nobody reads: the newest 200 stay, 1,800 are
    counted as dropped; `block` instead makes the writer wait until a reader takes a chunk."""
    import threading

    from sinkd.cli.narrator import BLOCK, DROP_OLDEST, Counts, LineQueue

    counts = Counts()
    q = LineQueue(200, DROP_OLDEST, counts)
    for i in range(2000):
        q.put(f"line {i}")
    assert counts.lines_dropped == 1800
    assert q.take(200, 0) == [f"line {i}" for i in range(1800, 2000)]
    blocking = LineQueue(2, BLOCK, Counts())
    blocking.put("a")
    blocking.put("b")
    writer = threading.Thread(target=blocking.put, args=("c",))
    writer.start()
    assert blocking.take(1, 0) == ["a"]  # the writer waits for this room: nothing is dropped
    writer.join(10)
    assert not writer.is_alive() and blocking.take(3, 0) == ["b", "c"]


def test_the_same_error_exits_with_the_same_code_embedded_and_remote(tmp_path: Path) -> None:
    """gemma3-270m cannot run sink-noshift (its positions would outgrow the 512-token sliding
    window): Unsupported, exit 5, in process and through a daemon (which names the error's class;
    its status alone, FAILED_PRECONDITION, would say 12)."""
    args = ("-m", "gemma3-270m", "--policy", "sink-noshift", "--window", "60")
    code, _, err = sinkd("chat", "--embedded", *args, input="hi\n")
    assert code == 5 and "sliding window of 512" in err, err
    d = Daemon(settings(tmp_path, model="gemma3-270m", n_ctx_seq=512, max_sessions=2))
    d.start()
    d.wait_ready(120)
    try:
        code, _, err = sinkd(
            "chat", "--connect", d.addresses[0], "--token", "alice-token", *args, input="hi\n"
        )
        assert code == 5 and "sliding window of 512" in err, err
    finally:
        d.stop()


def test_sessions_memory_and_forget(address: str) -> None:
    """The owner lists, searches and deletes the memory from the CLI; bad targets exit 2, an
    unknown passage 11, another tenant sees nothing (11)."""
    from tests.support.clients import planted
    from tests.support.texts import SENTINEL

    client = Client(address)
    h = planted(client)
    conn = ["--connect", address, "--token", "alice-token"]
    code, out, err = sinkd(
        "sessions", "memory", h.session_id, *conn, "--search", SENTINEL, "--json"
    )
    assert code == 0, err
    found = json.loads(out)
    assert found and SENTINEL in found[0]["text"] and found[0]["score"] > 0
    code, out, _ = sinkd("sessions", "memory", h.session_id, *conn)
    assert code == 0 and "memory of" in out
    # appended text is no one's turn: said by "text"; by speaker, listed and refused by name
    code, out, err = sinkd("sessions", "memory", h.session_id, *conn, "--speaker", "text", "--json")
    assert code == 0 and {p["speaker"] for p in json.loads(out)} == {"text"}, err
    code, out, _ = sinkd("sessions", "memory", h.session_id, *conn, "--speaker", "user", "--json")
    assert code == 0 and json.loads(out) == []
    code, _, err = sinkd("sessions", "memory", h.session_id, *conn, "--speaker", "model")
    assert code == 2 and "speaker 'model' is unknown" in err
    code, _, err = sinkd("sessions", "forget", h.session_id, "3", "--speaker", "text", *conn)
    assert code == 2 and "one of them" in err
    code, _, err = sinkd("sessions", "forget", h.session_id, "twelve", *conn)
    assert code == 2 and "passage id" in err
    code, _, err = sinkd("sessions", "forget", h.session_id, "9:3", *conn)
    assert code == 2
    code, _, _ = sinkd(
        "sessions", "memory", h.session_id, "--connect", address, "--token", "bob-token"
    )
    assert code == 11
    pid = str(found[0]["passage_id"])
    code, out, err = sinkd("sessions", "forget", h.session_id, pid, *conn, "--json")
    assert code == 0 and json.loads(out) == {"forgotten": 1, "purge_owed": False}, err
    code, _, _ = sinkd("sessions", "forget", h.session_id, pid, *conn)
    assert code == 11
    code, out, _ = sinkd("sessions", "memory", h.session_id, *conn, "--search", SENTINEL, "--json")
    assert json.loads(out) == []
    code, out, _ = sinkd("sessions", "forget", h.session_id, "0:100000", *conn, "--json")
    assert code == 0 and json.loads(out)["forgotten"] > 0
    client.s.Close(pb.HandleRequest(handle=h), metadata=ALICE)
    client.close()


def test_text_from_the_stream_is_printed_as_text_not_markup_or_escapes(address: str) -> None:
    """A passage or the retained text holding `[/x]` (rich raises), `[ERROR]` (rich hides it) and an
    escape sequence (the terminal obeys it) prints as it is, the escape shown, not sent."""
    from tests.support.texts import LONG
    from tests.support.texts import RECALL_POLICY as POLICY

    client = Client(address)
    h = client.create(**POLICY).handle
    hostile = "\nlog: [/x] closed [ERROR] disk \x1b[2J\x1b]0;owned\x07 gone.\n"
    client.append(h, LONG[:200] + hostile)
    client.append(h, LONG[200:1400])  # evicted: in the memory now
    conn = ["--connect", address, "--token", "alice-token"]
    code, out, err = sinkd("sessions", "memory", h.session_id, *conn, "--search", "closed disk")
    assert code == 0, err
    assert "[/x] closed [ERROR] disk \\x1b[2J\\x1b]0;owned\\x07" in out and "\x1b" not in out
    client.append(h, hostile)  # and in the window
    code, out, err = sinkd("sessions", "inspect", h.session_id, *conn, "--text")
    assert code == 0, err
    assert "[ERROR] disk \\x1b[2J" in out and "\x1b" not in out
    client.s.Close(pb.HandleRequest(handle=h), metadata=ALICE)
