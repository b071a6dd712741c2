"""CLI commands against a live daemon on a temporary socket, and `sinkd narrate` fed by a pipe."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sinkd.cli.main import app
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


def test_narrate_a_long_bursty_log_at_flat_memory() -> None:
    """20,000 lines in bursts of 2,000 (with 5,000-byte lines and invalid UTF-8) through S=4, W=60.

    Bound stated: from the first narration after the first eviction to the end, the floor of
    resident memory (about 350 MiB) rises by less than 24 MiB. Its floor, not a sample: from one
    narration to the next it swings by ~30 MiB and back (under load: 350, 349, 379, 379, 350, 378,
    382, 387, 355 ... 355 MiB over 25 narrations, no trend; where the swing comes from is not yet
    known), so one sample against another says which phase each caught. A leak raises the floor."""
    gen = subprocess.Popen(
        [sys.executable, "tests/loggen.py", "20000", "2000", "0.8"], stdout=subprocess.PIPE
    )
    proc = subprocess.run(
        [sys.executable, "-m", "sinkd.cli.main", "narrate", "--window", "60", "--sinks", "4", "--chunk-lines", "8",
         "--every-seconds", "2", "--queue-lines", "200", "--max-tokens", "16", "--json"],
        stdin=gen.stdout, capture_output=True, timeout=400, check=False,
    )  # fmt: skip
    gen.wait(10)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    events = [
        json.loads(line) for line in proc.stdout.decode().splitlines() if line.startswith("{")
    ]
    narrations = [e for e in events if e["event"] == "narration"]
    summary = events[-1]
    assert summary["event"] == "summary" and not summary["interrupted"]
    assert summary["lines_read"] == 20000
    assert summary["lines_appended"] + summary["lines_dropped"] == summary["lines_read"]
    # whether a burst overflows the queue depends on the machine's speed: drop-oldest itself is
    # tested deterministically in test_a_full_queue_drops_the_oldest_lines
    assert summary["lines_truncated"] == len(range(0, 20000, 997))
    # invalid bytes end a line; where that line was also cut (line 0), they were cut with it
    assert summary["lines_with_invalid_utf8"] == sum(1 for i in range(0, 20000, 1499) if i % 997)
    assert summary["narrations"] == len(narrations) >= 5
    assert "running the model in this process" in proc.stderr.decode().splitlines()[0]
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
    assert code == 0 and json.loads(out) == {"forgotten": 1}, err
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
