"""The narrator's loop: facts from every line, a model's sentence over them, checked.

The reader thread puts every line through the digest (`sinkd.narration.facts.Digest`), at input
speed and never dropped, so an incident is cut into its own interval however far behind the model
is. The main loop takes each cut interval: a quiet one is said in a few words without the model;
otherwise the model is given the facts (not the raw lines) and asked for one sentence, which is
checked against the facts and the lines they cite; a sentence that fails is dropped and counted,
and the facts are printed whatever the model said. When cuts pile up behind the model, only the
newest (an incident first) is phrased; the others are printed as facts alone.

With `feed_lines` the raw lines also go into the session, as before facts existed (so they reach
its memory and recall), through a bounded queue whose policy is `drop-oldest` or `block`.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import IO, Any, Protocol

from sinkd.cli.backend import Backend, NarrationBackend
from sinkd.daemon.runtime.api import (
    DigestOptions,
    GenerationOptions,
    Handle,
    Receipt,
    Stream,
    TokenEvent,
)
from sinkd.errors import FailedPrecondition, InvalidInput
from sinkd.narration.facts import Digest, DigestConfig, Facts
from sinkd.narration.grounding import Dropped, check

# the model continues a sentence sinkd starts (true by construction) after the facts: plain
# continuation, for a model with a chat template or without; asked in a chat turn, the 135M model
# talked about the request instead (docs/narrate.md)
HEADER = "Log facts:\n"
ASK = "\n\nOne-sentence summary for the operator: "
DROP_OLDEST, BLOCK = "drop-oldest", "block"
MAX_QUERY_CHARS = 2000
MAX_SENTENCES = 2
MAX_PENDING = 128  # cut intervals waiting for the main loop before the reader waits
POLL_SECONDS = 0.25
DUE_POLL_S = 0.5  # a narrated stream's open interval: asked this often whether it is due


@dataclass
class NarrateConfig:
    chunk_lines: int = 16
    chunk_seconds: float = 1.0
    every_lines: int = 200
    every_seconds: float = 30.0
    max_line_bytes: int = 512
    queue_lines: int = 1024
    on_full: str = DROP_OLDEST
    max_tokens: int = 48
    recall: bool = False  # before each phrasing, recall evicted text like these facts
    feed_lines: bool = False  # the raw lines into the session too
    quiet: bool = False  # print nothing for a quiet interval
    incident_lines: int = 20
    incident_seconds: float = 1.0
    gap_seconds: float = 60.0
    recur_intervals: int = 3
    info_bursts: bool = False
    inferred_min: int = 2
    page_handled: bool = False
    stream: str = ""  # a narrated stream kept by the daemon (`--stream`); "" this process's
    keep_lines: bool = False  # the daemon keeps each interval's raw lines (`--keep-lines`)

    def validate(self) -> None:
        # the CLI's options check the integer bounds and the choices; a library caller gets these
        for name in (
            "chunk_lines",
            "every_lines",
            "max_line_bytes",
            "queue_lines",
            "max_tokens",
            "incident_lines",
            "recur_intervals",
            "inferred_min",
        ):
            if getattr(self, name) < 1:
                raise InvalidInput(
                    f"--{name.replace('_', '-')}: must be >= 1, got {getattr(self, name)}"
                )
        for name in ("chunk_seconds", "every_seconds", "incident_seconds", "gap_seconds"):
            if getattr(self, name) <= 0:
                raise InvalidInput(
                    f"--{name.replace('_', '-')}: must be > 0, got {getattr(self, name)}"
                )
        if self.keep_lines and not self.stream:
            raise InvalidInput(
                "--keep-lines: the daemon keeps a stream's lines; name one (--stream)"
            )
        if self.on_full not in (DROP_OLDEST, BLOCK):
            raise InvalidInput(f"--on-full: must be {DROP_OLDEST} or {BLOCK}, got {self.on_full!r}")

    def options(self) -> DigestOptions:
        """The digest's rules as a narrated stream takes them."""
        d = self.digest()
        rules = {f.name: getattr(d, f.name) for f in fields(DigestOptions) if hasattr(d, f.name)}
        return DigestOptions(**rules, keep_lines=self.keep_lines)

    def digest(self) -> DigestConfig:
        return DigestConfig(
            every_lines=self.every_lines,
            incident_lines=self.incident_lines,
            incident_seconds=self.incident_seconds,
            gap_seconds=self.gap_seconds,
            recur_intervals=self.recur_intervals,
            info_bursts=self.info_bursts,
            inferred_min=self.inferred_min,
            page_handled=self.page_handled,
        )


