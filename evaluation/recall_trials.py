"""Recall, evaluated through the service: passkey retrieval by distance, a multi-key variant, and
facts stated early in a chat and asked many turns later.

Passkey: a 5-digit number is stated once in long filler text; at each checkpoint (tokens since the
statement) the stream is forked and the fork is asked for it, once without recall (`sink`, the
policy as it is) and once with an explicit Recall between the question and the answer (`recall`).
One stream per trial serves every distance. Controls (`window`, and `full` where the budget fits
the trained context) run their own streams. A trial is right when the number is in the greedy
answer. Several trials run at once, so the scheduler batches their prefills.
"""

from __future__ import annotations

import functools
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sinkd.daemon.runtime.api import (
    ChatRequest,
    Done,
    GenerationOptions,
    Handle,
    PolicyRequest,
    RecallRequest,
    SamplingRequest,
    Stream,
    TokenEvent,
)
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.evaluation.plotting import pyplot

PRINCIPAL = Principal("local")
QUESTION = "\nWhat is the pass key?\n"
ANSWER = "\nThe pass key is"
GREEDY = SamplingRequest(temperature=0.0)


def key_sentence(key: int, door: int | None = None) -> str:
    what = "pass key" if door is None else f"pass key of door {door}"
    return f"\nThe {what} is {key}. Remember it. {key} is the {what}.\n"


@dataclass
class Tally:
    right: dict[tuple[str, int], int] = field(default_factory=dict)
    asked: dict[tuple[str, int], int] = field(default_factory=dict)
    recalled_tokens: dict[tuple[str, int], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, arm: str, distance: int, right: bool, recalled: int = 0) -> None:
        with self.lock:
            k = (arm, distance)
            self.right[k] = self.right.get(k, 0) + int(right)
            self.asked[k] = self.asked.get(k, 0) + 1
            self.recalled_tokens[k] = self.recalled_tokens.get(k, 0) + recalled

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "arm": arm,
                "distance": d,
                "trials": n,
                "right": self.right[(arm, d)],
                "accuracy": self.right[(arm, d)] / n,
                "mean_recalled_tokens": self.recalled_tokens[(arm, d)] / n,
            }
            for (arm, d), n in sorted(self.asked.items(), key=lambda kv: (kv[0][0], kv[0][1]))
        ]


class Filler:
    """Long public-domain text, tokenized once; each trial reads from its own offset."""

    def __init__(self, service: SinkdService, text: str, max_tokens: int) -> None:
        self.tokens = service.engine.vocab.tokenize(text[: max_tokens * 8], add_bos=False)

    def take(self, rng: random.Random, n: int) -> list[int]:
        if n > len(self.tokens):
            raise ValueError(f"the filler holds {len(self.tokens)} tokens, {n} asked")
        start = rng.randrange(0, len(self.tokens) - n + 1)
        return self.tokens[start : start + n]


def _answer(service: SinkdService, handle: Handle, max_tokens: int = 8) -> str:
    events = service.generate(PRINCIPAL, handle, GenerationOptions(max_tokens, sampling=GREEDY))
    return "".join(e.text for e in events if isinstance(e, TokenEvent))


def _chat(service: SinkdService, handle: Handle, message: str, max_tokens: int) -> Stream:
    return service.chat(
        PRINCIPAL, handle, ChatRequest(message, GenerationOptions(max_tokens, sampling=GREEDY))
    )


def _append_tokens(service: SinkdService, handle: Handle, tokens: list[int]) -> None:
    for i in range(0, len(tokens), 1024):  # each call well within any deadline
        service.append(PRINCIPAL, handle, None, tokens[i : i + 1024])


def ask(
    service: SinkdService,
    handle: Handle,
    key: int,
    recall: bool,
    question: str = QUESTION,
    answer: str = ANSWER,
) -> tuple[bool, int]:
    """In a fork: the question, optionally a Recall of it, then the answer's start; greedy."""
    h = service.fork(PRINCIPAL, handle).handle
    try:
        service.append(PRINCIPAL, h, question, None)
        recalled = 0
        if recall:
            report = service.memory.recall_into(PRINCIPAL, h, question.strip()).report
            recalled = sum(r.stream[1] - r.stream[0] for r in report.recalled)
        service.append(PRINCIPAL, h, answer, None)
        return str(key) in _answer(service, h), recalled
    finally:
        service.close(PRINCIPAL, h)


