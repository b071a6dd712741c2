"""A chat turn from a client that resends the whole history (OpenAI's Chat Completions, Ollama's
/api/chat): the session that took those turns continues with the new user message alone; a history
no session of the caller's took starts one, its earlier turns ingested through the policy (a long
history at prefill speed and constant memory; what it evicts goes to recall). Every answer says
which session answered and how it was found (`Continuation`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sinkd.daemon.runtime.access import Access
from sinkd.daemon.runtime.api import (
    ChatRequest,
    Done,
    Handle,
    PolicyRequest,
    Receipt,
    SamplingRequest,
    Stream,
    TokenEvent,
)
from sinkd.daemon.runtime.conversations import ConversationIndex, Turn
from sinkd.daemon.runtime.sessions import Principal, SessionState
from sinkd.daemon.runtime.turns import JobHook, Turns
from sinkd.errors import InvalidInput, NotFound, ResourceExhausted

MAX_TURNS = 4096  # a history longer than this is refused (400), not ingested


@dataclass(frozen=True)
class StatelessChatRequest:
    system: str
    turns: tuple[Turn, ...]  # user and assistant, alternating; the last is the new user message
    max_tokens: int = 256
    stops: tuple[str, ...] = ()
    sampling: SamplingRequest | None = None
    session_id: str | None = None  # the client names its session (it must be the caller's)


@dataclass(frozen=True)
class Continuation:
    """Which session answered, and how it was found: "continued" (only the new turn was
    appended), "new" (the history was ingested), "named" (the client named it)."""

    handle: Handle
    how: str
    why: str
    ingested_turns: int  # earlier turns appended this time (0 when continued)
    n_seen_before: int = 0  # the session's tokens before this request (0 for a new one)


Create = Callable[[Principal, PolicyRequest, SamplingRequest | None, str], Receipt]
Close = Callable[[Principal, Handle], None]
# (session id, reset count, tenant, head): journal where a conversation stands (engine thread)
Persist = Callable[[str, int, str, str], None]


class StatelessChats:
    def __init__(
        self,
        access: Access,
        turns: Turns,
        index: ConversationIndex,
        create: Create,
        close: Close,
        persist: Persist | None = None,
    ) -> None:
        self.access = access
        self.turns = turns
        self.index = index
        self.create = create
        self.close = close
        self.persist = persist
        self._made: set[str] = set()  # the sessions this layer made for stateless clients

    def turn(
        self,
        principal: Principal,
        request: StatelessChatRequest,
        job_hook: JobHook | None = None,
        timeout: float | None = None,
    ) -> tuple[Continuation, Stream]:
        tenant = _check(principal, request)
        earlier, new = list(request.turns[:-1]), request.turns[-1]
        continuation = self._find(principal, tenant, request, earlier)
        chat = ChatRequest(new.content, request.max_tokens, request.stops, request.sampling)
        self.index.remove(continuation.handle.session_id)  # until this turn is whole
        events = self.turns.chat(principal, continuation.handle, chat, job_hook, timeout)
        stream = self._placed(events, tenant, continuation.handle, request)
        return continuation, stream

    def _find(
        self,
        principal: Principal,
        tenant: str,
        request: StatelessChatRequest,
        earlier: list[Turn],
    ) -> Continuation:
        if request.session_id:
            handle = self._live(principal, request.session_id)
            if handle is None:
                raise NotFound(f"no session {request.session_id!r} of yours to continue")
            return Continuation(handle, "named", "the request named it", 0, self._seen(handle))
        match = self.index.find(tenant, self.index.head(request.system, earlier), len(earlier))
        if match.session_id is not None:
            handle = self._live(principal, match.session_id, match.reset_count)
            if handle is not None:
                return Continuation(handle, "continued", match.why, 0, self._seen(handle))
            self.index.remove(match.session_id)
            why = "the session that took these turns is gone (closed, reset or expired)"
        else:
            why = match.why
        receipt, made_room = self._new_session(principal, request.system)
        if made_room:
            why += f"; {made_room}"
        handle = receipt.handle
        if earlier:
            self.turns.history(principal, handle, [(t.role, t.content) for t in earlier])
        return Continuation(handle, "new", why, len(earlier))

    def _new_session(self, principal: Principal, system: str) -> tuple[Receipt, str]:
        """A session for a new conversation. At the session limit, the caller's least recently
        used idle conversation session is closed to make room (a stateless client that comes back
        to it resends its history: it is read again, and says so); never another tenant's, never
        a session made over gRPC."""
        policy, note = PolicyRequest(name="sink"), ""
        try:
            receipt = self.create(principal, policy, None, system)
        except ResourceExhausted:
            victim = self._least_recent(principal)
            if victim is None:
                raise
            self.index.remove(victim.session_id)
            self.close(principal, victim)
            self._made.discard(victim.session_id)
            receipt = self.create(principal, policy, None, system)
            note = f"closed its least recently used conversation {victim.session_id} for room"
        self._made.add(receipt.handle.session_id)
        return receipt, note

    def adopt(self, session_id: str) -> None:
        """A conversation session resumed after a restart is this layer's again."""
        self._made.add(session_id)

    def _least_recent(self, principal: Principal) -> Handle | None:
        assert principal.tenant is not None
        idle = [
            s
            for s in self.access.registry.of_tenant(principal.tenant)
            if s.id in self._made and not self.access.scheduler.queues.busy(s.id)
        ]
        if not idle:
            return None
        oldest = min(idle, key=lambda s: s.last_active)
        return Handle(oldest.id, oldest.generation)

    def _seen(self, handle: Handle) -> int:
        session = self.access.registry.get(handle.session_id)
        return 0 if session is None else session.seq.state.n_seen

    def _live(
        self, principal: Principal, session_id: str, reset_count: int | None = None
    ) -> Handle | None:
        """The caller's session by id at its current generation, if it can take a turn (and is
        still at `reset_count`: a reset session holds none of the history)."""
        assert principal.tenant is not None
        for session in self.access.registry.of_tenant(principal.tenant):
            if reset_count is not None and session.reset_count != reset_count:
                continue
            if session.id == session_id and session.state not in (
                SessionState.STALE,
                SessionState.FAILED,
                SessionState.CLOSED,
            ):
                return Handle(session.id, session.generation)
        return None

    def _placed(
        self, events: Stream, tenant: str, handle: Handle, request: StatelessChatRequest
    ) -> Iterator[TokenEvent | Done]:
        """The turn's events; once it is whole, the session stands at the history plus the reply
        as it produced it (a turn cut short leaves it unplaced: the next request starts anew)."""
        reply: list[str] = []
        for event in events:
            if isinstance(event, TokenEvent):
                reply.append(event.text)
            else:
                turns = [*request.turns, Turn("assistant", "".join(reply))]
                head = self.index.head(request.system, turns)
                reset_count = event.receipt.reset_count
                self.index.place(tenant, handle.session_id, reset_count, head)
                if self.persist is not None:
                    self.persist(handle.session_id, reset_count, tenant, head)
            yield event


def _check(principal: Principal, request: StatelessChatRequest) -> str:
    if principal.tenant is None:
        raise InvalidInput("the admin token owns no sessions; use a tenant's token")
    turns = request.turns
    if not turns:
        raise InvalidInput("messages: at least one user message is needed")
    if len(turns) > MAX_TURNS:
        raise InvalidInput(f"messages: {len(turns)} turns; at most {MAX_TURNS}")
    for i, t in enumerate(turns):
        expected = "user" if i % 2 == 0 else "assistant"
        if t.role != expected:
            raise InvalidInput(
                f"messages[{i}]: expected a {expected} turn after the system messages, got"
                f" {t.role!r} (user and assistant turns alternate, the last is the user's)"
            )
    if not turns[-1].content.strip():
        raise InvalidInput("messages: the last user message is empty")
    return principal.tenant