@dataclass
class Counts:
    lines_read: int = 0
    lines_appended: int = 0  # raw lines into the session (feed_lines)
    lines_dropped: int = 0
    lines_truncated: int = 0
    lines_with_invalid_utf8: int = 0
    narrations: int = 0  # intervals printed (or skipped as quiet)
    incidents: int = 0  # intervals cut early for an incident
    phrased: int = 0  # intervals the model was asked about
    behind: int = 0  # intervals printed as facts alone: newer ones were waiting
    quiet_intervals: int = 0
    sentences_kept: int = 0
    unsupported_dropped: int = 0  # model sentences that failed the check
    recalls: int = 0  # phrasings preceded by recalled earlier text
    recalled_passages: int = 0
    evictions: int = 0
    evicted_tokens: int = 0
    tokens_seen: int = 0
    retained: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        d.update(self.extra)
        return d


@dataclass(frozen=True)
class Narration:
    facts: Facts
    text: str  # the model's sentences that passed the check ("" if none, or not asked)
    dropped: tuple[Dropped, ...]  # the sentences that failed it, with their unsupported claims
    phrased: bool  # the model was asked
    behind: bool  # not asked: newer intervals were waiting
    lines_read: int  # how far the reader was when this was printed (lag = this - last line)


class LineQueue:
    """Bounded FIFO of lines with a policy for when it is full; thread-safe."""

    def __init__(self, capacity: int, on_full: str, counts: Counts) -> None:
        self._lines: deque[str] = deque()
        self._capacity = capacity
        self._on_full = on_full
        self._counts = counts
        self._cond = threading.Condition()
        self._closed = False

    def put(self, line: str) -> None:
        with self._cond:
            if len(self._lines) >= self._capacity:
                if self._on_full == DROP_OLDEST:
                    self._lines.popleft()
                    self._counts.lines_dropped += 1
                else:
                    while len(self._lines) >= self._capacity and not self._closed:
                        self._cond.wait()
            self._lines.append(line)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take(self, max_lines: int, timeout: float) -> list[str] | None:
        """Up to `max_lines`, waiting at most `timeout` for a full chunk; None once closed and empty."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._lines) < max_lines and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if not self._lines and self._closed:
                return None
            n = min(max_lines, len(self._lines))
            out = [self._lines.popleft() for _ in range(n)]
            self._cond.notify_all()
            return out


class Digester(Protocol):
    """Where lines become facts: a digest in this process, or a narrated stream's in the daemon."""

    @property
    def lines(self) -> int: ...
    @property
    def pending(self) -> int: ...
    def feed(self, line: str) -> list[Facts]: ...
    def due(self) -> list[Facts]: ...
    def cut(self) -> list[Facts]: ...


class LocalDigester:
    """A digest in this process: gone with it."""

    def __init__(self, digest: Digest) -> None:
        self.digest = digest

    @property
    def lines(self) -> int:
        return self.digest.lines

    @property
    def pending(self) -> int:
        return self.digest.pending

    def feed(self, line: str) -> list[Facts]:
        facts = self.digest.observe(line)
        return [facts] if facts is not None else []

    def due(self) -> list[Facts]:
        facts = self.digest.due()
        return [facts] if facts is not None else []

    def cut(self) -> list[Facts]:
        facts = self.digest.cut()
        return [facts] if facts is not None else []


class StreamDigester:
    """A narrated stream's digest, in the daemon (`--stream`): its templates, baselines and line
    numbers outlive this process, and its intervals are kept there. Lines go in batches of
    `batch` (an interval closed by a batch's first line is seen when the batch is sent, at most
    `batch` lines late; an incident's seconds and the time bound send what waits)."""

    def __init__(
        self, calls: NarrationBackend, stream: str, options: DigestOptions, batch: int = 64
    ) -> None:
        self.calls = calls
        self.stream = stream
        self.options: DigestOptions | None = options
        self.batch = batch
        self._waiting: list[str] = []
        self._lines = self._pending = 0
        self._sent = 0.0  # when lines were last sent (monotonic)
        self._new_pipe = True  # this process's first lines begin a new pipe of the stream

    @property
    def lines(self) -> int:
        return self._lines + len(self._waiting)

    @property
    def pending(self) -> int:
        return self._pending + len(self._waiting)

    def feed(self, line: str) -> list[Facts]:
        self._waiting.append(line)
        return self._send() if len(self._waiting) >= self.batch else []

    def due(self) -> list[Facts]:
        """What waits, sent; an open interval asked about twice a second (its incident's
        seconds run in the daemon)."""
        if self._waiting or (self._pending and time.monotonic() - self._sent >= DUE_POLL_S):
            return self._send()
        return []

    def cut(self) -> list[Facts]:
        return self._send(close=True)

    def _send(self, close: bool = False) -> list[Facts]:
        lines, self._waiting = self._waiting, []
        self._sent = time.monotonic()
        fed = self.calls.narrate(self.stream, lines, close, self.options, self._new_pipe)
        self.options = None  # the stream keeps them
        self._new_pipe = self._new_pipe and not lines
        self._lines, self._pending = fed.lines, fed.pending
        out = []
        for interval in fed.closed:
            record = json.loads(interval.record_json)
            out.append(Facts.from_dict(record["facts"], frozenset(interval.support)))
        return out


