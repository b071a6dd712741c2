"""The completions layer's bookkeeping on the fake engine: a growing prompt continues the session
that holds its beginning (the longest), one request at a time holds it, a refused call leaves it
to continue, a reply the model ended is not continued, and a tenant keeps MAX_HELD at most."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sinkd.daemon.runtime.api import CancelToken, Done, GenerationOptions, TokenEvent
from sinkd.daemon.runtime.conversations import completions
from sinkd.daemon.runtime.conversations.completions import CompletionRequest
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import InvalidInput, ResourceExhausted
from tests.support.services import fake_engine_of, fake_service

pytestmark = pytest.mark.unit
ALICE, BOB = Principal("alice"), Principal("bob")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[SinkdService]:
    s = fake_service(tmp_path, max_sessions=32)
    fake_engine_of(s).markov = 2  # its toy model then writes text and never ends a turn
    yield s
    s.stop()


def complete(
    service: SinkdService, who: Principal, prompt: str, admit=None
) -> tuple[str, str, str]:  # type: ignore[no-untyped-def]
    """(how, session id, text) of one completion of 4 tokens."""
    how, events = service.completions.complete(
        who, CompletionRequest(prompt, GenerationOptions(4)), CancelToken(),
        admit or (lambda sid: None),
    )  # fmt: skip
    text, done = "", None
    for event in events:
        if isinstance(event, TokenEvent):
            text += event.text
        elif isinstance(event, Done):
            done = event
    assert done is not None
    return how.how, how.handle.session_id, text


def test_a_growing_prompt_continues_the_longest_holder_and_no_other_tenants(
    service: SinkdService,
) -> None:
    how, first, text = complete(service, ALICE, "alpha beta ")
    assert how == "new"
    how, again, text2 = complete(service, ALICE, "alpha beta " + text + "gamma ")
    assert (how, again) == ("continued", first)
    how, other, _ = complete(service, BOB, "alpha beta " + text + "gamma " + text2)
    assert how == "new" and other != first  # bob never continues alice's session
    how, third, _ = complete(service, ALICE, "alpha beta " + text + "gamma " + text2 + "delta")
    assert (how, third) == ("continued", first)
    how, fresh, _ = complete(service, ALICE, "alpha beta changed")
    assert how == "new" and fresh != first  # the prompt does not begin with what it holds


def test_a_refused_call_leaves_its_session_to_continue(service: SinkdService) -> None:
    _, first, text = complete(service, ALICE, "one two ")

    def refuse(session_id: str) -> None:
        raise ResourceExhausted("too many calls on this session")

    with pytest.raises(ResourceExhausted):
        complete(service, ALICE, "one two " + text + "three", admit=refuse)
    how, again, _ = complete(service, ALICE, "one two " + text + "three")
    assert (how, again) == ("continued", first)


def test_a_tenant_keeps_at_most_max_held_sessions(
    service: SinkdService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(completions, "MAX_HELD", 3)
    made = [complete(service, ALICE, f"file {i} ")[1] for i in range(4)]
    open_ids = {s.id for s in service.registry.of_tenant("alice")}
    assert made[0] not in open_ids and set(made[1:]) <= open_ids  # the least recent closed


def test_a_reply_the_model_ended_is_not_continued(service: SinkdService) -> None:
    fake_engine_of(service).markov = 0  # the toy model ends this prompt's reply at once
    how, first, text = complete(service, ALICE, "alpha beta ")
    assert how == "new" and text == ""
    assert first not in {s.id for s in service.registry.of_tenant("alice")}  # closed
    how, again, _ = complete(service, ALICE, "alpha beta " + text + "more")
    assert how == "new" and again != first


def test_fill_in_the_middle_and_an_empty_prompt_are_refused_by_name(service: SinkdService) -> None:
    with pytest.raises(InvalidInput, match="suffix: fill-in-the-middle"):
        service.completions.complete(
            ALICE, CompletionRequest("a", GenerationOptions(4), suffix="b"), CancelToken(),
            lambda sid: None,
        )  # fmt: skip
    with pytest.raises(InvalidInput, match="prompt: empty"):
        complete(service, ALICE, "")


@pytest.mark.parametrize("what", ["close", "reset"])
def test_a_session_closed_or_reset_as_it_is_claimed_is_read_anew(
    service: SinkdService, what: str
) -> None:
    """The race, triggered where it bites: after the request claimed the session and before it
    appends (its admission), the owner closes or resets it. The prompt is read into a new session;
    nothing of the old generation answers."""
    _, first, text = complete(service, ALICE, "race me ")
    handle = service.completions._held["alice"][first].handle
    done: list[str] = []

    def meanwhile(session_id: str) -> None:
        if session_id == first and not done:
            (service.close if what == "close" else service.reset)(ALICE, handle)
            done.append(what)

    how, answered, _ = complete(service, ALICE, "race me " + text + "again", admit=meanwhile)
    assert done == [what] and how == "new" and answered != first
