"""A tenant's share of a pool, alone (runtime/shares.py): the default reserves, the exact limits
and refusals, and the guarantee under any order of takes and gives (hypothesis): a tenant below its
reserve is never refused, whatever the others took."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinkd.daemon.runtime.shares import Pool, Share, default_reserve, in_bytes, shares_of

pytestmark = pytest.mark.unit


def sessions(total: int, shares: dict[str, Share]) -> Pool:
    return Pool("open sessions", total, shares, "max_open_sessions", "reserved_sessions")


def test_the_default_reserves_half_the_pool_split_evenly() -> None:
    assert default_reserve(68, 2) == 17
    assert default_reserve(68, 3) == 11
    assert default_reserve(68, 1) == 0  # one tenant: nobody to keep room for
    assert default_reserve(3, 2) == 0  # a pool too small to reserve from
    assert shares_of(68, {"alice": (None, None), "bob": (2, 10)}) == {
        "alice": Share(17, None),
        "bob": Share(2, 10),
    }


def test_a_tenant_takes_what_the_others_reserves_leave_then_is_refused_naming_its_limit() -> None:
    pool = sessions(68, shares_of(68, {"alice": (None, None), "bob": (None, None)}))
    held = {"alice": 0, "bob": 0}
    for _ in range(68):  # bounded: a broken rule must fail here, not loop
        if pool.refusal(held, "alice") is not None:
            break
        held["alice"] += 1
    assert held["alice"] == 51 and pool.room(held, "alice") == 0
    assert pool.refusal(held, "alice") == (
        "tenant alice holds 51 open sessions, its limit now: of 68, 17 more are kept for other"
        " tenants' reserves (reserved_sessions)"
    )
    assert pool.refusal(held, "bob") is None and pool.room(held, "bob") == 17
    held["bob"] = 17
    assert pool.room(held, "bob") == 0 and pool.refusal(held, "bob") is None  # the pool's own end
    held["bob"], held["alice"] = 5, 40  # once bob uses its reserve, what it leaves is anyone's
    assert pool.room(held, "alice") == 68 - 45 - 12


def test_a_cap_of_its_own_is_named_with_the_tenant_use() -> None:
    pool = sessions(68, {"alice": Share(0, 3), "bob": Share()})
    assert pool.refusal({"alice": 2}, "alice") is None
    assert pool.refusal({"alice": 3}, "alice") == (
        "tenant alice holds 3 of its 3 open sessions (max_open_sessions)"
    )
    stored = Pool("stored", 10 * 2**20, {"a": Share(0, 2**20)}, "max_stored_mb", "r", in_bytes)
    assert stored.refusal({"a": 2**20 + 5}, "a") == (
        "tenant a holds 1.0 MiB of its 1.0 MiB stored (max_stored_mb)"
    )
    assert stored.refusal({"a": 900 * 2**10}, "a", amount=2**20) is not None
    assert in_bytes(3 * 2**10) == "3.0 KiB"


# takes three times as often as gives, so that pools fill
OPS = st.lists(
    st.tuples(
        st.sampled_from("abc"), st.sampled_from([True, True, True, False]), st.integers(1, 3)
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    total=st.integers(0, 16),
    reserved=st.tuples(*[st.integers(0, 5)] * 3),
    caps=st.tuples(*[st.one_of(st.none(), st.integers(0, 16))] * 3),
    ops=OPS,
)
def test_below_its_reserve_a_tenant_is_never_refused(
    total: int,
    reserved: tuple[int, int, int],
    caps: tuple[int | None, int | None, int | None],
    ops: list[tuple[str, bool, int]],
) -> None:
    """Any order of takes (each as admission allows it) and gives: the pool never runs over, no
    tenant passes its cap, and a tenant below both its reserve and its cap may always take one
    more; `room` is exactly what `refusal` allows."""
    if sum(reserved) > total:  # the settings refuse reserves the pool cannot hold
        reserved = (0, 0, 0)
    names = ("a", "b", "c")
    shares = {n: Share(r, c) for n, r, c in zip(names, reserved, caps, strict=True)}
    pool = sessions(total, shares)
    held = dict.fromkeys(names, 0)
    for tenant, take, amount in ops:
        if take:
            room = pool.room(held, tenant)
            allowed = pool.refusal(held, tenant, amount) is None and amount <= total - sum(
                held.values()
            )
            assert allowed == (amount <= room)
            if allowed:
                held[tenant] += amount
        else:
            held[tenant] -= min(amount, held[tenant])
        assert sum(held.values()) <= total
        for n in names:
            cap = shares[n].most
            assert cap is None or held[n] <= cap
            if held[n] < shares[n].reserved and (cap is None or held[n] < cap):
                assert pool.refusal(held, n) is None and pool.room(held, n) >= 1, (n, held)
