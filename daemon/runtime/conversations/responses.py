"""Stateful responses (OpenAI's Responses API): each stored conversation is one sinkd session, and
a response names the point it reached. `previous_response_id` continues the session from its latest
response (only the new input goes in), or takes its latest turn back when it names the one before
(a regenerate); a conversation id is a session id. With `store` off nothing is kept: a new
conversation's session is closed once it has answered.

What is stored of a response (its text, counts and place) lives beside its session and goes with
it: a reset or close deletes it, so does DELETE. Text is the owner's alone."""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sinkd.daemon.runtime import requests
from sinkd.daemon.runtime.access import Access
from sinkd.daemon.runtime.api import (
    CancelToken,
    ChatRequest,
    ChatStream,
    Done,
    Erased,
    GenerationOptions,
    Handle,
    Receipt,
    TokenEvent,
    ToolCall,
    ToolUse,
    Turn,
    calls_of,
)
from sinkd.daemon.runtime.conversations import tool_plan
from sinkd.daemon.runtime.conversations.chats import Admit, Continuation, Deadline
from sinkd.daemon.runtime.sessions import Principal, Session, SessionState, made_elsewhere
from sinkd.daemon.runtime.turns import Turns
from sinkd.errors import FailedPrecondition, InvalidInput, NotFound, TenantLimit

MAX_ITEMS = 4096


@dataclass(frozen=True)
class ResponseRequest:
    instructions: str | None
    items: tuple[Turn, ...]  # the input, in order; the last is the user's
    previous_id: str | None = None
    conversation: str | None = None  # a session id of the caller's
    store: bool = True
    options: GenerationOptions = field(default_factory=GenerationOptions)
    tools: ToolUse | None = None


@dataclass(frozen=True)
class StoredResponse:
    """One response as it is kept: where its session stood once it was whole, and its text."""

    id: str
    tenant: str
    session_id: str
    reset_count: int
    previous_id: str | None
    n_end: int  # the session's token count after this response
    created: int
    text: str
    input_tokens: int
    output_tokens: int
    reason: str  # Done's: max_tokens, stop, eog, cache_full
    instructions: str
    stored: bool = True
    calls: tuple[ToolCall, ...] = ()  # the tool calls it made

    @classmethod
    def of(
        cls, response_id: str, c: Continuation, text: str, done: Done, request: ResponseRequest
    ) -> StoredResponse:
        """The response a turn made, once it is whole."""
        r = done.receipt
        return cls(
            response_id, r.tenant, c.handle.session_id, r.reset_count,
            request.previous_id if c.how != "new" else None, r.n_seen, int(time.time()), text,
            max(r.n_seen - done.generated - c.n_seen_before, 0), done.generated, done.reason,
            request.instructions or "", request.store, calls_of(done),
        )  # fmt: skip

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> StoredResponse:
        """A journalled response (one from before tools has no calls)."""
        calls = tuple(ToolCall(**c) for c in record.pop("calls", ()))
        return cls(**record, calls=calls)


# a new conversation's session under these instructions, and a note if room was made for it
Open = Callable[[Principal, str], tuple[Receipt, str]]
Close = Callable[[Principal, Handle], None]
Rewind = Callable[[Principal, Handle, int], None]
Keep = Callable[[StoredResponse], None]  # journal a response
# journal a response's deletion (raises if it cannot); whether its purge is still owed
Drop = Callable[[str], bool]


def new_response_id(node: str | None = None) -> str:
    """`resp_` and 32 hex digits (`resp_<node>-...` on a node of a deployment, as session ids)."""
    return f"resp_{node}-{secrets.token_hex(16)}" if node else f"resp_{secrets.token_hex(16)}"


