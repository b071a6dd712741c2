"""Recall on the real model, through the daemon: evicted text is kept, searched, brought back into
the cache with its provenance, deleted by its owner, isolated between tenants and generations, and
durable. Passkey accuracy by distance is bench/recall.py's (too slow for a test)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from sinkd.daemon import failpoints
from sinkd.daemon.node import Daemon
from sinkd.daemon.runtime.recall.framing import QUOTE_HEAD
from sinkd.proto.v1 import sinkd_pb2 as pb
from tests.support.clients import Client, planted
from tests.support.disk import holders
from tests.support.settings import settings
from tests.support.texts import LONG, SENTINEL
from tests.support.texts import RECALL_POLICY as POLICY
from tests.support.tokens import ADMIN, ALICE, BOB

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(settings(tmp_path_factory.mktemp("recall")))
    d.start()
    d.wait_ready(120)
    yield d
    d.stop()


def code(e: grpc.RpcError) -> grpc.StatusCode:
    return e.code()  # type: ignore[no-any-return]


def test_recall_brings_an_evicted_fact_back_with_its_provenance(client: Client) -> None:
    h = planted(client)
    before = client.inspect(h).receipt
    assert before.recall.mode == "auto" and before.memory_passages > 0
    found = client.memory(h, search=SENTINEL).passages
    assert found and SENTINEL in found[0].text
    source = found[0].logical
    assert source.end <= before.recent_logical.start  # it was evicted: not in the cache

    r = client.recall(h, "What is the sentinel word?")
    recalled = r.report.recalled
    assert recalled and recalled[0].passage_id == found[0].passage_id
    assert r.report.search == "bm25+dense"  # the pulled embedder, loaded with the model
    assert (recalled[0].source_logical.start, recalled[0].source_logical.end) == (
        source.start,
        source.end,
    )
    after = r.receipt
    assert [p.passage_id for p in after.recalled] == [p.passage_id for p in recalled]
    copy = after.recalled[0].stream_logical
    assert after.recent_logical.start <= copy.start < copy.end <= after.n_seen
    assert after.retained <= POLICY["sinks"] + POLICY["window"]
    # the byte count covers every retained cell, the recalled copy's included
    per_cell = before.kv_payload_bytes / before.retained
    assert after.kv_payload_bytes == pytest.approx(after.retained * per_cell, abs=1)
    text = client.inspect(h, text=True).retained_text
    assert SENTINEL in text  # back in the cache, as text decoded afresh
    kinds = [e.kind for e in client.s.Trace(pb.HandleRequest(handle=h), metadata=ALICE).events]
    assert "recall" in kinds

    # the stream evicts the copy like any cells, and the memory does not store it twice
    client.append(h, LONG[1600:2600])
    assert not client.inspect(h).receipt.recalled
    assert [p.passage_id for p in client.memory(h, search=SENTINEL).passages] == [
        found[0].passage_id
    ]


def test_the_repetition_penalty_spares_a_recalled_copy(daemon: Daemon, client: Client) -> None:
    """A reply may quote what recall brought back (that is what it is for): the penalty's
    history is the stream's last N tokens less the recalled copies among them, the rest of the
    stream and the reply's own tokens still in it. (Penalised, Gemma 3 with its chat sampling
    answered 0-15% of the recalled facts: docs/recall.md.)"""
    h = planted(client)
    r = client.recall(h, "What is the sentinel word?")
    copy = r.report.recalled[0].stream_logical
    session = daemon.service.registry.get(h.session_id)
    assert session is not None
    n_seen, tail = session.seq.state.n_seen, session.retained.tail(64)
    assert n_seen - 64 < copy.start < copy.end <= n_seen  # the copy is among the last 64
    expected = [
        t for at, t in zip(range(n_seen - 64, n_seen), tail, strict=True)
        if not copy.start <= at < copy.end
    ]  # fmt: skip
    assert session.penalty_history(64) == expected
    assert len(expected) == 64 - (copy.end - copy.start)
    client.append(h, " and so on")
    assert session.penalty_history(64)[-3:] == session.retained.tail(3)  # after it: counted


def test_nothing_is_recalled_when_nothing_matches_and_the_report_says_so(client: Client) -> None:
    h = planted(client)
    seen = client.inspect(h).receipt.n_seen
    r = client.recall(h, "xylophone orchestra")
    assert not r.report.recalled and r.report.note.startswith("nothing recalled")
    assert r.receipt.n_seen == seen


def test_chat_recalls_before_the_answer_and_says_what(client: Client) -> None:
    h = client.create(**POLICY).handle

    def chat(message: str) -> pb.Done:
        events = list(
            client.s.Chat(pb.ChatRequest(handle=h, message=message, max_tokens=8), metadata=ALICE)
        )
        return events[-1].done

    first = chat(f"Remember: the sentinel word is {SENTINEL}.")
    assert not first.recall.recalled  # nothing evicted yet, nothing to recall
    client.append(h, LONG[:1400])
    done = chat("What is the sentinel word?")
    assert done.recall.recalled, done.recall.note
    assert done.receipt.last_recall.recalled[0].passage_id == done.recall.recalled[0].passage_id
    text = client.inspect(h, text=True).retained_text
    # SmolLM2's presentation (models.lock): quoted inside the user's turn, before the question
    question = text.rindex("What is the sentinel word?")
    turn = text.rindex("<|im_start|>user", 0, question)
    quote = text.index(QUOTE_HEAD, turn)
    assert quote < text.index(SENTINEL, quote) < question
    assert "<|im_end|>" not in text[turn:question]  # one user turn: the quote, then the question
    assert text.index("<|im_start|>assistant", question) > question


def test_a_stream_nothing_asks_about_is_bit_identical_to_recall_off(client: Client) -> None:
    """Recall auto keeps memory and makes vectors, but recalls only before a question: a stream
    of appends and generations (nothing asked) has recall-off's logits and tokens, bit for bit."""
    handles = {
        mode: client.create(recall=pb.RecallSettings(mode=mode), **POLICY).handle
        for mode in ("auto", "off")
    }
    for h in handles.values():
        client.append(h, LONG[:1600])
    got = {}
    for mode, h in handles.items():
        greedy = pb.Sampling(temperature=0.0)
        request = pb.GenerateRequest(handle=h, max_tokens=24, sampling=greedy)
        tokens = [
            e.token.id for e in client.s.Generate(request, metadata=ALICE) if e.HasField("token")
        ]
        logits = client.s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE)
        got[mode] = (tokens, logits.logits, logits.receipt.n_seen)
    assert client.inspect(handles["auto"]).receipt.memory_tokens > 0
    assert client.inspect(handles["off"]).receipt.memory_tokens == 0
    assert got["auto"] == got["off"]


