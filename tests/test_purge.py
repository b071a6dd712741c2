"""A purge that knows it purged: what a deletion removed leaves every file of the state directory
before its reply, also while another connection reads journal.db (an operator's `sqlite3` shell, a
backup): the reply waits for that reader to let go, within `purge_wait_s`. Past that the reply says
the purge is owed, the metrics and the log say so, and the text leaves once the reader lets go, or
at the next start. Every deletion path is scanned. On the fake engine: what is tested is the bytes
on disk, not the model's numbers (the real model's paths: test_forgetting_files.py,
test_recall.py, test_memory_across_model.py, test_http.py)."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sinkd.daemon import failpoints
from sinkd.daemon.runtime.api import (
    CancelToken,
    ChatRequest,
    GenerationOptions,
    Handle,
    KeptSelection,
    PolicyRequest,
    Turn,
)
from sinkd.daemon.runtime.conversations.completions import MAX_HELD, CompletionRequest
from sinkd.daemon.runtime.conversations.responses import ResponseRequest, new_response_id
from sinkd.daemon.runtime.resume import Unrestorable
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import FailedPrecondition
from tests.support.disk import holders, token_needles
from tests.support.services import fake_engine_of, fake_service
from tests.support.texts import TEXT

pytestmark = pytest.mark.unit

ALICE = Principal("alice")
WORD = "ocelot"
SECRET = f" The vault code is marmalade {WORD} quasar 7391. "
FILLER = (TEXT + " ") * 2
SMALL = PolicyRequest(sinks=4, window=64)
WAIT_S = 30.0  # every wait ends; none is reached unless something is broken


def durable(tmp: Path, **kw: Any) -> SinkdService:
    return fake_service(tmp, **{"durable": True, "purge_interval_s": 0, "max_sessions": 32, **kw})


def state_of(svc: SinkdService) -> Path:
    return svc.settings.state_dir


def needles(svc: SinkdService) -> list[bytes | str]:
    """The secret as text and as the fake engine's token ids."""
    return [WORD, *token_needles(svc.scheduler.engine.vocab.tokenize(WORD))]  # type: ignore[union-attr]


def reader(svc: SinkdService) -> sqlite3.Connection:
    """Another program reading journal.db: its open read transaction holds a snapshot that the
    write-ahead log serves, so the log cannot be emptied until it ends."""
    db = sqlite3.connect(
        state_of(svc) / "journal.db", isolation_level=None, check_same_thread=False
    )
    db.execute("BEGIN")
    db.execute("SELECT COUNT(*) FROM chunks").fetchone()
    return db


def sample(svc: SinkdService, name: str) -> float:
    return svc.metrics.registry.get_sample_value(name) or 0.0


def owed_mark(svc: SinkdService) -> str | None:
    with sqlite3.connect(state_of(svc) / "journal.db") as db:
        row = db.execute("SELECT value FROM meta WHERE key='purge_owed'").fetchone()
    return None if row is None else str(row[0])


def with_secret(svc: SinkdService) -> Handle:
    """A session whose window and journal hold the secret."""
    h = svc.create(ALICE, SMALL).handle
    svc.append(ALICE, h, FILLER[:40] + SECRET)
    return h


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[SinkdService]:
    s = durable(tmp_path, purge_wait_s=WAIT_S)
    yield s
    s.stop()


def test_a_close_waits_for_a_reader_of_the_journal_and_leaves_no_trace(
    svc: SinkdService,
) -> None:
    """The reader lets go only once the close's reply waits for the purge: without that wait,
    or without the purge tried again, the secret would still be on disk at the reply."""
    h = with_secret(svc)
    assert holders(state_of(svc), needles(svc)), "the test plants the secret where it is found"
    db = reader(svc)
    released = threading.Event()

    def let_go() -> None:  # the reply's thread, waiting for the purge
        if not released.is_set():
            db.execute("COMMIT")
            released.set()

    try:
        with failpoints.armed("purge-wait", let_go):
            erased = svc.close(ALICE, h)
    finally:
        db.close()
    assert released.is_set()  # the first truncation was refused: the reply waited
    assert sample(svc, "sinkd_purge_refusals_total") >= 1
    assert not erased.purge_owed
    assert holders(state_of(svc), needles(svc)) == []
    assert owed_mark(svc) is None


