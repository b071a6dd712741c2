"""Questions about a narrated stream's past ("when did the sshd failures start?", "what happened
between 02:00 and 03:00?", "has this error been seen before?"), answered from its kept facts.

The intervals that match are found without the model (`select`): by the times the question names
(`HH:MM`, ISO dates, "between A and B", "since", "before", "last N hours", "today",
"yesterday"), by the lines it names ("around line 450", "between lines 300 and 600"), by severity words ("error", "fatal", "warning", "incident") and by the words of the
kept templates it uses. Only those intervals' facts are handed to the model, in a session of its
own closed after the answer, which continues a sentence sinkd starts; every sentence is checked as
a narration is (narration/grounding.py: a word, number or name the facts do not hold drops it). The
facts are returned whatever the model said; where none matched, the model is not asked and the
answer says the facts do not hold it.
"""

from __future__ import annotations

import datetime
import json
import re
import time
from collections.abc import Callable

from sinkd.daemon.runtime.api import (
    AppendResult,
    GenerationOptions,
    Handle,
    NarratedInterval,
    NarrationAnswer,
    PolicyRequest,
    Receipt,
    Stream,
    TokenEvent,
)
from sinkd.daemon.runtime.narrated import NarratedStreams
from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import InvalidInput
from sinkd.narration.grounding import STOPWORDS, check, words_of

MAX_QUESTION_CHARS = 500
MAX_CITED = 6  # intervals handed to the model at most (the newest of the best matches)
MAX_FACTS_CHARS = 3000
ASK = "\n\nQuestion: {question}\nAnswer from the facts above: "
LEAD = "According to the facts,"
SEVERITY_WORDS = {
    "error": 3, "errors": 3, "failed": 3, "failure": 3, "failures": 3, "fatal": 4,
    "critical": 4, "crash": 4, "panic": 4, "warning": 2, "warnings": 2, "warn": 2,
    "incident": 0, "incidents": 0, "alert": 0, "alerts": 0,
}  # fmt: skip
SEVERITY_FORMS = frozenset(f for w in SEVERITY_WORDS for f in words_of(w))  # "fail" of "failed"
QUESTION_WORDS = frozenset(
    """when what where which who why how did does do was were has have had happen happened
    start started begin began first last seen before after since until between during ever
    today yesterday hour hours minute minutes day days log logs line lines show tell around near
    how many much count number times anything any there""".split()
)
QUESTION_FORMS = frozenset(f for w in QUESTION_WORDS for f in words_of(w))
_CLOCK = re.compile(r"\b(\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2})?)?|\d{1,2}:\d{2})\b")
_LAST = re.compile(r"\blast (\d+) (minute|hour|day)s?\b")
_LINES = re.compile(r"\blines? (\d+)(?:\s*(?:-|to|and|through)\s*(?:lines? )?(\d+))?")

Create = Callable[[Principal, PolicyRequest], Receipt]
Append = Callable[[Principal, Handle, str], AppendResult]
Generate = Callable[[Principal, Handle, GenerationOptions], Stream]
Close = Callable[[Principal, Handle], None]


