"""Recall in a conversation, as a chat client meets it (issue 48): multi-turn chats through the
HTTP front's Chat Completions, the whole history resent each turn, greedy.

A chat: the user states a fact in turn 1; the model answers (in half the chats the client then
puts a contradicting assistant reply in its place, "its own contradiction": the locker case); then
`distance` turns on other topics, each answered by the model; then the user asks for the fact, in
the statement's words or in other words (alternating). Right: the answer holds the fact's value.

Three arms on the same chats, each a daemon of its own: `recall` (the HTTP front's defaults:
sessions of `cells` cells, recall on), `off` (the same cells, recall off: what the window alone
keeps) and `in-window` (sessions of `ceiling_cells`, every chat whole in the window: the ceiling).
Reported per distance, in turns and in the stream's tokens: accuracy per arm, recalled over the
ceiling, the share of turns that recalled, and what recall adds to time to first token, on the
turns that recalled and on those that did not, against the same turn with recall off.
"""

from __future__ import annotations

import json
import random
import statistics
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any

from sinkd.evaluation.facts import KINDS, WORDINGS, Fact

ARMS = ("recall", "off", "in-window")
SYSTEM = "You are a helpful assistant."
TOPICS = (
    "how bridges are built", "why the sky is blue", "how bread rises", "the history of maps",
    "how volcanoes form", "what makes a good cup of tea", "how trains are signalled",
    "why leaves change colour", "how a compass works", "the life of a honey bee",
    "how glass is made", "what tides are", "how to start a vegetable garden", "how clocks keep time",
    "why cats purr", "how paper is recycled", "what a lighthouse keeper did", "how rain forms",
    "how a bicycle stays upright", "the history of chess", "how cheese is made",
    "why we have seasons", "how sailing ships tack", "what coral reefs are", "how ink is made",
    "how owls hunt at night", "why bread goes stale", "how a piano makes sound",
    "how snow crystals form", "the history of the postal service", "how wind turbines work",
    "what makes soil fertile", "how rivers carve valleys", "how a kite flies",
)  # fmt: skip
LEADS = ("Please remember this:", "Just so you know,", "One thing about me:", "For later:")


@dataclass(frozen=True)
class ConversationPlan:
    distances: tuple[int, ...] = (10, 30)  # turns between the fact's turn and the question
    chats: int = 8  # per distance
    reply_tokens: int = 96  # 10 turns then hold ~1,200 tokens: past a default session's 1,024 cells
    answer_tokens: int = 32
    cells: int = 1024  # the recall and off arms' sessions (the daemon's default n_ctx_seq)
    ceiling_cells: int = 4096  # the in-window arm's: every chat whole
    arms: tuple[str, ...] = ARMS


@dataclass(frozen=True)
class Chat:
    distance: int
    index: int
    fact: Fact
    wording: str
    other: str | None  # the value of the contradicting reply the client keeps, or None
    topics: tuple[str, ...]

    @property
    def contradiction(self) -> str | None:
        """The assistant reply the client puts in place of the model's after the fact."""
        if self.other is None:
            return None
        return "Noted, I will remember: " + self.fact.kind.statement.format(v=self.other)

    @property
    def statement(self) -> str:
        return f"{LEADS[self.index % len(LEADS)]} {self.fact.statement}"

    @property
    def question(self) -> str:
        return self.fact.question(self.wording)