def test_a_reader_past_the_wait_leaves_the_purge_owed_and_said_until_it_lets_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    svc = durable(tmp_path, purge_wait_s=0)  # the reader outlasts any wait: none is made
    try:
        h = with_secret(svc)
        db = reader(svc)
        purges = sample(svc, "sinkd_purges_total")
        with caplog.at_level(logging.INFO, logger="sinkd.durability"):
            erased = svc.close(ALICE, h)
            assert erased.purge_owed  # never claimed gone
            assert holders(state_of(svc), needles(svc)) == ["journal.db-wal"]
            assert owed_mark(svc) is not None  # journalled: a start would pay it
            assert sample(svc, "sinkd_purge_held_seconds") > 0
            assert any("could not be truncated" in r.message for r in caplog.records)
            assert all(WORD not in r.getMessage() for r in caplog.records)
            db.execute("COMMIT")
            db.close()
            durability = svc.durability
            assert durability is not None
            assert durability.purged(durability.purge.asked, WAIT_S)  # tried again: paid
        assert holders(state_of(svc), needles(svc)) == []
        assert sample(svc, "sinkd_purges_total") == purges + 1
        assert sample(svc, "sinkd_purge_held_seconds") == 0
        assert owed_mark(svc) is None
        assert any("owed purge is done" in r.message for r in caplog.records)
    finally:
        svc.stop()


def test_a_reply_waits_out_the_merge_interval_rather_than_claim_the_text_gone(
    tmp_path: Path,
) -> None:
    """Two closes of sessions with a memory, one right after the other: the second's index
    merge waits out `purge_interval_s`, and its reply with it (whatever this machine's speed)."""
    svc = durable(tmp_path, purge_wait_s=WAIT_S, purge_interval_s=1.0)
    try:
        first, second = (svc.create(ALICE, SMALL).handle for _ in range(2))
        for h in (first, second):
            svc.append(ALICE, h, FILLER[:40] + SECRET + FILLER)  # evicted into its memory
        assert holders(state_of(svc), needles(svc))
        assert not svc.close(ALICE, first).purge_owed
        assert not svc.close(ALICE, second).purge_owed  # within the interval of the first
        assert holders(state_of(svc), needles(svc)) == []
    finally:
        svc.stop()


def test_a_purge_owed_at_a_stop_is_paid_at_the_next_start(tmp_path: Path) -> None:
    """The daemon stops while a reader holds the log (its stop's purge refused too); the reader
    is still open when the daemon starts again, lets go, and the start's purge is tried again."""
    svc = durable(tmp_path, purge_wait_s=0)
    scanned = needles(svc)
    db = again = None
    try:
        h = with_secret(svc)
        db = reader(svc)
        assert svc.close(ALICE, h).purge_owed
        svc.stop()  # its last purge refused: the mark stays in the journal
        assert owed_mark(svc) is not None
        assert "journal.db-wal" in holders(state_of(svc), scanned)
        db.execute("COMMIT")  # nothing read it since the stop: the log is still there
        again = durable(tmp_path, purge_wait_s=0)  # the start pays it
        assert holders(state_of(svc), scanned) == []
        assert owed_mark(again) is None
    finally:
        if db is not None:
            db.close()
        for s in (svc, again):
            if s is not None:
                s.stop()


# --- every path that deletes the owner's content: the files before and after ---


def _forget_passages(svc: SinkdService) -> None:
    h = svc.create(ALICE, SMALL).handle
    svc.append(ALICE, h, FILLER[:40] + SECRET + FILLER)  # evicted into the memory
    assert holders(state_of(svc), needles(svc))
    for p in svc.memory.memory(ALICE, h, search=WORD):
        assert not svc.memory.forget(ALICE, h, passage_id=p.passage_id).purge_owed


def _forget_a_range(svc: SinkdService) -> None:
    h = svc.create(ALICE, SMALL).handle
    svc.append(ALICE, h, FILLER[:40] + SECRET + FILLER)
    assert holders(state_of(svc), needles(svc))
    assert not svc.memory.forget(ALICE, h, logical=(0, 400)).purge_owed


def _forget_a_speaker(svc: SinkdService) -> None:
    h = svc.create(ALICE, SMALL).handle
    list(svc.chat(ALICE, h, ChatRequest(SECRET, GenerationOptions(2))))
    svc.append(ALICE, h, FILLER)  # the user's turn evicted into the memory
    assert holders(state_of(svc), needles(svc))
    assert not svc.memory.forget(ALICE, h, speaker="user").purge_owed