class NarrationQuestions:
    def __init__(
        self,
        streams: NarratedStreams,
        create: Create,
        append: Append,
        generate: Generate,
        close: Close,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.streams = streams
        self._create = create
        self._append = append
        self._generate = generate
        self._close = close
        self.clock = clock

    def ask(
        self, principal: Principal, name: str, question: str, max_tokens: int = 48
    ) -> NarrationAnswer:
        question = " ".join(question.split())
        if not question or len(question) > MAX_QUESTION_CHARS:
            raise InvalidInput(f"question: 1 to {MAX_QUESTION_CHARS} characters")
        if not 1 <= max_tokens <= 256:
            raise InvalidInput(f"max_tokens: 1 to 256, got {max_tokens}")
        kept = self.streams.history(principal, name)  # NotFound for another tenant's name
        cited = select(kept, question, self.clock())
        facts = facts_text(cited)
        if not cited:
            return NarrationAnswer(name, False, "", (), "", ())
        text = self._model(principal, facts, question, max_tokens)
        support = words_of(facts)
        checked = check(text, frozenset(support), LEAD)
        return NarrationAnswer(
            name,
            True,
            " ".join(checked.kept),
            tuple(d.sentence for d in checked.dropped),
            facts,
            tuple(cited),
        )

    def _model(self, principal: Principal, facts: str, question: str, max_tokens: int) -> str:
        """One sentence continued after the facts, in a session of its own, closed after."""
        receipt = self._create(principal, PolicyRequest(name="sink", sinks=4))
        handle = receipt.handle
        try:
            self._append(
                principal, handle, f"Log facts:\n{facts}{ASK.format(question=question)}{LEAD}"
            )
            options = GenerationOptions(max_tokens, ("\n",))
            parts = []
            for event in self._generate(principal, handle, options):
                if isinstance(event, TokenEvent):
                    parts.append(event.text)
            return LEAD + "".join(parts)
        finally:
            self._close(principal, handle)


def select(kept: list[NarratedInterval], question: str, now: float) -> list[NarratedInterval]:
    """The kept intervals the question is about, oldest first: within the times it names, then
    those that match its severity and template words best (the newest first among equals)."""
    lower = question.lower()
    since, until = window(lower, kept, now)
    first, last = line_span(lower)
    rows = [
        i
        for i in kept
        if (not since or i.ended >= since)
        and (not until or i.started <= until)
        and (not first or (i.last_line >= first and i.first_line <= last))
    ]
    severity = [SEVERITY_WORDS[w] for w in re.findall(r"[a-z]+", lower) if w in SEVERITY_WORDS]
    words = {  # times and numbers are the window's, severity words rank: neither must match
        w
        for w in words_of(lower)
        if len(w) >= 3
        and w not in STOPWORDS
        and w not in QUESTION_FORMS
        and w not in SEVERITY_FORMS
        and not any(c.isdigit() for c in w)
    }
    scored = []
    for i in rows:
        record = json.loads(i.record_json)
        text = record.get("text", "") or " ".join(record.get("error_templates", {}))
        hits = len(words & words_of(text.lower()))
        marked = bool(severity) and bool(i.incidents if min(severity) == 0 else i.errors)
        if words and not hits:  # the words it names must be there; a severity only ranks
            continue
        if severity and not words and not marked:
            continue
        scored.append((2 * hits + marked, i.number, i))
    if words and scored:  # the intervals that hold the most of its words, not a word of them
        most = max(t[0] // 2 for t in scored)
        scored = [t for t in scored if t[0] // 2 == most]
    if not words and not severity:  # a question about a time alone: that period, newest first
        scored = [(0, i.number, i) for i in rows]
    # "when did it start", "seen before", "first": the oldest matches first; else the newest
    oldest = bool(re.search(r"\b(start(ed|s)?|beg[ia]n|first|before|ever|earliest)\b", lower))
    best = sorted(scored, key=lambda t: (-t[0], t[1] if oldest else -t[1]))[:MAX_CITED]
    return sorted((i for _, _, i in best), key=lambda i: i.number)


def line_span(lower: str) -> tuple[int, int]:
    """The lines the question names ("around line 450", "between lines 300 and 600"), as
    (first, last); (0, 0) where it names none."""
    if not (m := _LINES.search(lower)):
        return 0, 0
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) else a
    return min(a, b), max(a, b)


def window(lower: str, kept: list[NarratedInterval], now: float) -> tuple[float, float]:
    """The times the question names, as (since, until) wall-clock seconds (0: open)."""
    if m := _LAST.search(lower):
        unit = {"minute": 60, "hour": 3600, "day": 86400}[m.group(2)]
        return now - int(m.group(1)) * unit, 0.0
    local = datetime.datetime.fromtimestamp(now).astimezone()
    midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if "yesterday" in lower:
        start = midnight - datetime.timedelta(days=1)
        return start.timestamp(), midnight.timestamp()
    if "today" in lower:
        return midnight.timestamp(), 0.0
    day = datetime.datetime.fromtimestamp(kept[-1].ended).astimezone() if kept else local
    times = [_at(t, day) for t in _CLOCK.findall(lower)]
    if len(times) >= 2:
        return min(times[:2]), max(times[:2])
    if len(times) == 1:
        if re.search(r"\b(before|until)\b", lower):
            return 0.0, times[0]
        if re.search(r"\b(since|after|from)\b", lower):
            return times[0], 0.0
        return times[0] - 1800, times[0] + 1800  # "at 02:10": the half hours around it
    return 0.0, 0.0


def _at(token: str, day: datetime.datetime) -> float:
    if ":" in token and "-" not in token:
        hour, minute = (int(x) for x in token.split(":"))
        if not (0 <= hour < 24 and 0 <= minute < 60):
            raise InvalidInput(f"question: {token} is not a time of day")
        return day.replace(hour=hour, minute=minute, second=0, microsecond=0).timestamp()
    try:
        parsed = datetime.datetime.fromisoformat(token)
    except ValueError:
        raise InvalidInput(f"question: {token} is not a date") from None
    if parsed.tzinfo is None:
        parsed = parsed.astimezone()
    return parsed.timestamp()


def facts_text(cited: list[NarratedInterval]) -> str:
    """The cited intervals' facts as the model reads them, each headed by its number, lines and
    times, at most MAX_FACTS_CHARS (the newest kept whole)."""
    blocks = []
    for i in cited:
        record = json.loads(i.record_json)
        start = datetime.datetime.fromtimestamp(i.started).astimezone().strftime("%Y-%m-%d %H:%M")
        end = datetime.datetime.fromtimestamp(i.ended).astimezone().strftime("%H:%M")
        head = f"[interval {i.number}, {start}-{end}]"
        if i.last_number > i.number:
            errors = record.get("error_templates", {})
            body = (
                f"Log lines {i.first_line}-{i.last_line}: {record.get('folded', 0)} intervals,"
                f" {i.incidents} incidents, {i.errors} error lines"
                + "".join(f'\nERROR: {n} lines "{t}".' for t, n in list(errors.items())[:5])
            )
        else:
            body = record.get("text", "")
            if record.get("sentence"):
                body += f"\nSaid then: {record['sentence']}"
        blocks.append(f"{head} {body}")
    text = "\n".join(blocks)
    while len(text) > MAX_FACTS_CHARS and len(blocks) > 1:
        blocks.pop(0)
        text = "\n".join(blocks)
    return text[-MAX_FACTS_CHARS:]
