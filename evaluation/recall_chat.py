"""Recall, evaluated as a user meets it: facts said in passing (in a chat turn, or a line of a
document appended to a stream), asked for later in a chat turn in the user's own words, answered
freely with the model's chat sampling and greedily, scored by the fact's exact word.

One stream per source holds one fact of each of the 20 kinds (`facts.py`), each followed by
ordinary text. Each fact is asked right after it was said (`in-window`: 126 tokens on, the window
still holds it: the ceiling) and again 1,000, 4,000 and 16,000 tokens on (evicted; recall must bring
it back), in both wordings (half the questions share no content word with the fact) and both
samplings, each in a fork of the stream, so every cell sees the same streams.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sinkd.daemon.runtime.api import (
    ChatRequest,
    Done,
    GenerationOptions,
    Handle,
    PolicyRequest,
    RecallRequest,
    SamplingRequest,
    TokenEvent,
    Turn,
)
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.evaluation.facts import WORDINGS, Fact, draw, shares_content_word

PRINCIPAL = Principal("local")
SAMPLINGS = {
    "greedy": SamplingRequest(temperature=0.0),
    "chat": None,
}  # None: the model's chat defaults
IN_WINDOW = 126
SOURCES = ("conversation", "document")

LEADS = ("Before we go on, one thing about me.", "A small personal note.", "By the way.",
         "Something you might like to know.", "Just so you know.")  # fmt: skip
TAILS = ("Anyway, let us go on with the reading.", "Now, back to the text.",
         "Let us continue.", "Right, where were we?", "Please carry on.")  # fmt: skip
ACKS = ("Thank you for telling me. Shall we continue?", "Noted. Let us go on.",
        "Good to know. Here is the next part.")  # fmt: skip


@dataclass(frozen=True)
class ChatPlan:
    distances: tuple[int, ...] = (1000, 4000, 16000)
    sources: tuple[str, ...] = SOURCES
    streams: int = 1  # per source; each holds one fact of every kind
    facts: int = 20  # of the 20 kinds, the first this many (fewer: a quick run)
    samplings: tuple[str, ...] = ("greedy", "chat")
    max_tokens: int = 24
    gap: int = 200  # tokens of ordinary text between two facts
    parallel: int = 4  # asks at once (the scheduler batches them)


@dataclass
class Trial:
    source: str
    kind: str
    wording: str
    sampling: str
    bucket: str  # "in-window" or the distance asked for
    tokens_back: int
    right: bool
    retrieved: bool  # a recalled passage holds the fact's value
    outcome: str  # recalled / in window / nothing
    shares_word: bool
    ttft_s: float


@dataclass
class Trials:
    rows: list[Trial] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, t: Trial) -> None:
        with self.lock:
            self.rows.append(t)


class Filler:
    def __init__(self, service: SinkdService, text: str, seed: int) -> None:
        self.vocab = service.engine.vocab
        self.text = text
        self.rng = random.Random(seed)
        self.at = self.rng.randrange(0, max(1, len(text) - 400_000))

    def chars(self, n_tokens: int) -> str:
        """About n_tokens of the text, from where the last piece ended, cut at a line."""
        piece = self.text[self.at : self.at + n_tokens * 4]
        cut = piece.rfind("\n")
        piece = piece[: cut + 1] if cut > 0 else piece
        self.at += len(piece)
        return piece


def _ask(
    service: SinkdService, stream: Handle, question: str, sampling: str, max_tokens: int
) -> tuple[str, Done | None, float]:
    h = service.fork(PRINCIPAL, stream).handle
    try:
        t0 = time.monotonic()
        ttft = 0.0
        text, done = "", None
        request = ChatRequest(question, GenerationOptions(max_tokens, sampling=SAMPLINGS[sampling]))
        for e in service.chat(PRINCIPAL, h, request):
            if isinstance(e, TokenEvent):
                if not text:
                    ttft = time.monotonic() - t0
                text += e.text
            elif isinstance(e, Done):
                done = e
        return text, done, ttft
    finally:
        service.close(PRINCIPAL, h)


def _outcome(
    done: Done | None, fact: Fact, service: SinkdService, stream: Handle
) -> tuple[bool, str]:
    report = done.recall if done is not None else None
    if report is None:
        return False, "nothing"
    if report.recalled:
        return fact.value.lower() in report.note.lower() or _held_value(
            report, fact, service, stream
        ), "recalled"
    return False, "in window" if "still in the window" in report.note else "nothing"


def _held_value(report: Any, fact: Fact, service: SinkdService, stream: Handle) -> bool:
    ids = {s.passage_id for s in report.recalled}
    passages = service.memory.memory(PRINCIPAL, stream, "", 10_000)
    return any(p.passage_id in ids and fact.value.lower() in p.text.lower() for p in passages)


def chat_stream(
    service: SinkdService,
    text: str,
    source: str,
    seed: int,
    plan: ChatPlan,
    trials: Trials,
    progress: Callable[[str], None],
) -> None:
    rng = random.Random(seed)
    facts = draw(rng)[: plan.facts]
    filler = Filler(service, text, seed)
    h = service.create(
        PRINCIPAL, PolicyRequest("sink"), None, recall=RecallRequest(mode="auto")
    ).handle
    targets: list[tuple[int, Fact, str, int]] = []  # (position, fact, bucket, fact's end)

    def n_seen() -> int:
        return service.receipt(service.access.owned(PRINCIPAL, h)).n_seen

    def put(segment: str, fact: Fact | None = None) -> None:
        if source == "conversation":
            if fact is None:
                turns = [
                    Turn("user", "Read on with me: " + segment),
                    Turn("assistant", filler.chars(60)),
                ]
            else:
                said = f"{rng.choice(LEADS)} {fact.statement} {rng.choice(TAILS)}"
                turns = [Turn("user", said), Turn("assistant", rng.choice(ACKS))]
            service.turns.history(PRINCIPAL, h, turns)
        else:
            body = segment if fact is None else f"\n{fact.statement}\n"
            service.append(PRINCIPAL, h, body)

    def due() -> None:
        now = n_seen()
        ready = [t for t in targets if t[0] <= now]
        for t in ready:
            targets.remove(t)
        jobs = []
        for _, fact, bucket, end in ready:
            for wording in WORDINGS:
                for sampling in plan.samplings:
                    jobs.append((fact, bucket, end, wording, sampling))

        def one(job: tuple[Fact, str, int, str, str]) -> None:
            fact, bucket, end, wording, sampling = job
            question = fact.question(wording)
            answer, done, ttft = _ask(service, h, question, sampling, plan.max_tokens)
            retrieved, outcome = _outcome(done, fact, service, h)
            trials.add(Trial(source, fact.kind.name, wording, sampling, bucket, now - end,
                             fact.answered(answer), retrieved, outcome,
                             shares_content_word(fact.statement, question), ttft))  # fmt: skip

        run_parallel([functools.partial(one, j) for j in jobs], plan.parallel)

    try:
        for i, fact in enumerate(facts):
            put(filler.chars(plan.gap // 2))
            put("", fact)
            end = n_seen()
            targets.append((end + IN_WINDOW, fact, "in-window", end))
            targets.extend((end + d, fact, str(d), end) for d in plan.distances)
            while (
                targets
                and min(t[0] for t in targets) <= end + plan.gap // 2 + IN_WINDOW
                and n_seen() < end + IN_WINDOW
            ):
                put(filler.chars(32))
            due()
            progress(f"  {source} stream {seed}: fact {i + 1}/{len(facts)} at {end} tokens")
        while targets:
            goal = min(t[0] for t in targets)
            while n_seen() < goal:
                put(filler.chars(min(256, max(16, goal - n_seen()))))
            due()
        progress(f"  {source} stream {seed}: done at {n_seen()} tokens")
    finally:
        service.close(PRINCIPAL, h)


def run_parallel(jobs: list[Callable[[], None]], parallel: int) -> None:
    """`parallel` at a time; the first error in any is raised here."""
    errors: list[BaseException] = []
    todo = list(jobs)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not todo or errors:
                    return
                job = todo.pop(0)
            try:
                job()
            except BaseException as e:  # collected, re-raised in the caller
                with lock:
                    errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(min(parallel, len(jobs)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def evaluate_chat(
    service: SinkdService,
    text: str,
    plan: ChatPlan,
    progress: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    trials = Trials()
    t0 = time.monotonic()
    for source in plan.sources:
        for s in range(plan.streams):
            chat_stream(
                service,
                text,
                source,
                1000 * (SOURCES.index(source) + 1) + s,
                plan,
                trials,
                progress,
            )
    return {
        "model": service.entry.name,
        "presentation": service.turns.presentation.value,
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.__dict__.items()},
        "seconds": round(time.monotonic() - t0, 1),
        "trials": [t.__dict__ for t in trials.rows],
        "cells": cells(trials.rows),
    }


def cells(rows: list[Trial]) -> list[dict[str, Any]]:
    """Per sampling and distance: the recalled accuracy beside the in-window accuracy of the same
    facts and questions, their ratio, and how many questions shared no content word."""
    out = []
    for sampling in sorted({r.sampling for r in rows}):
        base = [r for r in rows if r.sampling == sampling and r.bucket == "in-window"]
        base_acc = sum(r.right for r in base) / len(base) if base else 0.0
        for bucket in sorted({r.bucket for r in rows if r.bucket != "in-window"}, key=int):
            cell = [r for r in rows if r.sampling == sampling and r.bucket == bucket]
            acc = sum(r.right for r in cell) / len(cell)
            para = [r for r in cell if not r.shares_word]
            out.append({
                "sampling": sampling, "tokens_back": int(bucket), "trials": len(cell),
                "in_window_accuracy": base_acc, "recalled_accuracy": acc,
                "ratio": acc / base_acc if base_acc else None,
                "at_least_90pct_of_in_window": acc >= 0.9 * base_acc,
                "paraphrased_share": len(para) / len(cell),
                "paraphrased_accuracy": sum(r.right for r in para) / len(para) if para else None,
                "lexical_accuracy": sum(r.right for r in cell if r.shares_word) / max(1, len(cell) - len(para)),
                "retrieved": sum(r.retrieved for r in cell) / len(cell),
                "mean_ttft_s": sum(r.ttft_s for r in cell) / len(cell),
            })  # fmt: skip
    return out


def chat_table(runs: list[dict[str, Any]]) -> tuple[str, list[str], list[list[Any]]]:
    """The chat arm's table over runs of `evaluate_chat` (a model and presentation each)."""
    rows = []
    for data in runs:
        for c in data["cells"]:
            rows.append([
                data["model"], data["presentation"], c["sampling"], c["tokens_back"], c["trials"],
                c["in_window_accuracy"], c["recalled_accuracy"],
                "-" if c["ratio"] is None else c["ratio"], c["paraphrased_share"],
                "-" if c["paraphrased_accuracy"] is None else c["paraphrased_accuracy"],
                c["lexical_accuracy"], c["retrieved"], c["mean_ttft_s"],
            ])  # fmt: skip
    columns = ["model", "presentation", "sampling", "tokens back", "trials", "in window",
               "recalled", "ratio", "no shared word", "acc (para)", "acc (lexical)", "retrieved",
               "TTFT s"]  # fmt: skip
    return (
        "recall, chat arm: accuracy with the fact evicted and recalled vs still in the window",
        columns,
        rows,
    )
