"""`sinkd eval narrate --questions`: questions about a narrated stream's past, built from a log's
labels, asked of the daemon (`NarrationQuestions.ask`) and scored on what they cite and say.

The log (loghub's BGL_2k, its alert labels removed: `narrate.bgl_case`) is read as a stream in ten
parts, each an hour after the last. Then, for each labelled incident:
- **when**: "When did <its message> first happen?": right when a cited interval holds the first
  line of the log with that message and none lies wholly before it;
- **count**: "How many <its message> lines between lines A and B?" (its first and last line, at
  least 100 apart):
  right when every cited interval lies across A-B and one holds a line of it;
- **around**: "What happened around line N?" (its first line): right when a cited interval holds N;

and one question the log never answers (**absent**): right when the facts hold nothing for it.
Every question: a sentence printed that fails the grounding check against the facts handed to
the model is counted (it should be 0: the daemon drops those before they are printed).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Any

from sinkd.daemon.runtime.api import DigestOptions, NarrationAnswer
from sinkd.daemon.runtime.sessions import Principal
from sinkd.evaluation.narrate import Case
from sinkd.narration.grounding import sentences_of, unsupported_claims, words_of

WHO = Principal("local")
STREAM = "eval"
PARTS = 10
ABSENT = "When did the kubernetes scheduler evict the pods?"
_BGL_HEAD = 9  # "- stamp date node time node RAS KERNEL INFO": the message follows
_WORD = re.compile(r"[A-Za-z][A-Za-z_]+")


@dataclass(frozen=True)
class Question:
    text: str
    kind: str  # when | count | around | absent
    about: tuple[int, ...]  # the lines (1-based) whose text holds its subject
    span: tuple[int, int] = (0, 0)  # count: the lines it names; around: (N, N)


def message(line: str) -> str:
    """A BGL line's message, without its stamps and node names."""
    return " ".join(line.split()[_BGL_HEAD:])


def subject(line: str) -> str:
    """The first four words of a line's message: what a question names it by."""
    return " ".join(_WORD.findall(message(line))[:4])


def questions(case: Case) -> list[Question]:
    out: list[Question] = []
    seen: set[str] = set()
    for incident in case.incidents:
        words = subject(case.lines[incident.first_line - 1])
        if not words or words in seen:
            continue
        seen.add(words)
        pattern = re.compile(r"\W+".join(map(re.escape, words.split())))
        about = tuple(n for n, text in enumerate(case.lines, 1) if pattern.search(message(text)))
        first = incident.lines[0]
        last = max(incident.lines[-1], first + 99)  # a range, even for a lone line
        out.append(Question(f"When did {words} first happen?", "when", about))
        out.append(
            Question(
                f"How many {words} lines between lines {first} and {last}?",
                "count",
                about,
                (first, last),
            )
        )
        out.append(Question(f"What happened around line {first}?", "around", about, (first, first)))
    out.append(Question(ABSENT, "absent", ()))
    return out


def read_as_stream(service: Any, lines: list[str], every_lines: int) -> None:
    """The lines into the daemon's narrated stream, a part an hour, on a clock of its own."""
    day = datetime.datetime(2026, 12, 7).astimezone()
    size = -(-len(lines) // PARTS)
    for part in range(PARTS):
        at = (day + datetime.timedelta(hours=part, minutes=30)).timestamp()
        service.narrated.clock = lambda at=at: at
        chunk = lines[size * part : size * (part + 1)]
        if chunk:
            service.narrated.feed(WHO, STREAM, chunk, True, DigestOptions(every_lines=every_lines))
    service.questions.clock = lambda: (day + datetime.timedelta(hours=PARTS + 1)).timestamp()


def score(question: Question, answer: NarrationAnswer) -> dict[str, Any]:
    spans = [(i.first_line, i.last_line) for i in answer.cites]

    def held(n: int) -> bool:
        return any(a <= n <= b for a, b in spans)

    if question.kind == "when":  # and nothing cited before it, which would say it began sooner
        first = question.about[0] if question.about else 0
        right = held(first) and not any(b < first for _, b in spans)
    elif question.kind == "count":
        a, b = question.span
        inside = all(lo <= b and hi >= a for lo, hi in spans)
        right = bool(spans) and inside and any(held(n) for n in question.about if a <= n <= b)
    elif question.kind == "around":
        right = held(question.span[0])
    else:
        right = not answer.held
    support = words_of(answer.facts_text)
    unsupported = [
        s
        for s in sentences_of(answer.text)
        if unsupported_claims(s.removeprefix("According to the facts,"), support, min_words=1)
    ]
    return {
        "question": question.text,
        "kind": question.kind,
        "right": right,
        "held": answer.held,
        "cites": spans,
        "first_line_about": question.about[0] if question.about else None,
        "said": answer.text,
        "dropped": len(answer.dropped),
        "printed_unsupported": len(unsupported),
    }


def evaluate(service: Any, case: Case, every_lines: int) -> list[dict[str, Any]]:
    read_as_stream(service, case.lines, every_lines)
    return [score(q, service.questions.ask(WHO, STREAM, q.text)) for q in questions(case)]


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    kinds = sorted({r["kind"] for r in rows})
    return {
        "right": sum(r["right"] for r in rows),
        "of": len(rows),
        "by_kind": {k: [sum(r["right"] for r in rows if r["kind"] == k),
                        sum(r["kind"] == k for r in rows)] for k in kinds},
        "printed_unsupported": sum(r["printed_unsupported"] for r in rows),
    }  # fmt: skip
