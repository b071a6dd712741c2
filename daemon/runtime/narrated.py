"""Narrated streams in the daemon: a tenant's named log streams, each digested here (facts from
every line, narration/facts.py) and kept in the store (store/narrated.py), so that the templates,
the baselines and every interval's facts outlive the pipe and the daemon.

A call's lines are digested on the caller's thread under its stream's lock (tens of microseconds
a line, never on the engine thread); what the call closed is written with the stream's state in
one commit between steps (the journal is the engine thread's). A call is answered once that commit
is made: a restart continues from the last call answered, line numbers and all. A write refused
(a full disk) fails the call with nothing counted: the stream is read again from the store, and
the caller may send the same lines again.

Raw lines are not kept unless the stream asks (`keep_lines`): then each interval keeps its lines
(its first KEEP_LINES, within KEEP_CHARS) beside its facts, in the same row, so that they live, move, fold
away and are forgotten with it; the open interval's lines wait in the stream's state.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any, overload

from sinkd.daemon import failpoints
from sinkd.daemon.config import Settings
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.api import (
    DigestOptions,
    Narrated,
    NarratedInterval,
    NarratedStream,
    NarrationForgotten,
    NarrationMuted,
)
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.erasure import Erasure
from sinkd.daemon.runtime.loop.scheduler import Scheduler
from sinkd.daemon.runtime.narrated_retention import Retention
from sinkd.daemon.runtime.sessions import Principal
from sinkd.daemon.store.narrated import IntervalRow, NarratedTables
from sinkd.errors import (
    InvalidInput,
    JournalError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    SessionElsewhere,
)
from sinkd.narration.facts import MAX_MUTED, Digest, DigestConfig, Facts
from sinkd.narration.severity import Severity

log = logging.getLogger("sinkd.narrated")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_LINES = 4096  # a call's lines at most
MAX_LINE_CHARS = 4096  # longer lines are cut (a digest reads a line's first words)
STREAMS_IN_MEMORY = 256  # digests held between calls; the others are read from the store again
MAX_STREAMS = 64  # a tenant's narrated streams at most (each keeps a digest's state)
SEVERITIES = ("", "warning", "error", "critical")
KEEP_LINES = 1000  # an interval's lines kept at most, where its stream keeps them,
KEEP_CHARS = 256 * 1024  # and their characters (the open interval's are in every state write)


class _Stream:
    def __init__(self, digest: Digest, started: float) -> None:
        self.digest = digest
        self.started = started  # the open interval's first line, wall clock
        self.lock = threading.Lock()
        self.gone = False  # forgotten, or out of memory: a call holding it must look again
        self.keep_lines = False  # the stream keeps its raw lines (`DigestOptions.keep_lines`)
        self.kept: list[tuple[int, str]] = []  # the open interval's lines, where kept
        self.left_out = 0  # the open interval's lines past KEEP_LINES or KEEP_CHARS, not kept
        self.kept_chars = 0
        self.pipes: list[int] = []  # the open interval's lines where a new pipe began


class NarratedStreams:
    def __init__(
        self,
        scheduler: Scheduler,
        durability: Durability | None,
        metrics: Metrics,
        settings: Settings,
        erasure: Erasure,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.scheduler = scheduler
        self.durability = durability
        self.metrics = metrics
        self.erasure = erasure
        self.retention = Retention(
            settings.narrate_keep_days * 86_400, settings.narrate_keep_bytes
        )  # past its bounds, a tenant's oldest intervals are folded (narrated_retention.py)
        self._open: dict[tuple[str, str], int] = {}  # open incidents by stream, for the gauge
        # engine thread (the writes): each stream's state's bytes, counted in its tenant's
        self._state_bytes: dict[tuple[str, str], int] = {}
        self.clock = clock
        self._memory_db: sqlite3.Connection | None = None  # without a state directory
        self._streams: OrderedDict[tuple[str, str], _Stream] = OrderedDict()
        self._lock = threading.Lock()
        # raises SessionElsewhere for a tenant marked moving (tenant_moves.py); checked again on
        # the engine thread by every write, so a call that passed the edge's check before the
        # mark writes nothing the move's export would miss
        self.served_here: Callable[[str], None] = lambda tenant: None

    # --- the calls ---

    def feed(
        self,
        principal: Principal,
        name: str,
        lines: list[str],
        close: bool = False,
        options: DigestOptions | None = None,
        keep_lines: bool | None = None,
        new_pipe: bool = False,
    ) -> Narrated:
        """Digest `lines` into the stream (created by its first call), then close the interval
        read so far if `close` (a time bound, the end of a pipe); an incident's interval closes
        once its seconds have passed, at any call. `options`: the stream's rules from now on;
        `keep_lines` alone (its rules as they were): whether it keeps raw lines from now on;
        `new_pipe`: the lines begin a new pipe (its first line is noted with its interval)."""
        tenant = _tenant(principal)
        _check_name(name)
        if len(lines) > MAX_LINES:
            raise InvalidInput(f"lines: at most {MAX_LINES} a call, got {len(lines)}")
        config = None if options is None else digest_config(options)
        keep = options.keep_lines if options is not None else keep_lines
        while True:
            stream = self._stream(tenant, name, config)
            with stream.lock:
                if stream.gone:  # forgotten or set aside while this call waited: again
                    continue
                if keep is not None and stream.keep_lines != keep:
                    stream.keep_lines, stream.kept, stream.left_out = keep, [], 0
                    stream.kept_chars = 0
                changed = options is not None or keep is not None
                if new_pipe and lines and stream.digest.lines:  # the stream's first: no news
                    stream.pipes.append(stream.digest.lines + 1)
                    changed = True
                return self._feed(tenant, name, stream, lines, close, changed)

    def _feed(
        self, tenant: str, name: str, stream: _Stream, lines: list[str], close: bool, changed: bool
    ) -> Narrated:
        digest = stream.digest
        now = self.clock()
        cuts: list[tuple[Facts, float, tuple[list[str], int] | None, list[int]]] = []
        for line in lines:
            if digest.pending == 0:
                stream.started = now
            if stream.keep_lines:
                _keep(stream, digest.lines + 1, line[:MAX_LINE_CHARS])
            facts = digest.observe(line[:MAX_LINE_CHARS])
            if facts is not None:  # it closes with this line: its lines are taken now
                cuts.append((facts, stream.started, _taken(stream, facts), _pipes(stream, facts)))
        last = digest.cut() if close else digest.due()
        if last is not None:
            cuts.append((last, stream.started, _taken(stream, last), _pipes(stream, last)))
        rows = [(_row(name, f, started, now, kept, pipes), f) for f, started, kept, pipes in cuts]
        failpoints.hit("narrate-digested")
        if lines or rows or changed:  # else nothing changed: nothing to write
            self._write(tenant, name, stream, [r for r, _ in rows], now)
        closed = tuple(_interval(r, tuple(sorted(f.support))) for r, f in rows)
        if rows:
            self._count(tenant, name, [f for _, f in rows], len(digest.open_incidents))
        return Narrated(closed, digest.lines, digest.pending)

    def _count(self, tenant: str, name: str, cut: list[Facts], still_open: int) -> None:
        """The metrics of the incidents these intervals opened, and of those still open."""
        for facts in cut:
            for incident in facts.opened:
                self.metrics.narrate_incidents.labels(name, incident.severity).inc()
        with self._lock:
            self._open[(tenant, name)] = still_open
            total = sum(n for (_, other), n in self._open.items() if other == name)
        self.metrics.narrate_open_incidents.labels(name).set(total)

    def note(self, principal: Principal, name: str, number: int, sentence: str) -> bool:
        """The checked sentence a client said of interval `number`, kept with its facts."""
        tenant = _tenant(principal)
        _check_name(name)
        noted = self._call(lambda t: t.note(tenant, name, number, sentence[:2000]), True, tenant)
        return bool(noted)

    def mute(
        self, principal: Principal, name: str, template_id: int, muted: bool = True
    ) -> NarrationMuted:
        """Mute one of the stream's templates (or unmute it): still read, counted and listed,
        never paged (`Digest.mute`). Kept with the stream's state, so it outlives the daemon."""
        tenant = _tenant(principal)
        with self._existing(tenant, name) as stream:
            try:
                template = stream.digest.mute(template_id, muted)
            except LookupError:
                raise NotFound(f"no template {template_id} in stream {name!r}") from None
            except OverflowError:
                raise ResourceExhausted(
                    f"muted templates: {MAX_MUTED} a stream at most; unmute one first"
                ) from None
            self._feed(tenant, name, stream, [], False, True)
            return NarrationMuted(template_id, template, tuple(sorted(stream.digest.muted)))

    def muted(self, principal: Principal, name: str) -> list[tuple[int, str]]:
        """The stream's muted templates, each with its text (oldest first)."""
        with self._existing(_tenant(principal), name) as stream:
            digest = stream.digest
            held = [(t, digest.miner.get(t)) for t in sorted(digest.muted)]
            return [(t, template.text()) for t, template in held if template is not None]

    def history(
        self,
        principal: Principal,
        name: str,
        since: float = 0.0,
        until: float = 0.0,
        severity: str = "",
        template: str = "",
        limit: int = 0,
    ) -> list[NarratedInterval]:
        """The stream's intervals in [since, until], oldest first; with `severity`, those with
        a template at it or worse (and every folded row, which may hold one); with `template`,
        those whose facts name words of it."""
        tenant = _tenant(principal)
        _check_name(name)
        if severity not in SEVERITIES:
            raise InvalidInput(f"severity: one of {', '.join(SEVERITIES[1:])}, got {severity!r}")
        filtered = bool(severity or template)
        rows = self._call(
            lambda t: t.intervals(tenant, name, since, until, 0 if filtered else limit), False
        )
        if not rows and not self._call(lambda t: t.state(tenant, name) is not None, False):
            raise NotFound(f"no narrated stream {name!r}")
        if severity:
            least = Severity[severity.upper()]
            rows = [r for r in rows if r.folded or _worst(r) >= least]
        if template:
            words = template.lower().split()
            rows = [r for r in rows if _mentions(r, words)]
        return [_interval(r) for r in rows[-limit if limit else 0 :]]

    def streams(self, principal: Principal) -> list[NarratedStream]:
        tenant = _tenant(principal)
        rows = self._call(lambda t: t.streams(tenant), False)
        return [NarratedStream(r.name, r.created, r.updated, r.intervals, r.lines, r.incidents)
                for r in rows]  # fmt: skip

    def forget(
        self,
        principal: Principal,
        name: str,
        since: float | None = None,
        until: float | None = None,
    ) -> NarrationForgotten:
        """The stream's state and facts deleted, from the store and memory; with `since` or
        `until`, only its intervals that overlap that period (the stream goes on). A call in
        flight on it finishes first; one waiting on it then starts a new stream. The reply waits
        (within `purge_wait_s`) for the purge that takes them out of the files."""
        tenant = _tenant(principal)
        _check_name(name)
        if since is not None or until is not None:
            return self._forget_period(tenant, name, since or 0.0, until or 0.0)
        with self._lock:
            stream = self._streams.get((tenant, name))
        with stream.lock if stream is not None else contextlib.nullcontext():
            if not self._call(lambda t: t.state(tenant, name) is not None, False):
                raise NotFound(f"no narrated stream {name!r}")
            n, owed = self._erase(tenant, lambda t: t.forget(tenant, name))
            if stream is not None:
                stream.gone = True
                with self._lock:
                    if self._streams.get((tenant, name)) is stream:
                        del self._streams[(tenant, name)]
            self.retention.measure_again(tenant)
            self._state_bytes.pop((tenant, name), None)
            self._count(tenant, name, [], 0)
        return NarrationForgotten(n, owed)

    def _forget_period(
        self, tenant: str, name: str, since: float, until: float
    ) -> NarrationForgotten:
        """The intervals overlapping [since, until] (0: open) deleted. The open interval, if it
        began by `until`, is closed first, so that its lines and kept raw lines go too."""
        for field, value in (("since", since), ("until", until)):
            if not 0 <= value < 1e11:
                raise InvalidInput(f"{field}: unix seconds, got {value}")
        if not (since or until):
            raise InvalidInput("since or until: a period to forget (else forget the stream)")
        if since and until and since > until:
            raise InvalidInput(f"since ({since}) is after until ({until})")
        with self._existing(tenant, name) as stream:
            began_by_until = not until or stream.started <= until
            if stream.digest.pending and began_by_until and self.clock() >= since:
                self._feed(tenant, name, stream, [], True, False)
            n, owed = self._erase(tenant, lambda t: t.forget_period(tenant, name, since, until))
            self.retention.measure_again(tenant)
            return NarrationForgotten(n, owed)

    def _erase(self, tenant: str, delete: Callable[[NarratedTables], int]) -> tuple[int, bool]:
        """`delete` committed with a purge owed, and the wait for that purge."""
        if self.durability is None:
            return int(self._in_memory(delete)), False
        n, owed = self.erasure.run(self._transaction(delete, True, purge=True, tenant=tenant))
        if owed:
            log.info("a forgotten narration's purge is owed (a reader holds the journal)")
        return int(n), owed

    def drop_tenant(self, tenant: str) -> None:
        """The tenant left this node (its rows went with its archive): its streams held in
        memory go, a call holding one looks again."""
        with self._lock:
            gone = [k for k in self._streams if k[0] == tenant]
            for key in gone:
                self._streams.pop(key).gone = True
        self.retention.measure_again(tenant)
        for _, name in gone:
            self._count(tenant, name, [], 0)

    # --- the parts ---

    @contextlib.contextmanager
    def _existing(self, tenant: str, name: str) -> Iterator[_Stream]:
        """The stream, held under its lock (NotFound: there is none); one forgotten or set aside
        while this waited for its lock is read again."""
        _check_name(name)
        missing = NotFound(f"no narrated stream {name!r}")
        if not self._call(lambda t: t.state(tenant, name) is not None, False):
            raise missing
        failpoints.hit("narrate-found")
        while True:
            stream = self._stream(tenant, name, None, create=False)
            if stream is None:  # forgotten since: not made anew
                raise missing
            with stream.lock:
                if not stream.gone:
                    yield stream
                    return

    @overload
    def _stream(self, tenant: str, name: str, config: DigestConfig | None) -> _Stream: ...
    @overload
    def _stream(
        self, tenant: str, name: str, config: DigestConfig | None, create: bool
    ) -> _Stream | None: ...

    def _stream(
        self, tenant: str, name: str, config: DigestConfig | None, create: bool = True
    ) -> _Stream | None:
        """The stream, in memory or read from the store; a new one where the store has none
        (None instead, unless `create`)."""
        key = (tenant, name)
        with self._lock:
            stream = self._streams.get(key)
            if stream is not None:
                self._streams.move_to_end(key)
                if config is not None:
                    stream.digest.config = config
                return stream
        state, streams = self._call(
            lambda t: (t.state(tenant, name), t.count_streams(tenant)), False
        )
        if state is None and not create:
            return None
        if state is None and streams >= MAX_STREAMS:
            raise ResourceExhausted(
                f"narrated streams: this tenant has {streams}, the most it may; forget one first"
            )
        if state is None:
            stream = _Stream(Digest(config or DigestConfig()), self.clock())
        else:
            kept = DigestConfig(**state["config"])
            stream = _Stream(Digest.restored(state["digest"], config or kept), state["started"])
            stream.keep_lines = bool(state.get("keep_lines", False))
            stream.kept = [(int(n), str(t)) for n, t in state.get("kept", [])]
            stream.kept_chars = sum(len(t) for _, t in stream.kept)
            stream.left_out = int(state.get("left_out", 0))
            stream.pipes = [int(n) for n in state.get("pipes", [])]
        with self._lock:
            stream = self._streams.setdefault(key, stream)
            for old in list(self._streams)[: max(0, len(self._streams) - STREAMS_IN_MEMORY)]:
                held = self._streams[old]  # the least recently used first; none a call holds
                if old != key and held.lock.acquire(blocking=False):
                    held.gone = True  # a call about to use it reads the store again
                    held.lock.release()
                    del self._streams[old]
        return stream

    def _write(
        self, tenant: str, name: str, stream: _Stream, closed: list[IntervalRow], now: float
    ) -> None:
        state = {
            "config": asdict(stream.digest.config),
            "digest": stream.digest.state(),
            "started": stream.started,
            "keep_lines": stream.keep_lines,
            "kept": stream.kept,
            "left_out": stream.left_out,
            "pipes": stream.pipes,
        }
        state_json = json.dumps(state, separators=(",", ":"))  # here, not on the engine thread
        key = (tenant, name)

        def write(tables: NarratedTables) -> None:
            grown = sum(tables.add(tenant, row) for row in closed)
            grown += len(state_json) - self._state_bytes.get(key, 0)
            tables.put_state(tenant, name, state_json, now)
            self._state_bytes[key] = len(state_json)
            self.retention.trim(tables, tenant, now, grown)

        try:
            self._call(write, True, tenant)
        except (ResourceExhausted, JournalError, sqlite3.Error, SessionElsewhere):
            stream.gone = True  # nothing of this call counts: the store's state is read again
            with self._lock:
                if self._streams.get(key) is stream:
                    del self._streams[key]
            self.retention.measure_again(tenant)
            self._state_bytes.pop(key, None)
            raise

    def _call(self, fn: Callable[[NarratedTables], Any], writes: bool, tenant: str = "") -> Any:
        """`fn` over the tables between steps (engine thread), committed if it `writes` (for
        `tenant`, refused if it is marked moving)."""
        if self.durability is None:
            return self._in_memory(fn)
        return self.scheduler.call(self._transaction(fn, writes, tenant=tenant))

    def _transaction(
        self,
        fn: Callable[[NarratedTables], Any],
        writes: bool,
        purge: bool = False,
        tenant: str = "",
    ) -> Callable[[Any], Any]:
        """`fn` as the engine thread runs it: committed if it `writes` (a purge owed for what it
        deleted, `purge`), rolled back and ResourceExhausted if the store refuses it; nothing run
        for a `tenant` marked moving (SessionElsewhere)."""
        durability = self.durability
        assert durability is not None

        def run(_engine: Any) -> Any:
            if tenant:
                self.served_here(tenant)
            try:
                result = fn(durability.narrated_tables())
                if writes:
                    if purge:
                        durability.owe_purge()
                    durability.commit()
                return result
            except (sqlite3.Error, JournalError) as e:
                durability.rollback()
                raise ResourceExhausted(f"the store could not keep this: {e}") from None

        return run

    def _in_memory(self, fn: Callable[[NarratedTables], Any]) -> Any:
        with self._lock:
            if self._memory_db is None:
                self._memory_db = sqlite3.connect(":memory:", check_same_thread=False)
                NarratedTables.opened(self._memory_db)
            result = fn(NarratedTables(self._memory_db))
            self._memory_db.commit()
            return result