def test_forget_deletes_passages_by_id_and_by_range(client: Client) -> None:
    h = planted(client)
    target = client.memory(h, search=SENTINEL).passages[0]
    assert client.forget(h, passage_id=target.passage_id).forgotten == 1
    assert not client.memory(h, search=SENTINEL).passages
    assert not client.recall(h, "sentinel word zebraquartz").report.recalled
    with pytest.raises(grpc.RpcError) as e:
        client.forget(h, passage_id=target.passage_id)
    assert code(e.value) == grpc.StatusCode.NOT_FOUND
    n = client.inspect(h).receipt.memory_passages
    assert client.forget(h, logical=pb.Range(start=0, end=10**9)).forgotten == n
    assert client.inspect(h).receipt.memory_passages == 0
    with pytest.raises(grpc.RpcError) as e:
        client.forget(h, logical=pb.Range(start=5, end=6))
    assert code(e.value) == grpc.StatusCode.NOT_FOUND


def test_another_tenant_can_neither_search_nor_recall_nor_forget(client: Client) -> None:
    h = planted(client)
    for call in (
        lambda md: client.memory(h, search=SENTINEL, md=md),
        lambda md: client.recall(h, "sentinel", md=md),
        lambda md: client.forget(h, passage_id=1, md=md),
    ):
        for md in (BOB, ADMIN):
            with pytest.raises(grpc.RpcError) as e:
                call(md)
            assert code(e.value) == grpc.StatusCode.NOT_FOUND
    # the admin sees counts and bytes only: no message of the admin API carries passage text
    owner_view = client.recall(h, "What is the sentinel word?").receipt
    assert owner_view.last_recall.query_sha256 and owner_view.system_prompt_sha256
    listed = client.admin.ListAllSessions(pb.ListSessionsRequest(), metadata=ADMIN).sessions
    mine = next(r for r in listed if r.session_id == h.session_id)
    assert mine.memory_passages > 0 and mine.memory_bytes > 0
    assert SENTINEL not in str(listed)
    # nor a hash that confirms a guess of the chat message or the system prompt
    inspected = client.inspect(h, md=ADMIN).receipt
    for seen in (mine, inspected):
        assert seen.last_recall.query_sha256 == "" and seen.system_prompt_sha256 == ""
        assert seen.last_recall.candidates == owner_view.last_recall.candidates  # counts stay
    assert client.memory(h, search=SENTINEL).passages  # the owner still has it


