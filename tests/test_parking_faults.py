"""Faults while parking, restoring and storing, on the fake engine and triggered by failpoints: a
full disk at a park's snapshot write, a parked snapshot truncated or swapped for another session's,
a parking lot one tenant fills, and a state directory below its free-space margin, served again
once space returns. Each names the guard it checks (each test fails with it removed). The kill -9
points (a park's snapshot written and its sequence not yet freed, a restore's cells read and not
yet audited) run the real model in a subprocess: tests/test_parking.py."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

import pytest

from sinkd.daemon import failpoints
from sinkd.daemon.runtime.api import GenerationOptions, PolicyRequest, SamplingRequest, TokenEvent
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal, Session
from sinkd.errors import DiskFull, ResourceExhausted, StaleGeneration, TenantLimit
from tests.support.services import fake_service

pytestmark = pytest.mark.unit
ALICE, BOB = Principal("alice"), Principal("bob")
POLICY = PolicyRequest(name="sink", sinks=4, window=200)
GREEDY = GenerationOptions(6, sampling=SamplingRequest(temperature=0.0))


def turn(service: SinkdService, who: Principal, handle: Any, text: str) -> str:
    service.append(who, handle, text, timeout=20)
    events = service.generate(who, handle, GREEDY, timeout=20)
    return "".join(e.text for e in events if isinstance(e, TokenEvent))


def session_of(service: SinkdService, handle: Any) -> Session:
    session = service.registry.get(handle.session_id)
    assert session is not None
    return session


def state_of(session: Session) -> tuple[int, list[int]]:
    """What must survive: the token count and the retained tokens, in stream order."""
    return session.seq.state.n_seen, session.retained.all()


def full_disk() -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_at_a_parks_snapshot_write_keeps_the_session_and_refuses_the_new_one(
    tmp_path: Path,
) -> None:
    """Guard: a park whose snapshot is not written frees nothing (residency.park). The disk fills
    as alice's session is parked for bob's: bob is refused by name, alice's stays resident and
    answers; after a kill (no stop snapshots) it resumes exactly as it stood."""
    service = fake_service(tmp_path, max_sessions=1, durable=True)
    try:
        h = service.create(ALICE, POLICY).handle
        turn(service, ALICE, h, "Keep every word of this.")
        before = state_of(session_of(service, h))
        with (
            failpoints.armed("snapshot-before-rename", full_disk),
            pytest.raises(ResourceExhausted, match="snapshots could not be written"),
        ):
            service.create(BOB, POLICY)
        session = session_of(service, h)
        assert not session.parked and state_of(session) == before
        assert service.registry.of_tenant("bob") == []
        assert not list((tmp_path / "state" / "snapshots").glob("*/.*.tmp"))  # no half file
        assert turn(service, ALICE, h, "Still here?")
        after = state_of(session_of(service, h))
    finally:
        service.stop(snapshot=False)  # as a kill -9 leaves it
    again = fake_service(tmp_path, max_sessions=1, durable=True)
    try:
        resumed = session_of(again, h)
        assert resumed.state.value == "idle", resumed.failure
        assert state_of(resumed) == after
    finally:
        again.stop()


def parked_pair(service: SinkdService) -> tuple[Any, Any]:
    """Two of alice's sessions with histories, both parked (a third holds the one sequence)."""
    a = service.create(ALICE, POLICY).handle
    turn(service, ALICE, a, "The first conversation, about boats.")
    b = service.create(ALICE, POLICY).handle
    turn(service, ALICE, b, "The second one, about trains and stations.")
    turn(service, ALICE, service.create(ALICE, POLICY).handle, "A third.")
    assert session_of(service, a).parked and session_of(service, b).parked
    return a, b


def snapshot_path(service: SinkdService, handle: Any) -> Path:
    durability = service.durability
    assert durability is not None
    return durability.dir / durability.snapshots_of(session_of(service, handle))[0].path