def digest_config(options: DigestOptions) -> DigestConfig:
    """The digest's rules from a call's options, a default where an option is 0."""
    for field, value, most in (
        ("every_lines", options.every_lines, 1_000_000),
        ("incident_lines", options.incident_lines, 1_000_000),
        ("incident_seconds", options.incident_seconds, 86_400),
        ("gap_seconds", options.gap_seconds, 30 * 86_400),
        ("recur_intervals", options.recur_intervals, 1_000_000),
        ("inferred_min", options.inferred_min, 1_000_000),
    ):
        if not 0 <= value <= most:
            raise InvalidInput(f"{field}: 0 (the default) to {most}, got {value}")
    base = DigestConfig()
    return DigestConfig(
        every_lines=options.every_lines or base.every_lines,
        incident_lines=options.incident_lines or base.incident_lines,
        incident_seconds=options.incident_seconds or base.incident_seconds,
        gap_seconds=options.gap_seconds or base.gap_seconds,
        recur_intervals=options.recur_intervals or base.recur_intervals,
        info_bursts=options.info_bursts,
        inferred_min=options.inferred_min or base.inferred_min,
        page_handled=options.page_handled,
    )


def _interval(row: IntervalRow, support: tuple[str, ...] = ()) -> NarratedInterval:
    return NarratedInterval(
        row.stream, row.number, row.last_number, row.first_line, row.last_line, row.started,
        row.ended, row.incidents, row.errors, json.dumps(row.record), support,
    )  # fmt: skip


