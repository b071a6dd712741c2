"""A chat turn from a client that resends the whole history (OpenAI's Chat Completions, Ollama's
/api/chat): the session that took those turns continues with the new user message alone; a history
no session of the caller's took starts one, its earlier turns ingested through the policy (a long
history at prefill speed and constant memory; what it evicts goes to recall). Every answer says
which session answered and how it was found (`Continuation`)."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sinkd.cachepolicy import CannotRewind
from sinkd.daemon.runtime import requests
from sinkd.daemon.runtime.access import Access
from sinkd.daemon.runtime.api import (
    CancelToken,
    ChatRequest,
    ChatStream,
    Done,
    GenerationOptions,
    Handle,
    PolicyRequest,
    Receipt,
    SamplingRequest,
    Stream,
    TokenEvent,
    ToolUse,
    Turn,
)
from sinkd.daemon.runtime.conversations import tool_format, tool_plan, ui_tasks
from sinkd.daemon.runtime.conversations.chains import ConversationIndex, Place, Took, chain
from sinkd.daemon.runtime.conversations.tool_plan import ToolsReport
from sinkd.daemon.runtime.sessions import Principal, SessionState
from sinkd.daemon.runtime.turns import Turns
from sinkd.errors import (
    InvalidInput,
    NotFound,
    SessionLimit,
    ShuttingDown,
    StaleGeneration,
    message_of,
)

MAX_TURNS = 4096
ROOM_TRIES = 4  # a new conversation at the session limit: how often room is sought  # a history longer than this is refused (400), not ingested


@dataclass(frozen=True)
class StatelessChatRequest:
    system: str
    turns: tuple[Turn, ...]  # user and assistant, alternating; the last is the new user message
    options: GenerationOptions = field(default_factory=GenerationOptions)
    session_id: str | None = None  # the client names its session (it must be the caller's)
    # how long the session may stay idle after this turn (None: the daemon's; 0: closed once it
    # has answered)
    keep_alive_s: float | None = None
    tools: ToolUse | None = None  # the functions the reply may call
    # keep the conversation out of its tenant's memory across conversations (a header)
    private: bool = False


@dataclass(frozen=True)
class Continuation:
    """Which session answered, and how it was found: "continued" (only the new turn was
    appended), "regenerated" (the session's last turn was taken back out of the cache and this
    one appended instead: a regenerated reply or an edited last message), "caught-up" (the
    session took the history's first turns and none since: the turns it missed were appended, then
    the new one), "new" (the history was ingested), "named" (the client named it)."""

    handle: Handle
    how: str
    why: str
    ingested_turns: int  # earlier turns appended this time (0 when continued)
    n_seen_before: int = 0  # the session's tokens before this request (0 for a new one)
    # ... and of them, those restored from stored prefixes (the receipt's `prefix_tokens`)
    prefix_before: int = 0
    tools: ToolsReport | None = None  # the turn's tools, pinned or left out (None: none sent)
    output: str = ""  # a form the client did not ask by a field, and why (a UI's task prompt)


# the edge admits the session a call turned out to touch, before anything is done to it (the
# per-session call limit: ResourceExhausted refuses the call)
Admit = Callable[[str], None]


class Deadline:
    """One deadline for every engine wait of a call: a new session's history ingest, then the
    turn."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return max(self.at - time.monotonic(), 1e-3)  # never 0: that would mean "the default"


Create = Callable[[Principal, PolicyRequest, SamplingRequest | None, str], Receipt]
Close = Callable[[Principal, Handle], None]
Rewind = Callable[[Principal, Handle, int], None]  # back to a token count (CannotRewind, ...)
# journal where a conversation session stands (on the engine thread)
Persist = Callable[[str, Place], None]


