"""Carry out `placement`'s exchanges on the engine: the step's sessions end at one run of ids, and
every session whose sequence moved follows it."""

from __future__ import annotations

from dataclasses import dataclass, field

from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.runtime.loop.placement import swaps_for_one_run
from sinkd.daemon.runtime.sessions import Session, SessionState
from sinkd.errors import EngineError


@dataclass
class Moved:
    done: int = 0  # exchanges made
    failed: list[tuple[Session, str]] = field(default_factory=list)  # a refused exchange's sessions


def place_in_one_run(engine: Engine, sessions: list[Session], everyone: list[Session]) -> Moved:
    """Exchange sequences until `sessions` hold one run of ids. A refused exchange leaves both
    sequences unlike their histories: the sessions that held them are returned, to be failed."""
    moved = Moved()
    for a, b in swaps_for_one_run([s.seq_id for s in sessions], engine.config.n_seq_max):
        holders = [s for s in everyone if s.seq_id in (a, b) and s.state is not SessionState.CLOSED]
        try:
            engine.cells.swap_seqs(a, b)
        except EngineError as e:
            moved.failed += [(s, str(e)) for s in holders]
            continue
        for s in holders:
            s.seq_id = b if s.seq_id == a else a
        moved.done += 1
    return moved
