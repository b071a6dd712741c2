"""`sinkd narrate`: an endless log from stdin, appended in chunks, narrated every N lines or T seconds.

A reader thread takes lines as fast as they come into a bounded queue; the main loop appends them to
one session and asks the model for a short narration. When the model falls behind, the queue's
policy decides: `drop-oldest` (default: the narration stays current, drops are counted) or `block`
(nothing is lost, the writer waits). Memory is bounded by the queue and the session's S+W cells.
"""

from __future__ import annotations

import datetime
import enum
import json
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Annotated, Any

import typer
from rich.text import Text

from sinkd.cli.backend import Backend
from sinkd.cli.console import console, shown
from sinkd.cli.exit_codes import handle_errors
from sinkd.cli.options import (
    ConnectOpt,
    EvictOpt,
    JsonFlag,
    ModelOpt,
    SinksOpt,
    TokenOpt,
    WindowOpt,
    policy_request,
    session_backend,
)
from sinkd.daemon.metrics import rss_bytes
from sinkd.daemon.runtime.api import (
    ChatRequest,
    GenerationOptions,
    Handle,
    RecallRequest,
    Receipt,
    Stream,
    TokenEvent,
)
from sinkd.errors import FailedPrecondition, Unsupported

NARRATION_REQUEST = (
    "In one or two sentences, say what just happened in the log lines above. Be concrete and brief."
)
DROP_OLDEST, BLOCK = "drop-oldest", "block"
MAX_QUERY_CHARS = 2000
out = console()
err = console(stderr=True)


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
    recall: bool = True  # before each narration, recall earlier lines like the recent ones

    def validate(self) -> None:
        from sinkd.errors import InvalidInput

        # the CLI's options check the integer bounds and the choices; a library caller gets these
        for name in ("chunk_lines", "every_lines", "max_line_bytes", "queue_lines", "max_tokens"):
            if getattr(self, name) < 1:
                raise InvalidInput(
                    f"--{name.replace('_', '-')}: must be >= 1, got {getattr(self, name)}"
                )
        for name in ("chunk_seconds", "every_seconds"):
            if getattr(self, name) <= 0:
                raise InvalidInput(
                    f"--{name.replace('_', '-')}: must be > 0, got {getattr(self, name)}"
                )
        if self.on_full not in (DROP_OLDEST, BLOCK):
            raise InvalidInput(f"--on-full: must be {DROP_OLDEST} or {BLOCK}, got {self.on_full!r}")


@dataclass
class Counts:
    lines_read: int = 0
    lines_appended: int = 0
    lines_dropped: int = 0
    lines_truncated: int = 0
    lines_with_invalid_utf8: int = 0
    narrations: int = 0
    recalls: int = 0  # narrations preceded by recalled earlier lines
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


def read_lines(stream: IO[bytes], queue: LineQueue, counts: Counts, max_line_bytes: int) -> None:
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
            counts.lines_read += 1
            queue.put(line)
    finally:
        queue.close()


class Narrator:
    def __init__(
        self,
        backend: Backend,
        handle: Handle,
        config: NarrateConfig,
        counts: Counts,
        emit: Callable[[str, dict[str, Any]], None],
    ) -> None:
        self.backend = backend
        self.handle = handle
        self.config = config
        self.counts = counts
        self.emit = emit
        self._since = 0
        self._last = time.monotonic()
        self._chat = True
        self._recent: list[str] = []  # the latest appended lines: the next recall's query

    def run(self, queue: LineQueue) -> None:
        cfg = self.config
        while True:
            lines = queue.take(cfg.chunk_lines, cfg.chunk_seconds)
            if lines is None:
                break
            if lines:
                self._recent = (self._recent + lines)[-8:]
                self._note(self.backend.append(self.handle, "\n".join(lines) + "\n").receipt)
                self.counts.lines_appended += len(lines)
                self._since += len(lines)
            due = (
                self._since >= cfg.every_lines or time.monotonic() - self._last >= cfg.every_seconds
            )
            if due and self._since:
                self.narrate()
        if self._since:
            self.narrate()

    def narrate(self) -> None:
        if self.config.recall:
            self._recall()
        text, receipt = self._ask()
        self._note(receipt)
        self.counts.narrations += 1
        self._since = 0
        self._last = time.monotonic()
        self.emit(text.strip(), self.counts.as_dict())

    def _recall(self) -> None:
        """Earlier (evicted) lines that match the latest ones come back into the cache before
        the narration is asked for, so it can say "again" where it is again."""
        query = "\n".join(self._recent)[-MAX_QUERY_CHARS:]
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

    def _ask(self) -> tuple[str, Receipt]:
        options = GenerationOptions(self.config.max_tokens, ("\n\n",))
        if self._chat:
            try:
                ask = ChatRequest(NARRATION_REQUEST, options)
                return self._collect(self.backend.chat(self.handle, ask))
            except Unsupported:  # embedded and remote raise the same class
                self._chat = False  # a model without a chat template: plain continuation
        self.backend.append(self.handle, "\nWhat just happened, in one sentence:")
        return self._collect(self.backend.generate(self.handle, options))

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


