"""A tenant's memory across its conversations (issue 62), on the fake engine: what is kept (the
user's statements, never the model's words unless asked, never a private conversation's or a UI's
task prompt), where it comes back (a later conversation of the same tenant, after its own memory,
marked with where and when it was said), and the owner's control (list, search, forget; a reset of
the source drops it, a close does not). The real model and the wire: tests/test_memory_across_model.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sinkd.cachepolicy.recall_plan import Candidate
from sinkd.daemon.runtime.api import (
    ChatRequest,
    GenerationOptions,
    Handle,
    KeptSelection,
    PolicyRequest,
    RecallRequest,
)
from sinkd.daemon.runtime.api import Turn as ChatTurn
from sinkd.daemon.runtime.conversations.chats import StatelessChatRequest
from sinkd.daemon.runtime.recall import across
from sinkd.daemon.runtime.recall.across import ranked_across
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import FailedPrecondition, InvalidInput, NotFound, PermissionDenied
from tests.support import open_webui_tasks
from tests.support.services import fake_service

pytestmark = pytest.mark.unit
ALICE, BOB = Principal("alice"), Principal("bob")
WINDOW = PolicyRequest(name="sink", sinks=4, window=600)
BUDGET = RecallRequest(budget=300, passages=3)  # the fake engine's tokens are bytes
FACT = "My locker code is 4417."
FILLER = ["The boat is painted red today.", "Our cat sleeps on the sofa all day."]
QUESTION = "What is my locker code?"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[SinkdService]:
    s = fake_service(tmp_path, memory_across_conversations=True, n_ctx_seq=1024)
    yield s
    s.stop()


def conversation(
    service: SinkdService, who: Principal, *messages: str, private: bool = False
) -> Handle:
    h = service.create(who, WINDOW, recall=RecallRequest(budget=300, private=private)).handle
    for m in messages:
        say(service, who, h, m)
    return h


def say(service: SinkdService, who: Principal, h: Handle, message: str, **kw: object) -> None:
    list(service.chat(who, h, ChatRequest(message, GenerationOptions(2), **kw)))  # type: ignore[arg-type]


def asked(service: SinkdService, who: Principal, question: str = QUESTION) -> list[object]:
    """A new conversation's turn: what its recall brought back."""
    h = service.create(who, WINDOW, recall=BUDGET).handle
    say(service, who, h, question)
    session = service.registry.get(h.session_id)
    assert session is not None and session.last_recall is not None
    return list(session.last_recall.recalled)


def kept(service: SinkdService, who: Principal = ALICE) -> list[str]:
    return [p.text for p in service.across.listing(who, KeptSelection())]


def retained_text(service: SinkdService, h: Handle) -> str:
    session = service.registry.get(h.session_id)
    assert session is not None
    engine = service.scheduler.engine
    assert engine is not None
    return b"".join(engine.vocab.piece(t) for t in session.retained.all()).decode()


def test_a_users_fact_comes_back_in_another_conversation_with_where_and_when(
    service: SinkdService,
) -> None:
    before = time.time()
    first = conversation(service, ALICE, FACT, *FILLER)
    h = service.create(ALICE, WINDOW, recall=BUDGET).handle
    say(service, ALICE, h, QUESTION)
    session = service.registry.get(h.session_id)
    assert session is not None and session.last_recall is not None
    (span,) = [s for s in session.last_recall.recalled if s.conversation]
    assert span.conversation == first.session_id and span.speaker == "user"
    assert before <= span.said_at <= time.time()
    assert "from other conversations" in session.last_recall.note
    (listed,) = service.across.listing(ALICE, KeptSelection(passage_id=span.passage_id))
    assert listed.text == FACT and listed.conversation == first.session_id and listed.turn == 1
    held = retained_text(service, h)
    assert FACT in held and "(the user, in another conversation on " in held


def test_never_for_another_tenant(service: SinkdService) -> None:
    conversation(service, ALICE, FACT, *FILLER)
    assert asked(service, BOB) == []
    assert kept(service, BOB) == []
    with pytest.raises(PermissionDenied):
        service.across.listing(Principal(None, admin=True), KeptSelection())


