"""What a tenant's narrated streams keep, bounded: past its age (`keep_s`) or its bytes
(`keep_bytes`), a tenant's oldest intervals are folded, FOLD_ROWS into one row (their line range,
times, incidents and error counts), never dropped without a trace.

What a tenant keeps is measured (a scan of its rows) once, then carried as last measured plus what
was written since: a write scans again only past the bound, or a minute on for the ages. The
engine thread's alone (the writes)."""

from __future__ import annotations

from sinkd.daemon.store.narrated import NarratedTables

FOLD_ROWS = 16  # rows folded into one at a time when a tenant is past its bounds
AGE_CHECK_S = 60.0  # a tenant's rows are looked at for their age at most this often
MAX_FOLDS = 64  # folds in one write: each shrinks what is kept; a bound on one call's work


class Retention:
    def __init__(self, keep_s: float, keep_bytes: int) -> None:
        self.keep_s = keep_s
        self.keep_bytes = keep_bytes
        self._kept: dict[str, int] = {}  # per tenant: as last measured, plus written since
        self._aged: dict[str, float] = {}  # per tenant: when its ages were last looked at

    def trim(self, tables: NarratedTables, tenant: str, now: float, grown: int) -> None:
        """After a write that grew the tenant's rows by `grown` bytes: its oldest rows folded
        while they are older than `keep_s` or its streams keep more than `keep_bytes`."""
        kept = self._kept.get(tenant)
        kept = (tables.bytes_of(tenant) if kept is None else kept) + grown
        aged = now - self._aged.get(tenant, 0.0) >= AGE_CHECK_S
        if kept <= self.keep_bytes and not aged:
            self._kept[tenant] = kept
            return
        self._aged[tenant] = now if aged else self._aged.get(tenant, 0.0)
        kept = tables.bytes_of(tenant)
        for _ in range(MAX_FOLDS):
            oldest = tables.oldest(tenant)
            if oldest is None:
                break
            stream, ended = oldest
            if ended >= now - self.keep_s and kept <= self.keep_bytes:
                break
            if tables.fold_oldest(tenant, stream, FOLD_ROWS) is None:
                break  # one row left: it stays
            kept = tables.bytes_of(tenant)
        self._kept[tenant] = kept

    def measure_again(self, tenant: str) -> None:
        """The tenant's rows changed outside a write (a forget, a refused write): its next write
        measures them."""
        self._kept.pop(tenant, None)