class StatelessChats:
    def __init__(
        self,
        access: Access,
        turns: Turns,
        index: ConversationIndex,
        create: Create,
        close: Close,
        rewind: Rewind,
        persist: Persist | None = None,
        policy: PolicyRequest | None = None,
        pin_bound: int = 0,
        ui_task_grammar: bool = True,
    ) -> None:
        self.access = access
        self.turns = turns
        self.index = index
        self.ui_task_grammar = ui_task_grammar  # a UI's task prompt decoded as it asks (ui_tasks)
        self.create = create
        self.close = close
        self.rewind = rewind
        self.persist = persist
        self.policy = policy or PolicyRequest(name="sink")  # of every session this layer makes
        # a system prompt (with its tools' descriptions) of at most this many tokens is pinned
        self.pin_bound = pin_bound
        self._made: set[str] = set()  # the sessions this layer made for stateless clients
        # made for a call whose first turn is not whole yet, until when: never room for another
        # (idle between its creation and its first job, it is not idle to its caller)
        self._starting: dict[str, float] = {}
        self._starting_lock = threading.Lock()

    def turn(
        self,
        principal: Principal,
        request: StatelessChatRequest,
        cancel: CancelToken | None = None,
        timeout: float | None = None,
        admit: Admit | None = None,
    ) -> tuple[Continuation, ChatStream]:
        """`cancel` and the call's deadline (`timeout`, else the daemon's) bound the history's
        ingest and the turn alike; `admit` is given the session before anything is done to it."""
        request, plan = self._with_tools(request)  # refused (400) before any session
        # what a chat UI sends beside the chat (its task prompts quote the chat, the model's
        # words too) never joins the tenant's memory across conversations, nor reads it
        private = request.private or ui_tasks.recognized(request.turns) is not None
        request, form = self._ui_task(request)
        tenant = _check(principal, request)
        requests.output_grammar(request.options.output)  # a schema refused before any session
        earlier, new = list(request.turns[:-1]), request.turns[-1]
        call = _Call(Deadline(timeout or self.turns.call_timeout_s), cancel, admit or _admitted)
        continuation, seen = self._find(principal, tenant, request, earlier, call)
        continuation = dataclasses.replace(continuation, tools=plan.report, output=form)
        handle = continuation.handle
        session = self.access.registry.get(handle.session_id)
        before = Place(
            tenant,
            -1 if session is None else session.reset_count,
            None,  # until this turn is whole; it can be taken again meanwhile
            self.index.retake_key(request.system, earlier, new),
            seen,
        )
        self.index.place(handle.session_id, before)
        replies = [t.content for t in earlier if t.role == "assistant"]
        chat = ChatRequest(
            new.content,
            request.options,
            private=private,
            reply_before=replies[-1] if replies and earlier[-1].role == "assistant" else "",
        )
        try:
            events = self.turns.chat(principal, handle, chat, cancel, call.deadline.left())
        except BaseException:
            self._started(handle.session_id)
            raise
        return continuation, plan.reading(self._placed(events, before, handle, request))

    def _ui_task(self, request: StatelessChatRequest) -> tuple[StatelessChatRequest, str]:
        """A chat UI's side task that asks for a JSON object and sends no format: decoded under
        that object's grammar, and said (ui_tasks.py); anything else as it came."""
        if not self.ui_task_grammar or request.options.output is not None or request.tools:
            return request, ""
        task = ui_tasks.recognized(request.turns)
        if task is None:
            return request, ""
        options = dataclasses.replace(request.options, output=task.output)
        return dataclasses.replace(request, options=options), task.note

    def _with_tools(
        self, request: StatelessChatRequest
    ) -> tuple[StatelessChatRequest, tool_plan.ToolPlan]:
        """The request as the session takes it (`tool_plan.plan`): refused (400) here, before
        any session, when its tools cannot be offered as asked."""
        p = tool_plan.plan(
            request.system, request.turns, request.options, request.tools,
            self.access.engine, self.pin_bound,
        )  # fmt: skip
        tools = request.tools if p.active else None
        changed = dataclasses.replace(
            request, system=p.system, turns=p.turns, options=p.options, tools=tools
        )
        return changed, p

    def _find(
        self,
        principal: Principal,
        tenant: str,
        request: StatelessChatRequest,
        earlier: list[Turn],
        call: _Call,
    ) -> tuple[Continuation, int]:
        """The session to answer, how it was found, and its tokens before the new turn."""
        if request.session_id:
            handle = self._live(principal, request.session_id)
            if handle is None and self.access.registry.get(request.session_id) is None:
                raise self.access.registry.missing(tenant, request.session_id)  # or elsewhere
            if handle is None:
                raise NotFound(f"no session {request.session_id!r} of yours to continue")
            call.admit(handle.session_id)
            seen, cached = self._seen(handle)
            return Continuation(handle, "named", "the request named it", 0, seen, cached), seen
        heads = chain(self.index.key, request.system, earlier)
        retake = self.index.retake_key(request.system, earlier, request.turns[-1])
        match = self.index.find(tenant, heads[-1], len(earlier), retake)
        if match.session_id is not None:
            handle = self._live(principal, match.session_id, match.reset_count)
            if handle is not None:
                call.admit(handle.session_id)
            if handle is not None and match.rewind_to is None:
                seen, cached = self._seen(handle)
                return Continuation(handle, "continued", match.why, 0, seen, cached), seen
            if handle is not None and match.rewind_to is not None:
                try:  # its last turn goes back out of the cache: nothing is read again
                    self.rewind(principal, handle, match.rewind_to)
                    back = match.rewind_to
                    _, cached = self._seen(handle)
                    how = Continuation(handle, "regenerated", match.why, 0, back, cached)
                    return how, back
                except CannotRewind as e:
                    why = f"its last turn cannot be taken back ({message_of(e)})"
            else:
                why = "the session that took these turns is gone (closed, reset or expired)"
            self.index.remove(match.session_id)
        else:
            why = match.why
            trimmed = self._trimmed(principal, tenant, request, earlier, call)
            if trimmed is not None:
                return trimmed
            behind = self._catch_up(principal, tenant, heads, earlier, call)
            if behind is not None:
                return behind
        receipt, made_room = self.new_session(principal, request.system)
        if made_room:
            why += f"; {made_room}"
        handle = receipt.handle
        call.admit(handle.session_id)
        seen = receipt.n_seen
        if earlier:
            seen = call.history(self.turns, principal, handle, earlier)
        return Continuation(handle, "new", why, len(earlier)), seen

    def _trimmed(
        self,
        principal: Principal,
        tenant: str,
        request: StatelessChatRequest,
        earlier: list[Turn],
        call: _Call,
    ) -> tuple[Continuation, int] | None:
        """A session whose newest turns are this history's, the client having dropped the oldest
        to fit its context (its system prompt kept or dropped): it continues, nothing read again."""
        for found in self.index.find_trimmed(tenant, request.system, earlier):
            handle = self._live(principal, found.session_id, found.reset_count)
            if handle is None:
                continue
            call.admit(handle.session_id)
            seen, cached = self._seen(handle)
            why = (
                f"its newest {found.matched} turns match; the client dropped the"
                f" {len(found.dropped)} oldest"
            )
            return Continuation(handle, "continued", why, 0, seen, cached), seen
        return None

    def _catch_up(
        self,
        principal: Principal,
        tenant: str,
        heads: list[str],
        earlier: list[Turn],
        call: _Call,
    ) -> tuple[Continuation, int] | None:
        """A session that took the first turns of this history and none since (the conversation
        went on on another node meanwhile) takes the turns it missed, then the new one."""
        found = self.index.find_behind(tenant, heads[:-1])
        if found is None:
            return None
        session_id, reset_count, took = found
        handle = self._live(principal, session_id, reset_count)
        if handle is None:
            return None
        call.admit(handle.session_id)
        seen, cached = self._seen(handle)
        missed = earlier[took:]
        now = call.history(self.turns, principal, handle, missed)
        why = (
            f"its first {took} turns match; the {len(missed)} turns since (taken elsewhere) were"
            " read"
        )
        return Continuation(handle, "caught-up", why, len(missed), seen, cached), now

    def new_session(
        self, principal: Principal, system: str, stateless: bool = True
    ) -> tuple[Receipt, str]:
        """A session for a new conversation. Past the resident sessions an idle one is parked
        for it (the runtime's residency); at the limit of open sessions (resident and parked),
        one of the caller's idle stateless conversation sessions is closed to make room: one
        answered once and never
        continued first, least recently used first in each (a client that comes back to it
        resends its history: it is read again, and says so); never another tenant's, never
        a session made over gRPC or holding stored responses (not `stateless`). Calls starting
        conversations at once may pick the same one: closed already is room made, and the room
        another call took is sought again, a few times, before the caller hears 429."""
        policy, closed = self.policy, []
        if system and policy.name == "sink":  # instructions stay: pinned with the sinks
            n_system = len(requests.system_tokens(self.access.engine, system))
            if n_system <= self.pin_bound:
                policy = dataclasses.replace(policy, pin_system_prompt=True)
                # the window `http_window` names is an upper bound: where the pinned prompt
                # leaves less, the window fills what it leaves rather than fail the request
                cells = self.access.engine.n_ctx_seq
                if policy.window is not None and n_system + policy.window > cells:
                    policy = dataclasses.replace(policy, window=None, fill_window=True)
        for attempt in range(ROOM_TRIES):
            try:
                receipt = self.create(principal, policy, None, system)
                break
            except SessionLimit:
                victim = self._least_recent(principal)
                if victim is None or attempt == ROOM_TRIES - 1:
                    raise
                with contextlib.suppress(NotFound, StaleGeneration):  # another call closed it
                    self.close(principal, victim)  # which forgets it here (`forget`)
                closed.append(victim.session_id)
        note = (
            f"closed its least recently used conversation {', '.join(closed)} for room"
            if closed
            else ""
        )
        if stateless:
            with self._starting_lock:
                self._starting[receipt.handle.session_id] = (
                    time.monotonic() + self.turns.call_timeout_s
                )
            self._made.add(receipt.handle.session_id)
        return receipt, note

    def _started(self, session_id: str) -> None:
        """The call that made the session is over: it may give way like any other now."""
        with self._starting_lock:
            self._starting.pop(session_id, None)

    def _is_starting(self, session_id: str) -> bool:
        with self._starting_lock:
            until = self._starting.get(session_id)
            if until is not None and until < time.monotonic():  # its call ended long ago
                del self._starting[session_id]
                until = None
            return until is not None

    def forget(self, session_id: str) -> None:
        """Engine thread, as a session closes (any way: a client, expiry, room, a move): nothing
        of it stays in this layer."""
        self.index.remove(session_id)
        self._made.discard(session_id)
        with self._starting_lock:
            self._starting.pop(session_id, None)

    def adopt(self, session_id: str) -> None:
        """A conversation session resumed after a restart is this layer's again."""
        self._made.add(session_id)

    def _least_recent(self, principal: Principal) -> Handle | None:
        """Chosen on the engine thread, which alone knows which sessions have work queued."""
        tenant = principal.tenant
        assert tenant is not None
        queues = self.access.scheduler.queues

        def pick(engine: object) -> Handle | None:
            idle = [
                s
                for s in self.access.registry.of_tenant(tenant)
                if s.id in self._made and not queues.busy(s.id) and not self._is_starting(s.id)
            ]
            if not idle:
                return None
            # segmented LRU: a conversation answered once and never continued (a chat UI's
            # title, tags or follow-up request; a one-shot call) is on probation and gives way
            # before any that was continued; least recently used first within each
            oldest = min(idle, key=lambda s: (s.turns_taken > 1, s.last_active))
            return Handle(oldest.id, oldest.generation)

        return self.access.scheduler.call(pick)

    def _seen(self, handle: Handle) -> tuple[int, int]:
        """The session's tokens now, and how many of them came from stored prefixes, read on the
        engine thread (a turn of its may be running)."""
        session = self.access.registry.get(handle.session_id)
        if session is None:
            return 0, 0
        return self.access.scheduler.call(
            lambda e: (session.seq.state.n_seen, session.prefix_tokens)
        )

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
        self, events: Stream, before: Place, handle: Handle, request: StatelessChatRequest
    ) -> Iterator[TokenEvent | Done]:
        """The turn's events; once it is whole, the session stands at the history plus the reply
        as it produced it (a turn cut short stands nowhere: only taking it again continues)."""
        reply: list[str] = []
        try:
            for event in events:
                if isinstance(event, TokenEvent):
                    reply.append(event.text)
                else:
                    said = "".join(reply)
                    if request.tools is not None:  # as the client will send it back
                        said = tool_format.canonical(said)
                    turns = [*request.turns, Turn("assistant", said)]
                    head = self.index.head(request.system, turns)
                    place = dataclasses.replace(
                        before, reset_count=event.receipt.reset_count, head=head
                    )
                    self.index.place(handle.session_id, place)
                    self._took(handle.session_id, place, request, turns)
                    if self.persist is not None:
                        self.persist(handle.session_id, place)
                    self._keep_alive(handle, request.keep_alive_s)
                yield event
        finally:
            self._started(handle.session_id)

    def _took(
        self, session_id: str, place: Place, request: StatelessChatRequest, turns: list[Turn]
    ) -> None:
        """Every turn the session holds now: those a trimming client dropped (still the session's)
        and the history with this reply."""
        index = self.index
        sent = tuple(index.digest(t) for t in request.turns[:-1])
        base: tuple[bytes, ...] = ()
        prev = index.taken(session_id)
        if prev is not None and prev.reset_count == place.reset_count:
            cut = len(prev.turns) - len(sent)
            if cut >= 0 and prev.turns[cut:] == sent:
                base = prev.turns[:cut]
        system = index.digest(Turn("system", request.system))
        if prev is not None and not request.system:  # a client that dropped the system prompt
            system = prev.system
        took = base + tuple(index.digest(t) for t in turns)
        index.took(session_id, Took(place.tenant, place.reset_count, system, took))

    def _keep_alive(self, handle: Handle, seconds: float | None) -> None:
        """The session's own idle expiry, set on the engine thread (which expires sessions)."""
        session = self.access.registry.get(handle.session_id)
        if seconds is None or session is None:
            return

        def keep(engine: object) -> None:
            session.idle_timeout_s = seconds  # 0: closed at the next expiry round

        with contextlib.suppress(ShuttingDown):  # the answer stands; no session outlives a stop
            self.access.scheduler.call(keep)


@dataclass(frozen=True)
class _Call:
    """What one stateless turn is bound by: its deadline, its client's cancel, its admission."""

    deadline: Deadline
    cancel: CancelToken | None
    admit: Admit

    def history(
        self, turns: Turns, principal: Principal, handle: Handle, earlier: list[Turn]
    ) -> int:
        """Ingest `earlier`; the session's tokens after it."""
        result = turns.history(principal, handle, earlier, self.cancel, self.deadline.left())
        return result.receipt.n_seen


def _admitted(session_id: str) -> None:
    """No per-session admission (a caller inside the daemon)."""


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