def test_a_fork_gets_the_parents_memory_as_it_was(client: Client) -> None:
    h = planted(client)
    child = client.s.Fork(pb.HandleRequest(handle=h), metadata=ALICE).handle
    parent_texts = [p.text for p in client.memory(h, limit=1000).passages]
    assert [p.text for p in client.memory(child, limit=1000).passages] == parent_texts
    client.append(h, "\nAnother word: quokkaplinth.\n" + LONG[1600:2800])
    assert client.memory(h, search="quokkaplinth").passages
    assert not client.memory(child, search="quokkaplinth").passages
    client.forget(child, logical=pb.Range(start=0, end=10**9))
    assert client.memory(h, search=SENTINEL).passages  # the parent's copy is its own


@pytest.mark.parametrize(
    ("query", "status"),
    [("", grpc.StatusCode.INVALID_ARGUMENT), ("x" * 5000, grpc.StatusCode.INVALID_ARGUMENT)],
)
def test_bad_queries_are_refused_and_change_nothing(
    client: Client, query: str, status: grpc.StatusCode
) -> None:
    h = planted(client)
    before = client.inspect(h).receipt
    with pytest.raises(grpc.RpcError) as e:
        client.recall(h, query)
    assert code(e.value) == status
    after = client.inspect(h).receipt
    assert (after.n_seen, after.memory_passages) == (before.n_seen, before.memory_passages)


def test_recall_settings_the_policy_cannot_hold_are_refused(client: Client) -> None:
    with pytest.raises(grpc.RpcError) as e:  # a budget above half the window
        client.create(recall=pb.RecallSettings(mode="auto", budget=61), **POLICY)
    assert code(e.value) == grpc.StatusCode.INVALID_ARGUMENT
    assert "recall.budget" in (e.value.details() or "")
    with pytest.raises(grpc.RpcError) as e:  # the full policy never evicts
        client.create(recall=pb.RecallSettings(mode="auto"), name="full", sinks=4, window=120)
    assert code(e.value) == grpc.StatusCode.INVALID_ARGUMENT
    full = client.create(name="full", sinks=4, window=120).handle
    client.append(full, LONG[:300])
    with pytest.raises(grpc.RpcError) as e:  # a control keeps no memory unless asked
        client.recall(full, "anything at all")
    assert code(e.value) == grpc.StatusCode.FAILED_PRECONDITION
    assert client.inspect(full).receipt.n_seen > 0


def test_reset_starts_an_empty_memory_and_the_old_text_leaves_the_disk(tmp_path: Path) -> None:
    d = Daemon(settings(tmp_path))
    d.start()
    d.wait_ready(120)
    client = Client(d.addresses[0])
    try:
        h = planted(client)
        state = tmp_path / "state"
        assert holders(state, [SENTINEL]), "the test plants the sentinel where it can be found"
        reset = client.s.Reset(pb.HandleRequest(handle=h), metadata=ALICE)
        assert not reset.purge_owed  # the reply came once the old text had left every file
        h2 = reset.handle
        assert client.inspect(h2).receipt.memory_passages == 0
        assert not client.memory(h2, search=SENTINEL).passages
        client.append(h2, LONG[2000:3400])  # a new stream, evicting too
        assert not client.recall(h2, f"What is the sentinel word {SENTINEL}?").report.recalled
        assert not holders(state, [SENTINEL])

        h3 = planted(client)  # close deletes it as well
        assert holders(state, [SENTINEL])
        # its index merge may wait out purge_interval_s after the reset's (on a machine fast
        # enough to get here within it): the reply waits with it
        assert not client.s.Close(pb.HandleRequest(handle=h3), metadata=ALICE).purge_owed
        assert not holders(state, [SENTINEL])
    finally:
        client.close()
        d.stop()


