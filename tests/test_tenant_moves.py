"""A tenant moved whole between two daemons, on the fake engine (the model's numbers play no part):
its sessions, its memory across conversations (provenance and corrections' links) and its prefix
states arrive in one transaction; the node it left answers none of its calls and keeps no file
holding any of it; what cannot be imported whole is refused with the reason and leaves nothing.
The real model, a kill -9 at each step of a move and the backup round trip:
tests/test_tenant_moves_model.py; behind HAProxy: tests/test_deployment.py."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sinkd.cli import moves
from sinkd.daemon import failpoints
from sinkd.daemon.runtime.api import (
    ChatRequest,
    DigestOptions,
    Done,
    GenerationOptions,
    Handle,
    KeptSelection,
    PolicyRequest,
)
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.daemon.store import archive
from sinkd.daemon.store.archive import Archive
from sinkd.errors import CorruptArchive, FailedPrecondition, SessionElsewhere
from tests.support.disk import holders, token_needles
from tests.support.services import fake_service

pytestmark = pytest.mark.unit

ALICE, BOB, ADMIN = Principal("alice"), Principal("bob"), Principal(None, admin=True)
SYSTEM = "You answer for the facilities team, briefly and exactly. " * 3
FACT = "My locker code is 7351 and my cat is called Mr Whiskers."
WORD = "Whiskers"


def node(tmp: Path, **kw: Any) -> SinkdService:
    return fake_service(
        tmp,
        **{"durable": True, "memory_across_conversations": True, "n_ctx_seq": 1024,
           "max_sessions": 4, "max_parked_sessions": 8, "prefix_min_tokens": 16,
           "purge_interval_s": 0, **kw},
    )  # fmt: skip


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[SinkdService, SinkdService]]:
    a, b = node(tmp_path / "a"), node(tmp_path / "b")
    yield a, b
    a.stop()
    b.stop()


def chat(svc: SinkdService, who: Principal, h: Handle, text: str) -> Done:
    done = [
        e for e in svc.chat(who, h, ChatRequest(text, GenerationOptions(4))) if isinstance(e, Done)
    ]
    return done[0]


def settled(svc: SinkdService, who: Principal, fact: str = FACT) -> tuple[Handle, np.ndarray]:
    """A conversation that told the tenant's memory a fact, and a second one open beside it (its
    system prompt restored from the first's prefix state)."""
    first = svc.create(who, PolicyRequest(sinks=4, window=400), system_prompt=SYSTEM).handle
    chat(svc, who, first, fact)
    second = svc.create(who, PolicyRequest(sinks=4, window=400), system_prompt=SYSTEM)
    assert second.prefix_tokens > 0
    session = svc.registry.get(first.session_id)
    assert session is not None and session.last_logits is not None
    return first, np.array(session.last_logits)


def move(a: SinkdService, b: SinkdService, tenant: str, move_id: str = "m1") -> Any:
    a.tenants.mark(ADMIN, tenant, "leaving", move_id, "b")
    data = b"".join(a.tenants.export(ADMIN, tenant, move_id))
    got = b.tenants.import_(ADMIN, data)
    return got, a.tenants.release(ADMIN, tenant, move_id)


def test_a_tenant_moves_whole_and_leaves_nothing_behind(
    nodes: tuple[SinkdService, SinkdService],
) -> None:
    a, b = nodes
    first, logits = settled(a, ALICE)
    settled(a, BOB, "My desk is on floor 3, next to the window.")  # another tenant: it stays
    (kept,) = a.across.listing(ALICE, KeptSelection())
    assert kept.conversation == first.session_id
    state_a = a.settings.state_dir
    ids = a.scheduler.engine.vocab.tokenize(FACT)  # type: ignore[union-attr]
    assert holders(state_a, [WORD, *token_needles(ids)])

    got, released = move(a, b, "alice")
    assert (got.tenant, got.sessions, got.passages, got.prefixes) == ("alice", 2, 1, 2)
    assert released.count >= 3 and not released.purge_owed
    # on b: the same handle and logits, the memory with its provenance, the prefix serving
    session = b.registry.get(first.session_id)
    assert session is not None and session.parked and np.array_equal(session.last_logits, logits)
    (there,) = b.across.listing(ALICE, KeptSelection())
    assert (there.text, there.conversation, there.created_unix_time) == (
        kept.text, kept.conversation, kept.created_unix_time,
    )  # fmt: skip
    assert b.create(ALICE, PolicyRequest(sinks=4, window=400), system_prompt=SYSTEM).prefix_tokens
    done = chat(b, ALICE, first, "What is my locker code?")  # restored from its snapshot
    assert done.reason and b.registry.get(first.session_id).seq_id >= 0  # type: ignore[union-attr]
    # on a: nothing of alice's in any file; bob's there still; alice refused, bob served
    assert holders(state_a, [WORD, *token_needles(ids)]) == []
    assert a.across.listing(BOB, KeptSelection())
    held, _ = a.tenants.held(ADMIN)
    assert [(h.tenant, h.sessions, h.passages, h.prefixes, h.state) for h in held] == [
        ("alice", 0, 0, 0, "gone"),
        ("bob", 2, 1, 2, ""),
    ]
    with pytest.raises(SessionElsewhere, match="alice is gone"):
        a.tenants.check_here(ALICE)
    a.tenants.check_here(BOB)
    assert b.tenants.held(ADMIN, "m1")[1] == "alice"  # the move arrived there, by its id


