"""Sessions: one llama.cpp sequence each, owned by one tenant, identified by a generation hash.

State diagram (one session; `TRANSITIONS` is the table `Session.transition` enforces)::

    CREATED -> PREFILLING (system prompt) -> IDLE
    CREATED -> IDLE (no system prompt; a fork; a resumed session)
    IDLE -> PREFILLING (append, or a generation's prompt) -> GENERATING -> IDLE
    IDLE -> GENERATING (generate) -> IDLE
       any live state --reset--> IDLE (new generation, cells freed)
       any state but CLOSED --close/expiry--> CLOSED
       any live state --invariant violation, failed step--> FAILED (cells freed; reset or close)
    CREATED --at resume, cannot be restored exactly--> STALE (no cells; close only)
    IDLE --parked, its files cannot be restored exactly--> STALE

Residency is beside the state: an IDLE session may be parked (its cells freed, its state in its
newest snapshot, `seq_id` -1) and is restored into a sequence by the next call that needs its cells
(loop/residency.py).
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import json
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sinkd.cachepolicy import CacheSequence, Evict, PolicyConfig, SubBatch
from sinkd.cachepolicy.recall_plan import RecallConfig, RecalledSpan, held, in_any
from sinkd.daemon.runtime.api import RecallReport, Receipt
from sinkd.daemon.store.passages import SessionKey
from sinkd.errors import IllegalTransition, NotFound, SessionElsewhere, StaleGeneration, echo


class SessionState(str, enum.Enum):
    CREATED = "created"
    PREFILLING = "prefilling"
    GENERATING = "generating"
    IDLE = "idle"
    CLOSED = "closed"
    FAILED = "failed"
    STALE = "stale"


TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    SessionState.CREATED: frozenset(
        {SessionState.PREFILLING, SessionState.IDLE, SessionState.FAILED, SessionState.STALE}
    ),
    SessionState.PREFILLING: frozenset(
        {SessionState.PREFILLING, SessionState.GENERATING, SessionState.IDLE, SessionState.FAILED}
    ),
    SessionState.GENERATING: frozenset(
        {SessionState.GENERATING, SessionState.IDLE, SessionState.FAILED}
    ),
    SessionState.IDLE: frozenset(
        {
            SessionState.IDLE,
            SessionState.PREFILLING,
            SessionState.GENERATING,
            SessionState.FAILED,
            SessionState.STALE,  # parked, and its files cannot be restored exactly
        }
    ),
    SessionState.FAILED: frozenset({SessionState.FAILED, SessionState.IDLE}),  # IDLE: a reset
    SessionState.STALE: frozenset(),
    SessionState.CLOSED: frozenset(),
}
for _state in SessionState:  # close is allowed from anywhere but CLOSED itself
    if _state is not SessionState.CLOSED:
        TRANSITIONS[_state] = TRANSITIONS[_state] | {SessionState.CLOSED}


LOCAL_TENANT = "local"  # the Unix socket's user, when no tenants are configured


@dataclass(frozen=True)
class Principal:
    """Who is calling, as the transport authenticated it."""

    tenant: str | None  # None: the admin, who owns no sessions
    admin: bool = False


@dataclass(frozen=True)
class ModelIdentity:
    name: str
    sha256: str
    tokenizer_sha256: str
    template_sha256: str


def generation_hash(
    session_id: str,
    tenant: str,
    reset_count: int,
    model: ModelIdentity,
    system_prompt_sha256: str,
    policy: PolicyConfig,
) -> str:
    """Everything that makes a stream a different stream; any change makes old handles stale.

    Nothing about the daemon's run is in it: a session resumed after a restart keeps its handle.
    """
    material = json.dumps(
        {
            "session": session_id,
            "tenant": tenant,
            "reset_count": reset_count,
            "model_sha256": model.sha256,
            "tokenizer_sha256": model.tokenizer_sha256,
            "template_sha256": model.template_sha256,
            "system_prompt_sha256": system_prompt_sha256,
            "policy": policy.as_dict(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()


class RetainedTokens:
    """The token ids of the retained cells, kept beside the policy so the owner can read them back.

    Content: never logged, never shown to the admin.
    """

    def __init__(self, sinks: int) -> None:
        self.sinks_cap = sinks
        self.sinks: list[int] = []
        self.window: deque[int] = deque()

    def apply(self, sub_batch: SubBatch, tokens: Iterable[int]) -> list[tuple[int, list[int]]]:
        """Follow the sub-batch; returns what it evicted, as (first logical position, tokens)."""
        evicted = []
        for op in sub_batch.ops:
            if isinstance(op, Evict):
                n = op.logical_end - op.logical_start
                evicted.append((op.logical_start, [self.window.popleft() for _ in range(n)]))
        for tok in tokens:
            if len(self.sinks) < self.sinks_cap:
                self.sinks.append(tok)
            else:
                self.window.append(tok)
        return evicted

    def all(self) -> list[int]:
        return self.sinks + list(self.window)

    def drop_newest(self, n: int) -> None:
        """Follow a rewind: the newest `n` tokens leave (from the window, then the sinks)."""
        for _ in range(n):
            (self.window or self.sinks).pop()

    def tail(self, n: int) -> list[int]:
        """The last `n` retained tokens, in stream order (the repetition penalty's history)."""
        if n <= 0:
            return []
        if n <= len(self.window):  # from the right end: O(n), not O(window)
            return list(itertools.islice(reversed(self.window), n))[::-1]
        return (self.sinks + list(self.window))[-n:]

    def __len__(self) -> int:
        return len(self.sinks) + len(self.window)

    def copy(self) -> RetainedTokens:
        other = RetainedTokens(self.sinks_cap)
        other.sinks = list(self.sinks)
        other.window = deque(self.window)
        return other


@dataclass
class Session:
    id: str
    tenant: str
    seq_id: int
    policy: PolicyConfig
    seq: CacheSequence
    sampling: Any  # sinkd.daemon.engine.sampler.SamplingParams (kept import-free of llama_cpp)
    sampler: Any  # sinkd.daemon.engine.sampler.Sampler
    model: ModelIdentity
    system_tokens: list[int]
    system_prompt_sha256: str
    pinned: int  # how many system prompt tokens are sinks
    reset_count: int = 0
    state: SessionState = SessionState.CREATED
    generation: str = ""
    last_logits: np.ndarray | None = None
    # llama.cpp's argmax of last_logits, computed in the decode, with the row it belongs to: it
    # holds only while last_logits is that very row (any other assignment leaves it unused)
    last_greedy: tuple[np.ndarray, int] | None = None
    pending_prefix: list[int] = field(default_factory=list)
    retained: RetainedTokens = field(init=False)
    last_active: float = field(default_factory=time.monotonic)
    failure: str = ""
    # durability (engine thread): decoded prefill chunks not yet acknowledged, as
    # (logical_pos, cache_pos, tokens); the journal and snapshot counters shown by `sessions list`
    unlogged: list[tuple[int, int, list[int]]] = field(default_factory=list)
    resume: str = "new"
    snap_n_seen: int | None = None
    snap_time: float | None = None
    snap_retry_at: float = 0.0  # after a failed snapshot, not again before this (wall clock)
    logged_since_snap: int = 0
    # forget: the history is to be rewritten without the forgotten tokens (a new snapshot, the
    # older ones and every chunk dropped) at the next gap between steps; `scrub_after`: again once
    # the stream has evicted a live recalled copy of a forgotten passage, up to this position
    scrub_due: bool = False
    scrub_after: int | None = None
    log_chunks: int = 0
    log_tokens: int = 0
    # recall (engine thread): the settings, the recalled copies in the stream (oldest first, until
    # the stream evicts them), the memory's size (passages, tokens, bytes) and the last recall's
    # report
    recall: RecallConfig = field(default_factory=RecallConfig)
    recalled: list[RecalledSpan] = field(default_factory=list)
    memory_stats: tuple[int, int, int] = (0, 0, 0)
    last_recall: RecallReport | None = None
    # regenerated turns so far: each draws its chat sampling seed anew (kept in snapshots)
    rewinds: int = 0
    # the user's chat turns so far in this generation (kept in snapshots): the turn a passage of
    # the tenant's memory names; and whether a passage of that memory was copied into the stream
    # (a forget of one then rewrites this session's files too)
    user_turns: int = 0
    took_across: bool = False
    # closed after this long idle, if shorter than the daemon's `idle_timeout_s` (a client's
    # keep_alive; not kept across a restart)
    idle_timeout_s: float | None = None
    # residency (engine thread): parked (no sequence: seq_id -1; its cells in its newest snapshot,
    # or in memory without a state directory); whole turns answered (one: on probation, the first
    # to give up its cells); restores so far
    parked: bool = False
    turns_taken: int = 0
    restores: int = 0
    # decode steps since the audit last compared its cells with llama.cpp's (loop/audit.py)
    unchecked_steps: int = 0
    # prefix states (loop/prefixes.py): where each job's read began while the stream is still as
    # read from position 0 (None: an eviction, shift, recall or rewind touched it, or it was
    # resumed, forked or moved); the tokens restored from stored prefixes rather than read
    reads: list[int] | None = None
    prefix_tokens: int = 0

    def __post_init__(self) -> None:
        self.retained = RetainedTokens(self.policy.sinks)
        self.refresh_generation()

    @property
    def key(self) -> SessionKey:
        """What its stored memory is filed under: this session at this reset count."""
        return SessionKey(self.id, self.reset_count, self.tenant)

    def transition(self, to: SessionState) -> None:
        """Move to `to` along an edge of TRANSITIONS; any other move is a bug, refused loudly."""
        if to not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"session {self.id}: {self.state.value} -> {to.value}")
        self.state = to

    def settle(self) -> None:
        """A request ended: back to IDLE unless the session failed or closed meanwhile."""
        if self.state in (SessionState.PREFILLING, SessionState.GENERATING, SessionState.CREATED):
            self.transition(SessionState.IDLE)
        self.last_active = time.monotonic()

    def clear_history(self) -> None:
        """Forget what the policy, the ledger, the sampler and the logits knew of the stream (the
        caller has removed, or will remove, the cells themselves)."""
        self.seq.reset()
        self.retained = RetainedTokens(self.policy.sinks)
        self.recalled = []
        self.user_turns = 0
        self.memory_stats = (0, 0, 0)
        self.last_recall = None
        if self.sampler is not None:
            self.sampler.reset()
        self.last_logits = None
        self.last_greedy = None

    def set_logits(self, logits: np.ndarray | None, greedy: int | None) -> None:
        """The next-token logits, and their greedy token where llama.cpp computed it."""
        self.last_logits = logits
        self.last_greedy = None if logits is None or greedy is None else (logits, greedy)

    @property
    def greedy_hint(self) -> int | None:
        """The greedy token of last_logits as the decode computed it, or None."""
        pair = self.last_greedy
        return pair[1] if pair is not None and pair[0] is self.last_logits else None

    @property
    def has_history(self) -> bool:
        """Its cache holds a history the journal keeps (not failed, closed or stale)."""
        return self.state not in (SessionState.FAILED, SessionState.CLOSED, SessionState.STALE)

    def refresh_generation(self) -> None:
        self.generation = generation_hash(
            self.id,
            self.tenant,
            self.reset_count,
            self.model,
            self.system_prompt_sha256,
            self.policy,
        )

    def receipt(self, bytes_per_token: float) -> Receipt:
        r = self.seq.receipt()
        return Receipt(
            session_id=self.id,
            generation=self.generation,
            reset_count=self.reset_count,
            state=self.state.value,
            tenant=self.tenant,
            policy=r.config,
            n_seen=r.n_seen,
            retained=r.retained,
            anchors_logical=r.anchors_logical,
            recent_logical=r.recent_logical,
            anchors_cache=r.anchors_cache,
            recent_cache=r.recent_cache,
            pending_gap=r.pending_gap,
            evictions=r.evictions,
            evicted_tokens=r.evicted_tokens,
            shifts=r.shifts,
            kv_payload_bytes=int(r.retained * bytes_per_token),
            model=self.model.name,
            model_sha256=self.model.sha256,
            system_prompt_tokens=len(self.system_tokens),
            system_prompt_tokens_pinned=self.pinned,
            system_prompt_sha256=self.system_prompt_sha256,
            resume=self.resume,
            stale_reason=self.failure if self.state is SessionState.STALE else "",
            snapshot_n_seen=-1 if self.snap_n_seen is None else self.snap_n_seen,
            snapshot_unix_time=self.snap_time
            if self.snap_time is not None and self.snap_n_seen is not None
            else 0.0,
            journal_chunks=self.log_chunks,
            journal_tokens=self.log_tokens,
            recall=self.recall,
            recalled=tuple(self.recalled_held()),
            memory_passages=self.memory_stats[0],
            memory_tokens=self.memory_stats[1],
            memory_bytes=self.memory_stats[2],
            last_recall=self.last_recall,
            residency="parked" if self.parked else ("resident" if self.seq_id >= 0 else "none"),
            restores=self.restores,
            prefix_tokens=self.prefix_tokens,
        )

    def penalty_history(self, n: int) -> list[int]:
        """The repetition penalty's history: the stream's last `n` tokens, less the recalled
        copies among them. A reply may quote what recall brought back (that is what it is for);
        its own repeats, and the rest of the stream's, stay penalised."""
        tokens = self.retained.tail(n)
        if not self.recalled or not tokens:
            return tokens
        k = min(len(tokens), len(self.retained.window))  # the window's part ends at n_seen
        start = self.seq.state.n_seen - k
        kept = [t for i, t in enumerate(tokens[-k:]) if not in_any(start + i, self.recalled)]
        return tokens[: len(tokens) - k] + kept

    def recalled_held(self) -> list[RecalledSpan]:
        """The recalled copies the cache holds now (cut to what the stream has not evicted)."""
        s = self.seq.state
        return held(self.recalled, max(s.window_start, self.seq.config.sinks), s.n_seen)


