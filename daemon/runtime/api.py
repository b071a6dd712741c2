"""The typed objects that cross from the runtime to its edges (gRPC, the CLI, an embedded user).

Requests come in as these, answers go out as these; an edge translates them to its wire format in
one place (`sinkd.proto.convert` for protobuf) and nowhere else. Content (text, token ids, logits)
appears only in the owner's answers, never in the admin's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import TypeAlias

import numpy as np

from sinkd.cachepolicy import PolicyConfig
from sinkd.cachepolicy.recall_plan import RecallConfig, RecalledSpan
from sinkd.cachepolicy.sequence import TraceEvent
from sinkd.errors import SinkdError

Span: TypeAlias = tuple[int, int]  # [start, end)

__all__ = [
    "AppendResult",
    "CancelToken",
    "ChatRequest",
    "DigestOptions",
    "Done",
    "ErrorEvent",
    "Event",
    "GenerationOptions",
    "Handle",
    "Inspection",
    "KeptSelection",
    "ModelInfo",
    "Narrated",
    "NarratedInterval",
    "NarratedStream",
    "NarrationAnswer",
    "PassageView",
    "PolicyRequest",
    "RecallReport",
    "RecallRequest",
    "RecallResult",
    "Receipt",
    "SamplingRequest",
    "Stats",
    "Stream",
    "TokenEvent",
    "TraceEvent",
    "Turn",
    "to_json",
]


@dataclass(frozen=True)
class Handle:
    """A session at one generation: a reset, a model change or a close makes it stale."""

    session_id: str
    generation: str


# --- requests ---


@dataclass(frozen=True)
class PolicyRequest:
    """A client's policy fields as given; unset (None) fields take the model's or daemon's
    defaults when the runtime resolves them."""

    name: str = "sink"
    sinks: int | None = None
    window: int | None = None
    evict_chunk: int | None = None
    compact_interval: int | None = None
    pin_system_prompt: bool = False
    ingest_chunk: int | None = None
    # with the window unset: W as large as the session's cells and the model allow (a chat's
    # window), instead of the model's default
    fill_window: bool = False


@dataclass(frozen=True)
class RecallRequest:
    mode: str | None = None
    budget: int | None = None
    passages: int | None = None
    threshold: float | None = None
    # out of the tenant's memory across conversations (where the tenant keeps one)
    private: bool = False


@dataclass(frozen=True)
class SamplingRequest:
    """Sampling fields a client set; the runtime validates them (InvalidInput names the field).
    Unset repetition fields keep the sampler's defaults."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None

    def given(self) -> dict[str, float | int]:
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


@dataclass(frozen=True)
class OutputFormat:
    """A reply constrained to JSON by a grammar: any object (`schema_json` None) or valid for one
    JSON schema (its canonical text). What the grammar cannot enforce is refused, never ignored."""

    schema_json: str | None = None


@dataclass(frozen=True)
class GenerationOptions:
    """How one reply is generated: built once at the edge from its wire format, carried as is by
    every request type, turned into the engine's spec once (`runtime/turns.py`)."""

    # None: the client named none; the reply runs to the end of its turn, cut by the repetition
    # guard or at the daemon's `max_reply_tokens` (config.py: the one default)
    max_tokens: int | None = None
    stops: tuple[str, ...] = ()
    # None: the session's own sampler (a chat turn of a session that chose none: the model's
    # recommended chat sampling)
    sampling: SamplingRequest | None = None
    # None: free text
    output: OutputFormat | None = None


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: `arguments` is JSON text, valid for the tool's schema (a grammar
    decoded it), exactly as the model wrote it, except the last call of a reply cut short (its
    finish "length"), whose text may stop midway; `id` is the daemon's, for the client to answer."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Tool:
    """A function the client offers: its parameters' JSON schema as canonical text."""

    name: str
    description: str
    parameters_json: str


@dataclass(frozen=True)
class ToolUse:
    """The tools a chat turn offers and how the reply may use them: `choice` is "auto", "none",
    "required", or a tool's name; `parallel` lets one reply make several calls."""

    tools: tuple[Tool, ...]
    choice: str = "auto"
    parallel: bool = True