def test_without_the_embedder_recall_searches_by_words_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not pulled yet (or offline at the first start): BM25 alone, and every report says why."""
    shipped = Path(str(resources.files("sinkd") / "models.lock")).read_text()
    lock = tmp_path / "models.lock"
    lock.write_text(shipped.replace('"all-MiniLM-L6-v2.zip"', '"not-pulled.zip"'))
    monkeypatch.setenv("SINKD_MODELS_LOCK", str(lock))
    d = Daemon(settings(tmp_path))
    d.start()
    d.wait_ready(120)
    client = Client(d.addresses[0])
    try:
        h = planted(client)
        report = client.recall(h, f"What is the sentinel word {SENTINEL}?").report
        assert report.recalled, "BM25 finds the word itself"
        assert report.search == (
            "bm25 alone: the embedder minilm-l6-v2 is not pulled (sinkd models pull minilm-l6-v2)"
        )
    finally:
        client.close()
        d.stop()


@pytest.mark.parametrize("call", ["recall", "memory"])
def test_a_recall_or_search_overtaken_by_a_reset_finds_nothing_of_the_old_generation(
    client: Client, call: str
) -> None:
    """Held after its handle was checked, while a reset deletes the memory: the call is refused or
    finds nothing, and the new generation holds none of the old text, in its cache or memory."""
    h = planted(client)
    checked, release = threading.Event(), threading.Event()

    def hold() -> None:
        if not checked.is_set():
            checked.set()
            release.wait(30)

    result: dict[str, Any] = {}

    def run() -> None:
        try:
            if call == "recall":
                result["ok"] = client.recall(h, f"What is the sentinel word {SENTINEL}?")
            else:
                result["ok"] = client.memory(h, search=SENTINEL)
        except grpc.RpcError as e:
            result["code"] = code(e)

    with failpoints.armed("handle-checked", hold):
        t = threading.Thread(target=run)
        t.start()
        assert checked.wait(30)
    fresh = client.s.Reset(pb.HandleRequest(handle=h), metadata=ALICE).handle
    release.set()
    t.join(60)
    assert not t.is_alive()
    if call == "recall":
        assert result.get("code") == grpc.StatusCode.FAILED_PRECONDITION, result
    else:  # a read: refused, or an empty answer (the rows are gone), never the old text
        assert result.get("code") == grpc.StatusCode.FAILED_PRECONDITION or not any(
            SENTINEL in p.text for p in result["ok"].passages
        ), result
    r = client.inspect(fresh, text=True)
    assert r.receipt.n_seen == 0 and not r.receipt.recalled and r.receipt.memory_passages == 0
    assert SENTINEL not in r.retained_text
    assert not client.memory(fresh, search=SENTINEL).passages


def test_memory_and_recalled_copies_survive_a_crash_and_resume_bit_identical(
    tmp_path: Path,
) -> None:
    d = Daemon(settings(tmp_path))
    d.start()
    d.wait_ready(120)
    client = Client(d.addresses[0])
    h = planted(client)
    client.recall(h, "What is the sentinel word?")
    client.append(h, "\nSo the word is")
    before = client.inspect(h).receipt
    logits = client.s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE)
    texts = [(p.logical.start, p.text) for p in client.memory(h, limit=1000).passages]
    assert before.recalled  # the copies are in the window: a later eviction must skip them
    client.close()
    d.stop(snapshot=False)  # what a kill -9 leaves: nothing written at the stop

    for restart in (1, 2):  # a second crash after the first resume finds the copies recorded too
        d = Daemon(settings(tmp_path))
        d.start()
        d.wait_ready(120)
        client = Client(d.addresses[0])
        try:
            after = client.inspect(h).receipt
            assert after.n_seen == before.n_seen
            assert list(after.recalled) == list(before.recalled), restart
            stored = [(p.logical.start, p.text) for p in client.memory(h, limit=1000).passages]
            assert stored == texts
            again = client.s.Inspect(
                pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE
            )
            assert np.array_equal(
                np.frombuffer(again.logits, dtype="<f4"), np.frombuffer(logits.logits, dtype="<f4")
            )
        finally:
            client.close()
            d.stop(snapshot=False)


def test_the_store_is_bounded_oldest_first(tmp_path: Path) -> None:
    d = Daemon(settings(tmp_path, memory_max_tokens=64))
    d.start()
    d.wait_ready(120)
    client = Client(d.addresses[0])
    try:
        h = planted(client)
        r = client.inspect(h).receipt
        assert 0 < r.memory_tokens <= 64
        assert r.evicted_tokens > 64
        assert d.service.metrics.count("memory_pruned_tokens") >= r.evicted_tokens - 64
        assert not client.memory(h, search=SENTINEL).passages  # the oldest went first
    finally:
        client.close()
        d.stop()


def test_a_turn_whose_best_match_the_window_holds_recalls_nothing_and_resumes_bit_identical(
    tmp_path: Path,
) -> None:
    """Two chat paths, then `sinkd serve` killed with SIGKILL: a question that shares no word
    with the fact recalls it by its sentence vector alone; the next turn, whose best match the
    window still holds as that recalled copy, decodes nothing again and says why. Restarted, the
    session's logits are bit for bit those before the kill."""
    import os
    import signal

    from tests.support.daemons import serve_subprocess
    from tests.support.tokens import sha

    config = tmp_path / "sinkd.toml"
    config.write_text(f'[[tenants]]\nname = "alice"\ntoken_sha256 = "{sha("alice-token")}"\n')
    env = {**os.environ, "SINKD_CONFIG": str(config), "SINKD_STATE_DIR": str(tmp_path / "state"),
           "SINKD_N_CTX_SEQ": "256", "SINKD_MAX_SESSIONS": "2", "SINKD_HTTP": "off"}  # fmt: skip
    sock = tmp_path / "sinkd.sock"
    proc = serve_subprocess(sock, env)
    try:
        client = Client(f"unix:{sock}")
        h = client.create(**POLICY).handle

        def chat(message: str) -> pb.Done:
            request = pb.ChatRequest(handle=h, message=message, max_tokens=4)
            return list(client.s.Chat(request, metadata=ALICE))[-1].done

        chat("By the way. The wifi password is tulip42. Please carry on.")
        client.append(h, LONG[:1400])
        before = client.inspect(h).receipt.n_seen
        first = chat("What is the network passphrase?")  # no word of the fact
        assert first.recall.recalled, first.recall.note
        ids = {r.passage_id for r in first.recall.recalled}
        held = [p.text for p in client.memory(h, limit=1000).passages if p.passage_id in ids]
        assert any("tulip42" in t for t in held), first.recall.note
        seen = first.receipt.n_seen
        again = chat("What is the wifi password?")
        assert not again.recall.recalled
        assert "still in the window" in again.recall.note
        assert any(f"passage {i}," in again.recall.note for i in ids), again.recall.note
        # a question and answer of about the same length, without the copies (and their frames)
        copies = sum(r.stream_logical.end - r.stream_logical.start for r in first.recall.recalled)
        assert again.receipt.n_seen - seen <= (seen - before) - copies + 4
        logits = client.s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE)
        client.close()
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL

        proc = serve_subprocess(sock, env)
        client = Client(f"unix:{sock}")
        after = client.s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE)
        assert after.receipt.n_seen == again.receipt.n_seen
        assert list(after.receipt.recalled) == list(again.receipt.recalled)
        assert np.array_equal(
            np.frombuffer(after.logits, dtype="<f4"), np.frombuffer(logits.logits, dtype="<f4")
        )
        client.close()
    finally:
        proc.kill()
        proc.wait(30)


def test_a_chat_turn_that_asks_nothing_of_the_past_is_searched_by_words_alone(
    client: Client,
) -> None:
    """A request that neither asks a question nor speaks of an earlier turn is not embedded
    (its turn's first token does not wait for the query's vector); a question is."""
    from sinkd.daemon.runtime.recall.layer import WORDS_ALONE

    h = client.create(**POLICY).handle

    def chat(message: str) -> pb.Done:
        events = list(
            client.s.Chat(pb.ChatRequest(handle=h, message=message, max_tokens=4), metadata=ALICE)
        )
        return events[-1].done

    chat(f"Remember: the sentinel word is {SENTINEL}.")
    client.append(h, LONG[:1400])
    assert chat("Tell me about the weather.").recall.search == WORDS_ALONE
    assert chat("Explain how glass is made.").recall.search == WORDS_ALONE
    asked = chat("Which word was the sentinel")  # a question without its mark
    assert asked.recall.search == "bm25+dense" and asked.recall.recalled