def _forget_from_the_tenant_memory(svc: SinkdService) -> None:
    h = svc.create(ALICE, SMALL).handle
    list(
        svc.chat(
            ALICE, h, ChatRequest("Remember: my locker code is" + SECRET, GenerationOptions(2))
        )
    )
    svc.close(ALICE, h)  # the conversation goes; what it gave the tenant's memory stays
    kept = svc.across.listing(ALICE, KeptSelection(), WORD)
    assert kept and holders(state_of(svc), needles(svc))
    for p in kept:
        assert not svc.across.forget(ALICE, KeptSelection(passage_id=p.passage_id)).purge_owed


def _reset(svc: SinkdService) -> None:
    h = with_secret(svc)
    assert holders(state_of(svc), needles(svc))
    receipt, erased = svc.reset(ALICE, h)
    assert not erased.purge_owed
    svc.append(ALICE, receipt.handle, FILLER[:80])


def _close(svc: SinkdService) -> None:
    h = with_secret(svc)
    assert holders(state_of(svc), needles(svc))
    assert not svc.close(ALICE, h).purge_owed


def _delete_a_response(svc: SinkdService) -> list[bytes | str]:
    request = ResponseRequest(SECRET, (Turn("user", "Hello there."),), options=GenerationOptions(2))
    response_id = new_response_id()
    _, events = svc.responses.respond(ALICE, request, response_id)
    list(events)
    assert holders(state_of(svc), [WORD])  # its instructions, in the stored record
    assert not svc.responses.delete(ALICE, response_id).purge_owed
    return [WORD]  # its conversation stays (docs/security.md): the record's text is what goes


def _end_a_completion_session(svc: SinkdService) -> None:
    fake_engine_of(svc).markov = 2  # its toy model then never ends a reply: each session is held

    def complete(prompt: str) -> None:
        _, events = svc.completions.complete(
            ALICE, CompletionRequest(prompt, GenerationOptions(2)), CancelToken(), lambda sid: None
        )
        list(events)

    complete(SECRET + FILLER[:40])
    assert holders(state_of(svc), needles(svc))
    for i in range(MAX_HELD):  # past its bound the least recent session closes: the secret's
        complete(f"Request {i:02d}: " + FILLER[:40])
    durability = svc.durability
    assert durability is not None
    assert durability.purged(durability.purge.asked, WAIT_S)  # no reply waits on this close


def _remove_a_prefix_state(svc: SinkdService) -> None:
    r = svc.create(ALICE, PolicyRequest(sinks=4, window=1000), system_prompt=SECRET * 4)
    assert svc.list_prefixes(ALICE) and any(
        p.startswith("prefixes/") for p in holders(state_of(svc), needles(svc))
    )
    assert not svc.close(ALICE, r.handle).purge_owed  # the last session holding it


def _refuse_an_import_halfway(svc: SinkdService, source: SinkdService) -> None:
    h = with_secret(source)
    data = b"".join(source.moves.export(ALICE, h))
    mover = svc.moves.mover
    assert mover is not None

    def refuse(*args: Any) -> Any:  # the rows are written; the session cannot be restored
        raise Unrestorable("refused for the test, after its rows were written")

    mover.resumer.adopt = refuse  # type: ignore[method-assign]
    with pytest.raises(FailedPrecondition, match="refused for the test"):
        svc.moves.import_(ALICE, data)
    durability = svc.durability
    assert durability is not None
    assert durability.purged(durability.purge.asked, WAIT_S)


PATHS: dict[str, Callable[..., list[bytes | str] | None]] = {
    "forget a passage": _forget_passages,
    "forget a range": _forget_a_range,
    "forget a speaker": _forget_a_speaker,
    "forget from the tenant's memory": _forget_from_the_tenant_memory,
    "reset": _reset,
    "close": _close,
    "delete a response": _delete_a_response,
    "end a completion session": _end_a_completion_session,
    "remove a prefix state": _remove_a_prefix_state,
    "refuse an import halfway": _refuse_an_import_halfway,
}


@pytest.mark.parametrize("path", list(PATHS))
def test_each_deletion_leaves_no_file_holding_the_text(tmp_path: Path, path: str) -> None:
    svc = durable(
        tmp_path / "node",
        purge_wait_s=WAIT_S,
        memory_across_conversations=path == "forget from the tenant's memory",
        n_ctx_seq=1024,
        prefix_min_tokens=16,
    )
    source = (
        durable(tmp_path / "source", n_ctx_seq=1024) if path == "refuse an import halfway" else None
    )
    try:
        scanned = needles(svc)
        found = PATHS[path](svc, source) if source is not None else PATHS[path](svc)
        assert holders(state_of(svc), found or scanned) == []
        assert owed_mark(svc) is None
    finally:
        svc.stop()
        if source is not None:
            source.stop()
