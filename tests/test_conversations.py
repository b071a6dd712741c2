"""The conversation layer for stateless clients, against the fake engine: which session answers a
resent history, and how it was found (continued, regenerated, caught-up, new, named), what a
reset or a close does to that, and which session makes room at the limit. Seconds, not minutes:
the real model's part (the bits a continued session computes, the HTTP wire) is tests/test_http.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sinkd.daemon.runtime.api import (
    GenerationOptions,
    Handle,
    SamplingRequest,
    TokenEvent,
    Turn,
)
from sinkd.daemon.runtime.conversations.chats import Continuation, StatelessChatRequest
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import InvalidInput, NotFound, ResourceExhausted, StaleGeneration
from tests.support.services import fake_engine_of, fake_service

pytestmark = pytest.mark.unit
ALICE, BOB = Principal("alice"), Principal("bob")
GREEDY = GenerationOptions(12, sampling=SamplingRequest(temperature=0.0))


@pytest.fixture
def service(tmp_path: Path) -> Iterator[SinkdService]:
    s = fake_service(tmp_path)
    yield s
    s.stop()


def say(
    service: SinkdService,
    history: list[Turn],
    who: Principal = ALICE,
    seed: int | None = None,
    **kw: Any,
) -> tuple[Continuation, str]:
    """One turn of a client that resends `history` whole (its last turn is the new message),
    greedy, or sampled with `seed`."""
    options = GREEDY
    if seed is not None:
        options = GenerationOptions(12, sampling=SamplingRequest(temperature=1.0, seed=seed))
    request = StatelessChatRequest("You are terse.", tuple(history), options, **kw)
    found, events = service.chats.turn(who, request)
    reply = "".join(e.text for e in events if isinstance(e, TokenEvent))
    return found, reply


def n_seen(service: SinkdService, session_id: str) -> int:
    session = service.registry.get(session_id)
    assert session is not None
    return session.seq.state.n_seen


def test_a_resent_history_continues_its_session_with_only_the_new_turn(
    service: SinkdService,
) -> None:
    history = [Turn("user", "Hello, who are you?")]
    first, reply = say(service, history)
    assert first.how == "new" and first.ingested_turns == 0
    sid = first.handle.session_id
    after_first = n_seen(service, sid)
    decoded = fake_engine_of(service).decoded
    history += [Turn("assistant", reply), Turn("user", "And what do you do?")]
    second, _ = say(service, history)
    assert (second.how, second.handle.session_id) == ("continued", sid), second.why
    assert second.ingested_turns == 0 and second.n_seen_before == after_first
    # nothing of the history was decoded again: the new turn's framing and the reply alone
    new_turn = len(
        fake_engine_of(service).vocab.tokenize("\n<|im_start|>user\nAnd what do you do?")
    )
    assert fake_engine_of(service).decoded - decoded <= new_turn + 8 + GREEDY.max_tokens


def test_the_same_last_message_again_is_a_regenerate_that_reads_nothing_again(
    service: SinkdService,
) -> None:
    history = [Turn("user", "Tell me a word.")]
    first, reply = say(service, history)
    sid = first.handle.session_id
    history += [Turn("assistant", reply), Turn("user", "Another?")]
    second, _ = say(service, history)
    again, reply_again = say(service, history)  # the last reply regenerated
    assert (again.how, again.handle.session_id) == ("regenerated", sid), again.why
    assert again.n_seen_before == second.n_seen_before  # back where the turn began
    session = service.registry.get(sid)
    assert session is not None and session.rewinds == 1
    assert reply_again  # a turn was generated from the taken-back point
    history[-1] = Turn("user", "Another one, please?")  # the last message edited
    edit, _ = say(service, history)
    assert (edit.how, edit.handle.session_id) == ("regenerated", sid), edit.why


def test_a_first_message_again_is_a_conversation_of_its_own(service: SinkdService) -> None:
    """Two chats that open with the same message are two conversations (a chat UI's title request
    repeats a chat's first message): content alone never takes another's turn back. A
    regenerated first reply reads its one message again, in a session of its own."""
    opening = [Turn("user", "Hello!")]
    one, reply_one = say(service, opening, seed=1)
    two, reply_two = say(service, opening, seed=2)
    assert reply_one != reply_two  # two conversations as they go on, told apart by their replies
    assert (one.how, two.how) == ("new", "new"), two.why
    assert two.handle.session_id != one.handle.session_id
    session = service.registry.get(one.handle.session_id)
    assert session is not None and session.rewinds == 0  # the first chat was not touched
    for found, reply in ((one, reply_one), (two, reply_two)):
        on, _ = say(service, [*opening, Turn("assistant", reply), Turn("user", "Go on.")])
        assert (on.how, on.handle.session_id) == ("continued", found.handle.session_id)


def test_room_another_call_made_is_taken_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two calls starting conversations at the limit pick the same least recent one: the second
    finds it closed already, which is room, not a 404."""
    service = fake_service(tmp_path, max_sessions=2, max_parked_sessions=0)
    try:
        say(service, [Turn("user", "One.")])
        say(service, [Turn("user", "Two.")])
        real = service.chats.close

        def raced(principal: Principal, handle: Handle) -> None:
            real(principal, handle)  # another call closed it first
            real(principal, handle)  # then this one

        monkeypatch.setattr(service.chats, "close", raced)
        third, _ = say(service, [Turn("user", "Three.")])
        assert third.how == "new" and "for room" in third.why
    finally:
        service.stop()


def test_a_session_made_for_a_call_is_no_room_for_another_before_its_first_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a new conversation's session being made and its first turn being queued, the
    session is idle to the engine, not to its caller: another new conversation at the limit is
    told 429, and does not close it."""
    service = fake_service(tmp_path, max_sessions=1, max_parked_sessions=0)
    try:
        real = service.chats.turns.chat
        others: list[str] = []
        calls = []

        def meanwhile(*args: Any, **kw: Any) -> Any:
            calls.append(1)
            if len(calls) == 1:  # the first call, its session made, its turn not yet queued
                try:
                    say(service, [Turn("user", "Another conversation.")])
                    others.append("answered")
                except ResourceExhausted:
                    others.append("429")
            return real(*args, **kw)

        monkeypatch.setattr(service.chats.turns, "chat", meanwhile)
        first, reply = say(service, [Turn("user", "The first conversation.")])
        assert others == ["429"] and first.how == "new" and reply
    finally:
        service.stop()


def test_a_flood_of_one_first_message_gets_answers_or_429_never_404_or_409(
    tmp_path: Path,
) -> None:
    """Twelve calls at once, one tenant, one first message, four sessions: each is answered or
    told the daemon is full; none is told its conversation is missing or busy."""
    service = fake_service(tmp_path, max_sessions=4)
    held, go = threading.Event(), threading.Event()

    def hold(engine: object) -> None:
        held.set()
        assert go.wait(30)

    outcomes: list[str] = []
    lock = threading.Lock()

    def call() -> None:
        try:
            say(service, [Turn("user", "Same opening.")])
            result = "answered"
        except ResourceExhausted:
            result = "429"
        except Exception as e:  # collected and asserted on the test's thread
            result = f"{type(e).__name__}: {e}"
        with lock:
            outcomes.append(result)

    try:
        holder = threading.Thread(target=service.scheduler.call, args=(hold,))
        holder.start()
        assert held.wait(30)  # the engine thread is busy: every call's create waits in line
        threads = [threading.Thread(target=call) for _ in range(12)]
        for t in threads:
            t.start()
        go.set()
        for t in [holder, *threads]:
            t.join(60)
        assert len(outcomes) == 12 and set(outcomes) <= {"answered", "429"}, outcomes
        assert "answered" in outcomes
    finally:
        service.stop()


def test_a_session_that_missed_turns_taken_elsewhere_catches_up(service: SinkdService) -> None:
    history = [Turn("user", "Start here.")]
    first, reply = say(service, history)
    sid = first.handle.session_id
    # the conversation went on on another node: two turns this session never took
    history += [
        Turn("assistant", reply),
        Turn("user", "Meanwhile, elsewhere."),
        Turn("assistant", "A reply this node never gave."),
        Turn("user", "Back here."),
    ]
    back, _ = say(service, history)
    assert (back.how, back.handle.session_id) == ("caught-up", sid), back.why
    assert back.ingested_turns == 2


def test_a_history_no_session_took_starts_one_and_reads_its_turns(service: SinkdService) -> None:
    history = [
        Turn("user", "First."),
        Turn("assistant", "One."),
        Turn("user", "Second."),
        Turn("assistant", "Two."),
        Turn("user", "Third?"),
    ]
    found, _ = say(service, history)
    assert found.how == "new" and found.ingested_turns == 4, found.why
    assert "no session" in found.why or found.why


def test_another_tenant_never_continues_or_learns_of_a_session(service: SinkdService) -> None:
    history = [Turn("user", "A shared opening line.")]
    mine, reply = say(service, history)
    history += [Turn("assistant", reply), Turn("user", "Go on.")]
    theirs, _ = say(service, history, who=BOB)
    assert theirs.how == "new" and theirs.handle.session_id != mine.handle.session_id
    with pytest.raises(NotFound):  # naming alice's session as bob: nothing to find
        say(service, [Turn("user", "Hi.")], who=BOB, session_id=mine.handle.session_id)


def test_after_a_reset_the_history_is_read_again_in_a_new_session(service: SinkdService) -> None:
    history = [Turn("user", "Remember this.")]
    first, reply = say(service, history)
    service.reset(ALICE, first.handle)
    history += [Turn("assistant", reply), Turn("user", "Did you?")]
    again, _ = say(service, history)
    assert again.how == "new" and again.handle.session_id != first.handle.session_id, again.why
    assert again.ingested_turns == 2
    with pytest.raises(StaleGeneration):  # the reset session's old handle is refused
        service.reset(ALICE, first.handle)


@pytest.mark.parametrize("how", ["reset", "close"])
def test_a_reset_or_close_that_overtakes_a_regenerate_wins_and_leaks_nothing(
    service: SinkdService, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between matching the regenerate and taking the last turn back, the session is reset or
    closed: the rewind, checked on the engine thread at the handle's generation, is refused; the
    reset session holds nothing of the old turns; the client's next try starts anew."""
    history = [Turn("user", f"A conversation that will be {how}.")]
    first, reply = say(service, history)
    sid = first.handle.session_id
    history += [Turn("assistant", reply), Turn("user", "And then?")]
    say(service, history)  # its second turn: the one a regenerate takes back
    real = service.chats.rewind

    def overtaken(principal: Principal, handle: Handle, to: int) -> None:
        (service.reset if how == "reset" else service.close)(ALICE, handle)
        real(principal, handle, to)

    monkeypatch.setattr(service.chats, "rewind", overtaken)
    with pytest.raises(StaleGeneration if how == "reset" else NotFound):
        say(service, history)
    session = service.registry.get(sid)
    if how == "reset":
        assert session is not None and session.rewinds == 0
        # the system prompt alone, decoded or waiting to be: nothing of the old turns
        held = session.seq.state.n_seen + len(session.pending_prefix)
        assert held == len(session.system_tokens)
    else:
        assert session is None
    monkeypatch.setattr(service.chats, "rewind", real)
    again, _ = say(service, history)
    assert again.how == "new" and again.handle.session_id != sid


def test_a_named_session_is_continued_as_named_and_checked(service: SinkdService) -> None:
    first, _ = say(service, [Turn("user", "Name me.")])
    sid = first.handle.session_id
    named, _ = say(service, [Turn("user", "Whatever the history.")], session_id=sid)
    assert (named.how, named.handle.session_id) == ("named", sid)
    with pytest.raises(NotFound):
        say(service, [Turn("user", "Hi.")], session_id="s-no-such-session")


def test_past_the_session_limit_the_callers_least_recent_conversation_makes_room(
    tmp_path: Path,
) -> None:
    service = fake_service(tmp_path, max_sessions=2, max_parked_sessions=0)
    try:
        oldest, _ = say(service, [Turn("user", "Conversation one.")])
        kept, _ = say(service, [Turn("user", "Conversation two.")])
        with pytest.raises(ResourceExhausted):  # bob has no conversation to give up
            say(service, [Turn("user", "Bob's.")], who=BOB)
        third, _ = say(service, [Turn("user", "Conversation three.")])
        assert third.how == "new" and oldest.handle.session_id in third.why
        assert service.registry.get(oldest.handle.session_id) is None
        assert service.registry.get(kept.handle.session_id) is not None
    finally:
        service.stop()


@pytest.mark.parametrize(
    "turns",
    [
        [],
        [Turn("assistant", "I speak first.")],
        [Turn("user", "Hi."), Turn("user", "Two user turns in a row.")],
        [Turn("user", "   ")],
    ],
)
def test_a_history_that_is_no_conversation_is_refused(
    service: SinkdService, turns: list[Turn]
) -> None:
    with pytest.raises(InvalidInput):
        say(service, turns)
    assert not service.registry.of_tenant("alice")  # nothing was made


@pytest.mark.parametrize("http_window", [None, 300, 1020])
def test_a_conversation_session_fills_its_cells_unless_a_window_is_set(
    tmp_path: Path, http_window: int | None
) -> None:
    """A chat UI's side prompt (a title or tags request of a few hundred tokens) keeps its
    instructions: the model's default window (252) would evict them in a 1,024-cell session. Its
    system prompt is pinned: the sinks are the whole of it. A window set that the pinned prompt
    leaves no room for (1,020 beside its sinks, in 1,024 cells) is a bound: the session fills what
    is left rather than fail the request."""
    service = fake_service(tmp_path, n_ctx_seq=1024, http_window=http_window)
    try:
        found, _ = say(service, [Turn("user", "Title this chat: " + "words " * 80)])
        session = service.registry.get(found.handle.session_id)
        assert session is not None
        sinks = len(session.system_tokens)
        assert sinks > 4 and session.pinned == sinks
        filled = http_window is None or sinks + http_window > 1024
        window = 1024 - sinks if filled else http_window
        assert (session.policy.sinks, session.policy.window) == (sinks, window)
        # a 550-token prompt: all of it still there to answer in a filled session
        assert (session.seq.state.evictions == 0) == filled
    finally:
        service.stop()


@pytest.mark.parametrize("keep_system", [True, False])
def test_a_client_that_trims_its_oldest_turns_keeps_its_session(
    service: SinkdService, keep_system: bool
) -> None:
    """Twelve turns from a client that sends only its newest four turns and the new message (as
    LibreChat, Continue or LangChain's trim_messages do to fit a context), with its system prompt
    or without: one session throughout, nothing read again, `why` saying what was dropped."""
    history: list[Turn] = []
    sid = ""
    for turn in range(12):
        history.append(Turn("user", f"Question number {turn}?"))
        sent = history[-5:]
        system = "You are terse." if keep_system or turn == 0 else ""
        found, events = service.chats.turn(ALICE, StatelessChatRequest(system, tuple(sent), GREEDY))
        reply = "".join(e.text for e in events if isinstance(e, TokenEvent))
        if turn == 0:
            assert found.how == "new"
            sid = found.handle.session_id
        else:
            assert (found.how, found.handle.session_id) == ("continued", sid), (turn, found.why)
            assert found.ingested_turns == 0
        if len(history) > 5:
            assert f"dropped the {len(history) - 5} oldest" in found.why, found.why
        history.append(Turn("assistant", reply))
    # an edit inside what the client still sends is no match: never continue on a mismatch
    edited = [Turn("user", "Question number 9, edited?"), *history[-3:]]
    edited.append(Turn("user", "And now?"))
    found, _ = say(service, edited)
    assert found.how == "new" and found.handle.session_id != sid


def test_one_shot_requests_give_way_before_a_continued_conversation(tmp_path: Path) -> None:
    """A chat UI sends a title, tags and follow-ups request beside each chat, each a one-turn
    conversation: at the session limit those give way first (segmented LRU), and the chat, though
    least recently used, keeps its session."""
    service = fake_service(tmp_path, max_sessions=3, max_parked_sessions=0)
    try:
        chat = [Turn("user", "Let us talk about rivers.")]
        first, reply = say(service, chat)
        chat += [Turn("assistant", reply), Turn("user", "Which is the longest?")]
        second, reply = say(service, chat)
        assert second.how == "continued"
        titles = [say(service, [Turn("user", f"Title for chat {i}?")])[0] for i in range(2)]
        third, _ = say(service, [Turn("user", "Suggest follow-ups.")])  # at the limit
        assert titles[0].handle.session_id in third.why  # the oldest one-shot made room
        assert service.registry.get(first.handle.session_id) is not None
        chat += [Turn("assistant", reply), Turn("user", "And the widest?")]
        back, _ = say(service, chat)
        assert (back.how, back.handle.session_id) == ("continued", first.handle.session_id)
    finally:
        service.stop()


def test_a_closed_conversation_leaves_nothing_in_the_layer(service: SinkdService) -> None:
    """However a session closes (here its client closes it over the service), the conversation
    layer forgets where it stood and what it took: nothing piles up over a daemon's life."""
    history = [Turn("user", "Short-lived.")]
    found, reply = say(service, history)
    sid = found.handle.session_id
    assert service.chats.index.taken(sid) is not None
    service.close(ALICE, found.handle)
    assert service.chats.index.taken(sid) is None
    history += [Turn("assistant", reply), Turn("user", "Still there?")]
    again, _ = say(service, history)
    assert again.how == "new" and again.ingested_turns == 2