def test_a_truncated_parked_snapshot_is_refused_stale_and_reported(tmp_path: Path) -> None:
    """Guard: a snapshot's checksum and section lengths (store/snapshots.py `decode`)."""
    service = fake_service(tmp_path, max_sessions=1, durable=True)
    try:
        a, b = parked_pair(service)
        path = snapshot_path(service, a)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        with pytest.raises(StaleGeneration, match="cannot be restored"):
            turn(service, ALICE, a, "Go on.")
        receipt = service.receipt(session_of(service, a))
        assert receipt.state == "stale" and "cannot be restored" in receipt.stale_reason
        assert turn(service, ALICE, b, "Go on.")  # the other parked one restores
        assert service.metrics.count("restore_failures") == 1
    finally:
        service.stop()


def test_a_parked_snapshot_swapped_for_another_sessions_is_refused(tmp_path: Path) -> None:
    """Guard: a snapshot names its session and generation (durability.snapshot_disagrees), so
    another session's cells, whole and checksummed, are never served as this one's."""
    service = fake_service(tmp_path, max_sessions=1, durable=True)
    try:
        a, b = parked_pair(service)
        shutil.copyfile(snapshot_path(service, b), snapshot_path(service, a))
        with pytest.raises(StaleGeneration, match="belongs to another session"):
            turn(service, ALICE, a, "Go on.")
        assert "belongs to another session" in service.receipt(session_of(service, a)).stale_reason
        assert turn(service, ALICE, b, "Go on.")
    finally:
        service.stop()


def test_a_parking_lot_one_tenant_fills_still_takes_another_tenants_session(
    tmp_path: Path,
) -> None:
    """Guard: the tenant's share of the open sessions (admission.check_new). One resident and
    four parked: alice fills what bob's reserve leaves; bob's session is made (alice's resident
    one parked for it) and answers."""
    service = fake_service(tmp_path, max_sessions=1, max_parked_sessions=4, durable=True)
    try:
        made = 0
        with pytest.raises(TenantLimit, match="tenant alice holds 4 open sessions"):
            for _ in range(6):
                turn(service, ALICE, service.create(ALICE, POLICY).handle, "Mine.")
                made += 1
        assert made == 4 and len(service.registry.parked()) == 3
        h = service.create(BOB, POLICY).handle
        assert turn(service, BOB, h, "And mine?")
        assert len(service.registry.parked()) == 4
    finally:
        service.stop()


class Disk:
    """The state directory's free space as the service reads it, set by the test."""

    def __init__(self) -> None:
        self.free = 10 * 2**30

    def __call__(self, path: Path) -> int:
        return self.free


def test_a_state_directory_that_fills_refuses_writes_by_name_and_recovers_by_itself(
    tmp_path: Path,
) -> None:
    """Guard: the free-space margin (durability.check_space before a job or a new session). Below
    it, an append, a generation and a new session are refused with DiskFull, naming the space and
    the setting; reads, listings and a close still answer; nothing stored changes. Space returns:
    the next call is served, with no restart. (On a real filesystem: tests/test_parking.py.)"""
    service = fake_service(tmp_path, max_sessions=2, durable=True, min_free_mb=64)
    disk = Disk()
    assert service.durability is not None and service.durability.space is not None
    service.durability.space.free = disk
    try:
        h = service.create(ALICE, POLICY).handle
        turn(service, ALICE, h, "Before the disk filled.")
        spare = service.create(ALICE, POLICY).handle
        before = state_of(session_of(service, h))
        disk.free = 10 * 2**20
        for refused in (
            lambda: service.append(ALICE, h, "More.", timeout=20),
            lambda: list(service.generate(ALICE, h, GREEDY, timeout=20)),
            lambda: service.create(BOB, POLICY),
        ):
            with pytest.raises(DiskFull, match=r"10\.0 MiB free, below min_free_mb \(64\.0 MiB\)"):
                refused()
        assert service.reads.list_sessions(ALICE) and service.reads.inspect(ALICE, h, True)
        service.close(ALICE, spare)  # a close frees space: it is never refused for lack of it
        assert state_of(session_of(service, h)) == before
        assert service.metrics.count("disk_full_refusals") == 3
        disk.free = 10 * 2**30
        assert turn(service, ALICE, h, "After space returned.")
        assert service.create(BOB, POLICY)
    finally:
        service.stop()