@dataclass(frozen=True)
class Turn:
    """One turn of a conversation as a client sends it: "user", "assistant" (or "system"); with
    tools, an assistant turn's `calls` and "tool" turns answering them (`name`: the tool's)."""

    role: str
    content: str
    calls: tuple[ToolCall, ...] = ()
    name: str = ""
    call_id: str = ""  # a tool turn's call (its `name` found from it where the client gave none)


@dataclass(frozen=True)
class ChatRequest:
    message: str
    options: GenerationOptions = field(default_factory=GenerationOptions)
    # keep the conversation out of its tenant's memory across conversations, from this turn on
    # (what it gave goes too): nothing of it kept, nothing recalled from the others
    private: bool = False
    # the model's reply before this message: kept in the tenant's memory when the message asks
    # to remember it ("remember that"); the model's words cross no other way
    reply_before: str = ""


class CancelToken:
    """An edge's hold on the engine work of one call, cancelled when its client goes away: the
    runtime ties each job of the call to it, and a job tied after the cancel is cancelled at once
    (a history still being ingested included). The edges hold this, never the jobs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancels: list[Callable[[], None]] = []
        self.cancelled = False

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            cancels, self._cancels = self._cancels, []
        for cancel in cancels:
            cancel()

    def tie(self, cancel: Callable[[], None]) -> None:
        with self._lock:
            if not self.cancelled:
                self._cancels.append(cancel)
                return
        cancel()


# --- answers ---


@dataclass(frozen=True)
class RecallReport:
    """What one recall did: counts, scores and provenance; the query only as its hash."""

    query_sha256: str
    query_terms: int
    candidates: int
    best_score: float
    threshold: float
    note: str
    recalled: tuple[RecalledSpan, ...] = ()
    search: str = ""  # "bm25+dense", or "bm25 alone: why" (the embedder is off or not pulled)


@dataclass(frozen=True)
class Receipt:
    """Content-free account of one session: its policy, positions (logical and cache), counts,
    durability and recall. The admin may read it; it holds no text."""

    session_id: str
    generation: str
    reset_count: int
    state: str
    tenant: str
    policy: PolicyConfig
    n_seen: int
    retained: int
    anchors_logical: Span
    recent_logical: Span
    anchors_cache: Span
    recent_cache: Span
    pending_gap: int
    evictions: int
    evicted_tokens: int
    shifts: int
    kv_payload_bytes: int
    model: str
    model_sha256: str
    system_prompt_tokens: int
    system_prompt_tokens_pinned: int
    system_prompt_sha256: str
    resume: str
    stale_reason: str
    snapshot_n_seen: int  # -1: no snapshot
    snapshot_unix_time: float
    journal_chunks: int
    journal_tokens: int
    recall: RecallConfig
    recalled: tuple[RecalledSpan, ...]
    memory_passages: int
    memory_tokens: int
    memory_bytes: int
    last_recall: RecallReport | None
    # resident (in the context's cells), parked (on disk, restored by its next call) or none (a
    # stale or failed session); its restores so far, and this request's restore, if it needed one
    residency: str = "resident"
    restores: int = 0
    restored_ms: float = 0.0
    # tokens of its stream restored from a stored prefix (runtime/loop/prefixes.py), not read
    prefix_tokens: int = 0

    @property
    def handle(self) -> Handle:
        return Handle(self.session_id, self.generation)

    def for_admin(self) -> Receipt:
        """What the admin reads: without the sha256 of the system prompt and of the last recall's
        query (the user's chat message): an unsalted hash lets whoever holds it confirm a guess."""
        last = self.last_recall
        return replace(
            self,
            system_prompt_sha256="",
            last_recall=None if last is None else replace(last, query_sha256=""),
        )


@dataclass(frozen=True)
class TokenEvent:
    id: int
    text: str  # what this token completes (UTF-8 held back until whole, stop strings cut)
    index: int
    latency_ms: float  # since the previous token (or the request, for the first)


@dataclass(frozen=True)
class Done:
    """A request's end: why (max_tokens, stop, eog, cache_full; "" for an append or a recall),
    how many tokens it generated, the receipt as it left the session, and its recall if it
    tried one."""

    reason: str
    generated: int
    receipt: Receipt
    recall: RecallReport | None = None


@dataclass(frozen=True)
class ChatDone(Done):
    """The end of an HTTP chat turn that offered tools: the calls its reply made, whole (the gRPC
    API offers no tools; its Done is the plain one)."""

    calls: tuple[ToolCall, ...] = ()


def calls_of(done: Done) -> tuple[ToolCall, ...]:
    return done.calls if isinstance(done, ChatDone) else ()


@dataclass(frozen=True)
class ToolCallDelta:
    """A streamed piece of tool call `index`: its id and name first, then argument text as it
    comes (the pieces of one call join into its `arguments`)."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ErrorEvent:
    error: SinkdError


Event: TypeAlias = TokenEvent | Done | ErrorEvent
Stream: TypeAlias = Iterator[TokenEvent | Done]  # a generation as the caller reads it: errors raise
# a chat turn that may call tools: its text as TokenEvents, its calls as ToolCallDeltas
ChatStream: TypeAlias = Iterator[TokenEvent | ToolCallDelta | Done]


@dataclass(frozen=True)
class Erased:
    """What a deletion removed (passages; 1 for a session or a response), and whether its content
    may still be on disk: a reader of journal.db held the write-ahead log past the reply's wait;
    it leaves once that reader lets go (docs/security.md)."""

    count: int = 1
    purge_owed: bool = False


@dataclass(frozen=True)
class TenantHeld:
    """What a node holds of a tenant, counts only, and where the tenant stands here."""

    tenant: str
    sessions: int
    passages: int
    prefixes: int
    state: str = ""  # "", or a TenantMark's state
    move_id: str = ""
    peer: str = ""


@dataclass(frozen=True)
class TenantImported:
    tenant: str
    sessions: int
    passages: int
    prefixes: int
    move_id: str


@dataclass(frozen=True)
class AppendResult:
    appended: int  # how many of the caller's tokens went in
    receipt: Receipt


@dataclass(frozen=True)
class RecallResult:
    report: RecallReport
    receipt: Receipt


@dataclass(frozen=True)
class Inspection:
    receipt: Receipt
    retained_text: str  # "" unless asked for (the owner's)
    logits: np.ndarray | None = None  # the next token's, float32, when asked for (the owner's)


@dataclass(frozen=True)
class PassageView:
    """A stored passage of evicted text (the owner's), with its score when it answered a search."""

    passage_id: int
    logical: Span
    n_tokens: int
    text: str
    created_unix_time: float
    sealed: bool
    score: float | None = None
    speaker: str = "unknown"  # who said it: its turn's role, "text" outside any turn
    turn: int = 0  # its turn's number in the session generation's stream (0: before any)
    # in the tenant's memory across conversations: the conversation that said it ("(given)" for
    # a text given to the memory itself), and whether the user asked for it to be remembered
    conversation: str = ""
    asked: bool = False


@dataclass(frozen=True)
class KeptSelection:
    """Which passages of the tenant's memory across conversations a listing or a forget takes:
    one passage, one conversation's, one speaker's, those kept in [since, until) (unix seconds);
    unset: any."""

    passage_id: int | None = None
    conversation: str | None = None
    speaker: str | None = None
    since: float | None = None
    until: float | None = None


@dataclass(frozen=True)
class ModelInfo:
    name: str
    sha256: str
    loaded: bool
    is_default: bool
    default_sinks: int
    default_window: int
    backend: str = ""  # the loaded model's (engine/devices.py), "" for the others


@dataclass(frozen=True)
class TenantUsage:
    """What one tenant holds, counts and bytes (never text), beside its limits as they stand
    now (`max_*`: what it holds plus the room left it; `reserved_*`: kept for it)."""

    tenant: str
    sessions: int  # open: resident and parked
    parked: int
    max_sessions: int
    reserved_sessions: int
    snapshot_bytes: int  # the state directory's: its sessions' snapshots,
    journal_bytes: int  # their journalled tokens,
    memory_bytes: int  # and their memory's passages (token ids and text)
    max_stored_bytes: int  # 0: no state directory (nothing stored)
    reserved_stored_bytes: int
    prefix_bytes: int  # its prefix states on disk: a cache, bounded by prefix_disk_mb
    responses: int  # stored /v1/responses
    max_responses: int

    @property
    def stored_bytes(self) -> int:
        return self.snapshot_bytes + self.journal_bytes + self.memory_bytes


@dataclass(frozen=True)
class Stats:
    sessions: int
    max_sessions: int
    cells_in_use: int
    cells_per_session: int
    kv_bytes_per_token: int
    prefill_tokens: int
    decode_tokens: int
    evictions: int
    steps: int
    invariant_violations: int
    model: str
    model_sha256: str
    stale_sessions: int
    snapshots: int
    snapshot_failures: int
    parked_sessions: int = 0
    max_parked_sessions: int = 0
    parks: int = 0
    restores: int = 0
    tenants: tuple[TenantUsage, ...] = ()


@dataclass(frozen=True)
class PrefixInfo:
    """One stored prefix state, content-free: its keyed hash, whose it is (a tenant, or "*":
    shared by the operator's declaration), its size in tokens and bytes (RAM, disk), its uses."""

    key: str
    tenant: str
    shared: bool
    tokens: int
    ram_bytes: int
    disk_bytes: int
    hits: int
    idle_s: float


# --- narrated streams (runtime/narrated.py) ---


@dataclass(frozen=True)
class DigestOptions:
    """How a narrated stream cuts intervals and raises incidents (narration/facts.py's
    DigestConfig); 0 takes the default."""

    every_lines: int = 0
    incident_lines: int = 0
    incident_seconds: float = 0.0
    gap_seconds: float = 0.0
    recur_intervals: int = 0
    info_bursts: bool = False
    # keep each interval's raw lines beside its facts (the first 1,000), forgotten with them
    keep_lines: bool = False
    inferred_min: int = 0  # lines of an error only its words suggest ("denied") before a page
    page_handled: bool = False  # such an error its program says it carried past pages too


@dataclass(frozen=True)
class NarratedInterval:
    """One closed interval of a narrated stream, or (`last_number` > `number`) older ones
    folded into one. `record_json`: its facts, their text and the sentence said of them (a
    fold: lines, incidents and errors by template); `support`: the words of its lines the
    grounding check needs, in a Narrate answer only (never kept)."""

    stream: str
    number: int
    last_number: int
    first_line: int
    last_line: int
    started: float
    ended: float
    incidents: int
    errors: int
    record_json: str
    support: tuple[str, ...] = ()


@dataclass(frozen=True)
class NarrationMuted:
    """A template muted or unmuted in a narrated stream: the template as the miner holds it, and
    the stream's muted templates now."""

    template_id: int
    template: str
    muted: tuple[int, ...]


@dataclass(frozen=True)
class NarrationForgotten:
    """What a forget took out of a narrated stream: its intervals (a folded row counts once),
    and whether the purge that takes them out of the files is still owed."""

    intervals: int
    purge_owed: bool = False


@dataclass(frozen=True)
class Narrated:
    """What a Narrate call closed, and where the stream stands."""

    closed: tuple[NarratedInterval, ...]
    lines: int
    pending: int


@dataclass(frozen=True)
class NarratedStream:
    name: str
    created: float
    updated: float
    intervals: int
    lines: int
    incidents: int


@dataclass(frozen=True)
class NarrationAnswer:
    """A question about a narrated stream's past, answered from its kept facts: the intervals
    that matched (`cites`, oldest first: their facts are what the model was given), the model's
    sentences that passed the grounding check (`text`, "" if none) and those it dropped. `held`:
    some kept facts matched the question; if not, nothing was asked of the model."""

    stream: str
    held: bool
    text: str
    dropped: tuple[str, ...]
    facts_text: str
    cites: tuple[NarratedInterval, ...]


def to_json(value: object) -> object:
    """The JSON form of any of these objects (the CLI's `--json`): ranges as [start, end], the
    policy and recall settings as their own dicts, the logits left out."""
    if isinstance(value, PolicyConfig | RecallConfig | RecalledSpan | TraceEvent):
        return value.as_dict()
    if isinstance(value, np.ndarray):
        return None
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    return value