def chats(plan: ConversationPlan) -> list[Chat]:
    """The same chats for every arm: per distance, facts of every kind in turn, the wording
    alternating, a contradiction in every other pair."""
    out = []
    for distance in plan.distances:
        rng = random.Random(1000 + distance)
        for i in range(plan.chats):
            kind = KINDS[(i * 7 + distance) % len(KINDS)]
            value, other = rng.sample(kind.values, 2)
            topics = tuple(rng.sample(TOPICS, min(distance, len(TOPICS))))
            topics = tuple(topics[t % len(topics)] for t in range(distance))
            out.append(
                Chat(distance, i, Fact(kind, value), WORDINGS[i % 2],
                     other if (i // 2) % 2 else None, topics)
            )  # fmt: skip
    return out


@dataclass
class TurnResult:
    n: int
    ttft_s: float
    n_seen: int  # the session's stream after the turn (its receipt)
    recalled: int  # passages the turn recalled
    speakers: list[str] = field(default_factory=list)
    continuation: str = ""


@dataclass
class ChatResult:
    arm: str
    distance: int
    index: int
    kind: str
    wording: str
    contradicted: bool
    right: bool
    said_the_contradiction: bool  # the answer holds the contradiction's value
    tokens_back: int  # stream tokens from the end of the fact's turn to the question
    recalled_user: bool  # the question's turn recalled a passage the user said
    turns: list[TurnResult]


class ChatClient:
    """Chat Completions over HTTP, streamed (stdlib only: the eval runs where the daemon does)."""

    def __init__(self, base_url: str, token: str, model: str) -> None:
        self.url = f"{base_url}/v1/chat/completions"
        self.token = token
        self.model = model

    def turn(
        self, messages: list[dict[str, str]], max_tokens: int, headers: dict[str, str] | None = None
    ) -> tuple[str, float, Any]:
        """(reply, seconds to its first token, the `sinkd` field)."""
        body = {
            "model": self.model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        request = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
                **(headers or {}),
            },
        )
        t0 = time.perf_counter()
        ttft, text = 0.0, []
        extension: dict[str, Any] = {}
        with urllib.request.urlopen(request, timeout=900) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        ttft = ttft or time.perf_counter() - t0
                        text.append(piece)
                extension.update(chunk.get("sinkd") or {})
        return "".join(text), ttft or time.perf_counter() - t0, extension


def run_chat(client: ChatClient, chat: Chat, arm: str, plan: ConversationPlan) -> ChatResult:
    history = [{"role": "system", "content": SYSTEM}]
    turns: list[TurnResult] = []
    fact_end, answer = 0, ""
    asks = [chat.statement] + [f"Tell me about {t}." for t in chat.topics] + [chat.question]
    for n, ask in enumerate(asks, start=1):
        last = n == len(asks)
        messages = [*history, {"role": "user", "content": ask}]
        reply, ttft, ext = client.turn(messages, plan.answer_tokens if last else plan.reply_tokens)
        recalled = (ext.get("recall") or {}).get("recalled") or []
        receipt = ext.get("receipt") or {}
        turns.append(
            TurnResult(n, round(ttft, 4), int(receipt.get("n_seen", 0)), len(recalled),
                       [str(p.get("speaker", "")) for p in recalled],
                       str(ext.get("continuation", "")))
        )  # fmt: skip
        if n == 1:
            fact_end = turns[0].n_seen
            reply = chat.contradiction or reply  # the client keeps its edit of the reply
        history = [*messages, {"role": "assistant", "content": reply}]
        answer = reply
    question = turns[-1]
    return ChatResult(
        arm, chat.distance, chat.index, chat.fact.kind.name, chat.wording,
        chat.other is not None, chat.fact.answered(answer),
        chat.other is not None and Fact(chat.fact.kind, chat.other).answered(answer),
        question.n_seen - fact_end, "user" in question.speakers, turns,
    )  # fmt: skip


def warm_up(client: ChatClient, plan: ConversationPlan) -> None:
    """A short chat, not counted, before an arm's first: a fresh daemon's first turns run cold
    (its weights not yet in the page cache, Python's code not yet warm), and without it the arm
    run first read 1.2-1.5x slower on turns where it did nothing different."""
    history = [{"role": "system", "content": SYSTEM}]
    for ask in ("Hello there.", f"Tell me about {TOPICS[0]}.", "What did I say first?"):
        messages = [*history, {"role": "user", "content": ask}]
        reply, _, _ = client.turn(messages, plan.reply_tokens)
        history = [*messages, {"role": "assistant", "content": reply}]


Daemons = Callable[[str, int], AbstractContextManager[tuple[str, str, str]]]


def evaluate_conversations(
    daemon: Daemons, plan: ConversationPlan, progress: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """`daemon(arm, cells)`: a context that serves the arm (recall off for `off` and
    `in-window`) and yields (base URL, token, model name)."""
    t0 = time.monotonic()
    results: list[ChatResult] = []
    names = set()
    for arm in plan.arms:
        cells = plan.ceiling_cells if arm == "in-window" else plan.cells
        with daemon(arm, cells) as (url, token, name):
            names.add(name)
            client = ChatClient(url, token, name)
            warm_up(client, plan)
            for chat in chats(plan):
                r = run_chat(client, chat, arm, plan)
                results.append(r)
                progress(
                    f"{arm} d={chat.distance} #{chat.index}: {'right' if r.right else 'wrong'}"
                    f" ({r.tokens_back} tokens back)"
                )
    return {
        "model": ",".join(sorted(names)),
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(plan).items()},
        "seconds": round(time.monotonic() - t0, 1),
        "chats": [asdict(r) for r in results],
        "cells": summary(results, plan),
    }


def _paired(results: list[ChatResult], arm: str) -> Iterator[tuple[TurnResult, TurnResult]]:
    """Each turn of the `recall` arm beside the same chat's same turn in `arm`."""
    by_chat = {(r.distance, r.index): r for r in results if r.arm == arm}
    for r in results:
        other = by_chat.get((r.distance, r.index)) if r.arm == "recall" else None
        if other is not None:
            yield from zip(r.turns[1:], other.turns[1:], strict=True)  # turn 1 starts a session


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def summary(results: list[ChatResult], plan: ConversationPlan) -> list[dict[str, Any]]:
    """Per distance: accuracy per arm, recalled over in-window, tokens back, the share of turns
    that recalled, and TTFT with recall over the same turn with recall off (medians)."""
    out = []
    for distance in plan.distances:
        at = [r for r in results if r.distance == distance]
        row: dict[str, Any] = {"turns_back": distance, "chats": plan.chats}
        for arm in plan.arms:
            mine = [r for r in at if r.arm == arm]
            row[arm] = round(sum(r.right for r in mine) / len(mine), 3) if mine else None
            if arm == "recall" and mine:
                row["tokens_back"] = int(statistics.median(r.tokens_back for r in mine))
                row["recalled_user"] = round(sum(r.recalled_user for r in mine) / len(mine), 3)
                row["said_the_contradiction"] = sum(r.said_the_contradiction for r in mine)
                turns = [t for r in mine for t in r.turns[1:]]
                row["turns_recalling"] = round(sum(t.recalled > 0 for t in turns) / len(turns), 3)
        ceiling, recalled = row.get("in-window"), row.get("recall")
        row["recall_over_in_window"] = (
            round(recalled / ceiling, 3) if ceiling and recalled is not None else None
        )
        pairs = [(a, b) for a, b in _paired(at, "off") if a.ttft_s and b.ttft_s]
        row["ttft_recalling_over_off"] = _median(
            [a.ttft_s / b.ttft_s for a, b in pairs if a.recalled]
        )
        row["ttft_not_recalling_over_off"] = _median(
            [a.ttft_s / b.ttft_s for a, b in pairs if not a.recalled]
        )
        out.append(row)
    return out


def conversation_table(data: dict[str, Any]) -> tuple[str, list[str], list[list[Any]]]:
    columns = ["model", "turns back", "tokens back", "chats", "in window", "recall", "off",
               "recall / in window", "question recalled user's words", "turns recalling",
               "TTFT recalling / off", "TTFT not recalling / off"]  # fmt: skip
    rows = [
        [data["model"], c["turns_back"], c.get("tokens_back", "-"), c["chats"],
         c.get("in-window", "-"), c.get("recall", "-"), c.get("off", "-"),
         c["recall_over_in_window"] or "-", c.get("recalled_user", "-"),
         c.get("turns_recalling", "-"), c["ttft_recalling_over_off"] or "-",
         c["ttft_not_recalling_over_off"] or "-"]
        for c in data["cells"]
    ]  # fmt: skip
    return "recall in a conversation: facts said in turn 1, asked N turns later", columns, rows
