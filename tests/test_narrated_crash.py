"""A narrated stream through the real daemon, killed with -9 (after a call was answered, and inside
a call, between its digest and its write) and restarted: the stream goes on from the last call
answered, its templates known, its counts since the start continued, its history whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from sinkd.daemon.rpc.client import Client
from sinkd.daemon.runtime.api import DigestOptions, NarratedInterval
from sinkd.errors import SinkdError
from sinkd.narration.facts import Digest, DigestConfig, Facts
from tests.support.daemons import serve_subprocess

pytestmark = pytest.mark.model
OPTIONS = DigestOptions(every_lines=100)


def log(n: int) -> list[str]:
    kinds = [
        "2026-12-07T03:00:{s:02d} api INFO request served in {ms} ms",
        "2026-12-07T03:00:{s:02d} db INFO pool at {n}/64",
        "2026-12-07T03:00:{s:02d} worker INFO job {n} done",
    ]
    out = [kinds[i % 3].format(s=i % 60, ms=(i * 7) % 900 + 1, n=(i * 13) % 97) for i in range(n)]
    for i in [*range(130, 136), *range(430, 436)]:  # before the kill, and after it
        out[i] = f"2026-12-07T03:07:{i % 60:02d} db ERROR write to /var/lib/db/{i % 3} failed"
    return out


def facts_of(closed: list[NarratedInterval]) -> list[Facts]:
    return [Facts.from_dict(json.loads(i.record_json)["facts"]) for i in closed]


def test_a_stream_killed_and_restarted_goes_on_from_the_last_call_answered(tmp_path: Path) -> None:
    sock = tmp_path / "d.sock"
    env = dict(os.environ, SINKD_STATE_DIR=str(tmp_path / "state"))
    lines = log(900)
    closed: list[NarratedInterval] = []

    def start(failpoint: str = "") -> tuple[subprocess.Popen[bytes], Client]:
        proc = serve_subprocess(sock, dict(env, SINKD_FAILPOINT=failpoint))
        return proc, Client(f"unix:{sock}")

    proc, client = start()
    for k in range(0, 300, 50):  # six calls answered, then kill -9
        closed += client.narration.narrate("web", lines[k : k + 50], options=OPTIONS).closed
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)

    proc, client = start("narrate-digested")  # dies inside the next call, before its write
    with pytest.raises(SinkdError):
        client.narration.narrate("web", lines[300:400])
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL

    proc, client = start()
    for k in range(300, 900, 100):  # the unanswered call's lines sent again, then the rest
        closed += client.narration.narrate("web", lines[k : k + 100]).closed
    closed += client.narration.narrate("web", [], close=True).closed
    kept = client.narration.history("web")
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)

    digest = Digest(DigestConfig(every_lines=100), clock=lambda: 0.0)
    straight = [f for f in map(digest.observe, lines) if f is not None]
    straight += [f] if (f := digest.cut()) else []
    assert [f.as_dict() for f in facts_of(closed)] == [f.as_dict() for f in straight]
    later = [f for f in facts_of(closed) if f.first_line > 300]
    assert not any("INFO" in n.template for f in later for n in f.new)  # known, not NEW again
    error = next(e for f in later for e in f.errors)
    assert (error.since_line, error.total) == (131, 12)  # counted since the start
    assert [(i.first_line, i.last_line) for i in kept] == [
        (i.first_line, i.last_line) for i in closed
    ]
    assert kept[-1].last_line == 900