def test_a_correction_keeps_its_link_and_a_move_back_brings_what_changed(
    nodes: tuple[SinkdService, SinkdService],
) -> None:
    """Corrections' links are passage numbers: carried as they were. Moved back, the tenant
    brings what it forgot meanwhile: forgotten there, forgotten here."""
    a, b = nodes
    settled(a, ALICE)
    later = a.create(ALICE, PolicyRequest(sinks=4, window=400)).handle
    chat(a, ALICE, later, "Correction, that changed: my cat is called Felix now.")
    numbers = {p.passage_id: p.text for p in a.across.listing(ALICE, KeptSelection())}
    store = a.recall.store.across
    a.scheduler.call(
        lambda e: store.db.execute(  # the link the embedder would make
            "UPDATE passages SET corrects=? WHERE text LIKE 'Correction%'", (min(numbers),)
        )
    )
    a.scheduler.call(lambda e: a.durability.commit())  # type: ignore[union-attr]
    move(a, b, "alice", "m1")
    links = b.scheduler.call(
        lambda e: b.recall.store.across.corrections_of("alice", [min(numbers)])
    )
    assert list(links) == [min(numbers)]
    b.across.forget(ALICE, KeptSelection(passage_id=min(numbers)))  # the statement it corrects
    b.tenants.mark(ADMIN, "alice", "leaving", "m2", "a")
    data = b"".join(b.tenants.export(ADMIN, "alice", "m2"))
    a.tenants.import_(ADMIN, data)  # clears alice's gone mark on a
    b.tenants.release(ADMIN, "alice", "m2")
    a.tenants.check_here(ALICE)
    assert [p.text for p in a.across.listing(ALICE, KeptSelection())] == [
        "Correction, that changed: my cat is called Felix now."
    ]


def test_what_cannot_be_imported_whole_is_refused_and_leaves_nothing(
    nodes: tuple[SinkdService, SinkdService], tmp_path: Path
) -> None:
    a, b = nodes
    settled(a, ALICE)
    with pytest.raises(FailedPrecondition, match="not marked leaving"):
        a.tenants.export(ADMIN, "alice", "m9")  # a move's export needs the tenant's mark
    with pytest.raises(FailedPrecondition, match="not marked leaving"):
        a.tenants.release(ADMIN, "alice", "m9")  # nothing is deleted without a move
    a.tenants.mark(ADMIN, "alice", "leaving", "m1", "b")
    data = b"".join(a.tenants.export(ADMIN, "alice", "m1"))
    damaged = data[:200] + bytes([data[200] ^ 1]) + data[201:]
    with pytest.raises(CorruptArchive):
        b.tenants.import_(ADMIN, damaged)
    made = archive.unpack(data)  # another backend's, re-packed with fresh checksums
    config = {**made.manifest["config"], "backend": "Vulkan0 (a GPU): 31/31 layers"}
    other = b"".join(archive.pack(Archive({**made.manifest, "config": config}, made.members)))
    with pytest.raises(FailedPrecondition, match="backend was 'Vulkan0"):
        b.tenants.import_(ADMIN, other)
    assert b.tenants.held(ADMIN) == ([], "")  # none of the refused archives'
    b.tenants.import_(ADMIN, data)
    with pytest.raises(FailedPrecondition, match="already on this node"):
        b.tenants.import_(ADMIN, data)  # twice: refused
    held_b = {h.tenant: (h.sessions, h.passages) for h in b.tenants.held(ADMIN)[0]}
    assert held_b == {"alice": (2, 1)}
    a.tenants.mark(ADMIN, "alice", "", "", "")  # the move abandoned: alice served on a again
    a.tenants.check_here(ALICE)