class OnFull(str, enum.Enum):
    DROP_OLDEST = "drop-oldest"
    BLOCK = "block"


def narration_line(ts: str, text: str) -> Text:
    """A narration as the terminal shows it: the model's words as text, never markup."""
    return Text.assemble((ts, "dim"), " ", shown(text))


@handle_errors
def narrate(
    embedded: Annotated[
        bool,
        typer.Option("--embedded", help="Run the model in this process, even if a daemon runs."),
    ] = False,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    model: ModelOpt = None,
    sinks: SinksOpt = None,
    window: WindowOpt = None,
    evict: EvictOpt = None,
    chunk_lines: Annotated[
        int, typer.Option("--chunk-lines", min=1, help="Append after this many lines...")
    ] = 16,
    chunk_seconds: Annotated[
        float, typer.Option("--chunk-seconds", help="...or after this long.")
    ] = 1.0,
    every_lines: Annotated[
        int, typer.Option("--every-lines", min=1, help="Narrate after this many appended lines...")
    ] = 200,
    every_seconds: Annotated[
        float, typer.Option("--every-seconds", help="...or this many seconds.")
    ] = 30.0,
    max_line_bytes: Annotated[
        int, typer.Option("--max-line-bytes", min=1, help="Longer lines are cut here.")
    ] = 512,
    queue_lines: Annotated[
        int, typer.Option("--queue-lines", min=1, help="Lines waiting at most.")
    ] = 1024,
    on_full: Annotated[
        OnFull,
        typer.Option("--on-full", help="drop-oldest (stay current) or block (lose nothing)."),
    ] = OnFull.DROP_OLDEST,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Longest narration.")] = 48,
    recall: Annotated[
        bool,
        typer.Option(
            "--recall/--no-recall",
            help="Before each narration, bring back evicted lines like the latest ones.",
        ),
    ] = True,
    as_json: JsonFlag = False,
) -> None:
    """Narrate an endless log from stdin (`tail -f app.log | sinkd narrate`): through the daemon
    when one answers, else in this process."""
    cfg = NarrateConfig(
        chunk_lines,
        chunk_seconds,
        every_lines,
        every_seconds,
        max_line_bytes,
        queue_lines,
        on_full.value,
        max_tokens,
        recall,
    )
    cfg.validate()
    counts = Counts()
    backend = session_backend(embedded, address, token, model, 512)

    def emit(text: str, snapshot: dict[str, Any]) -> None:
        ts = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        if as_json:
            print(
                json.dumps(
                    {
                        "event": "narration",
                        "ts": ts,
                        "text": text,
                        **snapshot,
                        "rss_bytes": rss_bytes(),
                    }
                ),
                flush=True,
            )
        else:
            out.print(narration_line(ts, text), highlight=False)

    queue = LineQueue(cfg.queue_lines, cfg.on_full, counts)
    reader = threading.Thread(
        target=read_lines, args=(sys.stdin.buffer, queue, counts, cfg.max_line_bytes), daemon=True
    )
    interrupted = False
    try:
        # recall "manual": the narrator asks with the latest lines (see Narrator._recall)
        receipt = backend.create(
            policy_request("sink", sinks, window, evict, 0),
            recall=RecallRequest(mode="manual" if recall else "off"),
        )
        reader.start()
        Narrator(backend, receipt.handle, cfg, counts, emit).run(queue)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        backend.shutdown()
    summary = {**counts.as_dict(), "interrupted": interrupted, "rss_bytes": rss_bytes()}
    if as_json:
        print(json.dumps({"event": "summary", **summary}), flush=True)
    else:
        err.print(
            f"narrate: {summary['lines_read']} lines read, {summary['lines_appended']} appended,"
            f" {summary['lines_dropped']} dropped, {summary['lines_truncated']} cut,"
            f" {summary['narrations']} narrations ({summary['recalls']} with recalled lines),"
            f" {summary['evicted_tokens']} tokens evicted"
            f" in {summary['evictions']} evictions",
            highlight=False,
        )