class Responses:
    def __init__(
        self,
        access: Access,
        turns: Turns,
        open_session: Open,
        close: Close,
        rewind: Rewind,
        keep: Keep | None = None,
        drop: Drop | None = None,
        pin_bound: int = 0,
    ) -> None:
        self.pin_bound = pin_bound  # what a session pins: a system prompt with its tools
        self.access = access
        self.turns = turns
        self.open_session = open_session
        self.close = close
        self.rewind = rewind
        self.journal_keep, self.journal_drop = keep, drop
        self._lock = threading.Lock()
        self._by_id: dict[str, StoredResponse] = {}
        self._latest: dict[str, str] = {}  # session id -> its latest stored response
        self._held: Counter[str] = Counter()  # stored responses per tenant
        # how many responses a tenant may keep stored (the service's tenancy sets it)
        self.max_stored: Callable[[str], int | None] = lambda tenant: None

    def adopt(self, stored: StoredResponse) -> None:
        """A response journalled before a restart (in the order they were made)."""
        self._put(stored)

    def held(self) -> Counter[str]:
        """Stored responses per tenant."""
        with self._lock:
            return self._held.copy()

    def _room(self, principal: Principal) -> None:
        """TenantLimit if the caller keeps as many responses stored as it may."""
        tenant = principal.tenant or ""
        most = self.max_stored(tenant)
        with self._lock:
            held = self._held[tenant]
        if most is not None and held >= most:
            raise TenantLimit(
                f"tenant {tenant} stores {held} of its {most} responses (max_stored_responses);"
                " delete some, or send store=false"
            )

    # --- reads ---

    def get(self, principal: Principal, response_id: str) -> StoredResponse:
        """The caller's stored response, while its conversation lasts (NotFound otherwise, and
        for another tenant's: a response id says nothing of others)."""
        with self._lock:
            stored = self._by_id.get(response_id)
        if stored is None:
            elsewhere = made_elsewhere(self.access.registry.node, response_id)
            raise elsewhere or NotFound(f"no response {response_id!r} of yours")
        if stored.tenant != principal.tenant:
            raise NotFound(f"no response {response_id!r} of yours")
        if self._session(principal, stored) is None:
            self._drop(stored.id)
            raise NotFound(f"response {response_id!r}: its conversation was reset or closed")
        return stored

    def delete(self, principal: Principal, response_id: str) -> Erased:
        """Delete a stored response (its conversation stays; it can no longer be continued from
        this response); its text leaves the files before the reply, or the reply says the
        purge is owed."""
        stored = self.get(principal, response_id)
        owed = self.journal_drop(stored.id) if self.journal_drop is not None else False
        self._drop(stored.id)
        return Erased(1, owed)

    # --- a new response ---

    def respond(
        self,
        principal: Principal,
        request: ResponseRequest,
        response_id: str,
        cancel: CancelToken | None = None,
        admit: Admit | None = None,
    ) -> tuple[Continuation, ChatStream]:
        """Which session answers and how, and its events; once whole the response is stored
        under `response_id` (with `store`), and an unstored new conversation's session is
        closed."""
        request = self._named_calls(principal, request)
        instructions = request.instructions
        if request.tools is not None:  # the tools' descriptions go after the conversation's own
            instructions = self._instructions(principal, request)
        p = tool_plan.plan(
            instructions or "", request.items, request.options, request.tools,
            self.access.engine, self.pin_bound,
        )  # fmt: skip
        system = p.system if p.active else instructions
        # each response keeps its conversation's instructions, as the next turn's tools need them
        request = replace(request, instructions=instructions, items=p.turns, options=p.options)
        _check(principal, request)
        if request.store:
            self._room(principal)
        requests.output_grammar(request.options.output)  # a schema refused before any session
        deadline = Deadline(self.turns.call_timeout_s)
        c = self._session_for(principal, request, system)
        c = replace(c, tools=p.report)
        handle = c.handle
        if admit is not None:
            admit(handle.session_id)
        items = list(request.items)
        chat = ChatRequest(items[-1].content, request.options)
        try:
            if len(items) > 1:  # earlier input items go in as framed turns, the last is asked
                self.turns.history(principal, handle, items[:-1], cancel, deadline.left())
                c = replace(c, ingested_turns=len(items) - 1)
            raw = self.turns.chat(principal, handle, chat, cancel, deadline.left())
        except BaseException:
            self._end_unstored(principal, request, c)
            raise
        events = p.reading(raw)

        def kept() -> ChatStream:
            text: list[str] = []
            try:
                for event in events:
                    if isinstance(event, TokenEvent):
                        text.append(event.text)
                    elif isinstance(event, Done) and request.store:
                        self._keep(StoredResponse.of(response_id, c, "".join(text), event, request))
                    yield event
            finally:
                self._end_unstored(principal, request, c)

        return c, kept()

    def _instructions(self, principal: Principal, request: ResponseRequest) -> str:
        """The conversation's instructions: those given, else its latest response's (the tools'
        descriptions go after them, the same on every turn)."""
        if request.instructions is not None or request.previous_id is None:
            return request.instructions or ""
        return self.get(principal, request.previous_id).instructions

    def _named_calls(self, principal: Principal, request: ResponseRequest) -> ResponseRequest:
        """Each `function_call_output` named by the call it answers: one in this input, or one
        the previous response made."""
        known = {c.id: c.name for t in request.items for c in t.calls}
        if request.previous_id is not None and any(t.role == "tool" for t in request.items):
            known |= {c.id: c.name for c in self.get(principal, request.previous_id).calls}
        items = []
        for i, t in enumerate(request.items):
            if t.role == "tool" and not t.name:
                if t.call_id not in known:
                    raise InvalidInput(f"input[{i}].call_id: answers no call of this conversation")
                t = replace(t, name=known[t.call_id])
            items.append(t)
        return replace(request, items=tuple(items))

    def _session_for(
        self, principal: Principal, request: ResponseRequest, system: str | None
    ) -> Continuation:
        """The session that answers: the previous response's (continued, or rewound to it), the
        named conversation's, or a new one."""
        if request.previous_id is not None:
            prev = self.get(principal, request.previous_id)
            session = self._session(principal, prev)
            assert session is not None  # `get` checked
            _same_instructions(session, system)
            handle = Handle(session.id, session.generation)
            with self._lock:
                latest = self._by_id.get(self._latest.get(session.id, ""))
            if latest is not None and latest.id == prev.id:
                why = f"continues its latest response {prev.id}"
                return Continuation(
                    handle, "continued", why, 0, _seen(session), session.prefix_tokens
                )
            if latest is not None and latest.previous_id == prev.id:
                self.rewind(principal, handle, prev.n_end)  # its latest turn goes back out
                why = f"takes back {latest.id}, which followed {prev.id}"
                return Continuation(
                    handle, "regenerated", why, 0, prev.n_end, session.prefix_tokens
                )
            raise FailedPrecondition(
                f"response {prev.id} is not its conversation's latest (nor the one before it):"
                " sinkd continues a conversation from there only"
            )
        if request.conversation is not None:
            session = self._named(principal, request.conversation)
            _same_instructions(session, system)
            handle = Handle(session.id, session.generation)
            why = "the request named its conversation"
            return Continuation(handle, "named", why, 0, _seen(session), session.prefix_tokens)
        receipt, made_room = self.open_session(principal, system or "")
        why = "a new conversation" if request.store else "a new conversation, not stored"
        why += f"; {made_room}" if made_room else ""
        return Continuation(receipt.handle, "new", why, 0, receipt.n_seen)

    def _keep(self, stored: StoredResponse) -> None:
        if self.journal_keep is not None:
            self.journal_keep(stored)
        self._put(stored)

    def _put(self, stored: StoredResponse) -> None:
        with self._lock:
            if stored.id not in self._by_id:
                self._held[stored.tenant] += 1
            self._by_id[stored.id] = stored
            self._latest[stored.session_id] = stored.id

    def released(self, session_id: str, reset_count: int) -> None:
        """A session generation ended (closed, or reset): its responses went with its rows."""
        with self._lock:
            gone = [
                r.id
                for r in self._by_id.values()
                if r.session_id == session_id and r.reset_count == reset_count
            ]
        for response_id in gone:
            self._drop(response_id)

    def _drop(self, response_id: str) -> None:
        with self._lock:
            stored = self._by_id.pop(response_id, None)
            if stored is not None:
                self._held[stored.tenant] -= 1
                if not self._held[stored.tenant]:
                    del self._held[stored.tenant]
            if stored is not None and self._latest.get(stored.session_id) == response_id:
                del self._latest[stored.session_id]

    def _end_unstored(
        self, principal: Principal, request: ResponseRequest, c: Continuation
    ) -> None:
        """An unstored new conversation leaves nothing behind."""
        if not request.store and c.how == "new":
            with contextlib.suppress(NotFound):  # closed meanwhile
                self.close(principal, c.handle)

    def _session(self, principal: Principal, stored: StoredResponse) -> Session | None:
        session = self.access.registry.get(stored.session_id)
        if (
            session is None
            or session.tenant != principal.tenant
            or session.reset_count != stored.reset_count
            or session.state in (SessionState.STALE, SessionState.FAILED, SessionState.CLOSED)
        ):
            return None
        return session

    def _named(self, principal: Principal, session_id: str) -> Session:
        session = self.access.registry.get(session_id)
        if session is None:
            raise self.access.registry.missing(principal.tenant, session_id)
        if session.tenant != principal.tenant:
            raise NotFound(f"no conversation {session_id!r} of yours")
        if session.state in (SessionState.STALE, SessionState.FAILED, SessionState.CLOSED):
            state = session.state.value
            raise FailedPrecondition(f"conversation {session_id} cannot take a turn ({state})")
        return session