def test_a_tenant_served_on_two_nodes_is_merged_into_one_memory(
    nodes: tuple[SinkdService, SinkdService],
) -> None:
    """Its node down a while, alice was served on b: she told it something there. Moved back
    together: b's sessions beside a's, one memory numbered through, each passage with its own
    conversation; both found by a search, neither's number taken twice; a later fact follows."""
    a, b = nodes
    first, _ = settled(a, ALICE)
    other, _ = settled(b, ALICE, "My desk is on floor 3, next to the window.")
    move(a, b, "alice")
    kept = b.across.listing(ALICE, KeptSelection())
    assert sorted(p.conversation for p in kept) == sorted([first.session_id, other.session_id])
    assert len({p.passage_id for p in kept}) == 2
    assert [h.sessions for h in b.tenants.held(ADMIN)[0]] == [4]
    (found,) = [p for p in b.across.listing(ALICE, KeptSelection(), search="locker code")]
    assert found.conversation == first.session_id
    third = b.create(ALICE, PolicyRequest(sinks=4, window=400)).handle
    chat(b, ALICE, third, "My bike is the red one in rack 12.")
    numbers = [p.passage_id for p in b.across.listing(ALICE, KeptSelection())]
    assert len(numbers) == 3 == len(set(numbers))


def test_an_import_cut_after_its_rows_are_written_commits_none_of_them(
    nodes: tuple[SinkdService, SinkdService],
) -> None:
    """The import's transaction is one: a failure after every row is written (here, at the
    failpoint a kill -9 test uses) leaves no row committed, no session, no memory, no file."""
    a, b = nodes
    settled(a, ALICE)
    a.tenants.mark(ADMIN, "alice", "leaving", "m1", "b")
    data = b"".join(a.tenants.export(ADMIN, "alice", "m1"))

    def fail() -> None:
        raise RuntimeError("cut")

    with failpoints.armed("tenant-import-written", fail), pytest.raises(RuntimeError):
        b.tenants.import_(ADMIN, data)
    journal = b.settings.state_dir / "journal.db"  # what another connection sees: committed
    with contextlib.closing(sqlite3.connect(journal)) as db:
        assert db.execute("SELECT count(*) FROM sessions").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM passages").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM tenant_arrivals").fetchone() == (0,)
    assert b.tenants.held(ADMIN) == ([], "")
    assert not [p for p in (b.settings.state_dir / "snapshots").rglob("*") if p.is_file()]
    got = b.tenants.import_(ADMIN, data)  # whole, the second time
    assert (got.sessions, got.passages) == (2, 1)


def test_a_mark_is_journalled_and_refuses_every_call_of_its_tenant(tmp_path: Path) -> None:
    a = node(tmp_path / "a")
    try:
        a.tenants.mark(ADMIN, "alice", "arriving", "", "n1")
        with pytest.raises(SessionElsewhere, match="alice is arriving"):
            a.tenants.check_here(ALICE)
    finally:
        a.stop()
    a = node(tmp_path / "a")  # a restart keeps it
    try:
        with pytest.raises(SessionElsewhere):
            a.tenants.check_here(ALICE)
        a.tenants.mark(ADMIN, "alice", "", "", "")
        a.tenants.check_here(ALICE)
    finally:
        a.stop()


class Direct:
    """A node's admin calls as cli/moves.py makes them, straight to its service."""

    def __init__(self, svc: SinkdService) -> None:
        self.svc = svc

    def held_tenants(self, arrived: str = "") -> Any:
        return self.svc.tenants.held(ADMIN, arrived)

    def mark_tenant(self, tenant: str, state: str, move_id: str = "", peer: str = "") -> None:
        self.svc.tenants.mark(ADMIN, tenant, state, move_id, peer)

    def export_tenant(self, tenant: str, move_id: str = "") -> Any:
        return iter(self.svc.tenants.export(ADMIN, tenant, move_id))

    def import_tenant(self, data: bytes) -> Any:
        return self.svc.tenants.import_(ADMIN, data)

    def release_tenant(self, tenant: str, move_id: str) -> Any:
        return self.svc.tenants.release(ADMIN, tenant, move_id)


