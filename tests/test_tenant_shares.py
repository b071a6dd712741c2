"""One tenant cannot take the daemon, on the fake engine: each tenant's share of the open sessions
(a reserve kept for it, a cap of its own), of the state directory's bytes, and of stored
responses; refusals that name the tenant's own limit and use; a resume never refused; what the
admin reads. The wire (gRPC, HTTP, the real model) is tests/test_tenant_limits.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sinkd.daemon.runtime.api import GenerationOptions, PolicyRequest, SamplingRequest, TokenEvent
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import PermissionDenied, SessionLimit, TenantLimit
from tests.support.services import fake_service
from tests.support.tokens import sha

pytestmark = pytest.mark.unit
ALICE, BOB, ADMIN = Principal("alice"), Principal("bob"), Principal(None, admin=True)
POLICY = PolicyRequest(name="sink", sinks=4, window=200)
GREEDY = GenerationOptions(6, sampling=SamplingRequest(temperature=0.0))


def tenants(**overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """The test settings' two tenants, with `overrides` per name."""
    return [
        {"name": n, "token_sha256": sha(f"{n}-token"), **overrides.get(n, {})}
        for n in ("alice", "bob")
    ]


def served(service: SinkdService, who: Principal) -> str:
    """A new session of `who`: appended to and answered."""
    h = service.create(who, POLICY).handle
    service.append(who, h, "Hello there, how are you today?", timeout=20)
    return "".join(
        e.text for e in service.generate(who, h, GREEDY, timeout=20) if isinstance(e, TokenEvent)
    )


def usage_of(service: SinkdService, tenant: str) -> Any:
    return next(t for t in service.reads.stats(ADMIN).tenants if t.tenant == tenant)


def test_a_tenant_opening_sessions_in_a_loop_leaves_another_its_reserve(tmp_path: Path) -> None:
    """2 resident + 6 parked: each tenant is sure of 2 (half the 8, split), alice may take 6.
    Alice's create and fork are refused naming her use and limit; bob still opens, appends and
    generates; a session alice closes makes her room again."""
    service = fake_service(tmp_path, max_sessions=2, max_parked_sessions=6)
    try:
        mine = []
        for _ in range(20):
            try:
                mine.append(service.create(ALICE, POLICY).handle)
            except TenantLimit as e:
                refusal = str(e)
                break
        assert len(mine) == 6, len(mine)
        assert refusal.startswith(
            "tenant alice holds 6 open sessions, its limit now: of 8, 2 more are kept for other"
            " tenants' reserves (reserved_sessions)"
        )
        with pytest.raises(TenantLimit, match="tenant alice holds 6"):
            service.fork(ALICE, mine[0])
        assert served(service, BOB) and served(service, BOB)
        assert usage_of(service, "alice").sessions == 6
        bob = usage_of(service, "bob")
        assert (bob.sessions, bob.max_sessions, bob.reserved_sessions) == (2, 2, 2)
        with pytest.raises(SessionLimit, match="session limit reached"):  # the pool's own end
            service.create(BOB, POLICY)
        service.close(ALICE, mine.pop())
        assert served(service, ALICE)
        assert service.metrics.count("tenant_share_refusals") == 2
    finally:
        service.stop()


def test_a_tenant_cap_of_its_own_and_a_reserve_of_its_own(tmp_path: Path) -> None:
    """Four sessions: alice is sure of 1 (the default) and capped at 2; bob reserves none."""
    caps = tenants(alice={"max_open_sessions": 2}, bob={"reserved_sessions": 0})
    service = fake_service(tmp_path, max_sessions=2, max_parked_sessions=2, tenants=caps)
    try:
        bobs = [service.create(BOB, POLICY).handle for _ in range(3)]
        with pytest.raises(TenantLimit, match="tenant bob holds 3 open sessions, its limit now"):
            service.create(BOB, POLICY)
        service.create(ALICE, POLICY)  # her reserve
        for h in bobs[:2]:
            service.close(BOB, h)
        service.create(ALICE, POLICY)
        with pytest.raises(
            TenantLimit, match=r"tenant alice holds 2 of its 2 open sessions \(max_"
        ):
            service.create(ALICE, POLICY)
        assert usage_of(service, "alice").max_sessions == 2
    finally:
        service.stop()


