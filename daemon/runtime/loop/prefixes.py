"""Prefix states: a new session that begins as an earlier one of its tenant did starts from that
prefix's stored cells, and reads only what follows. Engine thread only.

What is kept (bench/prefixes.py measures what it saves):
- the end of a session's system prompt (its tools' descriptions with it), the first time it is
  read: every later chat of the tenant with that system prompt starts there;
- the end of a session's first turn's prompt: a chat UI's side requests (title, tags,
  follow-ups) are each one, the same task instructions then the chat so far, and the next
  one of its kind restores the part they share.
A new session takes the stored prefix it shares most with: all of it, or the shared part of a
longer one (the cells past it removed: a cell depends only on the tokens before it). Only a stream still as read from position 0 counts (`Session.reads`: no eviction, shift, recall
or rewind has touched it), so a prefix holds positions 0..n-1 exactly as read, beside the sinks.

Bit for bit: a prefix is llama.cpp's image of the sequence's cells and the logits of its last
token; a session whose earlier reads began where the prefix's did (`starts`) restores it and
reads on, and its journal gets the chunks a read would (resume replays them as if read). Where
the restore ends a read cut that a whole read would not make, the two compute the same bits only
where llama.cpp's decode does not depend on where a read is cut: so on this CPU for both pinned
models (tests/test_prefixes.py compares them), and on any backend for a system prompt read by its
own job (create), which ends where a read ends anyway.

Per tenant: a prefix serves the tenant that read it, and the prefixes of the system prompts an
operator declared shared serve everyone; never another tenant's, so no tenant learns by timing
what another read. Bounded: RAM first (`ram_bytes`), then the state directory (`disk_bytes`);
past a bound the least recently used prefix of the owner holding the most bytes goes first.
A file made under another model or configuration, or damaged, is dropped with its reason.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.private import secret
from sinkd.daemon.runtime.api import PrefixInfo
from sinkd.daemon.runtime.loop.jobs import Job
from sinkd.daemon.runtime.loop.prefix_shelf import SHARED, Prefix, PrefixShelf, common_length
from sinkd.daemon.runtime.sessions import Session, SessionState
from sinkd.daemon.store import prefix_files
from sinkd.errors import CorruptSnapshot, EngineError

log = logging.getLogger("sinkd.prefixes")

SECRET_FILE = "key"  # the listing's keys are keyed hashes: a key confirms no guess of a prompt


class PrefixStates:
    def __init__(
        self,
        metrics: Metrics,
        ram_bytes: int,
        disk_bytes: int,
        min_tokens: int,
        chunk: int,
        shared_system_sha256: frozenset[str] = frozenset(),
    ) -> None:
        self.metrics = metrics
        self.shelf = PrefixShelf(metrics, ram_bytes, disk_bytes)
        self.min_tokens = min_tokens
        self.chunk = chunk  # the scheduler's prefill chunk: the cuts of every read
        self.min_piece = 2  # the engine's: from this many rows a piece sums as a longer one
        self.shared = shared_system_sha256
        self._secret = b""

    @property
    def enabled(self) -> bool:
        return self.identity is not None and self.shelf.ram_bytes > 0

    @property
    def identity(self) -> dict[str, Any] | None:
        return self.shelf.identity

    # --- at the daemon's start ---

    def configure(
        self, identity: dict[str, Any], directory: Path | None, min_piece: int = 2
    ) -> None:
        """What makes a prefix valid (model, tokenizer and template hashes, KV type, the
        configuration gates a snapshot checks, the backend), and where prefixes are kept on disk
        (None: RAM only). The files there made under this identity are taken; the rest are
        dropped. `min_piece`: the engine's (`Engine.pieces_alike`)."""
        shelf = self.shelf
        shelf.identity = dict(identity)
        self.min_piece = min_piece
        if directory is None or not shelf.disk_bytes:
            self._secret = secrets.token_bytes(32)
            return
        directory = shelf.open(directory)
        self._secret = secret(directory / SECRET_FILE)
        found, bad = prefix_files.scan(directory)
        for path, why in bad:
            log.warning("prefix file %s dropped: %s", path.name, why)
            self.metrics.prefix_drops.labels("damaged").inc()
            prefix_files.remove(path)
        for f in found:
            meta = f.meta
            try:
                tokens = tuple(int(t) for t in meta["tokens"])
                key = self._key(str(meta["owner"]), tokens)
                ok = meta.get("identity") == self.identity and f.path.stem == key
                why = "made under another model or configuration"
            except (KeyError, TypeError, ValueError):
                ok, why = False, "its metadata is incomplete"
            if not ok:
                log.info("prefix file %s dropped: %s", f.path.name, why)
                self.metrics.prefix_drops.labels("mismatch").inc()
                prefix_files.remove(f.path)
                continue
            shelf.held[key] = Prefix(
                key=key,
                owner=str(meta["owner"]),
                tokens=tokens,
                starts=tuple(int(s) for s in meta["starts"]),
                kv_size=int(meta["kv_bytes"]),
                file_size=f.size,
                last_used=float(meta.get("created", 0.0)),
                created=float(meta.get("created", 0.0)),
                holders={(str(h[0]), int(h[1])) for h in meta.get("holders", ())},
            )
        shelf.fit()
        log.info("prefix states: %d on disk", len(shelf.held))

    def _meta(self, p: Prefix) -> dict[str, Any]:
        """A prefix's file's metadata."""
        return {"owner": p.owner, "tokens": list(p.tokens), "starts": list(p.starts),
                "identity": self.identity, "created": p.created,
                "holders": [list(h) for h in p.holders]}  # fmt: skip

    def close(self) -> None:
        """At the daemon's stop: the files handed over are written."""
        self.shelf.close()

    def _key(self, owner: str, tokens: tuple[int, ...]) -> str:
        material = json.dumps([self.identity, owner], sort_keys=True).encode()
        material += array("i", tokens).tobytes()
        return hmac.new(self._secret, material, hashlib.sha256).hexdigest()

    # --- as a job starts: restore, and decide where to keep ---

    def begin(self, engine: Engine, session: Session, job: Job, journal: bool) -> int:
        """The job starts on the session (its tokens final: the pending system prompt and any
        recalled text in them). Restores the longest stored prefix the stream begins with, and
        marks where this job's read is to be kept (`job.store_at`). Returns the tokens restored."""
        if not self.enabled or session.reads is None:
            return 0
        self.shelf.settle()
        start = session.seq.state.n_seen
        stream = session.retained.all()
        if len(stream) != start or session.seq.state.evicted_tokens:
            session.reads = None  # not as read from position 0: nothing of it is a prefix
            return 0
        session.reads.append(start)
        restored = 0
        found = self._longest(session, stream, job.tokens)
        if found is not None:
            restored = self._restore(engine, session, job, *found, journal)
        self._plan_keeps(session, job, stream)
        return restored

    def _owners(self, session: Session) -> tuple[str, str]:
        return session.tenant, SHARED

    def _longest(
        self, session: Session, stream: list[int], tokens: list[int]
    ) -> tuple[Prefix, int] | None:
        """The stored prefix that serves most of the stream, and how much of it: all of one the
        stream begins with, or the part of a longer one it shares (its cells past that are
        removed: a cell depends only on the tokens before it), the job then reading on."""
        assert session.reads is not None
        start, end = len(stream), len(stream) + len(tokens)
        owners = self._owners(session)
        full = array("i", stream)
        full.extend(tokens)
        raw = full.tobytes()
        best: tuple[Prefix, int] | None = None
        for p in self.shelf.held.values():
            if p.owner not in owners:
                continue
            use = common_length(p.raw, raw)
            if use < p.n and use >= end:
                use = end - 1  # a part of a longer prefix: its last logits are read, not kept
            if use < end:
                use = self._alike_last_piece(start, use, end)
            if use <= start or use < self.min_tokens:
                continue
            if best is not None and (use, use == p.n) <= (best[1], best[1] == best[0].n):
                continue
            if tuple(s for s in p.starts if s < use) != tuple(s for s in session.reads if s < use):
                continue  # read in other jobs: not the cuts a read of this stream makes
            best = (p, use)
        return best

    def _alike_last_piece(self, start: int, use: int, end: int) -> int:
        """`use`, lowered until reading on from it in chunks ends in a piece that sums like the
        last piece of reading the job whole (`alike`): pieces of `min_piece` rows or more sum
        alike, a shorter one (a lone row on the CPU, up to 8 rows on a GPU) only as one of its
        own size (docs/determinism.md, docs/gpu.md). Every piece before the last is a chunk."""

        def last(n: int) -> int:
            return (n - 1) % self.chunk + 1

        whole = last(end - start)
        while use > start and not self.alike(last(end - use), whole):
            use -= 1
        return use

    def alike(self, a: int, b: int) -> bool:
        """Pieces of `a` and `b` rows of a stream give a row the same bits (`Engine.pieces_alike`)."""
        return a == b or (a >= self.min_piece and b >= self.min_piece)

    def _restore(
        self, engine: Engine, session: Session, job: Job, p: Prefix, use: int, journal: bool
    ) -> int:
        start = session.seq.state.n_seen
        take = use - start
        cuts = [min(self.chunk, take - off) for off in range(0, take, self.chunk)]
        probe = session.seq.fork()
        for n in cuts:  # the policy would read them with no eviction: else no restore
            planned = probe.plan(n, max_batch=n).sub_batches
            if (
                len(planned) != 1
                or planned[0].ops
                or planned[0].cache_pos != planned[0].logical_pos
            ):
                return 0
            probe.adopt_tokens(planned[0])
        try:
            kv, logits = self.shelf.image(p)
        except CorruptSnapshot as e:
            self.shelf.drop(p, "damaged", str(e))
            return 0
        seq_id = session.seq_id
        before = engine.cells.save_seq(seq_id) if start else b""
        try:
            engine.cells.restore_seq(seq_id, kv)
            if use < p.n:
                engine.cells.remove(seq_id, use, -1)
            if engine.cells.pos_range(seq_id) != (0, use - 1):
                raise EngineError(f"it held positions {engine.cells.pos_range(seq_id)}")
        except EngineError as e:
            engine.cells.clear(seq_id)
            if before:
                engine.cells.restore_seq(seq_id, before)
            self.shelf.drop(p, "refused", f"llama.cpp refused its cells: {e}")
            return 0
        off = 0
        for n in cuts:  # as the executor records a read chunk
            sb = session.seq.append(n, max_batch=n).sub_batches[0]
            piece = job.tokens[off : off + n]
            session.retained.apply(sb, piece)
            if journal:
                session.unlogged.append((sb.logical_pos, sb.cache_pos, list(piece)))
            off += n
        job.offset = take
        # a part of a longer prefix: the job reads on, and its decode gives the logits
        session.set_logits(logits.copy() if use == p.n and logits is not None else None, None)
        session.prefix_tokens += take
        session.last_active = time.monotonic()  # the session's clock
        if session.state in (SessionState.CREATED, SessionState.IDLE):
            session.transition(SessionState.PREFILLING)
        p.hits += 1
        p.holders.add((session.id, session.reset_count))
        p.last_used = time.time()
        self.metrics.prefix_hits.inc()
        self.metrics.prefix_tokens.inc(take)
        log.info("session %s: %d tokens from prefix %s", session.id, take, p.key[:12])
        return take

    def _plan_keeps(self, session: Session, job: Job, stream: list[int]) -> None:
        """Where this job's read is kept: the end of the session's system prompt, and the end of
        its first turn's prompt (a chat UI's side request is one: the next of its kind restores
        the part they share). The read is cut at each (`cut_before`)."""
        start = len(stream)
        end = start + len(job.tokens)
        limit = session.policy.budget if session.policy.evicts else end
        now = session.seq.state.n_seen
        points = []
        n_system = len(session.system_tokens)
        if start == 0 and job.tokens[:n_system] == list(session.system_tokens):
            points.append(n_system)
        if session.turns_taken == 0:  # the first turn's prompt (gRPC: the appends before it)
            points.append(end)
        # each keeps at least `min_tokens` more than the stream holds (restored) as the job starts
        job.store_at = sorted(
            b for b in set(points) if now + self.min_tokens <= b <= min(end, limit)
        )

    # --- as a chunk is read ---

    def cut_before(self, job: Job, n_seen: int, take: int) -> int:
        """The job's next read of `take` tokens, cut short at a point where it is to be kept:
        never leaving a piece, before or after, shorter than `min_piece` (it would sum otherwise
        than the read not cut there)."""
        short = self.min_piece - 1
        for point in job.store_at:
            if n_seen + short < point < n_seen + take - short:
                return point - n_seen
        return take

    def reached(self, engine: Engine, session: Session, job: Job) -> None:
        """The job's read just ended a chunk: keep the cells if this is one of its points."""
        n = session.seq.state.n_seen
        if n not in job.store_at or session.reads is None or session.last_logits is None:
            return
        owner = session.tenant
        if session.system_prompt_sha256 in self.shared and n == len(session.system_tokens):
            owner = SHARED
        tokens = tuple(session.retained.all())
        if len(tokens) != n or engine.cells.pos_range(session.seq_id) != (0, n - 1):
            return
        key = self._key(owner, tokens)
        held = self.shelf.held.get(key)
        if held is not None:
            held.last_used = time.time()
            held.holders.add((session.id, session.reset_count))
            return
        kv = engine.cells.save_seq(session.seq_id)
        logits = np.array(session.last_logits, dtype=np.float32, copy=True)
        now = time.time()
        p = Prefix(key, owner, tokens, tuple(s for s in session.reads if s < n), len(kv),
                   kv=kv, logits=logits, last_used=now, created=now,
                   holders={(session.id, session.reset_count)})  # fmt: skip
        if p.ram > self.shelf.ram_bytes:
            return  # larger than the whole bound: never kept
        # written off this thread; on disk once the shelf settles
        self.shelf.write(key, self._meta(p), kv, logits)
        self.shelf.held[key] = p
        self.metrics.prefix_stored.inc()
        log.info("session %s: prefix %s kept (%d tokens)", session.id, key[:12], n)
        self.shelf.fit()

    # --- the owner's view ---

    def release(self, session_id: str, reset_count: int) -> None:
        """A session's generation ended (closed, or reset): the tenant's prefixes that no other
        live session holds go with it (their cells are its prompts)."""
        for p in list(self.shelf.held.values()):
            if p.owner == SHARED:
                continue
            p.holders.discard((session_id, reset_count))
            if not p.holders:
                self.shelf.drop(p, "released", "")

    def prune(self, live: set[tuple[str, int]]) -> None:
        """After a restart: the tenant's prefixes whose sessions are all gone go. A file names
        the session that made it alone (those that restored it later are not written down), so
        one that only they still hold goes too: a cache lost, nothing kept too long."""
        for p in list(self.shelf.held.values()):
            if p.owner != SHARED:
                p.holders &= live
                if not p.holders:
                    self.shelf.drop(p, "released", "")

    def of_tenant(self, tenant: str) -> list[dict[str, Any]]:
        """The tenant's own prefixes (not the shared ones) as a move carries them: tokens, where
        their reads began, the live sessions holding them, cells and logits (moving a 600-token
        system prompt's cells costs less than reading it again: docs/deployment.md)."""
        out = []
        for p in [p for p in self.shelf.held.values() if p.owner == tenant]:
            try:
                kv, logits = self.shelf.image(p)
            except CorruptSnapshot:
                continue  # a damaged file: the next node reads it again
            out.append({"tokens": list(p.tokens), "starts": list(p.starts), "kv": kv,
                        "logits": logits, "holders": [list(h) for h in p.holders]})  # fmt: skip
        return out

    def adopt(self, tenant: str, carried: list[dict[str, Any]]) -> int:
        """A moved tenant's prefixes, kept here under this node's keys (its RAM and disk bounds
        apply: one past them is dropped as any would be), written before this returns. They are
        a cache, taken after the import's commit: a kill in between loses them (read again at
        first use), never the sessions or the memory. Returns how many were taken."""
        if not self.enabled:
            return 0
        taken = 0
        for c in carried:
            tokens = tuple(int(t) for t in c["tokens"])
            key = self._key(tenant, tokens)
            if key in self.shelf.held:
                continue
            kv, logits, now = bytes(c["kv"]), c["logits"], time.time()
            p = Prefix(key, tenant, tokens, tuple(int(x) for x in c["starts"]), len(kv), kv=kv,
                       logits=logits, last_used=now, created=now,
                       holders={(str(h[0]), int(h[1])) for h in c["holders"]})  # fmt: skip
            if p.ram > self.shelf.ram_bytes:
                continue
            self.shelf.write(key, self._meta(p), kv, logits)
            self.shelf.held[key] = p
            taken += 1
        self.shelf.fit()
        self.shelf.flush()  # on disk before the import answers (and its source deletes)
        return taken

    def forget_tenant(self, tenant: str) -> int:
        """Drop the tenant's prefixes (a forget: their cells may hold what it forgot)."""
        mine = [p for p in self.shelf.held.values() if p.owner == tenant]
        for p in mine:
            self.shelf.drop(p, "forgotten", "")
        return len(mine)

    def count_by_owner(self) -> dict[str, int]:
        """Prefixes held per owner (a tenant, or SHARED)."""
        held: dict[str, int] = {}
        for p in self.shelf.held.values():
            held[p.owner] = held.get(p.owner, 0) + 1
        return held

    def disk_by_owner(self) -> dict[str, int]:
        """Bytes on disk per owner (a tenant, or SHARED)."""
        self.shelf.settle()
        held: dict[str, int] = {}
        for p in self.shelf.held.values():
            held[p.owner] = held.get(p.owner, 0) + p.file_size
        return held

    def listing(self, tenant: str | None) -> list[PrefixInfo]:
        """What is held, by key and size, never text: a tenant's own and the shared ones; the
        admin's (None) all, with their owners."""
        self.shelf.settle()
        now = time.time()
        return [
            PrefixInfo(
                key=p.key,
                tenant=p.owner,
                shared=p.owner == SHARED,
                tokens=p.n,
                ram_bytes=p.ram,
                disk_bytes=p.file_size,
                hits=p.hits,
                idle_s=round(now - p.last_used, 3) if p.last_used else 0.0,
            )
            for p in sorted(self.shelf.held.values(), key=lambda p: -p.last_used)
            if tenant is None or p.owner in (tenant, SHARED)
        ]
