"""Memory across conversations, as a chat client meets it (issue 62): one user's many short
conversations through the HTTP front's Chat Completions (greedy), each a new conversation.

The timeline: conversation i (of `facts`) states fact i in its first turn ("One thing about me:
My dog is named Pixel."); the next one states a distractor of the same kind about someone else
("My neighbour's dog is named Mango."); every other conversation talks of a topic (a request, and
a remark of the user's own: kept too, as noise). A quarter of the facts are corrected two
conversations later ("Correction, that changed: My dog is named Mango."). Each fact is asked in a
new conversation of its own `distances` conversations after it was stated, in the statement's
words or in other words (alternating). One conversation is private (the x-sinkd-private header)
and states a secret; one states a code and is then forgotten (POST /v1/sinkd/memory/forget); both
are asked for later. Another tenant states the same kinds of facts with other values first.

Reported on the `memory` arm: the stated passage (the correction's, for a corrected fact) among
the memory search's top 1 and top 3 (GET /v1/sinkd/memory?search=, recall's own ranking), among
what the question's turn recalled, and in the answer; whether a correction ranks above what it
corrected; contamination (a recalled or top-3 passage of the private conversation, the forgotten
one or the other tenant: must be 0). Against the `off` arm (the same daemon, memory off), the
time to first token of the question turns and of the new conversations' first turns that need no
past (the gate: `may_need_the_past`), p50 and p95, run alternately on two daemons at once.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any

from sinkd.daemon.runtime.recall.past import may_need_the_past
from sinkd.evaluation.facts import KINDS, WORDINGS, Fact
from sinkd.evaluation.recall_conversation import SYSTEM, TOPICS, ChatClient

ARMS = ("memory", "off")
LEAD = "One thing about me:"
CORRECTION = "Correction, that changed:"
# the same kinds of facts, about someone else ("{v}": another value of the kind)
ABOUT_OTHERS = {
    "name": "My neighbour's name is {v}.", "city": "My cousin lives in {v} these days.",
    "dog": "My neighbour's dog is named {v}.", "job": "My brother works as a {v}.",
    "colour": "My wife's favourite colour is {v}.", "car": "My colleague drives an old {v}.",
    "sister": "My friend's sister is called {v}.", "instrument": "My son plays the {v} at school.",
    "password": "The office wifi password is {v}.", "doctor": "My mother's doctor is Dr. {v}.",
    "allergy": "My friend is allergic to {v}.", "birthday": "My father's birthday is in {v}.",
    "daughter": "My neighbour's daughter is named {v}.", "sport": "My uncle plays {v} on weekends.",
    "dish": "My roommate's favourite dish is {v}.", "language": "My aunt is learning {v}.",
    "boat": "My uncle keeps a boat called {v}.", "office": "My brother's office is on {v} Street.",
    "number": "My sister's lucky number is {v}.", "collection": "My grandfather collects old {v}.",
}  # fmt: skip
PRIVATE = ("My safe combination is 3141 5926.", "What is my safe combination?", "3141")
FORGOTTEN = ("My locker code is 8552 on level two.", "What is my locker code?", "8552")
AFTER_PRIVATE = 6  # the private and forgotten conversations' questions: this many later


@dataclass(frozen=True)
class MemoryPlan:
    facts: int = 20
    distances: tuple[int, ...] = (5, 20)  # conversations between the statement and the question
    corrected_every: int = 4  # every 4th fact is corrected two conversations later
    reply_tokens: int = 48
    answer_tokens: int = 24
    cells: int = 1024
    other_tenant_facts: int = 5
    arms: tuple[str, ...] = ARMS


@dataclass(frozen=True)
class Said:
    """One conversation of the timeline: its user turns, whether private, and what it states."""

    index: int
    turns: tuple[str, ...]
    private: bool = False
    fact: int | None = None  # the fact it states (a correction is a turn of a later one)
    forget: bool = False  # forgotten once said


@dataclass(frozen=True)
class Question:
    after: int  # asked once conversation `after` is over
    fact: int | None  # None: the private or the forgotten conversation's question
    distance: int
    text: str
    value: str
    source: int  # the conversation that stated what is asked (the correction's, if corrected)
    original: int | None = None  # a corrected fact's first statement


@dataclass
class Asked:
    arm: str
    question: Question
    ttft_s: float
    answer: str = ""
    recalled: list[dict[str, Any]] = field(default_factory=list)
    top: list[dict[str, Any]] = field(default_factory=list)  # the memory search's top 3
    tokens_between: int = 0
    stated: list[int] = field(default_factory=list)  # the passages that state what is asked


def facts(plan: MemoryPlan) -> list[tuple[Fact, str, str]]:
    """(fact, its correction's value, a distractor's value) for each of the plan's facts."""
    out = []
    for i in range(plan.facts):
        kind = KINDS[i % len(KINDS)]
        values = kind.values
        out.append((Fact(kind, values[i % 8]), values[(i + 3) % 8], values[(i + 5) % 8]))
    return out


