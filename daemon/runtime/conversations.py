"""Sessions for stateless clients: a client that resends the whole history each turn continues the
session that took those turns, so only its new turn is tokenized and appended.

A conversation is identified by a chain of keyed hashes over its turns, (role, content) one link
each, the system prompt first: the chain's head after a turn names the session that produced it.
Only hashes are kept (never text), keyed with a secret of this daemon's so that a hash confirms no
guess. A tenant's histories match its own sessions alone. Pure: no engine, no transport.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Sequence
from dataclasses import dataclass

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Turn:
    role: str
    content: str


def link(key: bytes, head: str, turn: Turn) -> str:
    """The chain's next head: `head` followed by one turn (content compared without its outer
    whitespace: clients trim what they resend)."""
    body = f"{head}\x00{turn.role}\x00{turn.content.strip()}".encode()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def chain(key: bytes, system: str, turns: Sequence[Turn]) -> list[str]:
    """Heads after the system prompt and after each turn: `chain(...)[i]` names the history of
    the system prompt and the first i turns."""
    heads = [link(key, "", Turn("system", system))]
    for turn in turns:
        heads.append(link(key, heads[-1], turn))
    return heads


@dataclass(frozen=True)
class Match:
    """Where a history stands against the tenant's sessions."""

    session_id: str | None  # None: no session took these turns
    reset_count: int
    why: str


class ConversationIndex:
    """Per tenant: the chain head each conversation session (at one generation) stands at."""

    def __init__(self, key: bytes) -> None:
        self.key = key  # a durable daemon's is kept in its state directory: heads outlive restarts
        self._lock = threading.Lock()
        self._by_head: dict[tuple[str, str], tuple[str, int]] = {}
        self._head_of: dict[str, tuple[str, str]] = {}  # session id -> (tenant, head)

    def head(self, system: str, turns: Sequence[Turn]) -> str:
        return chain(self.key, system, turns)[-1]

    def find(self, tenant: str, head: str, n_turns: int) -> Match:
        """The session of this tenant's whose history has this head, if any."""
        with self._lock:
            found = self._by_head.get((tenant, head))
        if found is not None:
            return Match(found[0], found[1], f"its {n_turns} earlier turns match")
        why = "no session of yours took these turns" if n_turns else "a conversation's first turn"
        return Match(None, -1, why)

    def place(self, tenant: str, session_id: str, reset_count: int, head: str) -> None:
        """The session (at this generation) now stands at `head`."""
        with self._lock:
            old = self._head_of.pop(session_id, None)
            if old is not None:
                self._by_head.pop(old, None)
            self._by_head[(tenant, head)] = (session_id, reset_count)
            self._head_of[session_id] = (tenant, head)

    def remove(self, session_id: str) -> None:
        """The session no longer stands where it stood (a turn under way or cut short)."""
        with self._lock:
            old = self._head_of.pop(session_id, None)
            if old is not None:
                self._by_head.pop(old, None)