def test_the_asking_conversation_recalls_none_of_its_own_words_from_it(
    service: SinkdService,
) -> None:
    h = conversation(service, ALICE, FACT, *FILLER)
    say(service, ALICE, h, QUESTION)
    session = service.registry.get(h.session_id)
    assert session is not None and session.last_recall is not None
    assert not any(s.conversation for s in session.last_recall.recalled)


def test_only_what_the_user_states_is_kept_never_the_models_words(
    service: SinkdService,
) -> None:
    h = conversation(service, ALICE, FACT, QUESTION, "Tell me about boats.", "hi")
    assert kept(service) == [FACT]  # a question, a bidding, a greeting: nothing to keep
    assert {p.speaker for p in service.across.listing(ALICE, KeptSelection())} == {"user"}
    # the model's reply crosses only when the user asks for it ("remember that")
    say(service, ALICE, h, "Remember that.", reply_before="Your dentist is on Tuesday at 3.")
    say(service, ALICE, h, "A plain message, not asking to keep anything.", reply_before="Nope.")
    replies = service.across.listing(ALICE, KeptSelection(speaker="assistant"))
    assert [(p.text, p.asked) for p in replies] == [("Your dentist is on Tuesday at 3.", True)]
    say(service, ALICE, h, "Please remember this: the wifi password is tern.")
    (wifi,) = [p for p in service.across.listing(ALICE, KeptSelection()) if "wifi" in p.text]
    assert wifi.asked and wifi.speaker == "user"


def test_a_private_conversation_never_feeds_it_nor_reads_it(service: SinkdService) -> None:
    conversation(service, ALICE, FACT, *FILLER, private=True)
    assert kept(service) == []
    conversation(service, ALICE, FACT, *FILLER)
    h = conversation(service, ALICE, private=True)
    say(service, ALICE, h, QUESTION)
    session = service.registry.get(h.session_id)
    assert session is not None and session.last_recall is not None
    assert session.last_recall.recalled == ()
    receipt = service.receipt(session)
    assert not receipt.recall.across


def test_a_turn_made_private_takes_what_its_conversation_gave(service: SinkdService) -> None:
    h = conversation(service, ALICE, FACT, *FILLER)
    assert len(kept(service)) == 3
    say(service, ALICE, h, "My bank PIN is 9911.", private=True)
    assert kept(service) == []
    say(service, ALICE, h, "My other locker is 12.")  # private from then on
    assert kept(service) == []


def test_a_reset_of_the_source_drops_its_words_a_close_keeps_them(
    service: SinkdService,
) -> None:
    reset = conversation(service, ALICE, FACT)
    closed = conversation(service, ALICE, "Our boat is called the Heron.")
    fresh = service.reset(ALICE, reset)[0].handle
    say(service, ALICE, fresh, "The new generation says this.")
    service.close(ALICE, closed)
    assert kept(service) == ["Our boat is called the Heron.", "The new generation says this."]
    assert asked(service, ALICE) == []  # nothing of the reset generation comes back


def test_the_owner_lists_searches_and_forgets_by_passage_conversation_speaker_and_time(
    service: SinkdService,
) -> None:
    a = conversation(service, ALICE, FACT, FILLER[0])
    t = time.time()
    b = conversation(service, ALICE, FILLER[1])
    by_a = service.across.listing(ALICE, KeptSelection(conversation=a.session_id))
    assert [p.text for p in by_a] == [FACT, FILLER[0]]
    assert [p.text for p in service.across.listing(ALICE, KeptSelection(since=t))] == [FILLER[1]]
    found = service.across.listing(ALICE, KeptSelection(), search="locker code", limit=1)
    assert [p.text for p in found] == [FACT] and found[0].score is not None
    assert service.across.forget(ALICE, KeptSelection(passage_id=found[0].passage_id)).count == 1
    with pytest.raises(NotFound):
        service.across.forget(ALICE, KeptSelection(passage_id=found[0].passage_id))
    with pytest.raises(InvalidInput, match="name a passage"):
        service.across.forget(ALICE, KeptSelection())
    with pytest.raises(InvalidInput, match="since < until"):
        service.across.listing(ALICE, KeptSelection(since=2.0, until=1.0))
    assert service.across.forget(ALICE, KeptSelection(conversation=b.session_id)).count == 1
    assert service.across.forget(ALICE, KeptSelection(speaker="user")).count == 1
    assert kept(service) == []