def passkey_stream(
    service: SinkdService,
    filler: Filler,
    tally: Tally,
    seed: int,
    distances: list[int],
    policy: PolicyRequest,
    arms: dict[str, bool],
    doors: int = 0,
) -> None:
    """One trial: one stream, forked and asked at every distance. `arms`: name -> use recall.
    `doors` > 0: the multi-key variant (that many keys, one asked)."""
    rng = random.Random(seed)
    recall = RecallRequest(mode="manual") if any(arms.values()) else RecallRequest(mode="off")
    h = service.create(PRINCIPAL, policy, None, recall=recall).handle
    try:
        _append_tokens(service, h, filler.take(rng, 64))
        keys = [rng.randint(10000, 99999) for _ in range(max(doors, 1))]
        asked_door = rng.randrange(doors) if doors else None
        engine = service.engine
        for i, key in enumerate(keys):
            text = key_sentence(key, i + 1 if doors else None)
            _append_tokens(service, h, engine.vocab.tokenize(text, add_bos=False))
            if doors and i + 1 < len(keys):
                _append_tokens(service, h, filler.take(rng, 24))
        question, answer, key = QUESTION, ANSWER, keys[0]
        if asked_door is not None:
            key = keys[asked_door]
            question = f"\nWhat is the pass key of door {asked_door + 1}?\n"
            answer = f"\nThe pass key of door {asked_door + 1} is"
        done = 0
        after = filler.take(rng, max(distances))
        for d in sorted(distances):
            _append_tokens(service, h, after[done:d])
            done = d
            for arm, use_recall in arms.items():
                right, recalled = ask(service, h, key, use_recall, question, answer)
                tally.add(arm, d, right, recalled)
    finally:
        service.close(PRINCIPAL, h)


