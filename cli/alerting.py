"""`sinkd narrate --webhook URL --on-incident CMD`: each incident sent as it is raised and when it
is over, off the reader's and the model's way.

A sender thread takes what the narrator hands it (`Alerting.interval`, which never blocks: a full
queue drops its oldest, counted) and delivers each to the webhook (Alertmanager's JSON,
narration/alerts.py) and to the command (the incident as JSON on its stdin, one run each), trying
each delivery `ATTEMPTS` times with doubling pauses before counting it failed. At the end of the
stream it is given `DRAIN_S` seconds to deliver what waits; what is left is counted, not lost
silently.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sinkd.errors import InvalidInput
from sinkd.narration.alerts import alert, command_event, webhook_payload
from sinkd.narration.facts import Facts

ATTEMPTS = 3
FIRST_PAUSE_S = 0.5  # then 1 s, ...
WEBHOOK_TIMEOUT_S = 5.0
COMMAND_TIMEOUT_S = 10.0
QUEUE = 256  # deliveries waiting at most
DRAIN_S = 10.0


@dataclass
class AlertCounts:
    sent: int = 0
    failed: int = 0  # given up after ATTEMPTS
    dropped: int = 0  # the queue was full: the oldest went
    left: int = 0  # still waiting when the stream ended

    def as_dict(self) -> dict[str, int]:
        return {f"alerts_{k}": v for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class Delivery:
    kind: str  # "webhook" or "command"
    body: bytes


@dataclass
class Alerting:
    stream: str
    webhook: str = ""
    command: str = ""
    clock: Callable[[], float] = time.time
    pause: Callable[[float], None] = time.sleep
    counts: AlertCounts = field(default_factory=AlertCounts)

    def __post_init__(self) -> None:
        if self.webhook and not self.webhook.startswith(("http://", "https://")):
            raise InvalidInput(f"--webhook: an http:// or https:// URL, got {self.webhook[:80]!r}")
        if self.command and not shlex.split(self.command):
            raise InvalidInput("--on-incident: a command to run")
        self._queue: deque[Delivery] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._started: dict[int, float] = {}  # template id -> when its incident opened
        self._thread = threading.Thread(target=self._run, name="alerting", daemon=True)
        if self.webhook or self.command:
            self._thread.start()

    @property
    def wanted(self) -> bool:
        return bool(self.webhook or self.command)

    def interval(self, facts: Facts) -> None:
        """The incidents an interval opened and ended, handed to the sender (never waits)."""
        if not self.wanted or not (facts.opened or facts.ended):
            return
        now = self.clock()
        alerts = []
        events = []
        for incident in facts.opened:
            self._started[incident.template_id] = now
            alerts.append(alert(self.stream, incident, facts, now, None))
            events.append(command_event(self.stream, incident, facts, now, "firing"))
        for incident in facts.ended:
            starts = self._started.pop(incident.template_id, now)
            alerts.append(alert(self.stream, incident, facts, starts, now))
            events.append(command_event(self.stream, incident, facts, now, "resolved"))
        if self.webhook:
            self._put(
                Delivery("webhook", json.dumps(webhook_payload(self.stream, alerts)).encode())
            )
        if self.command:
            for event in events:
                self._put(Delivery("command", json.dumps(event).encode()))

    def close(self, drain_s: float = DRAIN_S) -> None:
        """Deliver what waits within `drain_s`; count the rest."""
        if not self.wanted:
            return
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(drain_s)
        with self._cond:
            self.counts.left = len(self._queue)
            self._queue.clear()

    def _put(self, delivery: Delivery) -> None:
        with self._cond:
            if len(self._queue) >= QUEUE:
                self._queue.popleft()
                self.counts.dropped += 1
            self._queue.append(delivery)
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                delivery = self._queue[0]
            ok = self._deliver(delivery)
            with self._cond:
                if self._queue and self._queue[0] is delivery:
                    self._queue.popleft()
                if ok:
                    self.counts.sent += 1
                else:
                    self.counts.failed += 1

    def _deliver(self, delivery: Delivery) -> bool:
        send = self._post if delivery.kind == "webhook" else self._run_command
        pause = FIRST_PAUSE_S
        for attempt in range(ATTEMPTS):
            if send(delivery.body):
                return True
            if attempt + 1 < ATTEMPTS:
                self.pause(pause)
                pause *= 2
        return False

    def _post(self, body: bytes) -> bool:
        request = urllib.request.Request(
            self.webhook, body, {"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as reply:
                return bool(200 <= reply.status < 300)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _run_command(self, body: bytes) -> bool:
        try:
            done = subprocess.run(
                shlex.split(self.command), input=body, timeout=COMMAND_TIMEOUT_S,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return False
        return done.returncode == 0