class Intake:
    """Where the reader puts lines: every one into the digest, and into the queue when the raw
    lines feed the session. Cut intervals wait here for the main loop; thread-safe."""

    def __init__(
        self,
        config: NarrateConfig,
        counts: Counts,
        clock: Callable[[], float] = time.monotonic,
        digester: Digester | None = None,
    ) -> None:
        self.config = config
        self.counts = counts
        self.clock = clock
        self.digester: Digester = digester or LocalDigester(Digest(config.digest(), clock=clock))
        self.queue = (
            LineQueue(config.queue_lines, config.on_full, counts) if config.feed_lines else None
        )
        self._cond = threading.Condition()
        self._cuts: list[Facts] = []
        self._newest_incident: int | None = None  # indexes in _cuts of what may still be phrased
        self._newest_loud: int | None = None
        self._closed = False
        self._last_cut = clock()

    def add(self, line: str) -> None:
        with self._cond:
            while len(self._cuts) >= MAX_PENDING and not self._closed:
                self._cond.wait()  # the main loop is behind: the reader waits, nothing is dropped
            self.counts.lines_read += 1
            for facts in self.digester.feed(line):
                self._cut(facts)
        if self.queue is not None:
            self.queue.put(line)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self.queue is not None:
            self.queue.close()

    def take(self, timeout: float) -> tuple[list[Facts], bool]:
        """The intervals cut so far (waiting up to `timeout` for one), and whether the stream has
        ended with nothing left to cut. An incident's time bound and `every_seconds` cut here."""
        deadline = self.clock() + timeout
        with self._cond:
            while not self._cuts and not self._closed:
                due = self.digester.due()
                if (
                    not due
                    and self.digester.pending
                    and (self.clock() - self._last_cut >= self.config.every_seconds)
                ):
                    due = self.digester.cut()
                for facts in due:
                    self._cut(facts)
                if due:
                    break
                left = deadline - self.clock()
                if left <= 0:
                    break
                self._cond.wait(min(left, POLL_SECONDS))
            ended = False
            if self._closed:
                for last in self.digester.cut():
                    self._cut(last)
                ended = True
            cuts, self._cuts = self._cuts, []
            self._newest_incident = self._newest_loud = None
            self._cond.notify_all()
            return cuts, ended

    @property
    def lines_read(self) -> int:
        with self._cond:
            return self.digester.lines

    def _cut(self, facts: Facts) -> None:
        """Queue a cut interval. Only the newest incident and the newest interval that is not
        quiet can still be phrased (`Narrator.narrate`): the others lose the words a check would
        need, so a backlog holds facts, not lines."""
        k = len(self._cuts)
        self._cuts.append(facts)
        if facts.quiet:
            self._strip(k)
        else:
            if facts.incident and self._newest_incident is not None:
                self._strip(self._newest_incident)
            if self._newest_loud is not None and self._newest_loud != self._newest_incident:
                self._strip(self._newest_loud)
            if facts.incident:
                self._newest_incident = k
            self._newest_loud = k
        self._last_cut = self.clock()
        self._cond.notify_all()

    def _strip(self, k: int) -> None:
        if self._cuts[k].support:
            self._cuts[k] = replace(self._cuts[k], support=frozenset())


def read_lines(stream: IO[bytes], intake: Intake, counts: Counts, max_line_bytes: int) -> None:
    """Read lines without ever holding more than `max_line_bytes` of one; the rest of a long line is
    skipped. Invalid UTF-8 is replaced, counted, never fatal."""
    try:
        while True:
            raw = stream.readline(max_line_bytes + 1)
            if not raw:
                break
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                counts.lines_truncated += 1
                raw = raw[:max_line_bytes]
                while True:  # discard the rest of the line
                    rest = stream.readline(65536)
                    if not rest or rest.endswith(b"\n"):
                        break
            line = raw.rstrip(b"\r\n").decode("utf-8", errors="replace")
            if "\ufffd" in line and b"\xef\xbf\xbd" not in raw:
                counts.lines_with_invalid_utf8 += 1
            intake.add(line)
    finally:
        intake.close()


