"""A narrated stream's store under its bound: 1,000,000 lines through the daemon's service
(durable, the journal's database), a tenant bound of `narrate_keep_bytes`, the facts' bytes read
after every call; at the end, whether the kept rows still cover every line once (folded rows
included) and how many errors they count.

    python bench/narrate_retention.py [LINES] [BOUND_BYTES]   -> bench/results/narrate_retention.json

Defaults: 1,000,000 lines, a bound of 1 MiB (the default is 64 MiB, which this log would not
reach). The log: three INFO templates, a new error every 5,000 lines (an incident, then over), a
burst of another every 50,000.
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

from common import start_service, table, write

from sinkd.daemon.runtime.api import DigestOptions
from sinkd.daemon.runtime.sessions import Principal

WHO = Principal("local")
CALL = 2000  # lines a Narrate call


def line(i: int) -> str:
    if i % 5000 == 2500:
        return f"2026-12-07T05:00:00 db ERROR shard {i // 5000} write failed: disk full"
    if i % 50_000 in range(40_000, 40_030):
        return f"2026-12-07T05:00:00 cache WARN eviction storm on node {i % 7}"
    return f"2026-12-07T05:00:{i % 60:02d} api INFO request {i} served in {i % 97} ms"


def main() -> None:
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    bound = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20
    tmp = Path(tempfile.mkdtemp())
    svc = start_service(tmp, durable=True, narrate_keep_bytes=bound)
    d = svc.durability
    assert d is not None
    kept = 0
    most = 0
    started = time.perf_counter()
    try:
        for k in range(0, total, CALL):
            batch = [line(i) for i in range(k, min(total, k + CALL))]
            svc.narrated.feed(
                WHO, "bench", batch, k + CALL >= total, DigestOptions(every_lines=200)
            )
            kept = svc.scheduler.call(lambda e: d.narrated_tables().bytes_of(WHO.tenant))
            most = max(most, kept)
        seconds = time.perf_counter() - started
        rows = svc.narrated.history(WHO, "bench")
    finally:
        svc.stop()
    covered = all(b.first_line == a.last_line + 1 for a, b in itertools.pairwise(rows))
    folded = [r for r in rows if r.last_number > r.number]
    errors = sum(r.errors for r in rows)
    journal = sum(p.stat().st_size for p in (tmp / "state").glob("journal.db*"))
    result = {
        "lines": total,
        "bound_bytes": bound,
        "most_kept_bytes": most,
        "kept_bytes_at_end": kept,
        "rows": len(rows),
        "folded_rows": len(folded),
        "every_line_covered_once": covered
        and rows[0].first_line == 1
        and rows[-1].last_line == total,
        "error_lines_counted": errors,
        "error_lines_written": sum(1 for i in range(total) if "ERROR" in line(i)),
        "journal_files_bytes": journal,
        "lines_per_s": total / seconds,
    }
    table(
        f"a narrated stream's store, {total:,} lines, bound {bound:,} bytes",
        list(result), [list(result.values())],
    )  # fmt: skip
    print(f"wrote {write('narrate_retention', result)}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
