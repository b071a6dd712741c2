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

from sinkd.daemon.runtime.api import Turn

ROLES = ("system", "user", "assistant")


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
    rewind_to: int | None = None  # the session took one more turn since: back to this token


@dataclass(frozen=True)
class Place:
    """Where one conversation session stands: `head` after its last whole turn (None while a
    turn is under way, or once one was cut short), `before` the history that turn started from
    and the session's token count then (a regenerate goes back there)."""

    tenant: str
    reset_count: int
    head: str | None
    before: str | None = None
    n_before: int = 0


@dataclass(frozen=True)
class Took:
    """Every turn a conversation session took, as keyed digests in order (for clients that trim:
    the turns they still send are the newest of these), and its system prompt's."""

    tenant: str
    reset_count: int
    system: bytes
    turns: tuple[bytes, ...]


@dataclass(frozen=True)
class Trimmed:
    """A session whose newest turns are a trimmed history's: how many matched, how many the
    client dropped, and the dropped turns' digests (the session still holds them)."""

    session_id: str
    reset_count: int
    matched: int
    dropped: tuple[bytes, ...]


class ConversationIndex:
    """Per tenant: the chain head each conversation session (at one generation) stands at, and
    the one it stood at before its last turn."""

    def __init__(self, key: bytes) -> None:
        self.key = key  # a durable daemon's is kept in its state directory: heads outlive restarts
        self._lock = threading.Lock()
        self._places: dict[str, Place] = {}  # session id -> where it stands
        self._by_head: dict[tuple[str, str], str] = {}
        self._by_before: dict[tuple[str, str], str] = {}
        # in memory only: after a restart a trimmed history starts anew (a whole one continues)
        self._took: dict[str, Took] = {}
        self._by_last: dict[tuple[str, bytes], set[str]] = {}  # (tenant, last turn) -> sessions

    def digest(self, turn: Turn) -> bytes:
        """One turn alone, keyed (content without its outer whitespace, as `link`)."""
        body = f"{turn.role}\x00{turn.content.strip()}".encode()
        return hmac.new(self.key, body, hashlib.sha256).digest()[:16]

    def took(self, session_id: str, took: Took) -> None:
        """The session has now taken these turns (the history as it stands after a whole turn)."""
        with self._lock:
            self._forget_took(session_id)
            self._took[session_id] = took
            if took.turns:
                self._by_last.setdefault((took.tenant, took.turns[-1]), set()).add(session_id)

    def taken(self, session_id: str) -> Took | None:
        with self._lock:
            return self._took.get(session_id)

    def find_trimmed(self, tenant: str, system: str, earlier: Sequence[Turn]) -> list[Trimmed]:
        """Sessions whose newest turns are exactly `earlier` (at least a user turn and its reply)
        while the client dropped older ones: a client that trims its history to fit (LibreChat,
        Continue, LangChain's `trim_messages`). Its system prompt is the session's, or dropped
        (empty). Every turn it sends must match; any edit is no match."""
        if len(earlier) < 2:
            return []
        sent = tuple(self.digest(t) for t in earlier)
        system_digest = self.digest(Turn("system", system))
        no_system = self.digest(Turn("system", ""))
        found = []
        with self._lock:
            for sid in sorted(self._by_last.get((tenant, sent[-1]), ())):
                took = self._took[sid]
                n = len(took.turns)
                if n < len(sent) or took.turns[n - len(sent) :] != sent:
                    continue  # an edit, or turns the session never took
                if system and took.system != system_digest:
                    continue  # another system prompt: another conversation
                if n == len(sent) and (system or took.system == no_system):
                    continue  # nothing dropped: a whole history matches by its head
                dropped = took.turns[: n - len(sent)]
                found.append(Trimmed(sid, took.reset_count, len(sent), dropped))
        return found

    def _forget_took(self, session_id: str) -> None:
        old = self._took.pop(session_id, None)
        if old is not None and old.turns:
            holders = self._by_last.get((old.tenant, old.turns[-1]), set())
            holders.discard(session_id)
            if not holders:
                self._by_last.pop((old.tenant, old.turns[-1]), None)

    def head(self, system: str, turns: Sequence[Turn]) -> str:
        return chain(self.key, system, turns)[-1]

    def retake_key(self, system: str, earlier: Sequence[Turn], new: Turn) -> str:
        """What a turn taken again must match: the history before it (its last message may be
        edited). A first turn is never taken again (`find`); its key holds the message too, so no
        two first turns share one."""
        return self.head(system, [*earlier] if earlier else [new])

    def find(self, tenant: str, head: str, n_turns: int, retake: str) -> Match:
        """The session of this tenant's whose history has this head, if any; else one whose last
        turn this one takes again (`retake_key`: a regenerated reply or an edited message). A
        conversation's first turn matches none: the same first message may open many
        conversations (a chat UI's title request repeats a chat's first message), and content
        alone never takes another conversation's turn back; a regenerated first reply reads its
        one message again, in a session of its own."""
        if n_turns == 0:
            return Match(None, -1, "a conversation's first turn: a conversation of its own")
        with self._lock:
            sid = self._by_head.get((tenant, head))
            if sid is not None:
                at = self._places[sid]
                return Match(sid, at.reset_count, f"its {n_turns} earlier turns match")
            sid = self._by_before.get((tenant, retake))
            if sid is not None:
                at = self._places[sid]
                why = f"its {n_turns} earlier turns match and its last turn is taken again"
                return Match(sid, at.reset_count, why, rewind_to=at.n_before)
        return Match(None, -1, "no session of yours took these turns")

    def find_behind(self, tenant: str, heads: Sequence[str]) -> tuple[str, int, int] | None:
        """The tenant's session that stands at the longest of these prefix heads, as (session
        id, its reset count, turns it took), or None: a conversation that went on elsewhere (on
        another node while this one was down) and comes back to the session that began it."""
        with self._lock:
            for turns in range(len(heads) - 1, 0, -1):
                sid = self._by_head.get((tenant, heads[turns]))
                if sid is not None:
                    return sid, self._places[sid].reset_count, turns
        return None

    def place(self, session_id: str, place: Place) -> None:
        """The session (at this generation) now stands at `place`."""
        with self._lock:
            self._drop(session_id)
            self._places[session_id] = place
            if place.head is not None:
                self._by_head[(place.tenant, place.head)] = session_id
            if place.before is not None:
                self._by_before[(place.tenant, place.before)] = session_id

    def remove(self, session_id: str) -> None:
        """The session no longer stands anywhere (closed, reset, its history rewritten)."""
        with self._lock:
            self._drop(session_id)
            self._forget_took(session_id)

    def _drop(self, session_id: str) -> None:
        old = self._places.pop(session_id, None)
        if old is None:
            return
        for by, key in ((self._by_head, old.head), (self._by_before, old.before)):
            if key is not None and by.get((old.tenant, key)) == session_id:
                del by[(old.tenant, key)]