def new_session_id(node: str | None = None) -> str:
    """`s_` and 16 hex digits; on a node of a deployment, `s_<node>-` and 16 hex digits: the id
    says where the session was made, so another node can tell a session it never held from one
    that lives on a node it cannot reach."""
    return f"s_{node}-{secrets.token_hex(8)}" if node else "s_" + secrets.token_hex(8)


def origin_of(made_id: str) -> str | None:
    """The node a session or response id was made on (`s_<node>-...`, `resp_<node>-...`), or
    None (a single daemon's id)."""
    _, _, rest = made_id.partition("_")
    node, dash, _ = rest.rpartition("-")
    return node if dash and node else None


def made_elsewhere(node: str | None, made_id: str) -> SessionElsewhere | None:
    """For an id this node does not know: SessionElsewhere if another node made it."""
    origin = origin_of(made_id)
    if not node or origin is None or origin == node:
        return None
    return SessionElsewhere(
        f"{echo(made_id)} is not on node {node}: it was made on node {echo(origin)}, which the"
        " proxy cannot reach now (down, restarting, or moving its sessions); retry"
    )


class Registry:
    """Sessions by id; lookups check tenant and generation. Thread-safe.

    On a node of a deployment (`node` set) a session this node does not hold is NotFound only
    where this node would hold it: made here and never moved away. One made on another node, or
    moved from here to another (`moved_out`, kept across restarts), is SessionElsewhere
    (UNAVAILABLE): it lives on a node the proxy cannot reach now, and a retry can find it."""

    def __init__(self, node: str | None = None) -> None:
        self.node = node
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._moved_out: dict[str, str] = {}  # session id -> its tenant

    def new_id(self) -> str:
        return new_session_id(self.node)

    def moved_out(self, session_id: str, tenant: str | None) -> None:
        """The session now lives on another node (None: it came back, or never left)."""
        with self._lock:
            if tenant is None:
                self._moved_out.pop(session_id, None)
            else:
                self._moved_out[session_id] = tenant

    def missing(self, tenant: str | None, session_id: str) -> NotFound | SessionElsewhere:
        """The error for a session this node does not hold (`tenant` None: the admin's call; a
        moved session of another tenant's: NotFound, so that nothing tells of it)."""
        with self._lock:
            moved = self._moved_out.get(session_id)
        if moved is not None and tenant in (moved, None):  # None: the admin
            return SessionElsewhere(
                f"session {session_id} moved from node {self.node} to another node; the proxy"
                " sends its calls there once the move is done: retry"
            )
        elsewhere = made_elsewhere(self.node, session_id) if moved is None else None
        return elsewhere or NotFound(f"no session {echo(session_id)}")

    def add(self, session: Session) -> None:
        with self._lock:
            self._sessions[session.id] = session

    def remove(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    def lookup(
        self, tenant: str, session_id: str, generation: str, allow_stale: bool = False
    ) -> Session:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise self.missing(tenant, session_id)
        if session.tenant != tenant or session.state is SessionState.CLOSED:
            raise NotFound(f"no session {echo(session_id)}")
        if session.state is SessionState.STALE and not allow_stale:
            raise StaleGeneration(
                f"session {session_id} could not be resumed: {session.failure}; this handle is"
                " stale (list your sessions for the reason; close it to delete its stored state)"
            )
        if generation != session.generation:
            raise StaleGeneration(
                f"session {session_id} is at another generation (reset, model change or restart):"
                " this handle is stale; use the handle from the latest create, reset or fork"
            )
        return session

    def get(self, session_id: str) -> Session | None:
        with self._lock:
            return self._sessions.get(session_id)

    def of_tenant(self, tenant: str) -> list[Session]:
        with self._lock:
            return [s for s in self._sessions.values() if s.tenant == tenant]

    def all(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())

    def __len__(self) -> int:
        """Open sessions, resident or parked (a stale one is neither)."""
        with self._lock:
            return sum(s.state is not SessionState.STALE for s in self._sessions.values())

    def resident(self) -> list[Session]:
        """The sessions holding a sequence of the context."""
        with self._lock:
            return [s for s in self._sessions.values() if s.seq_id >= 0]

    def parked(self) -> list[Session]:
        with self._lock:
            return [s for s in self._sessions.values() if s.parked]
