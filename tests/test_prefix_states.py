"""Prefix states on the fake engine: whose prefix serves whom, a side request's beginning kept once
it is seen twice, the bounds (least recently used of the owner holding the most goes first), the
content-free listing, a forget dropping the tenant's prefixes. The bits on the real model are
tests/test_prefixes.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sinkd.daemon.runtime.api import PolicyRequest, Receipt
from sinkd.daemon.runtime.loop.prefixes import SHARED
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from tests.support.services import fake_service

pytestmark = pytest.mark.unit

ALICE, BOB, ADMIN = Principal("alice"), Principal("bob"), Principal(None, admin=True)
WIDE = PolicyRequest(sinks=4, window=1000)
SYSTEM = "You are the operator's assistant. " * 6  # 204 bytes: tokens on the fake engine


def create(svc: SinkdService, who: Principal, system: str = SYSTEM) -> Receipt:
    return svc.create(who, WIDE, system_prompt=system)


def logits(svc: SinkdService, r: Receipt) -> np.ndarray:
    session = svc.registry.get(r.session_id)
    assert session is not None and session.last_logits is not None
    return np.array(session.last_logits)


def test_a_tenant_s_prefix_serves_it_alone_and_computes_what_a_read_does(tmp_path: Path) -> None:
    svc = fake_service(tmp_path, n_ctx_seq=1024)
    try:
        first = create(svc, ALICE)
        assert first.prefix_tokens == 0 and first.system_prompt_tokens > 64
        again = create(svc, ALICE)
        assert again.prefix_tokens == again.system_prompt_tokens  # nothing read again
        assert np.array_equal(logits(svc, again), logits(svc, first))
        other = create(svc, BOB)
        assert other.prefix_tokens == 0  # alice's prefix never serves bob
        # reading on after a restore is reading on after a read
        for r in (first, again):
            svc.append(ALICE, r.handle, "which host failed first?")
        assert np.array_equal(logits(svc, again), logits(svc, first))
        assert svc.metrics.count("prefix_hits") == 1
    finally:
        svc.stop()


def test_a_declared_shared_system_prompt_serves_every_tenant(tmp_path: Path) -> None:
    svc = fake_service(tmp_path, n_ctx_seq=1024, shared_system_prompts=[SYSTEM])
    try:
        create(svc, ALICE)
        assert create(svc, BOB).prefix_tokens > 64  # the operator's prompt: anyone's
        (held,) = svc.list_prefixes(BOB)
        assert held.shared and held.tenant == SHARED and held.hits == 1
        own = "Only alice's rules apply here, each of them. " * 3
        create(svc, ALICE, own)
        assert create(svc, BOB, own).prefix_tokens == 0  # not declared: alice's alone
        assert {p.tenant for p in svc.list_prefixes(BOB)} == {SHARED, "bob"}  # bob read it
        assert {p.tenant for p in svc.list_prefixes(ALICE)} == {SHARED, "alice"}
    finally:
        svc.stop()


TASK = "### Task: suggest three follow-up questions for the chat below, as JSON. " * 4


def side_request(svc: SinkdService, chat: str) -> Receipt:
    r = svc.create(ALICE, WIDE)
    return svc.append(ALICE, r.handle, TASK + chat).receipt


def test_a_first_prompt_is_kept_and_the_next_alike_starts_from_the_part_it_shares(
    tmp_path: Path,
) -> None:
    """A chat UI's side requests: the same task instructions, then each its own chat. Each keeps
    its prompt; the next restores the part it shares with the one it shares most with (the
    longer prefix's cells past that removed) and reads the rest."""
    svc = fake_service(tmp_path, n_ctx_seq=1024)
    try:
        first = side_request(svc, "USER: hi\nASSISTANT: hello")
        assert first.prefix_tokens == 0
        (kept,) = svc.list_prefixes(ALICE)
        assert kept.tokens == first.n_seen
        second = side_request(svc, "USER: how are disks?\nASSISTANT: full")
        assert second.prefix_tokens == len(TASK + "USER: h")  # what it shares with the first
        third = side_request(svc, "USER: and the logs?\nASSISTANT: rotated")
        assert third.prefix_tokens == len(TASK + "USER: ")
        assert len(svc.list_prefixes(ALICE)) == 1  # they add < prefix_min_tokens to it: not kept
    finally:
        svc.stop()


def test_prefixes_are_bounded_and_the_owner_holding_most_gives_way(tmp_path: Path) -> None:
    svc = fake_service(tmp_path, n_ctx_seq=1024)
    try:
        systems = [f"Prompt {i}: " + "you are a careful log reader. " * 6 for i in range(4)]
        create(svc, BOB, systems[0])
        (bobs,) = svc.list_prefixes(BOB)
        svc.prefixes.shelf.ram_bytes = 3 * bobs.ram_bytes + bobs.ram_bytes // 2  # three fit
        for system in systems[1:]:
            create(svc, ALICE, system)
        held = svc.list_prefixes(ADMIN)
        assert sum(p.ram_bytes for p in held) <= svc.prefixes.shelf.ram_bytes
        assert [p.tenant for p in held].count("bob") == 1  # alice's oldest went, not bob's
        dropped = svc.metrics.registry.get_sample_value(
            "sinkd_prefix_drops_total", {"reason": "ram"}
        )
        assert dropped == 1
        assert create(svc, ALICE, systems[1]).prefix_tokens == 0  # it was the one dropped
    finally:
        svc.stop()


def test_the_listing_is_content_free_and_a_forget_drops_the_tenant_s_prefixes(
    tmp_path: Path,
) -> None:
    svc = fake_service(tmp_path, n_ctx_seq=1024)
    try:
        create(svc, ALICE)
        create(svc, BOB)
        held = svc.list_prefixes(ADMIN)
        assert {p.tenant for p in held} == {"alice", "bob"}
        for p in held:
            assert len(p.key) == 64 and int(p.key, 16) >= 0
            assert SYSTEM[:20] not in repr(p)
        assert [p.tenant for p in svc.list_prefixes(ALICE)] == ["alice"]
        # alice's text evicted into memory, then forgotten: her prefixes go, bob's stay
        r = svc.create(ALICE, PolicyRequest(sinks=4, window=32))
        svc.append(ALICE, r.handle, "the disk on node-3 filled at noon. " * 4)
        (passage, *_) = svc.memory.memory(ALICE, r.handle)
        svc.memory.forget(ALICE, r.handle, passage_id=passage.passage_id)
        assert not svc.list_prefixes(ALICE)
        assert [p.tenant for p in svc.list_prefixes(ADMIN)] == ["bob"]
    finally:
        svc.stop()


def test_a_tenant_s_prefix_goes_with_the_last_session_holding_it(tmp_path: Path) -> None:
    """Close and reset remove everything of a session, its prompts too: a prefix stays while a
    live session of the tenant holds it (read or restored), and goes with the last one."""
    svc = fake_service(tmp_path, n_ctx_seq=1024, shared_system_prompts=["Shared rules. " * 8])
    try:
        first = create(svc, ALICE)
        second = create(svc, ALICE)  # restored: it holds the prefix too
        shared = create(svc, ALICE, "Shared rules. " * 8)
        svc.close(ALICE, first.handle)
        assert {p.shared for p in svc.list_prefixes(ALICE)} == {False, True}  # second holds it
        svc.reset(ALICE, second.handle)
        assert [p.shared for p in svc.list_prefixes(ALICE)] == [True]  # the operator's text stays
        svc.close(ALICE, shared.handle)
        assert len(svc.list_prefixes(ALICE)) == 1
        released = svc.metrics.registry.get_sample_value(
            "sinkd_prefix_drops_total", {"reason": "released"}
        )
        assert released == 1
    finally:
        svc.stop()