def test_forgetting_a_recalled_passage_rewrites_the_files_of_the_conversation_holding_it(
    service: SinkdService,
) -> None:
    """Its live copy: once the stream evicts it (`scrub_after`), as a session's own forget."""
    conversation(service, ALICE, FACT, *FILLER)
    h = service.create(ALICE, WINDOW, recall=BUDGET).handle
    say(service, ALICE, h, QUESTION)
    session = service.registry.get(h.session_id)
    assert session is not None
    (span,) = [s for s in session.recalled if s.conversation]
    assert session.took_across and session.scrub_after is None
    service.across.forget(ALICE, KeptSelection(passage_id=span.passage_id))
    assert session.scrub_after == span.stream[1] and session.scrub_due


def test_a_text_given_to_the_memory_is_the_users_asked_for(service: SinkdService) -> None:
    (p,) = service.across.remember(ALICE, "I am allergic to peanuts.")
    assert (p.speaker, p.asked, p.conversation) == ("user", True, "(given)")
    conversation(service, ALICE, *FILLER)
    recalled = asked(service, ALICE, "Am I allergic to peanuts?")
    assert [(s.conversation, s.passage_id) for s in recalled] == [("(given)", p.passage_id)]
    with pytest.raises(InvalidInput, match="empty"):
        service.across.remember(ALICE, "  ")


def test_a_chat_uis_task_prompt_is_never_kept(tmp_path: Path) -> None:
    """It quotes the chat, the model's words too. Recognised whether or not its JSON is decoded
    under a grammar (off here: the fake engine has none)."""
    s = fake_service(
        tmp_path, memory_across_conversations=True, n_ctx_seq=1024, ui_task_grammar=False
    )
    try:
        chat = [("user", FACT), ("assistant", "Noted: your locker code is 4417.")]
        prompt = open_webui_tasks.rendered(open_webui_tasks.TITLE, chat)
        request = StatelessChatRequest("", (ChatTurn("user", prompt),), GenerationOptions(2))
        _, events = s.chats.turn(ALICE, request)
        list(events)
        assert kept(s) == []
        _, events = s.chats.turn(ALICE, StatelessChatRequest("", (ChatTurn("user", FACT),)))
        list(events)
        assert kept(s) == [FACT]
    finally:
        s.stop()


def test_over_the_stateless_front_remember_that_keeps_the_reply_before(
    service: SinkdService,
) -> None:
    turns = (
        ChatTurn("user", "When is my dentist appointment?"),
        ChatTurn("assistant", "Tuesday at 3 pm, at the clinic on Elm Street."),
        ChatTurn("user", "Remember that"),
    )
    _, events = service.chats.turn(ALICE, StatelessChatRequest("", turns, GenerationOptions(2)))
    list(events)
    (reply,) = service.across.listing(ALICE, KeptSelection())
    assert (reply.text, reply.speaker, reply.asked) == (turns[1].content, "assistant", True)


def test_a_tenant_that_did_not_opt_in_keeps_nothing(tmp_path: Path) -> None:
    s = fake_service(
        tmp_path,
        n_ctx_seq=1024,
        memory_across_conversations=True,
        tenants=[
            {"name": "alice", "token_sha256": "a" * 64},
            {"name": "bob", "token_sha256": "b" * 64, "memory_across_conversations": False},
        ],
    )
    try:
        conversation(s, BOB, FACT)
        assert kept(s, BOB) == []
        with pytest.raises(FailedPrecondition, match="keeps no memory across"):
            s.across.remember(BOB, FACT)
        conversation(s, ALICE, FACT)
        assert kept(s, ALICE) == [FACT]
    finally:
        s.stop()


