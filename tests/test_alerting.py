"""Incidents where operators look: Alertmanager's webhook JSON to a real HTTP server, a command
with the incident on its stdin, retries with a bound, a sender that never blocks the narrator,
and the daemon's metrics of narrated incidents."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from sinkd.cli.alerting import ATTEMPTS, QUEUE, Alerting
from sinkd.daemon.runtime.api import DigestOptions
from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import InvalidInput
from sinkd.narration.facts import Digest, DigestConfig, Facts
from tests.support.services import fake_service

pytestmark = pytest.mark.unit


def incident_log() -> list[str]:
    ok = [f"2026-12-05T10:00:{i % 60:02d} api INFO request {i} served" for i in range(400)]
    flood = [f"db ERROR write to /var/lib/db/{i % 7} failed: disk full" for i in range(40)]
    return ok[:130] + flood + ok[130:]


def cuts(lines: list[str]) -> list[Facts]:
    digest = Digest(DigestConfig(every_lines=100, incident_lines=20), clock=lambda: 0.0)
    out = [f for f in map(digest.observe, lines) if f is not None]
    last = digest.cut()
    return [*out, *([last] if last else [])]


class Receiver:
    """A webhook receiver on a real socket: what it was sent, its status, and a gate."""

    def __init__(self, status: int = 200) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.status = status
        self.gate = threading.Event()
        self.gate.set()
        self.arrived = threading.Semaphore(0)  # one release a body received
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver.gate.wait(30)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.bodies.append(json.loads(body))
                self.send_response(receiver.status)
                self.end_headers()
                receiver.arrived.release()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.gate.set()
    r.server.shutdown()


def test_an_incident_goes_out_firing_then_resolved_as_alertmanager_sends_it(
    receiver: Receiver, tmp_path: Path
) -> None:
    out = tmp_path / "events.jsonl"
    command = (
        f"{sys.executable} -c \"import sys; open('{out}', 'a').write(sys.stdin.read() + chr(10))\""
    )
    alerting = Alerting("web", receiver.url, command, pause=lambda s: None)
    for facts in cuts(incident_log()):
        alerting.interval(facts)
    alerting.close()
    assert alerting.counts.sent == 4 and alerting.counts.failed == 0  # 2 posts, 2 command runs
    firing, resolved = receiver.bodies
    for body, status in ((firing, "firing"), (resolved, "resolved")):
        assert body["version"] == "4" and body["status"] == status
        assert body["groupLabels"] == {"stream": "web"}
        [a] = body["alerts"]
        assert a["status"] == status and a["labels"]["alertname"] == "SinkdNarratedIncident"
        assert a["labels"]["severity"] == "error" and "disk full" not in json.dumps(a["labels"])
        assert "disk full" in a["annotations"]["summary"]
    assert firing["alerts"][0]["fingerprint"] == resolved["alerts"][0]["fingerprint"]
    assert firing["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
    assert resolved["alerts"][0]["startsAt"] == firing["alerts"][0]["startsAt"]
    assert resolved["alerts"][0]["endsAt"] >= resolved["alerts"][0]["startsAt"]
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["status"] for e in events] == ["firing", "resolved"]
    assert events[1]["incident"]["first_line"] == 131 and events[1]["incident"]["count"] == 40


def test_the_receiver_has_the_incident_within_2_s_of_its_interval_closing(
    receiver: Receiver,
) -> None:
    """Handed over as the narrator prints the interval; the receiver holds it by the deadline (a
    wait that ends: 2 s), and the resolve likewise."""
    alerting = Alerting("web", receiver.url, pause=lambda s: None)
    for facts in cuts(incident_log()):
        alerting.interval(facts)
        if facts.opened or facts.ended:
            assert receiver.arrived.acquire(
                timeout=2.0
            ), f"no delivery within 2 s of interval {facts.number}"
    alerting.close()
    assert [b["status"] for b in receiver.bodies] == ["firing", "resolved"]


def test_a_refusing_receiver_is_tried_a_bounded_number_of_times(receiver: Receiver) -> None:
    receiver.status = 500
    pauses: list[float] = []
    alerting = Alerting("web", receiver.url, pause=pauses.append)
    alerting.interval(next(f for f in cuts(incident_log()) if f.opened))
    alerting.close()
    assert len(receiver.bodies) == ATTEMPTS and alerting.counts.failed == 1
    assert pauses == [0.5, 1.0]  # doubling, then given up


def test_a_hung_receiver_never_blocks_the_narrator_and_what_overflows_is_counted(
    receiver: Receiver,
) -> None:
    receiver.gate.clear()  # the receiver holds every request
    alerting = Alerting("web", receiver.url, pause=lambda s: None)
    raising = next(f for f in cuts(incident_log()) if f.opened)
    for _ in range(QUEUE + 10):
        alerting.interval(raising)  # returns at once: the sender holds the first, queues the rest
    assert alerting.counts.dropped >= 9
    alerting.close(drain_s=0.0)
    assert alerting.counts.left + alerting.counts.dropped + alerting.counts.sent >= QUEUE
    receiver.gate.set()


@pytest.mark.parametrize(
    ("webhook", "command"), [("file:///etc/passwd", ""), ("ftp://x", ""), ("", "   ")]
)
def test_a_target_that_is_not_one_is_refused_by_name(webhook: str, command: str) -> None:
    with pytest.raises(InvalidInput):
        Alerting("web", webhook, command)


def test_the_daemon_counts_a_stream_s_incidents_and_those_still_open(tmp_path: Path) -> None:
    service = fake_service(tmp_path)
    alice = Principal("alice")
    sample = service.metrics.registry.get_sample_value
    lines = incident_log()
    options = DigestOptions(every_lines=100, incident_lines=20)
    service.narrated.feed(alice, "web", lines[:160], options=options)
    assert sample("sinkd_narrate_incidents_total", {"stream": "web", "severity": "error"}) == 1
    assert sample("sinkd_narrate_open_incidents", {"stream": "web"}) == 1
    service.narrated.feed(alice, "web", lines[160:], close=True)
    assert sample("sinkd_narrate_open_incidents", {"stream": "web"}) == 0
    assert sample("sinkd_narrate_incidents_total", {"stream": "web", "severity": "error"}) == 1
    service.stop()
