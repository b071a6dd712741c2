"""Prometheus metrics: aggregate counts and latencies only: no text, no token ids, no session or
tenant ids (the endpoint answers anyone on the machine: it listens on 127.0.0.1 without a token).

Each daemon has its own registry, so several daemons (tests) can live in one process.
"""

from __future__ import annotations

import resource
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


PassTotals = Callable[[], dict[int, tuple[int, float]]]


class _SoloPasses:
    """One sequence's passes by the rows they carried (a token alone, or with its drafts): how
    many and their seconds, read at scrape time from what the executor already keeps, so that a
    token pays nothing for it. What a draft costs against a plain token, in one run."""

    def __init__(self) -> None:
        self.source: PassTotals | None = None
        self.rebuilt: Callable[[], tuple[int, float]] | None = None

    def collect(self) -> Iterator[Metric]:
        passes = CounterMetricFamily(
            "sinkd_solo_passes",
            "Passes of one sequence alone, none after a shift, by rows: a token (1) or a token"
            " and its drafts",
            labels=["rows"],
        )
        seconds = CounterMetricFamily(
            "sinkd_solo_pass_seconds",
            "Those passes' llama_decode seconds, by rows",
            labels=["rows"],
        )
        for rows, (n, total) in sorted((self.source() if self.source else {}).items()):
            passes.add_metric([str(rows)], n)
            seconds.add_metric([str(rows)], total)
        yield passes
        yield seconds
        n, total = self.rebuilt() if self.rebuilt else (0, 0.0)
        yield CounterMetricFamily(
            "sinkd_solo_rebuilt_passes",
            "Of the one-row passes, those after a pass of another shape (llama.cpp builds its"
            " graph again)",
            value=n,
        )
        yield CounterMetricFamily(
            "sinkd_solo_rebuilt_pass_seconds", "Those passes' llama_decode seconds", value=total
        )


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._solo_passes = _SoloPasses()
        r.register(self._solo_passes)
        self.ttft = Histogram(
            "sinkd_time_to_first_token_seconds",
            "Request to first token",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.itl = Histogram(
            "sinkd_inter_token_latency_seconds",
            "Between generated tokens",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.prefill_tokens = Counter(
            "sinkd_prefill_tokens", "Tokens appended (prefill)", registry=r
        )
        self.decode_tokens = Counter("sinkd_decode_tokens", "Generated tokens decoded", registry=r)
        self.steps = Counter("sinkd_steps", "llama_decode calls made by the scheduler", registry=r)
        self.run_tokens = Counter(
            "sinkd_run_tokens",
            "Generated tokens decoded in a decode run (several per scheduler pass: decode_run)",
            registry=r,
        )
        self.draft_tokens = Counter(
            "sinkd_draft_tokens",
            "Draft tokens verified (speculative decoding), by outcome: accepted or rejected",
            ["outcome"],
            registry=r,
        )
        self.verifications = Counter(
            "sinkd_verifications",
            "Tokens decoded with drafts after them (verifications)",
            registry=r,
        )
        self.sequence_swaps = Counter(
            "sinkd_sequence_swaps",
            "Sequences exchanged so that a step's sessions hold one run of ids (one llama.cpp pass)",
            registry=r,
        )
        self.evictions = Counter("sinkd_evictions", "Eviction events", registry=r)
        self.evicted_tokens = Counter("sinkd_evicted_tokens", "Cells evicted", registry=r)
        self.resets = Counter("sinkd_resets", "Session resets", registry=r)
        self.reset_latency = Histogram(
            "sinkd_reset_latency_seconds",
            "Reset, cells freed and verified",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.stale_handles = Counter(
            "sinkd_stale_handle_rejections", "Requests refused for a stale generation", registry=r
        )
        self.auth_rejections = Counter(
            "sinkd_auth_rejections", "Requests refused for a missing or wrong token", registry=r
        )
        self.alloc_failures = Counter(
            "sinkd_allocation_failures", "Sessions or batches refused for lack of room", registry=r
        )
        self.disk_full_refusals = Counter(
            "sinkd_disk_full_refusals",
            "Calls refused because the state directory's filesystem is below min_free_mb",
            registry=r,
        )
        self.state_disk_free = Gauge(
            "sinkd_state_disk_free_bytes",
            "Free space on the state directory's filesystem, as last checked",
            registry=r,
        )
        self.tenant_refusals = Counter(
            "sinkd_tenant_share_refusals",
            "New sessions or stored responses refused at the tenant's own share (its use and"
            " limits: the admin's Stats)",
            registry=r,
        )
        self.invariant_violations = Counter(
            "sinkd_invariant_violations", "Sessions failed by a run-time cache check", registry=r
        )
        self.snapshots = Counter("sinkd_snapshots", "Session snapshots written", registry=r)
        self.snapshot_failures = Counter(
            "sinkd_snapshot_failures", "Snapshots not written (the previous one kept)", registry=r
        )
        self.snapshot_seconds = Histogram(
            "sinkd_snapshot_seconds",
            "Snapshot: cells read, written, fsynced, renamed",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.snapshot_bytes = Histogram(
            "sinkd_snapshot_bytes",
            "Snapshot file size",
            registry=r,
            buckets=(2**16, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28),
        )
        self.journal_commit_seconds = Histogram(
            "sinkd_journal_commit_seconds",
            "Journal commits before replies (on the engine thread; the fsync is apart)",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.journal_sync_seconds = Histogram(
            "sinkd_journal_sync_seconds",
            "fsyncs of the journal's log that replies waited for (sync=full, off the engine thread)",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.journal_failures = Counter(
            "sinkd_journal_failures", "Journal commits that failed", registry=r
        )
        self.resumed_sessions = Counter(
            "sinkd_resumed_sessions", "Sessions restored at start", registry=r
        )
        self.stale_sessions = Counter(
            "sinkd_stale_sessions",
            "Stored sessions that could not be restored at start",
            registry=r,
        )
        self.memory_stored_tokens = Counter(
            "sinkd_memory_stored_tokens", "Evicted tokens kept in sessions' memories", registry=r
        )
        self.memory_pruned_tokens = Counter(
            "sinkd_memory_pruned_tokens",
            "Stored tokens deleted for a session's memory limit (oldest first)",
            registry=r,
        )
        self.memory_forgotten_passages = Counter(
            "sinkd_memory_forgotten_passages", "Passages deleted by their owner", registry=r
        )
        self.purges = Counter(
            "sinkd_purges",
            "Purges done: deleted text merged out of the indexes and the write-ahead log emptied",
            registry=r,
        )
        self.purge_refusals = Counter(
            "sinkd_purge_refusals",
            "Truncations of the write-ahead log refused: another connection read journal.db",
            registry=r,
        )
        self.purge_held = Gauge(
            "sinkd_purge_held_seconds",
            "How long an owed purge has waited for a reader of journal.db to let go (0: none)",
            registry=r,
        )
        self.recalls = Counter(
            "sinkd_recalls",
            "Recalls, by outcome (recalled, empty, in_window)",
            ["outcome"],
            registry=r,
        )
        self.recalled_tokens = Counter(
            "sinkd_recalled_tokens", "Tokens recalled into caches (frames included)", registry=r
        )
        self.recall_latency = Histogram(
            "sinkd_recall_search_seconds",
            "Recall: search and selection, before any decode",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.parks = Counter(
            "sinkd_parks",
            "Idle sessions parked: their state on disk, their cells freed",
            registry=r,
        )
        self.park_seconds = Histogram(
            "sinkd_park_seconds",
            "Park: snapshot (if behind) and cells freed",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.restores = Counter(
            "sinkd_restores", "Parked sessions brought back into cells for a call", registry=r
        )
        self.restore_seconds = Histogram(
            "sinkd_restore_seconds",
            "Restore: snapshot read, verified, cells written and checked",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.restore_failures = Counter(
            "sinkd_restore_failures",
            "Parked sessions that could not be restored (stale)",
            registry=r,
        )
        self.prefix_hits = Counter(
            "sinkd_prefix_hits", "Sessions that started from a stored prefix state", registry=r
        )
        self.prefix_tokens = Counter(
            "sinkd_prefix_tokens", "Tokens restored from stored prefixes, not read", registry=r
        )
        self.prefix_stored = Counter("sinkd_prefix_stored", "Prefix states kept", registry=r)
        self.prefix_drops = Counter(
            "sinkd_prefix_drops",
            "Prefix states dropped, by reason (ram: to disk alone; disk, damaged, mismatch,"
            " refused, unwritten, forgotten, released: the last session holding it closed)",
            ["reason"],
            registry=r,
        )
        self.prefix_bytes = Gauge(
            "sinkd_prefix_bytes",
            "Bytes of prefix states held, by tier (ram, disk)",
            ["tier"],
            registry=r,
        )
        self.prefix_entries = Gauge("sinkd_prefix_states", "Prefix states held", registry=r)
        self.active_sessions = Gauge("sinkd_active_sessions", "Open sessions", registry=r)
        self.resident_sessions = Gauge(
            "sinkd_resident_sessions", "Sessions holding cells in the context", registry=r
        )
        self.parked_sessions = Gauge(
            "sinkd_parked_sessions", "Sessions parked (state on disk, no cells)", registry=r
        )
        # narrated streams (runtime/narrated.py): by the stream's name (a name several tenants
        # use adds up), never log text
        self.narrate_incidents = Counter(
            "sinkd_narrate_incidents",
            "Incidents raised in narrated streams, by stream and severity",
            ["stream", "severity"],
            registry=r,
        )
        self.narrate_open_incidents = Gauge(
            "sinkd_narrate_open_incidents",
            "Incidents raised and not yet over (their template quiet an interval), by stream",
            ["stream"],
            registry=r,
        )
        self.cells_in_use = Gauge(
            "sinkd_cells_in_use", "KV cells retained, all sessions", registry=r
        )

    def watch_solo_passes(
        self, source: PassTotals, rebuilt: Callable[[], tuple[int, float]]
    ) -> None:
        """Where the solo passes' totals are read (the executor's DecodeCosts)."""
        self._solo_passes.source = source
        self._solo_passes.rebuilt = rebuilt

    def count(self, name: str) -> int:
        """The current value of one of our counters, by attribute name."""
        value = self.registry.get_sample_value(f"sinkd_{name}_total")
        return int(value or 0)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        start_http_server(port, addr=addr, registry=self.registry)


def rss_bytes() -> int:
    """Resident memory now (Linux /proc), else the peak from getrusage."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