def _seen(session: Session) -> int:
    return session.seq.state.n_seen


def _same_instructions(session: Session, instructions: str | None) -> None:
    """A conversation's instructions are its system prompt, fixed (and held as sinks) at its
    start: the same again is fine, others are refused rather than silently ignored."""
    if instructions is None:
        return
    if hashlib.sha256(instructions.encode()).hexdigest() != session.system_prompt_sha256:
        raise InvalidInput(
            "instructions: differ from the conversation's (with its tools' descriptions), which"
            " are its system prompt, fixed at its start; omit them, send the same (and the same"
            " tools), or start a new conversation",
            field="instructions",
        )


def _check(principal: Principal, request: ResponseRequest) -> None:
    if principal.tenant is None:
        raise InvalidInput("the admin token owns no sessions; use a tenant's token")
    if request.previous_id is not None and request.conversation is not None:
        raise InvalidInput("previous_response_id and conversation: give one, not both")
    items = request.items
    if not items:
        raise InvalidInput("input: at least one user message is needed")
    if len(items) > MAX_ITEMS:
        raise InvalidInput(f"input: {len(items)} items; at most {MAX_ITEMS}")
    if items[-1].role != "user" or not items[-1].content.strip():
        raise InvalidInput("input: the last item must be a non-empty user message")
    for i, t in enumerate(items):
        if t.role not in ("user", "assistant"):
            raise InvalidInput(f"input[{i}]: role {t.role!r}; user and assistant messages only")
