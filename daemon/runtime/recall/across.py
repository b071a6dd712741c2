"""What crosses from one conversation to another of the same tenant (its memory across
conversations, store/tenant_memory.py), and how it reads when it comes back.

Only the user's words cross: a chat turn's message, kept as it is said. The model's words cross
only where the user asks for it: a message that asks to remember and says nothing else ("remember
that", "please remember this") keeps the reply before it, marked as the model's, kept at the
user's request. A message that asks to remember something it says ("Remember: my locker is 4417")
is the user's words, marked as asked for. A passage that comes back says when it was said, so the
model can weigh an older statement against a newer one; a correction is found with what it
corrects, and first (`with_corrections`, `ranked_across`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from sinkd.cachepolicy.recall_plan import Candidate
from sinkd.daemon.runtime.recall.past import may_need_the_past
from sinkd.daemon.store.memory import MemoryStore

# a message that asks to remember: "remember ...", "please remember ...", "can you remember ..."
_ASKS = re.compile(
    r"^\s*(?:(?:please|pls|and|ok(?:ay)?|now|also|hey)[\s,]+)*(?:(?:can|could|would|will)\s+you\s+)?"
    r"(?:remember|memori[sz]e|keep\s+in\s+mind|note)\b[\s,:;-]*",
    re.IGNORECASE,
)
# ... and says nothing of its own to remember: the reply before it is what is asked for
_BARE = re.compile(
    r"^(?:(?:that|this|it|what\s+you\s+(?:just\s+)?said|your\s+(?:last\s+)?(?:answer|reply))"
    r"(?:\s+for\s+(?:me|later|next\s+time))?)?\s*(?:please)?\s*[.!?]*\s*$",
    re.IGNORECASE,
)


MIN_WORDS = 3  # "hi", "thanks!": nothing to keep
# a correction this close to the best match's score (a share of it) ranks first
CORRECTION_MARGIN = 0.12
_CORRECTS = re.compile(
    r"\b(?:actually|correction|correct(?:ed|ing)?|changed?|update[ds]?|now|anymore|any\s+more|"
    r"no\s+longer|instead|moved|switched|new)\b",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"(?<=[.!?\u3002\uff01\uff1f])\s*|\n+")
_WORDS = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")
_ASKS_OR_BIDS = frozenset(
    """what which who whom whose where when why how is are was were do does did can could would
    will should shall have has am tell show give let help teach explain write make describe list
    summarize summarise translate continue go remind recall repeat""".split()
)


@dataclass(frozen=True)
class Said:
    """A chat turn's words for the tenant's memory: the message (`tokens`, starting `offset`
    tokens into the job's), whether the user asked for it to be remembered, and the model's
    reply the user asked to be remembered (its text; "" when none was asked for)."""

    offset: int
    tokens: list[int]
    asked: bool = False
    reply: str = ""


def states_something(message: str) -> bool:
    """Whether the message says something of its own: a sentence that neither asks ("What is my
    code?", "how is glass made") nor bids the model do a thing ("Tell me about tides."). A
    question kept would come back for the next question like it, in the place of the answer."""
    for sentence in _SENTENCE.split(message.strip()):
        words = _WORDS.findall(sentence.lower())
        # a script written without spaces (Chinese, Japanese, Thai): a word per ~4 characters
        n = len(words) if sentence.isascii() else max(len(words), len(sentence.strip()) // 4)
        if not words or n < MIN_WORDS or sentence.rstrip().endswith(("?", "\uff1f", "\u061f")):
            continue
        first = words[1] if words[0] == "please" and len(words) > 1 else words[0]
        if first not in _ASKS_OR_BIDS:
            return True
    return False


def asks_for_the_past(message: str) -> bool:
    """Whether a chat turn searches the tenant's memory across conversations: it asks (a
    question), or bids the model recall ("Remind me of my code"), and speaks of its user or of
    what was said (past.py). A statement ("My dog is named Biscuit.") or a plain request ("Tell me
    about tides.") does not: it would pay a search, and often a recall, for nothing it asked."""
    if "?" in message or "\uff1f" in message:
        return True
    return may_need_the_past(message) and not states_something(message)


def says_it_corrects(text: str) -> bool:
    """The passage says it corrects or updates something the user said before ("Actually, I
    moved to Lima", "Correction: ...", "my code is 5150 now", "not Oslo anymore")."""
    return _CORRECTS.search(text) is not None


def asks_to_remember(message: str) -> bool:
    return _ASKS.match(message) is not None


def asks_for_the_reply(message: str) -> bool:
    """The message asks to remember and says nothing else: the reply before it is meant."""
    m = _ASKS.match(message)
    return m is not None and _BARE.match(message[m.end() :]) is not None


def heading(speaker: str, said_at: float) -> str:
    """What goes before a passage from another conversation (the template's frame is around)."""
    day = time.strftime("%Y-%m-%d", time.localtime(said_at))
    if speaker == "assistant":
        return f"(your reply in another conversation, {day}, kept as the user asked:) "
    return f"(the user, in another conversation on {day}:) "


def ranked_across(
    strong: list[Candidate], corrects: Callable[[Candidate], bool]
) -> list[Candidate]:
    """Passages from the tenant's memory, best first; but among those as good as the best
    (within `CORRECTION_MARGIN` of its score), the ones that say they correct something
    (`corrects`: "actually", "changed", "correction", "now"... `says_it_corrects`) first, newest
    first: a user who corrects a fact says much the same words again, later, and the correction
    is what holds. Not every newer passage: "my neighbour's dog is named Comet" is as close to
    "what is my dog named?" as "my dog is named Biscuit", and being newer makes it no answer."""
    if not strong:
        return []
    top = max(c.score for c in strong)
    near = top - CORRECTION_MARGIN * abs(top)
    first = [c for c in strong if c.score >= near and corrects(c)]
    rest = [c for c in strong if c not in first]
    return sorted(first, key=lambda c: -c.said_at) + sorted(rest, key=lambda c: -c.score)


def with_corrections(
    store: MemoryStore, tenant: str, found: list[Candidate], leave_out: str | None = None
) -> list[Candidate]:
    """The passages found, each that a later passage corrects preceded by its correction (the
    newest), scored just above it: a search that finds what the user said finds what the user
    said instead, though its words are farther from the question (tenant_memory.py,
    `link_correction`). A correction the asking conversation said stays out (its own words)."""
    out = list(found)
    for _ in range(4):  # a correction corrected in turn: followed a few links
        fixes = store.across.corrections_of(tenant, [c.passage_id for c in out])
        at = {c.passage_id: i for i, c in enumerate(out)}
        changed = False
        for c in list(out):
            fix = fixes.get(c.passage_id)
            if fix is None or fix.conversation == leave_out:
                continue
            lifted = c.score + 1e-6
            known = at.get(fix.number)
            if known is not None and out[known].score >= lifted:
                continue
            a, b = fix.logical
            better = Candidate(
                fix.number, fix.logical, b - a, lifted, c.lexical, c.dense, fix.speaker,
                fix.conversation, fix.said_at,
            )  # fmt: skip
            if known is not None:
                out[known] = better
            else:
                out.append(better)
                at[fix.number] = len(out) - 1
            changed = True
        if not changed:
            break
    return sorted(out, key=lambda c: -c.score)