def lead_of(facts: Facts) -> str:
    """The start of the model's sentence, written by sinkd: true of any interval."""
    return f"In lines {facts.first_line}-{facts.last_line}, the log shows"


class Narrator:
    def __init__(
        self,
        backend: Backend,
        handle: Handle,
        config: NarrateConfig,
        counts: Counts,
        emit: Callable[[Narration], None],
    ) -> None:
        self.backend = backend
        self.handle = handle
        self.config = config
        self.counts = counts
        self.emit = emit

    def run(self, intake: Intake) -> None:
        cfg = self.config
        queue = intake.queue
        while True:
            if queue is not None:
                chunk = queue.take(cfg.chunk_lines, cfg.chunk_seconds)
                if chunk:
                    self._note(self.backend.append(self.handle, "\n".join(chunk) + "\n").receipt)
                    self.counts.lines_appended += len(chunk)
                cuts, ended = intake.take(0)
                ended = ended and chunk is None
            else:
                cuts, ended = intake.take(cfg.chunk_seconds)
            if cuts:
                self.narrate(cuts, intake)
            if ended:
                break

    def narrate(self, cuts: list[Facts], intake: Intake) -> None:
        """Print every interval in order; ask the model about one: the newest incident, else the
        newest interval that is not quiet."""
        loud = [f for f in cuts if not f.quiet]
        incidents = [f for f in loud if f.incident]
        wanted = incidents or loud
        chosen = wanted[-1] if wanted else None
        for facts in cuts:
            self.counts.narrations += 1
            self.counts.incidents += facts.incident
            if facts.quiet:
                self.counts.quiet_intervals += 1
            if facts is chosen:
                text, dropped = self._phrase(facts)
                self.counts.phrased += 1
                self.counts.sentences_kept += len(text)
                self.counts.unsupported_dropped += len(dropped)
                item = Narration(facts, " ".join(text), dropped, True, False, intake.lines_read)
                if text and self.config.stream:  # kept with the interval's facts in the daemon
                    self.backend.narration.note(self.config.stream, facts.number, item.text)
            else:
                behind = not facts.quiet
                self.counts.behind += behind
                item = Narration(facts, "", (), False, behind, intake.lines_read)
            self.emit(item)

    def _phrase(self, facts: Facts) -> tuple[tuple[str, ...], tuple[Dropped, ...]]:
        if self.config.recall:
            self._recall(facts)
        text, receipt = self._ask(facts)
        self._note(receipt)
        checked = check(text, facts.support, lead_of(facts))
        kept = checked.kept[:MAX_SENTENCES]
        return kept, checked.dropped

    def _recall(self, facts: Facts) -> None:
        """Earlier (evicted) facts about the same templates come back into the cache before the
        model is asked, so it can say "again" where it is again."""
        query = " ".join(f.shown() for f in facts.listed())[-MAX_QUERY_CHARS:]
        if not query.strip():
            return
        try:
            result = self.backend.recall(self.handle, query)
        except FailedPrecondition:  # a session that keeps no memory
            self.config.recall = False
            return
        self._note(result.receipt)
        if result.report.recalled:
            self.counts.recalls += 1
            self.counts.recalled_passages += len(result.report.recalled)

    def _ask(self, facts: Facts) -> tuple[str, Receipt]:
        lead = lead_of(facts)
        self.backend.append(self.handle, f"\n{HEADER}{facts.render()}{ASK}{lead}")
        options = GenerationOptions(self.config.max_tokens, ("\n",))
        text, receipt = self._collect(self.backend.generate(self.handle, options))
        return lead + text, receipt

    def _collect(self, events: Stream) -> tuple[str, Receipt]:
        parts, receipt = [], None
        for event in events:
            if isinstance(event, TokenEvent):
                parts.append(event.text)
            else:
                receipt = event.receipt
        assert receipt is not None  # a stream ends with Done or raises
        return "".join(parts), receipt

    def _note(self, receipt: Receipt) -> None:
        self.counts.evictions = receipt.evictions
        self.counts.evicted_tokens = receipt.evicted_tokens
        self.counts.tokens_seen = receipt.n_seen
        self.counts.retained = receipt.retained
