"""OpenMP teams in this process: one warning when two threads' teams make libgomp throttle both.

llama.cpp's CPU build runs each multi-threaded decode as an OpenMP parallel region, and the thread
that runs it keeps a team of workers for as long as it lives. Once the teams of one process hold
more threads than there are cores, libgomp cuts the spin at every barrier from 300,000 turns to 100
before a thread sleeps, in every team: one-token decodes then run 1.4-1.7x slower (bench/README.md,
"overhead.py"). The daemon decodes on its engine thread alone; a program that also decodes on another
thread (a benchmark's raw loop, an application embedding engines) would be slowed without a word.
"""

from __future__ import annotations

import functools
import logging
import os
import threading

import llama_cpp as llama

log = logging.getLogger("sinkd.teams")

_lock = threading.Lock()
# thread ident -> (that thread, the most threads it decoded with). The thread itself, not only its
# ident: a new thread may reuse a dead one's ident, and a dead thread's team is gone with it
_teams: dict[int, tuple[threading.Thread, int]] = {}
_warned = False


@functools.cache
def uses_openmp() -> bool:
    """Whether this llama.cpp build runs its CPU threads with OpenMP (its system info says)."""
    info = bytes(llama.llama_print_system_info() or b"").decode(errors="replace")
    return "OPENMP = 1" in info


def available_cpus() -> int:
    """The cores this process may run on, as libgomp counts them (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def decoding(threads: int) -> None:
    """Before a decode with `threads` threads on the calling thread: note its team, and warn once
    per process when live threads' teams hold more threads than there are cores."""
    if threads <= 1:
        return  # no team
    me = threading.current_thread()
    known = _teams.get(threading.get_ident())
    if known is not None and known[0] is me and known[1] >= threads:
        return  # this thread's team is known already: the common case, no lock
    global _warned
    with _lock:
        before = known[1] if known is not None and known[0] is me else 0
        _teams[threading.get_ident()] = (me, max(threads, before))
        for ident in [i for i, (t, _) in _teams.items() if not t.is_alive()]:
            del _teams[ident]  # a thread's team goes with it
        total, cpus = sum(n for _, n in _teams.values()), available_cpus()
        if len(_teams) > 1 and total > cpus and not _warned and uses_openmp():
            _warned = True
            log.warning(
                "llama.cpp decodes on %d threads of this process with %d OpenMP threads in all on"
                " %d cores: libgomp now throttles every team's spin, and one-token decodes run"
                " about 1.5x slower; decode on one thread, or run the other engine in its own"
                " process",
                len(_teams),
                total,
                cpus,
            )
