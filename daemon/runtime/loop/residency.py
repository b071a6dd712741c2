"""Which sessions hold cells. The context holds `limit` sessions (its sequences, or fewer under a
memory budget); beyond them an idle session is parked: its cells freed, its exact state in its
newest snapshot (in memory without a state directory), and it is restored into a sequence by the
next call that needs its cells, bit for bit. Engine thread only.

Who gives up its cells, as a segmented LRU cache chooses (2Q, SLRU): an idle session of a tenant
holding more than its share of the resident sessions first; then one on probation (it answered one
turn and was never continued: a chat UI's title, tags or follow-up request, a one-shot call) before
one that was continued; one whose newest snapshot is current (parked without a write) before
one that needs a write; the least recently used first within each. A parked session whose files
cannot be restored exactly is stale, as resume would report it, never served from other state.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Collection

from sinkd.daemon import failpoints
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.durable.snapshotter import Snapshotter
from sinkd.daemon.runtime.loop import audit
from sinkd.daemon.runtime.loop.jobs import JobQueues
from sinkd.daemon.runtime.sessions import Registry, Session, SessionState
from sinkd.errors import CorruptSnapshot, EngineError, StaleGeneration, Unsupported

log = logging.getLogger("sinkd.residency")


class NoRoom(Exception):
    """Every resident session is busy (or parking is off): no sequence can be freed now."""


class ParkFailed(NoRoom):
    """Idle sessions could have given way, but their snapshots could not be written (a full or
    failing disk): waiting would not help."""


def admitted_sessions(
    sequences: int, cells_per_session: int, bytes_per_token: float, max_kv_bytes: int | None
) -> int:
    """The context's sequences, and with a memory budget as many sessions as it holds at their
    tensor-shape size."""
    if not max_kv_bytes:
        return sequences
    return min(sequences, int(max_kv_bytes // (cells_per_session * bytes_per_token)))


class Residency:
    def __init__(
        self,
        engine: Callable[[], Engine | None],
        registry: Registry,
        queues: JobQueues,
        snapshotter: Snapshotter | None,
        metrics: Metrics,
        max_kv_bytes: int | None,
        max_parked: int,
    ) -> None:
        self._engine = engine
        self.registry = registry
        self.queues = queues
        self.snapshotter = snapshotter
        self.metrics = metrics
        self.max_kv_bytes = max_kv_bytes
        self.max_parked = max_parked
        self._images: dict[str, bytes] = {}  # without a state directory: parked cells, in memory

    def limit(self, engine: Engine) -> int:
        """How many sessions may hold cells at once."""
        return admitted_sessions(
            engine.config.n_seq_max, engine.n_ctx_seq, engine.kv_bytes_per_token, self.max_kv_bytes
        )

    def free_sequence(self, engine: Engine, keep: Collection[str] = (), tenant: str = "") -> int:
        """A free, empty sequence. At the limit the idle resident session that gives way first
        (not one of `keep`) is parked; NoRoom if none can be. `tenant`: whom it is for (its share
        counts: a tenant past its share of the residents gives way to another first)."""
        refused: set[str] = set(keep)
        while len(self.registry.resident()) >= self.limit(engine):
            victim = self.victim(refused, tenant)
            if victim is None and len(refused) > len(keep):
                raise ParkFailed(
                    f"no session could be parked: {len(refused) - len(keep)} snapshots could not"
                    " be written (see the daemon's log; is the state directory's disk full?)"
                )
            if victim is None:
                raise NoRoom(
                    f"all {self.limit(engine)} resident sessions are busy"
                    if self.max_parked
                    else f"session limit reached: {self.limit(engine)} sessions of"
                    f" {engine.n_ctx_seq} cells x {engine.kv_bytes_per_token:.0f} bytes"
                )
            if not self.park(engine, victim):
                refused.add(victim.id)
        try:
            seq_id = engine.cells.acquire_seq()
        except Unsupported as e:
            raise NoRoom(str(e)) from None
        try:
            failpoints.hit("sequence-acquired")
            engine.cells.clear(seq_id)
        except BaseException:
            engine.cells.release_seq(seq_id)
            raise
        return seq_id

    def victim(self, keep: Collection[str] = (), tenant: str = "") -> Session | None:
        """The idle resident session that gives way first (see the module's note), or None."""
        if not self.max_parked:  # parking off (how many may wait parked is admission's check)
            return None
        resident = self.registry.resident()
        held = Counter(s.tenant for s in resident)
        share = len(resident) / max(1, len({*held, tenant} - {""}))
        idle = [
            s
            for s in resident
            if s.id not in keep
            and s.state in (SessionState.IDLE, SessionState.FAILED)
            and not s.unlogged
            and not self.queues.busy(s.id)
        ]
        if not idle:
            return None
        return min(
            idle,
            key=lambda s: (
                held[s.tenant] <= share, s.turns_taken != 1, self._writes(s), s.last_active
            ),
        )  # fmt: skip

    def _writes(self, session: Session) -> bool:
        """Parking it writes a snapshot first (its newest is behind its cells)."""
        if self.snapshotter is None or not (session.has_history and session.seq.retained):
            return False
        current = session.snap_n_seen == session.seq.state.n_seen
        return bool(session.logged_since_snap) or not current

    def park(self, engine: Engine, session: Session) -> bool:
        """Free the session's cells, its state kept (a snapshot at its token count, written if
        the newest is older); False if that snapshot could not be written (it stays resident)."""
        t0 = time.monotonic()
        if self.snapshotter is None:
            if session.has_history and session.seq.retained > 0:
                self._images[session.id] = engine.cells.save_seq(session.seq_id)
        elif self._writes(session) and not self.snapshotter.take(session):
            return False
        failpoints.hit("park-written")
        engine.cells.release_seq(session.seq_id)
        session.seq_id = -1
        session.parked = True
        self.metrics.parks.inc()
        self.metrics.park_seconds.observe(time.monotonic() - t0)
        self.counted()
        log.info("session %s parked (%d cells)", session.id, session.seq.retained)
        return True

    def restore(self, engine: Engine, session: Session) -> float:
        """Bring a parked session's cells back into a free sequence, checked against its policy
        state; returns the milliseconds it took. NoRoom if no sequence can be freed now; a session
        whose files cannot be restored exactly becomes stale (StaleGeneration)."""
        t0 = time.monotonic()
        seq_id = self.free_sequence(engine, keep=(session.id,), tenant=session.tenant)
        try:
            failpoints.hit("before-restore")
            kv = self._image(session)
            if kv:
                engine.cells.restore_seq(seq_id, kv)
            session.seq_id = seq_id
            failpoints.hit("restore-read")
            found = audit.problems(engine, self.registry, session)
            if found:
                raise CorruptSnapshot("the restored cells failed their check: " + "; ".join(found))
        except (CorruptSnapshot, EngineError) as e:
            engine.cells.release_seq(seq_id)
            session.seq_id = -1
            raise self._stale(session, str(e)) from None
        except BaseException:  # nothing learnt of its files: it stays parked
            engine.cells.release_seq(seq_id)
            session.seq_id = -1
            raise
        self._images.pop(session.id, None)
        session.parked = False
        session.restores += 1
        seconds = time.monotonic() - t0
        self.metrics.restores.inc()
        self.metrics.restore_seconds.observe(seconds)
        self.counted()
        return seconds * 1000.0

    def forget(self, session: Session) -> None:
        """The session closed, or was reset: its parked cells in memory go (its files go with the
        journal's rows)."""
        self._images.pop(session.id, None)

    def counted(self) -> None:
        self.metrics.resident_sessions.set(len(self.registry.resident()))
        self.metrics.parked_sessions.set(len(self.registry.parked()))

    def _image(self, session: Session) -> bytes:
        """The parked session's cells: its newest snapshot's (verified), or the image in memory."""
        if not session.has_history or session.seq.retained == 0:
            return b""
        if self.snapshotter is not None:
            return self.snapshotter.durability.newest_snapshot(session).kv
        image = self._images.get(session.id)
        if image is None:
            raise CorruptSnapshot("its parked cells are missing")
        return image

    def _stale(self, session: Session, why: str) -> StaleGeneration:
        log.warning("session %s: parked, cannot be restored: %s", session.id, why)
        self.metrics.restore_failures.inc()
        self.metrics.stale_sessions.inc()
        self._images.pop(session.id, None)
        session.parked = False
        session.transition(SessionState.STALE)
        session.failure = f"parked, and its state cannot be restored: {why}"
        session.resume = "stale"
        self.counted()
        return StaleGeneration(
            f"session {session.id} could not be restored: {session.failure}; this handle is"
            " stale (list your sessions for the reason; close it to delete its stored state)"
        )