def timeline(plan: MemoryPlan) -> tuple[list[Said], list[Question]]:
    """The conversations in order, and the questions, each asked once a conversation is over."""
    drawn = facts(plan)
    topics = iter(TOPICS * 8)
    corrected = {i: i + 2 for i in range(plan.facts) if i % plan.corrected_every == 3}
    turns: list[list[str]] = []
    for c in range(plan.facts + max(plan.distances) + 3):
        topic = next(topics)
        mine = [f"Tell me about {topic}.", f"I read about {topic} last week and liked it."]
        if c < plan.facts:
            mine[0:0] = [f"{LEAD} {drawn[c][0].statement}"]
        if 0 < c <= plan.facts:  # a distractor of the previous fact's kind
            prev, _, other = drawn[c - 1]
            mine.append(ABOUT_OTHERS[prev.kind.name].format(v=other))
        turns.append(mine)
    for i, at in corrected.items():
        fact, new, _ = drawn[i]
        turns[at].append(f"{CORRECTION} {Fact(fact.kind, new).statement}")
    said = [Said(c, tuple(t), fact=c if c < plan.facts else None) for c, t in enumerate(turns)]
    # the private and the forgotten conversations, halfway through the facts
    at = plan.facts // 2
    said[at:at] = [Said(0, (PRIVATE[0],), private=True), Said(0, (FORGOTTEN[0],), forget=True)]
    said = [Said(k, s.turns, s.private, s.fact, s.forget) for k, s in enumerate(said)]

    def where(c: int) -> int:  # conversation c of the loop above, in the timeline
        return c if c < at else c + 2

    questions = []
    for i, (fact, new, _) in enumerate(drawn):
        for d in plan.distances:
            text = fact.question(WORDINGS[(i + d) % 2])
            if i in corrected:
                q = Question(where(i) + d, i, d, text, new, where(corrected[i]), where(i))
            else:
                q = Question(where(i) + d, i, d, text, fact.value, where(i))
            questions.append(q)
    for index, (_, question, value) in ((at, PRIVATE), (at + 1, FORGOTTEN)):
        questions.append(
            Question(index + AFTER_PRIVATE, None, AFTER_PRIVATE, question, value, index)
        )
    return said, questions