def test_the_resolver_merges_a_tenant_served_on_two_nodes_and_clears_its_marks(
    tmp_path: Path,
) -> None:
    """alice was served on a and on b (her node down a while); the ring sends her to c, where a
    drain marked her arriving. The resolver brings both parts to c, leaves no mark behind, and
    does not touch bob, who is where the ring sends him."""
    svc = {n: node(tmp_path / n) for n in "abc"}
    try:
        settled(svc["a"], ALICE)
        settled(svc["b"], ALICE, "My desk is on floor 3, next to the window.")
        settled(svc["a"], BOB, "My badge number is 5521.")
        svc["c"].tenants.mark(ADMIN, "alice", "arriving", "", "a")
        ring = {"alice": "c", "bob": "a"}
        done = moves.resolve(lambda n: Direct(svc[n]), list("abc"), ring.__getitem__)
        assert [(m.tenant, m.source, m.target, m.what, m.error) for m in done] == [
            ("alice", "a", "c", "moved", ""),
            ("alice", "b", "c", "moved", ""),
            ("alice", "a", "a", "cleared", ""),
            ("alice", "b", "b", "cleared", ""),
        ]
        held = {n: [(h.tenant, h.sessions, h.passages, h.state) for h in s.tenants.held(ADMIN)[0]]
                for n, s in svc.items()}  # fmt: skip
        assert held == {"a": [("bob", 2, 1, "")], "b": [], "c": [("alice", 4, 2, "")]}
        assert moves.resolve(lambda n: Direct(svc[n]), list("abc"), ring.__getitem__) == []
    finally:
        for s in svc.values():
            s.stop()


def test_a_tenant_s_narrated_streams_move_with_it(
    nodes: tuple[SinkdService, SinkdService],
) -> None:
    """Its streams' state and intervals arrive whole: the next lines continue on the new node
    (line numbers, known templates); the old node keeps none and another tenant's stays."""
    a, b = nodes
    lines = [f"2026-12-07T02:00:{i % 60:02d} api INFO request {i} served" for i in range(450)]
    a.narrated.feed(ALICE, "web", lines[:250], options=DigestOptions(every_lines=100))
    a.narrated.feed(BOB, "web", lines[:120], options=DigestOptions(every_lines=100))
    before = a.narrated.history(ALICE, "web")
    move(a, b, "alice")
    assert b.narrated.history(ALICE, "web") == before
    fed = b.narrated.feed(ALICE, "web", lines[250:], close=True)
    assert fed.lines == 450 and fed.closed[0].first_line == 201
    assert not any(
        json.loads(i.record_json)["facts"]["new"] for i in fed.closed
    )  # its templates were known
    with pytest.raises(SessionElsewhere):
        a.tenants.check_here(ALICE)
    assert a.narrated.streams(BOB)[0].lines == 120
    db = sqlite3.connect(a.settings.state_dir / "journal.db")
    assert db.execute("SELECT count(*) FROM narrated_streams WHERE tenant='alice'").fetchone() == (
        0,
    )
    assert db.execute(
        "SELECT count(*) FROM narrated_intervals WHERE tenant='alice'"
    ).fetchone() == (0,)
    db.close()


def test_a_call_past_the_edge_when_its_tenant_is_marked_leaving_changes_nothing(
    nodes: tuple[SinkdService, SinkdService],
) -> None:
    """The edges refuse a marked tenant's calls; a call that passed that check just before the
    mark reaches the engine thread after it. There every write checks the mark again, so such an
    append, chat, remember or forget is refused (UNAVAILABLE: retry on the node it moved to) and
    the move's export misses nothing; a session, a fork, a reset or a close likewise. Once the
    mark is cleared they work."""
    a, _ = nodes
    first, _ = settled(a, ALICE)
    session = a.registry.get(first.session_id)
    assert session is not None
    seen, sessions = a.receipt(session).n_seen, len(a.registry.of_tenant("alice"))
    kept = a.across.listing(ALICE, KeptSelection())
    a.tenants.mark(ADMIN, "alice", "leaving", "m1", "b")
    past_the_edge = [
        lambda: a.append(ALICE, first, " and more"),
        lambda: chat(a, ALICE, first, "Anything else?"),
        lambda: a.across.remember(ALICE, "My bike is blue."),
        lambda: a.across.forget(ALICE, KeptSelection(conversation=first.session_id)),
        lambda: a.memory.forget(ALICE, first, passage_id=kept[0].passage_id),
        lambda: a.create(ALICE, PolicyRequest(sinks=4, window=400), system_prompt=SYSTEM),
        lambda: a.create(ALICE, PolicyRequest(sinks=4, window=400)),
        lambda: a.fork(ALICE, first),
        lambda: a.reset(ALICE, first),
        lambda: a.close(ALICE, first),
    ]
    for call in past_the_edge:
        with pytest.raises(SessionElsewhere):
            call()
    assert a.across.listing(ALICE, KeptSelection()) == kept
    assert a.receipt(session).n_seen == seen
    assert len(a.registry.of_tenant("alice")) == sessions
    a.tenants.mark(ADMIN, "alice", "", "", "")
    assert a.append(ALICE, first, " and more").appended > 0
    assert a.across.remember(ALICE, "My bike is blue.")
