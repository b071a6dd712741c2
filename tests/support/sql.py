"""What an SQLite store did, counted rather than timed."""

from __future__ import annotations

from collections.abc import Callable

from sinkd.daemon.store.memory import MemoryStore


def vm_steps(store: MemoryStore, run: Callable[[], object]) -> int:
    """The SQLite virtual machine's instructions `run` executes: the work of a search, counted
    (not timed: the same on any machine)."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    store.db.set_progress_handler(count, 1)
    try:
        run()
    finally:
        store.db.set_progress_handler(None, 1)
    return steps