class MemoryClient(ChatClient):
    """Chat Completions with the private header, and the memory's own routes."""

    def __init__(self, base_url: str, token: str, model: str) -> None:
        super().__init__(base_url, token, model)
        self.base = base_url

    def private_turn(
        self, messages: list[dict[str, str]], max_tokens: int, private: bool
    ) -> tuple[str, float, Any]:
        headers = {"x-sinkd-private": "true"} if private else None
        return self.turn(messages, max_tokens, headers)

    def memory(self, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(
            f"{self.base}/v1/sinkd/memory{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            method=method,
        )
        with urllib.request.urlopen(request, timeout=900) as r:
            return json.loads(r.read())


def converse(
    client: MemoryClient, turns: tuple[str, ...], plan: MemoryPlan, private: bool = False
) -> tuple[str, float, int, str]:
    """A new conversation: (its session, the first turn's TTFT, its tokens, the last reply)."""
    history = [{"role": "system", "content": SYSTEM}]
    first, session, n_seen, reply = 0.0, "", 0, ""
    for n, ask in enumerate(turns):
        messages = [*history, {"role": "user", "content": ask}]
        reply, ttft, ext = client.private_turn(messages, plan.reply_tokens, private)
        first = first or ttft
        session = str(ext.get("session_id", session))
        n_seen = int((ext.get("receipt") or {}).get("n_seen", n_seen))
        history = [*messages, {"role": "assistant", "content": reply}]
        del n
    return session, first, n_seen, reply


Daemons = Callable[[str, int], AbstractContextManager[tuple[str, list[str], str]]]


def evaluate_memory(
    daemon: Daemons, plan: MemoryPlan, progress: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """`daemon(arm, cells)`: a context serving the arm (memory off for `off`) and yielding (base
    URL, [alice's token, bob's token], model name). Both arms' daemons run at once, and each
    conversation goes to one and then the other."""
    said, questions = timeline(plan)
    t0 = time.monotonic()
    asked: list[Asked] = []
    first_turns: dict[str, list[tuple[bool, float]]] = {arm: [] for arm in plan.arms}
    sessions: dict[str, dict[int, str]] = {arm: {} for arm in plan.arms}
    tokens: dict[int, int] = {}
    with daemon("memory", plan.cells) as mem, daemon("off", plan.cells) as off:
        clients = {
            arm: MemoryClient(url, tokens_[0], name)
            for arm, (url, tokens_, name) in zip(ARMS, (mem, off), strict=True)
        }
        bob = MemoryClient(mem[0], mem[1][1], mem[2])
        for arm in plan.arms:
            converse(clients[arm], ("Hello there.", f"Tell me about {TOPICS[0]}."), plan)
        bobs = [converse(bob, (f"{LEAD} {Fact(f.kind, v).statement}",), plan)[0]
                for f, _, v in facts(plan)[: plan.other_tenant_facts]]  # fmt: skip
        for s in said:
            for arm in plan.arms:
                client = clients[arm]
                session, ttft, n_seen, _ = converse(client, s.turns, plan, s.private)
                sessions[arm][s.index] = session
                tokens[s.index] = n_seen
                first_turns[arm].append((may_need_the_past(s.turns[0]), ttft))
                if s.forget and arm == "memory":
                    client.memory("POST", "/forget", {"conversation": session})
            for q in [q for q in questions if q.after == s.index]:
                for arm in plan.arms:
                    a = ask(clients[arm], arm, q, plan, sessions[arm][q.source])
                    a.tokens_between = sum(tokens[k] for k in range(q.source + 1, q.after + 1))
                    asked.append(a)
            progress(f"conversation {s.index + 1}/{len(said)}")
        leaks = {*bobs, sessions["memory"][_private(said)], sessions["memory"][_forgotten(said)]}
    results = [_scored(a, sessions["memory"], leaks) for a in asked if a.arm == "memory"]
    return {
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(plan).items()},
        "seconds": round(time.monotonic() - t0, 1),
        "conversations": len(said),
        "questions": [asdict(a) for a in asked],
        "scored": results,
        "cells": summary(results, asked, first_turns, plan),
    }


def _private(said: list[Said]) -> int:
    return next(s.index for s in said if s.private)


def _forgotten(said: list[Said]) -> int:
    return next(s.index for s in said if s.forget)


def ask(client: MemoryClient, arm: str, q: Question, plan: MemoryPlan, source: str) -> Asked:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q.text}]
    answer, ttft, ext = client.turn(messages, plan.answer_tokens)
    recalled = [r for r in (ext.get("recall") or {}).get("recalled") or [] if r.get("conversation")]
    top: list[dict[str, Any]] = []
    stated: list[int] = []
    if arm == "memory":
        query = urllib.parse.urlencode({"search": q.text, "limit": 3})
        top = client.memory("GET", f"?{query}")["data"]
        theirs = client.memory("GET", "?" + urllib.parse.urlencode({"conversation": source}))
        stated = [p["id"] for p in theirs["data"] if q.value.lower() in p["text"].lower()]
    return Asked(arm, q, round(ttft, 4), answer, recalled, top, stated=stated)


def _scored(a: Asked, sessions: dict[int, str], leaks: set[str]) -> dict[str, Any]:
    q = a.question
    source = sessions[q.source]
    value = q.value.lower()
    stated = {(source, i) for i in a.stated}
    ranks = [i for i, p in enumerate(a.top) if (p["conversation"], p["id"]) in stated]
    original_ranks = []
    if q.original is not None:
        first = sessions[q.original]
        original_ranks = [i for i, p in enumerate(a.top) if p.get("conversation") == first]
    recalled_ids = {(r["conversation"], r["passage_id"]) for r in a.recalled}
    top_ids = {(p["conversation"], p["id"]) for p in a.top}
    return {
        "fact": q.fact,
        "distance": q.distance,
        "corrected": q.original is not None,
        "top1": bool(ranks) and ranks[0] == 0,
        "top3": bool(ranks),
        "correction_first": bool(ranks) and all(ranks[0] < r for r in original_ranks),
        "recalled": bool(stated & recalled_ids),
        "answered": value in a.answer.lower(),
        "contaminated": any(c in leaks for c, _ in recalled_ids | top_ids),
        "tokens_between": a.tokens_between,
    }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