def _tenant(principal: Principal) -> str:
    if principal.tenant is None:
        raise PermissionDenied("narrated streams are a tenant's: the admin has none")
    return principal.tenant


def _check_name(name: str) -> None:
    if not NAME.match(name):
        raise InvalidInput(
            f"stream: 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit;"
            f" got {name[:80]!r}"
        )


def _keep(stream: _Stream, number: int, line: str) -> None:
    """The open interval's line kept, within KEEP_LINES and KEEP_CHARS; else counted."""
    if len(stream.kept) < KEEP_LINES and stream.kept_chars + len(line) <= KEEP_CHARS:
        stream.kept.append((number, line))
        stream.kept_chars += len(line)
    else:
        stream.left_out += 1


def _taken(stream: _Stream, facts: Facts) -> tuple[list[str], int] | None:
    """The kept lines of the interval these facts close (and how many past KEEP_LINES were
    not), taken out of the stream's; None where the stream keeps none."""
    if not stream.keep_lines:
        return None
    mine = [t for n, t in stream.kept if facts.first_line <= n <= facts.last_line]
    stream.kept = [(n, t) for n, t in stream.kept if n > facts.last_line]
    stream.kept_chars = sum(len(t) for _, t in stream.kept)
    left_out, stream.left_out = stream.left_out, 0
    return mine, left_out


