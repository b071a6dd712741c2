"""What a tenant's move carries, and whether carrying its prefix states beats reading them again:
the choice docs/deployment.md ("Tenant moves") states, measured on the real model.

    python bench/tenant_move.py            -> bench/results/tenant_move.json

Per round (SINKD_MOVE_ROUNDS, 3), on node A (durable, the default model): alice's conversation
with a ~600-token system prompt (bench/prefixes.py's) tells her memory a fact; a second one starts
from the prefix state the first left. Then:
  - read: the first conversation's create (the system prompt read);
  - restored: the second's create on A (the prefix state restored);
  - the tenant's archive exported from A, imported into B with its prefix states and into C
    without them (the archive re-packed without its prefix members): seconds and bytes;
  - on B and on C, a third conversation with that system prompt: restored (B) or read again (C).
Prefix states are worth carrying where (import with them - import without) + restored on B is
below the read on C, and their bytes are what the move's network carries more.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import start_service, table, write
from prefixes import system_prompt

ROUNDS = int(os.environ.get("SINKD_MOVE_ROUNDS", "3"))
FACT = "My locker code is 7351 and my cat is called Mr Whiskers."


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def node(tmp: Path) -> Any:
    return start_service(
        tmp, durable=True, n_ctx_seq=1024, max_sessions=4, memory_across_conversations=True,
        prefix_min_tokens=16, purge_interval_s=0, recall_dense=False,
        tenants=[{"name": "alice", "token_sha256": sha("alice-token")}],
        admin_token_sha256=sha("admin-token"),
    )  # fmt: skip


def timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    got = fn()
    return got, time.perf_counter() - t0


def one_round(root: Path, r: int) -> dict[str, Any]:
    from sinkd.daemon.runtime.api import ChatRequest, GenerationOptions, PolicyRequest
    from sinkd.daemon.runtime.sessions import Principal
    from sinkd.daemon.store import archive
    from sinkd.daemon.store.archive import Archive

    alice, admin = Principal("alice"), Principal(None, admin=True)
    system, policy = system_prompt(r), PolicyRequest(sinks=4, window=1000)
    a, b, c = (node(root / f"{r}{n}") for n in "abc")
    try:
        first, read_s = timed(lambda: a.create(alice, policy, system_prompt=system))
        list(a.chat(alice, first.handle, ChatRequest(FACT, GenerationOptions(4))))
        second, restored_s = timed(lambda: a.create(alice, policy, system_prompt=system))
        assert second.prefix_tokens > 0
        data, export_s = timed(lambda: b"".join(a.tenants.export(admin, "alice")))
        whole = archive.unpack(data)
        prefix_bytes = sum(len(v) for k, v in whole.members.items() if k.startswith("prefix/"))
        bare = b"".join(archive.pack(Archive(whole.manifest, {
            k: v for k, v in whole.members.items() if not k.startswith("prefix/")})))  # fmt: skip
        got_b, import_b_s = timed(lambda: b.tenants.import_(admin, data))
        got_c, import_c_s = timed(lambda: c.tenants.import_(admin, bare))
        third_b, first_use_b_s = timed(lambda: b.create(alice, policy, system_prompt=system))
        third_c, first_use_c_s = timed(lambda: c.create(alice, policy, system_prompt=system))
        assert third_b.prefix_tokens > 0 and third_c.prefix_tokens == 0
        return {
            "system_tokens": first.system_prompt_tokens,
            "read_s": read_s,
            "restored_s": restored_s,
            "export_s": export_s,
            "archive_bytes": len(data),
            "prefix_bytes": prefix_bytes,
            "prefix_states": got_b.prefixes,
            "import_with_prefixes_s": import_b_s,
            "import_without_s": import_c_s,
            "first_use_carried_s": first_use_b_s,
            "first_use_read_again_s": first_use_c_s,
        }
    finally:
        for n in (a, b, c):
            n.stop()


def main() -> None:
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(ROUNDS):
            rounds.append(one_round(Path(tmp), r))
    keys = list(rounds[0])
    med = {k: statistics.median(x[k] for x in rounds) for k in keys}
    carried = med["import_with_prefixes_s"] - med["import_without_s"] + med["first_use_carried_s"]
    table(
        "a tenant's move: its prefix states carried, or read again (medians of "
        f"{ROUNDS} rounds, seconds and bytes)",
        ["what", "value"],
        [[k, med[k]] for k in keys]
        + [["carried: import's extra + first use", carried],
           ["read again: first use", med["first_use_read_again_s"]]],
    )  # fmt: skip
    path = write("tenant_move", {"rounds": rounds, "median": med, "carried_s": carried,
                                 "read_again_s": med["first_use_read_again_s"]})  # fmt: skip
    print(path)


if __name__ == "__main__":
    main()