def summary(
    results: list[dict[str, Any]],
    asked: list[Asked],
    first_turns: dict[str, list[tuple[bool, float]]],
    plan: MemoryPlan,
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for d in plan.distances:
        mine = [r for r in results if r["distance"] == d and r["fact"] is not None]
        corrected = [r for r in mine if r["corrected"]]
        out.append({
            "row": f"{d} conversations later",
            "facts": len(mine),
            "tokens_between": int(statistics.median(r["tokens_between"] for r in mine)),
            "top1": _share(mine, "top1"), "top3": _share(mine, "top3"),
            "recalled": _share(mine, "recalled"), "answered": _share(mine, "answered"),
            "corrected": len(corrected),
            "correction_first": _share(corrected, "correction_first") if corrected else None,
            "contaminated": sum(r["contaminated"] for r in mine),
        })  # fmt: skip
    leaks = [r for r in results if r["fact"] is None]
    out.append({"row": "private and forgotten", "facts": len(leaks),
                "contaminated": sum(r["contaminated"] for r in results),
                "answered": _share(leaks, "answered")})  # fmt: skip
    for name, on, base in (
        ("question turns", _ttfts(asked, "memory"), _ttfts(asked, "off")),
        ("first turns needing no past", _firsts(first_turns, "memory", False),
         _firsts(first_turns, "off", False)),
        ("first turns that may need the past", _firsts(first_turns, "memory", True),
         _firsts(first_turns, "off", True)),
    ):  # fmt: skip
        p50, p95 = _pct(on, 0.5), _pct(on, 0.95)
        b50, b95 = _pct(base, 0.5), _pct(base, 0.95)
        out.append({
            "row": f"TTFT, {name}", "n": len(on), "memory_p50_s": p50, "memory_p95_s": p95,
            "off_p50_s": b50, "off_p95_s": b95,
            "p50_over_off": round(p50 / b50, 3) if p50 and b50 else None,
            "p95_over_off": round(p95 / b95, 3) if p95 and b95 else None,
        })  # fmt: skip
    return out


def _share(rows: list[dict[str, Any]], key: str) -> float | None:
    return round(sum(bool(r[key]) for r in rows) / len(rows), 3) if rows else None


def _ttfts(asked: list[Asked], arm: str) -> list[float]:
    return [a.ttft_s for a in asked if a.arm == arm and a.question.fact is not None]


def _firsts(first: dict[str, list[tuple[bool, float]]], arm: str, past: bool) -> list[float]:
    return [t for needs, t in first[arm] if needs is past]


def memory_tables(data: dict[str, Any]) -> list[tuple[str, list[str], list[list[Any]]]]:
    rows = data["cells"]
    recall_rows = [r for r in rows if "top3" in r]
    columns = ["asked", "facts", "tokens between", "top 1", "top 3", "recalled", "answered",
               "corrected", "correction first", "contaminated"]  # fmt: skip
    first = [
        [r["row"], r["facts"], r["tokens_between"], r["top1"], r["top3"], r["recalled"],
         r["answered"], r["corrected"], r["correction_first"], r["contaminated"]]
        for r in recall_rows
    ]  # fmt: skip
    leak = [r for r in rows if r["row"] == "private and forgotten"]
    first += [[r["row"], r["facts"], "-", "-", "-", "-", r["answered"], "-", "-",
               r["contaminated"]] for r in leak]  # fmt: skip
    ttft_cols = ["turns", "n", "memory p50 s", "memory p95 s", "off p50 s", "off p95 s",
                 "p50 / off", "p95 / off"]  # fmt: skip
    second = [
        [r["row"][6:], r["n"], r["memory_p50_s"], r["memory_p95_s"], r["off_p50_s"],
         r["off_p95_s"], r["p50_over_off"], r["p95_over_off"]]
        for r in rows if r["row"].startswith("TTFT")
    ]  # fmt: skip
    return [
        ("memory across conversations: facts asked in a new conversation", columns, first),
        ("time to first token, memory on / off (same run, alternating)", ttft_cols, second),
    ]
