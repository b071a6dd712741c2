"""Shared by the benchmark scripts: the machine, a printed table, a JSON file."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
T = TypeVar("T")


def default_threads() -> int:
    """The threads an engine starts with when none are given, alone on this machine."""
    from sinkd.daemon.config import machine_threads, threads_given

    return threads_given() or machine_threads()


def session_default_k(policy: Any) -> Any:
    """`policy` with the K a daemon session gets when it leaves K unset: `evictions_per_shift` x E,
    at most W (no position limit: every bench context is inside the model's)."""
    from sinkd.daemon.config import Settings

    per_shift = Settings.model_fields["evictions_per_shift"].default
    return policy.with_deferred_shift(per_shift, position_limit=None)


def daemon_settings(tmp: Path, **kw: Any) -> Any:
    """A daemon on a temporary Unix socket and state directory, no tenants (the socket's user)."""
    from sinkd.daemon.config import Settings

    base: dict[str, Any] = {
        "socket": tmp / "sinkd.sock",
        "state_dir": tmp / "state",
        "max_sessions": 6,
        "n_ctx_seq": 256,
        "step_tokens": 64,
        "n_batch": 256,
        "http": None,
    }
    base.update(kw)
    return Settings(**base)


def start_service(tmp: Path, **kw: Any) -> Any:
    """The daemon's service in this process, non-durable, with 256-token steps and prefill chunks;
    started and ready. The caller stops it."""
    from sinkd.daemon.runtime.service import SinkdService

    base: dict[str, Any] = {"durable": False, "step_tokens": 256, "prefill_chunk": 256}
    svc = SinkdService(daemon_settings(tmp, **{**base, **kw}))
    svc.start()
    svc.wait_ready(120)
    return svc


def in_child(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a fresh process; its result.

    For a raw llama.cpp measurement beside a daemon. Every thread that runs a llama.cpp decode
    keeps an OpenMP team for as long as it lives, and once the teams of one process hold more
    threads than there are cores, libgomp cuts the spin at every barrier from 300,000 turns to 100
    (`gomp_throttled_spin_count_var`) before it sleeps: one-token decodes then run 1.4-1.7x slower
    in both teams (bench/README.md, "overhead.py"). A raw loop on the main thread beside a daemon's engine
    thread (or before it: the team outlives the loop) slows both, which neither does alone.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


class DecodeClock:
    """Every `llama_decode` of this process, timed: how long each ran and the gap before the next
    (on the decoding thread: sampling, bookkeeping, the daemon's Python). Installed by wrapping
    `llama_cpp.llama_decode`, which the engine and the bare loops call through the module; the
    wrapper adds ~1 us per call. `install()` in each process that decodes (a spawned child too)."""

    calls: ClassVar[list[tuple[int, int]]] = []

    @classmethod
    def install(cls) -> None:
        import llama_cpp

        if getattr(llama_cpp.llama_decode, "_timed", False):
            return
        decode, clock, calls = llama_cpp.llama_decode, time.perf_counter_ns, cls.calls

        def timed(ctx: Any, batch: Any) -> int:
            t0 = clock()
            rc: int = decode(ctx, batch)
            calls.append((t0, clock()))
            return rc

        timed._timed = True  # type: ignore[attr-defined]
        llama_cpp.llama_decode = timed

    @classmethod
    def mark(cls) -> int:
        return len(cls.calls)

    @classmethod
    def since(cls, mark: int, last: int) -> dict[str, float]:
        """Median decode and gap (ms) of the last `last` decodes after `mark` (steady state: the
        prompt's and the first tokens' decodes left out)."""
        import statistics

        calls = cls.calls[mark:][-last:]
        gaps = [calls[i + 1][0] - calls[i][1] for i in range(len(calls) - 1)]
        return {
            "decode_ms": statistics.median(b - a for a, b in calls) / 1e6,
            "gap_ms": statistics.median(gaps) / 1e6,
        }


def together(jobs: list[Callable[[], None]]) -> float:
    """Run the jobs at once, one thread each; the wall seconds until the last ends (an error in
    any is raised here)."""
    from sinkd.evaluation.recall_trials import run_parallel

    t0 = time.perf_counter()
    run_parallel(jobs, parallel=len(jobs))
    return time.perf_counter() - t0


def machine() -> dict[str, Any]:
    import llama_cpp

    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "llama_cpp_python": llama_cpp.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    """Print a results table (rich; never wrapped, so a log file keeps each row on one line)."""
    from rich.console import Console
    from rich.table import Table

    cells = [[f"{v:.3g}" if isinstance(v, float) else str(v) for v in row] for row in rows]
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, justify="right", no_wrap=True)
    for row in cells:
        t.add_row(*row)
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    Console(width=max(len(title), sum(w + 3 for w in widths) + 1)).print(t)


def write(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    data = {"command": "python " + " ".join(sys.argv), "machine": machine(), **data}
    path.write_text(json.dumps(data, indent=1))
    return path


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))] if s else float("nan")