def test_a_tenant_at_its_stored_bytes_opens_no_more_and_another_is_unaffected(
    tmp_path: Path,
) -> None:
    """Alice's sessions, parked (their snapshots written), fill her 64 KiB: her next session is
    refused naming her stored bytes and the setting; bob's is made, and answers."""
    caps = tenants(alice={"max_stored_mb": 1 / 16})
    service = fake_service(tmp_path, max_sessions=1, durable=True, tenants=caps)
    try:
        made = 0
        with pytest.raises(TenantLimit) as refused:
            for _ in range(50):
                served(service, ALICE)  # the previous one is parked for it
                made += 1
        assert 1 <= made < 50
        assert "tenant alice holds" in str(refused.value)
        assert "of its 64.0 KiB stored (max_stored_mb)" in str(refused.value)
        alice = usage_of(service, "alice")
        assert alice.stored_bytes >= 64 * 2**10 and alice.snapshot_bytes > 0
        assert alice.journal_bytes > 0 and alice.max_stored_bytes == 64 * 2**10
        assert served(service, BOB)
    finally:
        service.stop()


def test_a_resume_is_never_refused_by_a_share(tmp_path: Path) -> None:
    """Alice held 4 sessions; the daemon restarts with her capped at 2: all 4 resume and
    answer; a fifth is refused, naming 4 of 2."""
    service = fake_service(tmp_path, max_sessions=2, durable=True)
    handles = [service.create(ALICE, POLICY).handle for _ in range(4)]
    service.stop()
    again = fake_service(
        tmp_path, max_sessions=2, durable=True, tenants=tenants(alice={"max_open_sessions": 2})
    )
    try:
        assert len(again.registry.of_tenant("alice")) == 4
        for h in handles:
            again.append(ALICE, h, "still here", timeout=20)
        with pytest.raises(TenantLimit, match="tenant alice holds 4 of its 2 open sessions"):
            again.create(ALICE, POLICY)
    finally:
        again.stop()


def test_an_import_counts_as_a_new_session_of_its_tenant(tmp_path: Path) -> None:
    caps = tenants(alice={"max_open_sessions": 1})
    source = fake_service(tmp_path / "a", max_sessions=2, durable=True)
    target = fake_service(tmp_path / "b", max_sessions=2, durable=True, tenants=caps)
    try:
        h = source.create(ALICE, POLICY).handle
        source.append(ALICE, h, "moving house", timeout=20)
        archive = b"".join(source.moves.export(ALICE, h))
        target.create(ALICE, POLICY)
        with pytest.raises(TenantLimit, match="tenant alice holds 1 of its 1 open sessions"):
            target.moves.import_(ALICE, archive)
        assert len(target.registry.of_tenant("alice")) == 1  # nothing of it was kept
    finally:
        source.stop()
        target.stop()


def test_only_the_admin_reads_every_tenant_use(tmp_path: Path) -> None:
    service = fake_service(tmp_path, max_sessions=2)
    try:
        served(service, ALICE)
        with pytest.raises(PermissionDenied):
            service.reads.stats(ALICE)
        by_name = {t.tenant: t for t in service.reads.stats(ADMIN).tenants}
        assert list(by_name) == ["alice", "bob"]
        assert (by_name["alice"].sessions, by_name["bob"].sessions) == (1, 0)
        assert by_name["alice"].max_stored_bytes == 0  # no state directory: nothing stored
        assert [r.session_id for r in service.reads.list_sessions(ADMIN)] == [
            s.id for s in service.registry.all()
        ]
    finally:
        service.stop()
