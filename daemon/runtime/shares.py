"""What each tenant may take of a pool the daemon shares (open sessions, stored bytes), decided
alone: no engine, no store; counts in, a refusal's reason out.

A pool is shared work-conservingly, with guarantees, as Kubernetes' ResourceQuota and a capacity
scheduler's minimums do together: each configured tenant has a reserve, kept for it while it holds
less; what no reserve claims is anyone's, first come. A tenant may take more while, after it, the
pool still holds every other tenant's unused reserve, and while it stays within its own cap (a
per-tenant override). So a tenant below its reserve is never refused because of another's use,
and a busy tenant may use what idle ones leave. The default reserves split half the pool evenly:
two tenants of 68 sessions are each sure of 17 and may hold up to 51.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Share:
    """One tenant's part of a pool: `reserved` is kept for it while it holds less; `most` caps it
    (None: what the pool and the others' reserves leave)."""

    reserved: int = 0
    most: int | None = None


def in_bytes(n: int) -> str:
    """Bytes as an operator reads them: KiB below a MiB, MiB above."""
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


@dataclass(frozen=True)
class Pool:
    """`what`: the pool's name in a refusal ("open sessions"); `setting`: the setting that caps a
    tenant; `reserve_setting`: the one that reserves."""

    what: str
    total: int
    shares: Mapping[str, Share]
    setting: str
    reserve_setting: str
    show: Callable[[int], str] = field(default=str)  # a count; `in_bytes` for bytes

    def share(self, tenant: str) -> Share:
        return self.shares.get(tenant, Share())

    def owed(self, held: Mapping[str, int], tenant: str) -> int:
        """The other tenants' reserves they do not use now: what `tenant` may not take."""
        return sum(
            max(0, s.reserved - held.get(t, 0)) for t, s in self.shares.items() if t != tenant
        )

    def limit(self, held: Mapping[str, int], tenant: str) -> int:
        """The most `tenant` may hold now: its cap, or what it holds and what the pool less the
        others' unused reserves leaves."""
        mine = held.get(tenant, 0)
        most = max(0, mine + self.total - sum(held.values()) - self.owed(held, tenant))
        cap = self.share(tenant).most
        return most if cap is None else min(most, cap)

    def room(self, held: Mapping[str, int], tenant: str) -> int:
        """How much more `tenant` may take now (0: none)."""
        return max(0, self.limit(held, tenant) - held.get(tenant, 0))

    def refusal(self, held: Mapping[str, int], tenant: str, amount: int = 1) -> str | None:
        """Why `tenant` may not take `amount` more now, naming its own limit and use; None: it
        may. The pool's own end (every unit taken, no reserve owed) is the caller's to say."""
        mine, share = held.get(tenant, 0), self.share(tenant)
        if share.most is not None and mine + amount > share.most:
            return (
                f"tenant {tenant} holds {self.show(mine)} of its {self.show(share.most)}"
                f" {self.what} ({self.setting})"
            )
        free = self.total - sum(held.values())
        owed = self.owed(held, tenant)
        if amount > free - owed and owed > 0:
            return (
                f"tenant {tenant} holds {self.show(mine)} {self.what}, its limit now: of"
                f" {self.show(self.total)}, {self.show(owed)} more are kept for other tenants'"
                f" reserves ({self.reserve_setting})"
            )
        return None


def default_reserve(total: int, tenants: int) -> int:
    """Half the pool, split evenly among the configured tenants (none with fewer than two)."""
    return total // (2 * tenants) if tenants >= 2 else 0


def shares_of(
    total: int, overrides: Mapping[str, tuple[int | None, int | None]]
) -> dict[str, Share]:
    """Each configured tenant's share: its overrides (reserved, most), else the default reserve
    and no cap of its own."""
    reserve = default_reserve(total, len(overrides))
    return {
        name: Share(reserve if reserved is None else reserved, most)
        for name, (reserved, most) in overrides.items()
    }
