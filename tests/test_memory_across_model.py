"""A tenant's memory across its conversations (issue 62) on the real model and the wire: a fact
alice states in one conversation comes back in a later one of hers, over gRPC (the typed client)
and over HTTP (the openai SDK), with the conversation it was said in; never for bob; never after
it is forgotten (no file of the state directory holds it then), nor from a private conversation;
kept across the conversation's close and a restart. The logic alone: tests/test_memory_across.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from sinkd.daemon.node import Daemon
from sinkd.daemon.rpc.client import Client
from sinkd.daemon.runtime.api import (
    ChatRequest,
    Done,
    GenerationOptions,
    KeptSelection,
    PolicyRequest,
    RecallRequest,
)
from sinkd.errors import NotFound
from tests.support import disk
from tests.support.cli import sinkd
from tests.support.daemons import http_daemon, openai_client
from tests.support.disk import token_needles
from tests.support.settings import settings
from tests.support.texts import TEXT

pytestmark = pytest.mark.model
SECRET = "The vault code is marmalade ocelot quasar 7391, said Quentin."
WORD = "ocelot"
QUESTION = "What is the vault code Quentin gave?"
POLICY = PolicyRequest(name="sink", sinks=4, window=200)
ONE_TOKEN = GenerationOptions(1)  # the reply cannot repeat the secret: the files hold only copies


def chat(client: Client, handle: Any, message: str, options: GenerationOptions = ONE_TOKEN) -> Done:
    done = [e for e in client.chat(handle, ChatRequest(message, options)) if isinstance(e, Done)]
    return done[0]


def holders(state_dir: Path, tokens: list[int] | None, word: str = WORD) -> list[str]:
    """The files that hold the secret: as token ids (`token_needles`) or as text (None: as text
    alone)."""
    return disk.holders(state_dir, [word, *(token_needles(tokens) if tokens is not None else [])])


def test_over_grpc_a_fact_crosses_to_a_later_conversation_and_is_forgotten_from_every_file(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    config = {"memory_across_conversations": True, "purge_interval_s": 0, "max_sessions": 4}
    d = Daemon(settings(tmp_path, **config))
    d.start()
    d.wait_ready(120)
    alice = Client(d.addresses[0], token="alice-token")
    first = alice.create(POLICY).handle
    chat(alice, first, SECRET)
    chat(alice, first, "I like the sea. Tell me about boats.", GenerationOptions(24))
    tokens = d.service.engine.vocab.tokenize(SECRET)
    alice.close(first)  # its own files go; what it said stays in the memory
    d.stop()
    d = Daemon(settings(tmp_path, **config))  # kept across a restart too
    d.start()
    d.wait_ready(120)
    alice = Client(d.addresses[0], token="alice-token")
    bob = Client(d.addresses[0], token="bob-token")
    try:
        (kept,) = [p for p in alice.kept() if WORD in p.text]
        assert (kept.conversation, kept.speaker, kept.turn) == (first.session_id, "user", 1)
        assert {p.speaker for p in alice.kept()} == {"user"}  # the model's reply never crossed
        assert alice.kept(search=QUESTION, limit=1)[0].passage_id == kept.passage_id

        second = alice.create(POLICY, recall=RecallRequest(budget=100)).handle
        done = chat(alice, second, QUESTION)
        assert done.recall is not None
        (span,) = [s for s in done.recall.recalled if s.conversation]
        assert (span.conversation, span.passage_id) == (first.session_id, kept.passage_id)
        assert span.said_at == pytest.approx(kept.created_unix_time)
        assert WORD in alice.inspect(second, include_text=True).retained_text

        theirs = bob.create(POLICY).handle
        assert chat(bob, theirs, QUESTION).recall.recalled == ()  # type: ignore[union-attr]
        assert bob.kept() == []
        with pytest.raises(NotFound):
            bob.forget_kept(KeptSelection(passage_id=kept.passage_id))

        who = ("--connect", d.addresses[0], "--token", "alice-token")
        code, out, _ = sinkd("memory", "list", "--json", *who)
        assert code == 0 and {p["conversation"] for p in json.loads(out)} == {first.session_id}
        code, out, _ = sinkd("memory", "search", QUESTION, "--json", *who)
        assert code == 0 and json.loads(out)[0]["passage_id"] == kept.passage_id
        code, out, _ = sinkd("memory", "add", "I am allergic to peanuts.", "--json", *who)
        assert code == 0 and json.loads(out)[0]["conversation"] == "(given)"
        assert sinkd("memory", "forget", "--conversation", "(given)", *who)[0] == 0
        assert sinkd("memory", "forget", "--conversation", "(given)", *who)[0] == 11  # none left
        assert sinkd("memory", "forget", *who)[0] == 2  # names nothing: refused, nothing lost
        assert sinkd("memory", "list", "--since", "yesterday", *who)[0] == 2
        assert holders(state, tokens), "the test plants the secret where it can be found"
        assert alice.forget_kept(KeptSelection(conversation=first.session_id)).count >= 1
        assert alice.kept(search=QUESTION) == []
        # its text is gone from every file at once (the index merged, the log truncated); the
        # live copy is token ids in the second conversation's journal, until evicted
        assert holders(state, None) == []
        alice.append(second, TEXT[:1400])  # the live copy is evicted: its files are rewritten
        assert WORD not in alice.inspect(second, include_text=True).retained_text
        assert holders(state, tokens) == []
        third = alice.create(POLICY, recall=RecallRequest(budget=100)).handle
        assert not any(s.conversation for s in chat(alice, third, QUESTION).recall.recalled)  # type: ignore[union-attr]
    finally:
        alice.shutdown()
        bob.shutdown()
        d.stop()


def sinkd_field(completion: Any) -> dict[str, Any]:
    extra = completion.model_extra or {}
    field = extra["sinkd"]
    assert isinstance(field, dict)
    return field


def test_over_http_the_sinkd_field_names_the_conversation_a_passage_came_from(
    tmp_path: Path,
) -> None:
    d = http_daemon(tmp_path, memory_across_conversations=True, max_sessions=4, purge_interval_s=0)
    assert d.http is not None
    oai = openai_client(d)
    web = httpx.Client(base_url=d.http.address, headers={"authorization": "Bearer alice-token"})
    try:
        first = oai.chat.completions.create(
            model="smollm2-135m-instruct",
            messages=[{"role": "user", "content": "Please remember: " + SECRET}],
            max_tokens=8,
        )
        source = sinkd_field(first)["session_id"]
        hidden = oai.chat.completions.create(
            model="smollm2-135m-instruct",
            messages=[{"role": "user", "content": "My bank PIN is 5150, a private note."}],
            max_tokens=4,
            extra_headers={"x-sinkd-private": "true"},
        )
        assert sinkd_field(hidden)["session_id"] != source
        listed = web.get("/v1/sinkd/memory").json()["data"]
        assert [(p["conversation"], p["asked"]) for p in listed] == [(source, True)]
        assert web.get("/v1/sinkd/memory", params={"search": "bank PIN"}).json()["data"] == []

        later = oai.chat.completions.create(
            model="smollm2-135m-instruct",
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=1,
        )
        recalled = sinkd_field(later)["recall"]["recalled"]
        assert [(r["conversation"], r["speaker"]) for r in recalled] == [(source, "user")]
        assert recalled[0]["passage_id"] == listed[0]["id"]

        bobs = openai_client(d, "bob-token").chat.completions.create(
            model="smollm2-135m-instruct",
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=1,
        )
        assert sinkd_field(bobs)["recall"]["recalled"] == []

        gone = web.delete(f"/v1/sinkd/memory/{listed[0]['id']}")
        assert gone.status_code == 200 and gone.json()["forgotten"] == 1
        again = web.delete(f"/v1/sinkd/memory/{listed[0]['id']}")
        assert again.status_code == 404 and again.json()["error"]["message"]
        bad = web.get("/v1/sinkd/memory", params={"since": "yesterday"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"
        given = web.post("/v1/sinkd/memory", json={"text": "I am allergic to peanuts."})
        assert given.json()["data"][0]["conversation"] == "(given)"
        assert holders(tmp_path / "state", None, "peanuts")
        forgot = web.post("/v1/sinkd/memory/forget", json={"conversation": "(given)"})
        assert forgot.json()["forgotten"] == 1
        assert holders(tmp_path / "state", None, "peanuts") == []  # no conversation held a copy
    finally:
        web.close()
        d.stop()