def run_parallel(jobs: list[Callable[[], None]], parallel: int) -> None:
    """Run trials `parallel` at a time; an error in any is raised here."""
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

    threads = [threading.Thread(target=worker) for _ in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def conversation(service: SinkdService, recall_mode: str, turns: int, seed: int) -> dict[str, Any]:
    """Facts stated in the first message, many turns of other talk, then questions about them."""
    rng = random.Random(seed)
    names = ["Ada", "Bruno", "Chiara", "Dmitri", "Elif", "Farid", "Greta", "Hiro"]
    cities = ["Lisbon", "Oslo", "Nairobi", "Lima", "Hanoi", "Quebec", "Tbilisi", "Perth"]
    pets = ["Pixel", "Mango", "Biscuit", "Nimbus", "Pepper", "Waffles", "Juniper", "Comet"]
    name, city, pet = rng.choice(names), rng.choice(cities), rng.choice(pets)
    topics = [
        "Explain how a rainbow forms.",
        "Write a short poem about the sea.",
        "Describe how bread is baked.",
        "What are the planets of the solar system?",
        "Tell me about the history of the bicycle.",
        "How do bees make honey?",
        "Describe a walk in a forest in autumn.",
        "Explain what a volcano is.",
        "How does a train work?",
        "Tell me a story about a lighthouse keeper.",
        "What is the water cycle?",
        "Describe how a cake is decorated.",
    ]
    h = service.create(
        PRINCIPAL, PolicyRequest("sink"), None, recall=RecallRequest(recall_mode)
    ).handle
    try:
        first = f"Hi! My name is {name}, I live in {city} and my dog is called {pet}."
        _drain(_chat(service, h, first, 40))
        for i in range(turns):
            _drain(_chat(service, h, topics[i % len(topics)], 80))
        results = []
        for question, fact in (
            ("What is my name?", name),
            ("Which city do I live in?", city),
            ("What is my dog called?", pet),
        ):
            ch = service.fork(PRINCIPAL, h).handle
            try:
                done: Done | None = None
                text = ""
                for e in _chat(service, ch, question, 24):
                    if isinstance(e, TokenEvent):
                        text += e.text
                    else:
                        done = e
                recall = done.recall if done is not None else None
                results.append(
                    {
                        "question": question,
                        "right": fact.lower() in text.lower(),
                        "recalled_passages": len(recall.recalled) if recall else 0,
                    }
                )
            finally:
                service.close(PRINCIPAL, ch)
        receipt = service.reads.inspect(PRINCIPAL, h, include_text=False).receipt
        return {
            "recall": recall_mode,
            "turns": turns,
            "evicted_tokens": receipt.evicted_tokens,
            "first_message_evicted": receipt.recent_logical[0] > 60,
            "answers": results,
        }
    finally:
        service.close(PRINCIPAL, h)


def _drain(events: Stream) -> None:
    for _ in events:
        pass


PLACEMENTS = {
    # where a recalled fact can sit, relative to the question (docs/recall.md)
    "before the question": "{fact}{question}{answer}",
    "between question and answer": "{question}{fact}{answer}",
    "a window back (a region after the sinks)": "{fact}{far}{question}{answer}",
}


def placement(
    service: SinkdService, filler: Filler, trials: int, window: int, seed: int
) -> list[dict[str, Any]]:
    """The same fact at each place a recall could put it, in a sink session of window `window`
    whose cache is full of other text; the model's accuracy at copying it out."""
    right = dict.fromkeys(PLACEMENTS, 0)
    engine = service.engine
    for t in range(trials):
        rng = random.Random(seed * 1000 + t)
        key = rng.randint(10000, 99999)
        h = service.create(
            PRINCIPAL,
            PolicyRequest("sink", window=window),
            None,
            recall=RecallRequest(mode="off"),
        ).handle
        try:
            _append_tokens(service, h, filler.take(rng, window + 64))
            far = engine.vocab.detokenize(filler.take(rng, window - 40))
            for name, layout in PLACEMENTS.items():
                ch = service.fork(PRINCIPAL, h).handle
                try:
                    text = layout.format(
                        fact=key_sentence(key), question=QUESTION, answer=ANSWER, far=far
                    )
                    service.append(PRINCIPAL, ch, text, None)
                    right[name] += str(key) in _answer(service, ch)
                finally:
                    service.close(PRINCIPAL, ch)
        finally:
            service.close(PRINCIPAL, h)
    return [
        {"window": window, "placement": k, "trials": trials, "accuracy": v / trials}
        for k, v in right.items()
    ]


@dataclass
class Plan:
    """What one evaluation runs. Distances are tokens between the key and the question."""

    distances: list[int]
    trials: int
    long_distances: list[int]
    long_trials: int
    multi_distances: list[int]
    multi_trials: int
    control_trials: int
    conversation_turns: int
    conversations: int
    placement_trials: int = 10
    full_max_distance: int = 4000  # the full control's budget grows with it (8k: trained context)
    parallel: int = 8
    seed: int = 0


def evaluate(
    make_service: Callable[..., SinkdService],
    text: str,
    plan: Plan,
    progress: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """Every part of the evaluation; `make_service(**settings)` starts a service (durable or not,
    the caller's choice) and the caller stops none: this function stops what it starts."""
    out: dict[str, Any] = {"plan": plan.__dict__}
    longest = max([*plan.distances, *plan.long_distances, *plan.multi_distances])
    # cells per sequence = the budget: llama.cpp re-rotates every cell of every sequence at each
    # shift, so spare cells only slow the run down (bench/shift_cost.py)
    svc = make_service(n_ctx_seq=256, max_sessions=plan.parallel * 2 + 1)
    try:
        window = svc.entry.default_window
        filler = Filler(svc, text, longest + 200)
        tally = Tally()
        sink_arms = {"sink": False, "sink+recall": True}
        multi = Tally()

        def stream(
            into: Tally,
            trial: int,
            ds: list[int],
            policy: str,
            arms: dict[str, bool],
            doors: int = 0,
        ) -> Callable[[], None]:
            seed = plan.seed * 1000 + trial
            return functools.partial(
                passkey_stream, svc, filler, into, seed, ds, PolicyRequest(policy), arms, doors
            )

        jobs: list[Callable[[], None]] = []
        for t in range(max(plan.trials, plan.long_trials)):
            ds = [d for d in plan.distances if t < plan.trials]
            ds += [d for d in plan.long_distances if t < plan.long_trials]
            if ds:
                jobs.append(stream(tally, t, ds, "sink", sink_arms))
        for t in range(plan.control_trials):
            ds = [d for d in plan.distances if d <= 4096]
            jobs.append(stream(tally, t, ds, "window", {"window": False}))
        for t in range(plan.multi_trials):
            jobs.append(stream(multi, 500 + t, plan.multi_distances, "sink", sink_arms, doors=8))
        t0 = time.perf_counter()
        run_parallel(jobs, plan.parallel)
        progress(f"passkey streams done in {time.perf_counter() - t0:.0f} s")
        progress("passkey rows: " + json.dumps(tally.rows() + multi.rows()))
        out["window"] = window
        out["passkey"] = tally.rows()
        out["multikey"] = multi.rows()
        out["placement"] = placement(svc, filler, plan.placement_trials, window, plan.seed)
        progress("placement (default window) done")
        out["conversation"] = [
            conversation(svc, mode, plan.conversation_turns, plan.seed + i)
            for i in range(plan.conversations)
            for mode in ("off", "auto")
        ]
        progress("conversations done")
    finally:
        svc.stop()
    chat_window = 1020  # a chat-sized window: n_ctx_seq 1024
    svc = make_service(n_ctx_seq=chat_window + 4, max_sessions=2)
    try:
        filler = Filler(svc, text, longest + 200)
        out["placement"] += placement(svc, filler, plan.placement_trials, chat_window, plan.seed)
        progress("placement (chat-sized window) done")
    finally:
        svc.stop()
    full_ds = [d for d in plan.distances if d <= plan.full_max_distance]
    if plan.control_trials and full_ds:
        budget = 64 + 32 + max(full_ds) + 64
        svc = make_service(n_ctx_seq=budget, max_sessions=2, n_batch=512, step_tokens=512)
        try:
            filler = Filler(svc, text, longest + 200)
            full = Tally()
            for t in range(plan.control_trials):
                passkey_stream(
                    svc,
                    filler,
                    full,
                    plan.seed * 1000 + t,
                    full_ds,
                    PolicyRequest("full", sinks=4, window=budget - 4),
                    {"full": False},
                )
            out["passkey"] += full.rows()
            progress("full control done")
        finally:
            svc.stop()
    return out


def segmenting(
    make_service: Callable[..., SinkdService],
    text: str,
    distances: list[int],
    trials: int,
    parallel: int = 6,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Passkey with recall, the memory cut at text boundaries vs every 48 tokens, same streams."""
    rows: list[dict[str, Any]] = []
    for kind in ("text", "fixed"):
        svc = make_service(n_ctx_seq=256, max_sessions=parallel * 2 + 1, memory_passages=kind)
        try:
            filler = Filler(svc, text, max(distances) + 200)
            tally = Tally()
            jobs: list[Callable[[], None]] = [
                functools.partial(
                    passkey_stream,
                    svc,
                    filler,
                    tally,
                    seed * 1000 + t,
                    distances,
                    PolicyRequest("sink"),
                    {f"sink+recall ({kind} passages)": True},
                )
                for t in range(trials)
            ]
            run_parallel(jobs, parallel)
            rows += tally.rows()
        finally:
            svc.stop()
    return rows


def plot(data: dict[str, Any], path: Path) -> None:
    """Accuracy by distance, one line per arm, the window marked."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    arms = sorted({r["arm"] for r in data["passkey"]})
    for arm in arms:
        rows = sorted((r for r in data["passkey"] if r["arm"] == arm), key=lambda r: r["distance"])
        ax.plot([r["distance"] for r in rows], [r["accuracy"] for r in rows], marker="o", label=arm)
    ax.axvline(data["window"], color="grey", linestyle=":", label=f"window W={data['window']}")
    ax.set_xscale("log")
    ax.set_xlabel("tokens between the pass key and the question")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("Passkey retrieval, SmolLM2-135M-Instruct")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report_tables(data: dict[str, Any]) -> list[tuple[str, list[str], list[list[Any]]]]:
    """(title, columns, rows) for each table of the report, for any table printer."""
    return [
        (
            "Passkey accuracy by distance (tokens between the key and the question)",
            ["arm", "distance", "trials", "accuracy", "recalled tokens"],
            [
                [r["arm"], r["distance"], r["trials"], r["accuracy"], r["mean_recalled_tokens"]]
                for r in data["passkey"]
            ],
        ),
        (
            "Where recalled text sits: the same fact, copied out by the model",
            ["window", "placement", "trials", "accuracy"],
            [[r["window"], r["placement"], r["trials"], r["accuracy"]] for r in data["placement"]],
        ),
        (
            "Multi-key (8 keys, one asked)",
            ["arm", "distance", "trials", "accuracy"],
            [[r["arm"], r["distance"], r["trials"], r["accuracy"]] for r in data["multikey"]],
        ),
        (
            "Conversation: facts from the first message, asked after many turns",
            ["recall", "turns", "evicted", "first msg evicted", "right of 3", "recalled passages"],
            [
                [
                    c["recall"],
                    c["turns"],
                    c["evicted_tokens"],
                    c["first_message_evicted"],
                    sum(a["right"] for a in c["answers"]),
                    sum(a["recalled_passages"] for a in c["answers"]),
                ]
                for c in data["conversation"]
            ],
        ),
    ]
