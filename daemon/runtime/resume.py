"""Resume at start: every stored session comes back exactly, or comes back stale with a reason.

For each session in the journal: its record must verify (checksum) and have been made under this
daemon's configuration (model, tokenizer, template, KV dtype, llama.cpp, cells per sequence) and
recompute to its generation hash. Then the newest snapshot that verifies is restored into a free
sequence and the journal's chunks after it are replayed through the same policy, one sub-batch each,
exactly as they were decoded (the sessions' replays are batched together, one chunk of each per
llama_decode). A damaged snapshot is dropped and the previous one tried, with a
longer replay; a damaged or missing chunk means the history cannot be rebuilt: the session is stale,
never loaded with a state it did not have. Engine thread only.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sinkd.cachepolicy import CacheSequence, PolicyConfig
from sinkd.cachepolicy.recall_plan import RecallConfig
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.engine.sampler import Sampler, SamplingParams
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.admission import Admission
from sinkd.daemon.runtime.durable.durability import (
    Durability,
    adopt_snapshot_meta,
    gate_differences,
    policy_from,
    snapshot_disagrees,
)
from sinkd.daemon.runtime.loop import audit
from sinkd.daemon.runtime.loop.executor import Executor
from sinkd.daemon.runtime.loop.replay import replay
from sinkd.daemon.runtime.recall.layer import Recall
from sinkd.daemon.runtime.sessions import ModelIdentity, Registry, Session, SessionState
from sinkd.daemon.store import snapshots
from sinkd.daemon.store.journal import Chunk, SnapshotRow, StoredSession
from sinkd.daemon.validation import validated
from sinkd.errors import CorruptSnapshot, ResourceExhausted, SinkdError

log = logging.getLogger("sinkd.resume")


class Unrestorable(Exception):
    """This stored session cannot be brought back exactly; the message says why."""


@dataclass
class _Restoring:
    stored: StoredSession
    session: Session
    base: SnapshotRow | None
    skipped: list[str]
    chunks: list[Chunk]
    next: int = 0
    failed: str = field(default="")


class Resumer:
    def __init__(
        self,
        executor: Executor,
        durability: Durability,
        registry: Registry,
        identity: ModelIdentity,
        admission: Admission,
        metrics: Metrics,
        recall: Recall,
    ) -> None:
        self.recall = recall
        self.executor = executor
        self.durability = durability
        self.registry = registry
        self.identity = identity
        self.admission = admission
        self.metrics = metrics

    def run(self, engine: Engine) -> None:
        """Every stored session, as many at a time as the context holds: each batch's sessions
        are parked (their snapshot written if the replay went past it) as the next one needs
        their sequences, and the last batch stays resident."""
        stored = self.durability.stored()
        at_once = max(1, self.admission.limit(engine))
        for start in range(0, len(stored), at_once):
            self._run_batch(engine, stored[start : start + at_once])
        self.durability.commit()
        swept = self.durability.sweep()
        if swept:
            log.info("removed %d snapshot files left by an interrupted write", swept)

    def _run_batch(self, engine: Engine, batch: list[StoredSession]) -> None:
        restoring: list[_Restoring] = []
        for stored in batch:
            try:
                session = self._build(stored)
            except Unrestorable as e:
                self._stale(stored, str(e))
                continue
            try:
                self._admit(engine, session)
                if session.state is not SessionState.FAILED:
                    restoring.append(self._from_snapshot(engine, stored, session))
                    self.recall.resumed_spans(session)
            except Unrestorable as e:
                self._drop(engine, session)
                self._stale(stored, str(e))
            except sqlite3.DatabaseError as e:  # a damaged page: this session's, not the daemon's
                self._drop(engine, session)
                self._stale(stored, f"its journal rows cannot be read (damaged): {e}")
        self._replay(engine, restoring)
        for r in restoring:
            try:
                if r.failed:
                    raise Unrestorable(r.failed)
                self._finish(engine, r)
                self.recall.resumed(engine, r.session)
            except Unrestorable as e:
                self._drop(engine, r.session)
                self._stale(r.stored, str(e))
                continue
            except sqlite3.DatabaseError as e:
                self._drop(engine, r.session)
                self._stale(r.stored, f"its memory rows cannot be read (damaged): {e}")
                continue
            self.metrics.resumed_sessions.inc()
            log.info("session %s resumed: %s", r.session.id, r.session.resume)

    def adopt(self, engine: Engine, stored: StoredSession) -> Session:
        """One session whose rows were just written (an import), restored as at start under the
        same gates; raises Unrestorable with the reason, leaving nothing of it registered."""
        session = self._build(stored)
        if session.state is SessionState.FAILED:
            raise Unrestorable("it had failed (reset it where it was first)")
        try:
            self._admit(engine, session)
            r = self._from_snapshot(engine, stored, session)
            self.recall.resumed_spans(session)
            self._replay(engine, [r])
            if r.failed:
                raise Unrestorable(r.failed)
            self._finish(engine, r)
            self.recall.resumed(engine, session)
        except BaseException:
            self._drop(engine, session)
            raise
        return session

    def adopt_parked(self, engine: Engine, stored: StoredSession) -> Session:
        """One session of a tenant's import, its rows committed: registered parked, its cells
        left in its snapshot (an export takes one at its token count) until its first call
        restores them, so that an import takes no sequence and parks no other session. One that
        cannot be had so is registered stale, with the reason."""
        try:
            session = self._build(stored)
            if session.state is SessionState.FAILED:
                raise Unrestorable("it had failed (reset it where it was first)")
            engine.check_policy(session.policy)
            rows = self.durability.snapshots_of(session)
            if rows:
                snap = snapshots.read(self.durability.dir / Path(rows[0].path))
                why = snapshot_disagrees(session, snap.meta, rows[0].n_seen, self.durability.config)
                if why:
                    raise Unrestorable(why)
                adopt_snapshot_meta(session, snap.meta)
                session.set_logits(snap.logits, snap.meta.get("greedy"))
            at = session.seq.state.n_seen
            if next(iter(self.durability.chunks_after(session, at)), None) is not None:
                raise Unrestorable("its archive holds chunks past its snapshot")
        except (Unrestorable, CorruptSnapshot, SinkdError) as e:
            self._stale(stored, str(e))
            stale = self.registry.get(stored.id)
            assert stale is not None
            return stale
        session.pending_prefix = [] if session.seq.state.n_seen else list(session.system_tokens)
        session.parked = True
        session.transition(SessionState.IDLE)
        session.resume = "imported with its tenant, parked"
        session.snap_n_seen = rows[0].n_seen if rows else None
        session.snap_time = rows[0].created if rows else None
        session.log_chunks, session.log_tokens = self.durability.chunk_stats(session)
        session.logged_since_snap = 0
        self.registry.add(session)
        self.recall.resumed_spans(session)
        self.recall.resumed(engine, session)
        return session

    def _drop(self, engine: Engine, session: Session) -> None:
        if session.seq_id >= 0:
            engine.cells.release_seq(session.seq_id)
            session.seq_id = -1
        self.registry.remove(session.id)

    def _build(self, stored: StoredSession) -> Session:
        if not stored.intact:
            raise Unrestorable("its journal record is damaged (checksum mismatch)")
        r = stored.record
        differences = gate_differences(r["config"], self.durability.config)
        if differences:
            raise Unrestorable("made under another configuration: " + "; ".join(differences))
        try:
            policy = policy_from(r["policy"])
            sampling = validated(SamplingParams, **r["sampling"])
        except (SinkdError, TypeError, KeyError) as e:
            raise Unrestorable(f"its stored policy or sampling is not valid here: {e}") from None
        session = _session(stored, policy, self.identity, sampling)
        try:
            session.recall = RecallConfig.named(**r.get("recall", {"mode": "off"}))
        except (SinkdError, TypeError) as e:
            raise Unrestorable(f"its stored recall settings are not valid here: {e}") from None
        session.system_tokens = list(r["system_tokens"])
        session.pinned = r["pinned"]
        if session.generation != r["generation"]:
            raise Unrestorable("its generation hash does not recompute from its record")
        if stored.state == "failed":
            session.transition(SessionState.FAILED)
            session.failure = stored.reason
            session.resume = "failed before the restart (reset or close it)"
        return session

    def _admit(self, engine: Engine, session: Session) -> None:
        try:
            engine.check_policy(session.policy)
        except SinkdError as e:
            raise Unrestorable(f"its policy does not fit this daemon: {e}") from None
        try:
            # open before (a restart), or an import its mover checked against the shares
            session.seq_id = self.admission.acquire(engine, tenant=session.tenant, resuming=True)
        except ResourceExhausted as e:
            raise Unrestorable(f"no free sequence: {e}") from None
        self.registry.add(session)

    def _from_snapshot(self, engine: Engine, stored: StoredSession, session: Session) -> _Restoring:
        """Restore the newest snapshot that verifies (or none) and line up the chunks after it."""
        d = self.durability
        skipped: list[str] = []
        base = None
        for row in d.snapshots_of(session):
            try:
                self._load_snapshot(engine, session, row)
                base = row
                break
            except (CorruptSnapshot, Unrestorable) as e:
                log.warning(
                    "session %s: snapshot at token %d unusable: %s", session.id, row.n_seen, e
                )
                skipped.append(f"snapshot at token {row.n_seen} unusable ({e})")
                d.drop_snapshot(row)
                self._empty(engine, session)
        at = session.seq.state.n_seen
        chunks = []
        for chunk in d.chunks_after(session, at):
            if not chunk.intact:
                raise Unrestorable(f"journal chunk #{chunk.n} is damaged (checksum mismatch)")
            if chunk.logical_pos != at:
                raise Unrestorable(
                    f"the journal resumes at token {chunk.logical_pos}, the session is at {at}"
                    " (its history before that was pruned and no snapshot covers it)"
                )
            if len(chunk.tokens) > engine.n_batch:
                raise Unrestorable(f"journal chunk #{chunk.n} is larger than n_batch")
            chunks.append(chunk)
            at += len(chunk.tokens)
        return _Restoring(stored, session, base, skipped, chunks)

    def _replay(self, engine: Engine, restoring: list[_Restoring]) -> None:
        """One chunk of every session still replaying per llama_decode, until all are done."""
        active = [r for r in restoring if r.chunks]
        while active:
            batch, used = [], 0
            for r in active:
                n = len(r.chunks[r.next].tokens)
                if used + n <= engine.n_batch:
                    batch.append(r)
                    used += n
            try:
                refused = dict(
                    (id(s), why)
                    for s, why in replay(
                        self.executor,
                        [
                            (r.session, list(r.chunks[r.next].tokens), r.chunks[r.next].cache_pos)
                            for r in batch
                        ],
                    )
                )
            except SinkdError as e:
                refused = {id(r.session): f"the replay could not be decoded: {e}" for r in batch}
            for r in batch:
                chunk = r.chunks[r.next]
                if id(r.session) in refused:
                    r.failed = f"journal chunk #{chunk.n} does not replay: {refused[id(r.session)]}"
                    continue
                if chunk.draws is not None:
                    r.session.sampler.reset()
                    r.session.sampler.advance(chunk.draws)
                r.next += 1
            active = [r for r in active if not r.failed and r.next < len(r.chunks)]

    def _finish(self, engine: Engine, r: _Restoring) -> None:
        session, base = r.session, r.base
        session.pending_prefix = [] if session.seq.state.n_seen else list(session.system_tokens)
        problems = audit.problems(engine, self.registry, session)
        if problems:
            raise Unrestorable("the restored cache failed its check: " + "; ".join(problems))
        session.transition(SessionState.IDLE)
        head = (
            f"snapshot at token {base.n_seen} + {len(r.chunks)} chunks replayed"
            if base
            else f"{len(r.chunks)} chunks replayed from the journal"
        )
        session.resume = "; ".join([head, *r.skipped])
        session.snap_n_seen = base.n_seen if base else None
        session.snap_time = base.created if base else None
        d = self.durability
        session.log_chunks, session.log_tokens = d.chunk_stats(session)
        session.logged_since_snap = session.seq.state.n_seen - (base.n_seen if base else 0)

    def _load_snapshot(self, engine: Engine, session: Session, row: SnapshotRow) -> None:
        snap = snapshots.read(self.durability.dir / Path(row.path))
        meta: dict[str, Any] = snap.meta
        why = snapshot_disagrees(session, meta, row.n_seen, self.durability.config)
        if why:
            raise Unrestorable(why)
        try:
            engine.cells.restore_seq(session.seq_id, snap.kv)
        except SinkdError as e:
            raise Unrestorable(str(e)) from None
        adopt_snapshot_meta(session, meta)
        session.set_logits(snap.logits, meta.get("greedy"))
        if engine.cells.cell_count(session.seq_id) != session.seq.retained:
            raise Unrestorable("its cells disagree with its policy state")

    def _empty(self, engine: Engine, session: Session) -> None:
        engine.cells.clear(session.seq_id)
        session.clear_history()

    def register_stale(self, stored: StoredSession, why: str) -> None:
        """A session that cannot be restored here, listed with the reason for its owner to
        close (an imported session that was stale where it came from)."""
        self._stale(stored, why)

    def _stale(self, stored: StoredSession, why: str) -> None:
        log.warning("session %s is stale: %s", stored.id, why)
        self.metrics.stale_sessions.inc()
        session = _stale_session(stored, self.identity, why)
        self.registry.add(session)


def _session(
    stored: StoredSession,
    policy: PolicyConfig,
    identity: ModelIdentity,
    sampling: SamplingParams | None,
) -> Session:
    """A session as stored, without a sequence yet (seq_id -1) and with its stored generation."""
    r = stored.record
    return Session(
        id=stored.id,
        tenant=stored.tenant,
        seq_id=-1,
        policy=policy,
        seq=CacheSequence(policy),
        sampling=sampling,
        sampler=Sampler(sampling) if sampling else None,
        model=identity,
        system_tokens=[],
        system_prompt_sha256=str(r.get("system_prompt_sha256", "")),
        pinned=0,
        reset_count=int(r.get("reset_count", 0)),
    )


def _stale_session(stored: StoredSession, identity: ModelIdentity, why: str) -> Session:
    """A placeholder the owner can list and close: no sequence, no cells, every other call refused."""
    try:
        policy = policy_from(stored.record["policy"])
    except (KeyError, TypeError, SinkdError):
        policy = PolicyConfig.named("full", sinks=0, window=1)
    session = _session(stored, policy, identity, None)
    session.generation = str(stored.record.get("generation", ""))
    session.transition(SessionState.STALE)
    session.failure = why
    session.resume = "stale"
    return session