@pytest.mark.parametrize(
    ("message", "states", "asks", "bare"),
    [
        (FACT, True, False, False),
        (QUESTION, False, False, False),
        ("Tell me about boats, part 3.", False, False, False),
        ("Thanks!", False, False, False),
        ("I live in Oslo. What is the weather?", True, False, False),
        ("Remember that", False, True, True),
        ("please remember this.", True, True, True),
        ("Can you remember that for later?", False, True, True),
        ("Remember: my code is 5.", True, True, False),
        ("Mein Hund heißt Bello.", True, False, False),
        ("我的储物柜密码是四四一七。", True, False, False),
        ("我的密码是什么？", False, False, False),
        ("１２３４５６７８９０１２。", False, False, False),  # no word at all
    ],
)
def test_what_a_message_says_of_itself(message: str, states: bool, asks: bool, bare: bool) -> None:
    assert across.states_something(message) is states
    assert across.asks_to_remember(message) is asks
    assert across.asks_for_the_reply(message) is bare


def test_a_correction_ranks_first_among_the_close_matches_a_newer_distractor_does_not() -> None:
    def c(pid: int, score: float, said_at: float) -> Candidate:
        return Candidate(pid, (0, 8), 8, score, 0.0, score, "user", "s_1", said_at)

    texts = {
        1: "One thing about me: My dog is named Biscuit.",
        2: "My neighbour's dog is named Comet.",
        3: "Correction, that changed: my dog is named Mango now.",
        4: "I read about dogs last week.",
    }
    found = [c(1, 0.84, 1.0), c(2, 0.85, 2.0), c(3, 0.80, 3.0), c(4, 0.5, 4.0)]

    def corrects(x: Candidate) -> bool:
        return across.says_it_corrects(texts[x.passage_id])

    assert [x.passage_id for x in ranked_across(found, corrects)] == [3, 2, 1, 4]
    assert [x.passage_id for x in ranked_across(found[:2], corrects)] == [2, 1]  # by score
    far = [c(1, 0.84, 1.0), c(3, 0.6, 3.0)]  # a correction far below the best: by score
    assert [x.passage_id for x in ranked_across(far, corrects)] == [1, 3]


def test_only_a_turn_that_asks_for_the_past_searches_the_other_conversations(
    service: SinkdService,
) -> None:
    """A statement or a plain request that shares words with a kept passage recalls nothing of
    another conversation (it would pay a recall for what it did not ask)."""
    others = [f"The {w} was on the table in the hall." for w in ("lamp", "vase", "book", "cup")]
    conversation(service, ALICE, FACT, *FILLER, *others)
    for message in ("My locker code is on a card in my wallet.", "Tell me about locker codes."):
        h = service.create(ALICE, WINDOW, recall=BUDGET).handle
        say(service, ALICE, h, message)
        session = service.registry.get(h.session_id)
        assert session is not None and session.last_recall is not None
        assert session.last_recall.recalled == ()
    assert [s.conversation for s in asked(service, ALICE, "Remind me of my locker code.")]


def test_a_correction_is_recalled_though_two_closer_matches_fill_the_passages(
    service: SinkdService,
) -> None:
    """One passage a turn: the old statement and another match outscore the correction a little;
    it says it corrects, and is the one taken."""
    others = [f"The {w} was on the table in the hall." for w in ("lamp", "vase", "book", "cup")]
    conversation(service, ALICE, "My locker code is 4417, the locker code.", *others)
    conversation(service, ALICE, "The locker code of my gym locker is 2020.")
    fix = conversation(service, ALICE, "Actually my locker code is 5150 now, the locker code.")
    one = RecallRequest(budget=300, passages=1, threshold=0.1)  # BM25 alone here: small scores
    h = service.create(ALICE, WINDOW, recall=one).handle
    say(service, ALICE, h, "What is my locker code?")
    session = service.registry.get(h.session_id)
    assert session is not None and session.last_recall is not None
    assert [s.conversation for s in session.last_recall.recalled] == [fix.session_id]


def test_the_same_words_again_from_a_conversation_are_kept_once(service: SinkdService) -> None:
    """A client resending, a regenerated turn: one passage; a long message in pieces too."""
    long = " ".join(f"The shelf number {i} holds my winter boots." for i in range(12))
    h = conversation(service, ALICE, FACT, long)
    n = len(kept(service))
    assert n > 2  # the long message in pieces
    say(service, ALICE, h, FACT)
    say(service, ALICE, h, long)
    assert len(kept(service)) == n
    conversation(service, ALICE, FACT)  # another conversation says it too: kept, its own
    assert len(kept(service)) == n + 1