def _pipes(stream: _Stream, facts: Facts) -> list[int]:
    """The lines where a new pipe began in the interval these facts close, taken out."""
    mine = [n for n in stream.pipes if n <= facts.last_line]
    stream.pipes = [n for n in stream.pipes if n > facts.last_line]
    return mine


def _row(
    name: str,
    facts: Facts,
    started: float,
    ended: float,
    lines: tuple[list[str], int] | None,
    pipes: list[int],
) -> IntervalRow:
    errors = sum(f.count for f in facts.errors)
    record: dict[str, Any] = {"facts": facts.as_dict(), "text": facts.render(), "sentence": ""}
    if lines is not None:
        record["lines"], record["lines_left_out"] = lines
    if pipes:
        record["new_pipe_at"] = pipes
    return IntervalRow(
        name, facts.number, facts.number, facts.first_line, facts.last_line, started, ended,
        int(facts.incident), errors, record,
    )  # fmt: skip


def _worst(row: IntervalRow) -> Severity:
    facts = row.record.get("facts", {})
    listed = [f["severity"] for kind in ("errors", "new", "bursts") for f in facts.get(kind, [])]
    return max((Severity[s.upper()] for s in listed), default=Severity.INFO)


def _mentions(row: IntervalRow, words: list[str]) -> bool:
    if row.folded:
        text = " ".join(row.record.get("error_templates", {}))
    else:
        text = row.record.get("text", "")
    lower = text.lower()
    return all(w in lower for w in words)
