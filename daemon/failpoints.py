"""Named points in the daemon where a test can make something happen, deterministically.

- With SINKD_FAILPOINT=<name> in its environment the process kills itself (SIGKILL, no cleanup) when
  it reaches that point: the kill -9 tests.
- In process, `armed(name, action)` runs `action()` there (raise an error, wait on an event, race
  another call), for as long as the `with` block lasts: the race and failure-path tests.

Unarmed, a point costs a dictionary lookup and an environment read.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator

POINTS = (
    "snapshot-before-rename",
    "snapshot-before-journal",
    "snapshot-settle-wait",  # engine thread: about to wait for a snapshot file written off it
    "prefix-before-rename",  # prefix files' writer: a prefix state's temporary file is written
    "append-tokenized",  # service: an append's text is tokenized, its job not yet submitted
    "handle-checked",  # service: a mutating call checked its handle, before the engine acts
    "generation-done",  # service: a generation finished, its Done not yet yielded
    "expire-idle",  # scheduler: between steps, before idle sessions are expired
    "before-compact",  # executor: a sequence is about to be packed after an eviction
    "prefill-chunk",  # executor: a prefill chunk was decoded and recorded
    "verify-draft",  # executor: a verification's next draft is about to be checked (cells in)
    "engine-copy",  # lifecycle: a fork is about to copy the parent's cells
    "sequence-acquired",  # admission: a sequence was taken for a new session, not yet cleared
    "before-restore",  # residency: a parked session has a free sequence, its cells not yet read
    "restore-read",  # residency: a parked session's cells are back in a sequence, not yet audited
    "park-written",  # residency: a park's snapshot is written, the sequence not yet freed
    "tokenize",  # engine: inside a text operation, off the engine thread
    "call-enqueued",  # scheduler: a call is in the inbox, its caller about to wait
    "swap-cleared",  # engine: two sequences being exchanged are both empty, their images in hand
    "decode-piece",  # engine: a later llama_decode of one decode_batch (a length group, a piece) is next
    "before-sync",  # syncer: replies wait for the journal's fsync, which is about to run
    "chunk-write",  # syncer (or a statement after a handoff): the handed chunk rows are written
    "model-loading",  # service: the engine thread starts loading the model (health NOT_SERVING)
    "purge-truncate",  # durability: a purge is about to truncate the write-ahead log
    "purge-wait",  # service: a deletion's reply starts to wait for its purge
    "narrate-digested",  # narrated streams: a call's lines are digested, not yet written
    "narrate-found",  # narrated streams: a call found its stream in the store, not yet held
    # a tenant's move (runtime/tenant_moves.py), on the node the step runs on:
    "tenant-leaving",  # source: the tenant's leaving mark is committed
    "tenant-exported",  # source: its archive is built, not yet sent
    "tenant-import-written",  # destination: its rows are written, not yet committed
    "tenant-imported",  # destination: committed, not yet answered
    "tenant-released-sessions",  # source: its sessions are closed, its memory not yet forgotten
    "tenant-released",  # source: everything of it deleted, not yet marked gone
)

_actions: dict[str, Callable[[], None]] = {}
_lock = threading.Lock()


def hit(name: str) -> None:
    assert name in POINTS, name
    if os.environ.get("SINKD_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
    action = _actions.get(name)
    if action is not None:
        action()


@contextlib.contextmanager
def armed(name: str, action: Callable[[], None]) -> Iterator[None]:
    assert name in POINTS, name
    with _lock:
        _actions[name] = action
    try:
        yield
    finally:
        with _lock:
            _actions.pop(name, None)
