from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Policy(_message.Message):
    __slots__ = ("name", "sinks", "window", "evict_chunk", "compact_interval", "pin_system_prompt", "ingest_chunk", "fill_window")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SINKS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    EVICT_CHUNK_FIELD_NUMBER: _ClassVar[int]
    COMPACT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    PIN_SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    INGEST_CHUNK_FIELD_NUMBER: _ClassVar[int]
    FILL_WINDOW_FIELD_NUMBER: _ClassVar[int]
    name: str
    sinks: int
    window: int
    evict_chunk: int
    compact_interval: int
    pin_system_prompt: bool
    ingest_chunk: int
    fill_window: bool
    def __init__(self, name: _Optional[str] = ..., sinks: _Optional[int] = ..., window: _Optional[int] = ..., evict_chunk: _Optional[int] = ..., compact_interval: _Optional[int] = ..., pin_system_prompt: _Optional[bool] = ..., ingest_chunk: _Optional[int] = ..., fill_window: _Optional[bool] = ...) -> None: ...

class Sampling(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "min_p", "seed", "repeat_penalty", "repeat_last_n")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    REPEAT_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPEAT_LAST_N_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int
    repeat_penalty: float
    repeat_last_n: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., seed: _Optional[int] = ..., repeat_penalty: _Optional[float] = ..., repeat_last_n: _Optional[int] = ...) -> None: ...

class Handle(_message.Message):
    __slots__ = ("session_id", "generation")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    generation: str
    def __init__(self, session_id: _Optional[str] = ..., generation: _Optional[str] = ...) -> None: ...

class Range(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class Receipt(_message.Message):
    __slots__ = ("session_id", "generation", "reset_count", "state", "policy", "n_seen", "retained", "anchors_logical", "recent_logical", "anchors_cache", "recent_cache", "pending_gap", "evictions", "evicted_tokens", "shifts", "kv_payload_bytes", "model", "model_sha256", "system_prompt_tokens", "system_prompt_tokens_pinned", "system_prompt_sha256", "tenant", "resume", "stale_reason", "snapshot_n_seen", "snapshot_unix_time", "journal_chunks", "journal_tokens", "recall", "recalled", "memory_passages", "memory_tokens", "memory_bytes", "last_recall", "residency", "restores", "restored_ms", "prefix_tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RESET_COUNT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    N_SEEN_FIELD_NUMBER: _ClassVar[int]
    RETAINED_FIELD_NUMBER: _ClassVar[int]
    ANCHORS_LOGICAL_FIELD_NUMBER: _ClassVar[int]
    RECENT_LOGICAL_FIELD_NUMBER: _ClassVar[int]
    ANCHORS_CACHE_FIELD_NUMBER: _ClassVar[int]
    RECENT_CACHE_FIELD_NUMBER: _ClassVar[int]
    PENDING_GAP_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SHIFTS_FIELD_NUMBER: _ClassVar[int]
    KV_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_TOKENS_PINNED_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_SHA256_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    STALE_REASON_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_N_SEEN_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_UNIX_TIME_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECALL_FIELD_NUMBER: _ClassVar[int]
    RECALLED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PASSAGES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_RECALL_FIELD_NUMBER: _ClassVar[int]
    RESIDENCY_FIELD_NUMBER: _ClassVar[int]
    RESTORES_FIELD_NUMBER: _ClassVar[int]
    RESTORED_MS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    generation: str
    reset_count: int
    state: str
    policy: Policy
    n_seen: int
    retained: int
    anchors_logical: Range
    recent_logical: Range
    anchors_cache: Range
    recent_cache: Range
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
    tenant: str
    resume: str
    stale_reason: str
    snapshot_n_seen: int
    snapshot_unix_time: float
    journal_chunks: int
    journal_tokens: int
    recall: RecallSettings
    recalled: _containers.RepeatedCompositeFieldContainer[RecalledPassage]
    memory_passages: int
    memory_tokens: int
    memory_bytes: int
    last_recall: RecallReport
    residency: str
    restores: int
    restored_ms: float
    prefix_tokens: int
    def __init__(self, session_id: _Optional[str] = ..., generation: _Optional[str] = ..., reset_count: _Optional[int] = ..., state: _Optional[str] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., n_seen: _Optional[int] = ..., retained: _Optional[int] = ..., anchors_logical: _Optional[_Union[Range, _Mapping]] = ..., recent_logical: _Optional[_Union[Range, _Mapping]] = ..., anchors_cache: _Optional[_Union[Range, _Mapping]] = ..., recent_cache: _Optional[_Union[Range, _Mapping]] = ..., pending_gap: _Optional[int] = ..., evictions: _Optional[int] = ..., evicted_tokens: _Optional[int] = ..., shifts: _Optional[int] = ..., kv_payload_bytes: _Optional[int] = ..., model: _Optional[str] = ..., model_sha256: _Optional[str] = ..., system_prompt_tokens: _Optional[int] = ..., system_prompt_tokens_pinned: _Optional[int] = ..., system_prompt_sha256: _Optional[str] = ..., tenant: _Optional[str] = ..., resume: _Optional[str] = ..., stale_reason: _Optional[str] = ..., snapshot_n_seen: _Optional[int] = ..., snapshot_unix_time: _Optional[float] = ..., journal_chunks: _Optional[int] = ..., journal_tokens: _Optional[int] = ..., recall: _Optional[_Union[RecallSettings, _Mapping]] = ..., recalled: _Optional[_Iterable[_Union[RecalledPassage, _Mapping]]] = ..., memory_passages: _Optional[int] = ..., memory_tokens: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., last_recall: _Optional[_Union[RecallReport, _Mapping]] = ..., residency: _Optional[str] = ..., restores: _Optional[int] = ..., restored_ms: _Optional[float] = ..., prefix_tokens: _Optional[int] = ...) -> None: ...

class RecallSettings(_message.Message):
    __slots__ = ("mode", "budget", "passages", "threshold", "private")
    MODE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_FIELD_NUMBER: _ClassVar[int]
    mode: str
    budget: int
    passages: int
    threshold: float
    private: bool
    def __init__(self, mode: _Optional[str] = ..., budget: _Optional[int] = ..., passages: _Optional[int] = ..., threshold: _Optional[float] = ..., private: _Optional[bool] = ...) -> None: ...

class RecalledPassage(_message.Message):
    __slots__ = ("passage_id", "source_logical", "stream_logical", "score", "recalled_unix_time", "speaker", "conversation", "said_unix_time")
    PASSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LOGICAL_FIELD_NUMBER: _ClassVar[int]
    STREAM_LOGICAL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    RECALLED_UNIX_TIME_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    SAID_UNIX_TIME_FIELD_NUMBER: _ClassVar[int]
    passage_id: int
    source_logical: Range
    stream_logical: Range
    score: float
    recalled_unix_time: float
    speaker: str
    conversation: str
    said_unix_time: float
    def __init__(self, passage_id: _Optional[int] = ..., source_logical: _Optional[_Union[Range, _Mapping]] = ..., stream_logical: _Optional[_Union[Range, _Mapping]] = ..., score: _Optional[float] = ..., recalled_unix_time: _Optional[float] = ..., speaker: _Optional[str] = ..., conversation: _Optional[str] = ..., said_unix_time: _Optional[float] = ...) -> None: ...

class RecallReport(_message.Message):
    __slots__ = ("query_sha256", "query_terms", "candidates", "best_score", "threshold", "note", "recalled", "search")
    QUERY_SHA256_FIELD_NUMBER: _ClassVar[int]
    QUERY_TERMS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    BEST_SCORE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    RECALLED_FIELD_NUMBER: _ClassVar[int]
    SEARCH_FIELD_NUMBER: _ClassVar[int]
    query_sha256: str
    query_terms: int
    candidates: int
    best_score: float
    threshold: float
    note: str
    recalled: _containers.RepeatedCompositeFieldContainer[RecalledPassage]
    search: str
    def __init__(self, query_sha256: _Optional[str] = ..., query_terms: _Optional[int] = ..., candidates: _Optional[int] = ..., best_score: _Optional[float] = ..., threshold: _Optional[float] = ..., note: _Optional[str] = ..., recalled: _Optional[_Iterable[_Union[RecalledPassage, _Mapping]]] = ..., search: _Optional[str] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("policy", "sampling", "system_prompt", "recall")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    RECALL_FIELD_NUMBER: _ClassVar[int]
    policy: Policy
    sampling: Sampling
    system_prompt: str
    recall: RecallSettings
    def __init__(self, policy: _Optional[_Union[Policy, _Mapping]] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., system_prompt: _Optional[str] = ..., recall: _Optional[_Union[RecallSettings, _Mapping]] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("handle", "receipt")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    handle: Handle
    receipt: Receipt
    def __init__(self, handle: _Optional[_Union[Handle, _Mapping]] = ..., receipt: _Optional[_Union[Receipt, _Mapping]] = ...) -> None: ...

class TokenList(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("handle", "text", "tokens")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    handle: Handle
    text: str
    tokens: TokenList
    def __init__(self, handle: _Optional[_Union[Handle, _Mapping]] = ..., text: _Optional[str] = ..., tokens: _Optional[_Union[TokenList, _Mapping]] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("appended", "receipt")
    APPENDED_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    appended: int
    receipt: Receipt
    def __init__(self, appended: _Optional[int] = ..., receipt: _Optional[_Union[Receipt, _Mapping]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("handle", "max_tokens", "stop", "sampling")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    handle: Handle
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    sampling: Sampling
    def __init__(self, handle: _Optional[_Union[Handle, _Mapping]] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ...) -> None: ...

class ChatRequest(_message.Message):
    __slots__ = ("handle", "message", "max_tokens", "stop", "sampling", "private", "reply_before")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_FIELD_NUMBER: _ClassVar[int]
    REPLY_BEFORE_FIELD_NUMBER: _ClassVar[int]
    handle: Handle
    message: str
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    sampling: Sampling
    private: bool
    reply_before: str
    def __init__(self, handle: _Optional[_Union[Handle, _Mapping]] = ..., message: _Optional[str] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., private: _Optional[bool] = ..., reply_before: _Optional[str] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("id", "text", "index", "latency_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    id: int
    text: str
    index: int
    latency_ms: float
    def __init__(self, id: _Optional[int] = ..., text: _Optional[str] = ..., index: _Optional[int] = ..., latency_ms: _Optional[float] = ...) -> None: ...

class Done(_message.Message):
    __slots__ = ("reason", "generated", "receipt", "recall")
    REASON_FIELD_NUMBER: _ClassVar[int]
    GENERATED_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    RECALL_FIELD_NUMBER: _ClassVar[int]
    reason: str
    generated: int
    receipt: Receipt
    recall: RecallReport
    def __init__(self, reason: _Optional[str] = ..., generated: _Optional[int] = ..., receipt: _Optional[_Union[Receipt, _Mapping]] = ..., recall: _Optional[_Union[RecallReport, _Mapping]] = ...) -> None: ...

class GenerateEvent(_message.Message):
    __slots__ = ("token", "done")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    token: Token
    done: Done
    def __init__(self, token: _Optional[_Union[Token, _Mapping]] = ..., done: _Optional[_Union[Done, _Mapping]] = ...) -> None: ...

class HandleRequest(_message.Message):
    __slots__ = ("handle",)
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    handle: Handle
    def __init__(self, handle: _Optional[_Union[Handle, _Mapping]] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("handle", "receipt", "purge_owed")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    PURGE_OWED_FIELD_NUMBER: _ClassVar[int]
    handle: Handle
    receipt: Receipt
    purge_owed: bool
    def __init__(self, handle: _Optional[_Union[Handle, _Mapping]] = ..., receipt: _Optional[_Union[Receipt, _Mapping]] = ..., purge_owed: _Optional[bool] = ...) -> None: ...

class ForkResponse(_message.Message):
    __slots__ = ("handle", "receipt")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    handle: Handle
    receipt: Receipt
    def __init__(self, handle: _Optional[_Union[Handle, _Mapping]] = ..., receipt: _Optional[_Union[Receipt, _Mapping]] = ...) -> None: ...

class CloseResponse(_message.Message):
    __slots__ = ("purge_owed",)
    PURGE_OWED_FIELD_NUMBER: _ClassVar[int]
    purge_owed: bool
    def __init__(self, purge_owed: _Optional[bool] = ...) -> None: ...

class ArchivePiece(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class ImportResponse(_message.Message):
    __slots__ = ("handle", "receipt")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    handle: Handle
    receipt: Receipt
    def __init__(self, handle: _Optional[_Union[Handle, _Mapping]] = ..., receipt: _Optional[_Union[Receipt, _Mapping]] = ...) -> None: ...

class InspectRequest(_message.Message):
    __slots__ = ("handle", "include_text", "include_logits")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_TEXT_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_LOGITS_FIELD_NUMBER: _ClassVar[int]
    handle: Handle
    include_text: bool
    include_logits: bool
    def __init__(self, handle: _Optional[_Union[Handle, _Mapping]] = ..., include_text: _Optional[bool] = ..., include_logits: _Optional[bool] = ...) -> None: ...

class InspectResponse(_message.Message):
    __slots__ = ("receipt", "retained_text", "logits")
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    RETAINED_TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGITS_FIELD_NUMBER: _ClassVar[int]
    receipt: Receipt
    retained_text: str
    logits: bytes
    def __init__(self, receipt: _Optional[_Union[Receipt, _Mapping]] = ..., retained_text: _Optional[str] = ..., logits: _Optional[bytes] = ...) -> None: ...

class TraceEvent(_message.Message):
    __slots__ = ("at_token", "evicted_logical", "evicted_cache", "shift_delta", "shifted_cache", "kind", "passage_id", "recalled_source", "recalled_logical")
    AT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EVICTED_LOGICAL_FIELD_NUMBER: _ClassVar[int]
    EVICTED_CACHE_FIELD_NUMBER: _ClassVar[int]
    SHIFT_DELTA_FIELD_NUMBER: _ClassVar[int]
    SHIFTED_CACHE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PASSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    RECALLED_SOURCE_FIELD_NUMBER: _ClassVar[int]
    RECALLED_LOGICAL_FIELD_NUMBER: _ClassVar[int]
    at_token: int
    evicted_logical: Range
    evicted_cache: Range
    shift_delta: int
    shifted_cache: Range
    kind: str
    passage_id: int
    recalled_source: Range
    recalled_logical: Range
    def __init__(self, at_token: _Optional[int] = ..., evicted_logical: _Optional[_Union[Range, _Mapping]] = ..., evicted_cache: _Optional[_Union[Range, _Mapping]] = ..., shift_delta: _Optional[int] = ..., shifted_cache: _Optional[_Union[Range, _Mapping]] = ..., kind: _Optional[str] = ..., passage_id: _Optional[int] = ..., recalled_source: _Optional[_Union[Range, _Mapping]] = ..., recalled_logical: _Optional[_Union[Range, _Mapping]] = ...) -> None: ...

class RecallRequest(_message.Message):
    __slots__ = ("handle", "query", "budget", "passages", "threshold")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    handle: Handle
    query: str
    budget: int
    passages: int
    threshold: float
    def __init__(self, handle: _Optional[_Union[Handle, _Mapping]] = ..., query: _Optional[str] = ..., budget: _Optional[int] = ..., passages: _Optional[int] = ..., threshold: _Optional[float] = ...) -> None: ...

class RecallResponse(_message.Message):
    __slots__ = ("report", "receipt")
    REPORT_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    report: RecallReport
    receipt: Receipt
    def __init__(self, report: _Optional[_Union[RecallReport, _Mapping]] = ..., receipt: _Optional[_Union[Receipt, _Mapping]] = ...) -> None: ...

class MemoryRequest(_message.Message):
    __slots__ = ("handle", "search", "limit", "speaker")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    SEARCH_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    handle: Handle
    search: str
    limit: int
    speaker: str
    def __init__(self, handle: _Optional[_Union[Handle, _Mapping]] = ..., search: _Optional[str] = ..., limit: _Optional[int] = ..., speaker: _Optional[str] = ...) -> None: ...

class Passage(_message.Message):
    __slots__ = ("passage_id", "logical", "n_tokens", "text", "created_unix_time", "sealed", "score", "speaker", "turn", "conversation", "asked")
    PASSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_FIELD_NUMBER: _ClassVar[int]
    N_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_TIME_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    ASKED_FIELD_NUMBER: _ClassVar[int]
    passage_id: int
    logical: Range
    n_tokens: int
    text: str
    created_unix_time: float
    sealed: bool
    score: float
    speaker: str
    turn: int
    conversation: str
    asked: bool
    def __init__(self, passage_id: _Optional[int] = ..., logical: _Optional[_Union[Range, _Mapping]] = ..., n_tokens: _Optional[int] = ..., text: _Optional[str] = ..., created_unix_time: _Optional[float] = ..., sealed: _Optional[bool] = ..., score: _Optional[float] = ..., speaker: _Optional[str] = ..., turn: _Optional[int] = ..., conversation: _Optional[str] = ..., asked: _Optional[bool] = ...) -> None: ...

class KeptSelection(_message.Message):
    __slots__ = ("passage_id", "conversation", "speaker", "since", "until")
    PASSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    passage_id: int
    conversation: str
    speaker: str
    since: float
    until: float
    def __init__(self, passage_id: _Optional[int] = ..., conversation: _Optional[str] = ..., speaker: _Optional[str] = ..., since: _Optional[float] = ..., until: _Optional[float] = ...) -> None: ...

class KeptRequest(_message.Message):
    __slots__ = ("which", "search", "limit")
    WHICH_FIELD_NUMBER: _ClassVar[int]
    SEARCH_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    which: KeptSelection
    search: str
    limit: int
    def __init__(self, which: _Optional[_Union[KeptSelection, _Mapping]] = ..., search: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class KeptResponse(_message.Message):
    __slots__ = ("passages",)
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    passages: _containers.RepeatedCompositeFieldContainer[Passage]
    def __init__(self, passages: _Optional[_Iterable[_Union[Passage, _Mapping]]] = ...) -> None: ...

class ForgetKeptRequest(_message.Message):
    __slots__ = ("which",)
    WHICH_FIELD_NUMBER: _ClassVar[int]
    which: KeptSelection
    def __init__(self, which: _Optional[_Union[KeptSelection, _Mapping]] = ...) -> None: ...

class RememberRequest(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class MemoryResponse(_message.Message):
    __slots__ = ("passages",)
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    passages: _containers.RepeatedCompositeFieldContainer[Passage]
    def __init__(self, passages: _Optional[_Iterable[_Union[Passage, _Mapping]]] = ...) -> None: ...

class ForgetRequest(_message.Message):
    __slots__ = ("handle", "passage_id", "logical", "speaker")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    PASSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    handle: Handle
    passage_id: int
    logical: Range
    speaker: str
    def __init__(self, handle: _Optional[_Union[Handle, _Mapping]] = ..., passage_id: _Optional[int] = ..., logical: _Optional[_Union[Range, _Mapping]] = ..., speaker: _Optional[str] = ...) -> None: ...

class ForgetResponse(_message.Message):
    __slots__ = ("forgotten", "purge_owed")
    FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    PURGE_OWED_FIELD_NUMBER: _ClassVar[int]
    forgotten: int
    purge_owed: bool
    def __init__(self, forgotten: _Optional[int] = ..., purge_owed: _Optional[bool] = ...) -> None: ...

class TraceResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[TraceEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[TraceEvent, _Mapping]]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PrefixState(_message.Message):
    __slots__ = ("key", "tenant", "shared", "tokens", "ram_bytes", "disk_bytes", "hits", "idle_s")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    IDLE_S_FIELD_NUMBER: _ClassVar[int]
    key: str
    tenant: str
    shared: bool
    tokens: int
    ram_bytes: int
    disk_bytes: int
    hits: int
    idle_s: float
    def __init__(self, key: _Optional[str] = ..., tenant: _Optional[str] = ..., shared: _Optional[bool] = ..., tokens: _Optional[int] = ..., ram_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., hits: _Optional[int] = ..., idle_s: _Optional[float] = ...) -> None: ...

class ListPrefixesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPrefixesResponse(_message.Message):
    __slots__ = ("prefixes",)
    PREFIXES_FIELD_NUMBER: _ClassVar[int]
    prefixes: _containers.RepeatedCompositeFieldContainer[PrefixState]
    def __init__(self, prefixes: _Optional[_Iterable[_Union[PrefixState, _Mapping]]] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[Receipt]
    def __init__(self, sessions: _Optional[_Iterable[_Union[Receipt, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("sessions", "max_sessions", "cells_in_use", "cells_per_session", "kv_bytes_per_token", "prefill_tokens", "decode_tokens", "evictions", "steps", "invariant_violations", "model", "model_sha256", "stale_sessions", "snapshots", "snapshot_failures", "parked_sessions", "max_parked_sessions", "parks", "restores", "tenants")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    CELLS_IN_USE_FIELD_NUMBER: _ClassVar[int]
    CELLS_PER_SESSION_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    INVARIANT_VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    STALE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FAILURES_FIELD_NUMBER: _ClassVar[int]
    PARKED_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_PARKED_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    PARKS_FIELD_NUMBER: _ClassVar[int]
    RESTORES_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
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
    parked_sessions: int
    max_parked_sessions: int
    parks: int
    restores: int
    tenants: _containers.RepeatedCompositeFieldContainer[TenantUsage]
    def __init__(self, sessions: _Optional[int] = ..., max_sessions: _Optional[int] = ..., cells_in_use: _Optional[int] = ..., cells_per_session: _Optional[int] = ..., kv_bytes_per_token: _Optional[int] = ..., prefill_tokens: _Optional[int] = ..., decode_tokens: _Optional[int] = ..., evictions: _Optional[int] = ..., steps: _Optional[int] = ..., invariant_violations: _Optional[int] = ..., model: _Optional[str] = ..., model_sha256: _Optional[str] = ..., stale_sessions: _Optional[int] = ..., snapshots: _Optional[int] = ..., snapshot_failures: _Optional[int] = ..., parked_sessions: _Optional[int] = ..., max_parked_sessions: _Optional[int] = ..., parks: _Optional[int] = ..., restores: _Optional[int] = ..., tenants: _Optional[_Iterable[_Union[TenantUsage, _Mapping]]] = ...) -> None: ...

class TenantUsage(_message.Message):
    __slots__ = ("tenant", "sessions", "parked", "max_sessions", "reserved_sessions", "snapshot_bytes", "journal_bytes", "memory_bytes", "max_stored_bytes", "reserved_stored_bytes", "prefix_bytes", "responses", "max_responses")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    MAX_RESPONSES_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    sessions: int
    parked: int
    max_sessions: int
    reserved_sessions: int
    snapshot_bytes: int
    journal_bytes: int
    memory_bytes: int
    max_stored_bytes: int
    reserved_stored_bytes: int
    prefix_bytes: int
    responses: int
    max_responses: int
    def __init__(self, tenant: _Optional[str] = ..., sessions: _Optional[int] = ..., parked: _Optional[int] = ..., max_sessions: _Optional[int] = ..., reserved_sessions: _Optional[int] = ..., snapshot_bytes: _Optional[int] = ..., journal_bytes: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., max_stored_bytes: _Optional[int] = ..., reserved_stored_bytes: _Optional[int] = ..., prefix_bytes: _Optional[int] = ..., responses: _Optional[int] = ..., max_responses: _Optional[int] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "sha256", "loaded", "is_default", "default_sinks", "default_window", "backend")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_SINKS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    name: str
    sha256: str
    loaded: bool
    is_default: bool
    default_sinks: int
    default_window: int
    backend: str
    def __init__(self, name: _Optional[str] = ..., sha256: _Optional[str] = ..., loaded: _Optional[bool] = ..., is_default: _Optional[bool] = ..., default_sinks: _Optional[int] = ..., default_window: _Optional[int] = ..., backend: _Optional[str] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StopResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TenantRequest(_message.Message):
    __slots__ = ("tenant", "move_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MOVE_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    move_id: str
    def __init__(self, tenant: _Optional[str] = ..., move_id: _Optional[str] = ...) -> None: ...

class MarkTenantRequest(_message.Message):
    __slots__ = ("tenant", "state", "move_id", "peer")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MOVE_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    state: str
    move_id: str
    peer: str
    def __init__(self, tenant: _Optional[str] = ..., state: _Optional[str] = ..., move_id: _Optional[str] = ..., peer: _Optional[str] = ...) -> None: ...

class MarkTenantResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TenantImported(_message.Message):
    __slots__ = ("tenant", "sessions", "passages", "prefixes", "move_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    PREFIXES_FIELD_NUMBER: _ClassVar[int]
    MOVE_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    sessions: int
    passages: int
    prefixes: int
    move_id: str
    def __init__(self, tenant: _Optional[str] = ..., sessions: _Optional[int] = ..., passages: _Optional[int] = ..., prefixes: _Optional[int] = ..., move_id: _Optional[str] = ...) -> None: ...

class ReleaseTenantResponse(_message.Message):
    __slots__ = ("released", "purge_owed")
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    PURGE_OWED_FIELD_NUMBER: _ClassVar[int]
    released: int
    purge_owed: bool
    def __init__(self, released: _Optional[int] = ..., purge_owed: _Optional[bool] = ...) -> None: ...

class HeldTenantsRequest(_message.Message):
    __slots__ = ("arrived",)
    ARRIVED_FIELD_NUMBER: _ClassVar[int]
    arrived: str
    def __init__(self, arrived: _Optional[str] = ...) -> None: ...

class HeldTenant(_message.Message):
    __slots__ = ("tenant", "sessions", "passages", "prefixes", "state", "move_id", "peer")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    PREFIXES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MOVE_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    sessions: int
    passages: int
    prefixes: int
    state: str
    move_id: str
    peer: str
    def __init__(self, tenant: _Optional[str] = ..., sessions: _Optional[int] = ..., passages: _Optional[int] = ..., prefixes: _Optional[int] = ..., state: _Optional[str] = ..., move_id: _Optional[str] = ..., peer: _Optional[str] = ...) -> None: ...

class HeldTenantsResponse(_message.Message):
    __slots__ = ("tenants", "arrived")
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    ARRIVED_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[HeldTenant]
    arrived: str
    def __init__(self, tenants: _Optional[_Iterable[_Union[HeldTenant, _Mapping]]] = ..., arrived: _Optional[str] = ...) -> None: ...

class DigestOptions(_message.Message):
    __slots__ = ("every_lines", "incident_lines", "incident_seconds", "gap_seconds", "recur_intervals", "info_bursts", "keep_lines", "inferred_min", "page_handled")
    EVERY_LINES_FIELD_NUMBER: _ClassVar[int]
    INCIDENT_LINES_FIELD_NUMBER: _ClassVar[int]
    INCIDENT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GAP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RECUR_INTERVALS_FIELD_NUMBER: _ClassVar[int]
    INFO_BURSTS_FIELD_NUMBER: _ClassVar[int]
    KEEP_LINES_FIELD_NUMBER: _ClassVar[int]
    INFERRED_MIN_FIELD_NUMBER: _ClassVar[int]
    PAGE_HANDLED_FIELD_NUMBER: _ClassVar[int]
    every_lines: int
    incident_lines: int
    incident_seconds: float
    gap_seconds: float
    recur_intervals: int
    info_bursts: bool
    keep_lines: bool
    inferred_min: int
    page_handled: bool
    def __init__(self, every_lines: _Optional[int] = ..., incident_lines: _Optional[int] = ..., incident_seconds: _Optional[float] = ..., gap_seconds: _Optional[float] = ..., recur_intervals: _Optional[int] = ..., info_bursts: _Optional[bool] = ..., keep_lines: _Optional[bool] = ..., inferred_min: _Optional[int] = ..., page_handled: _Optional[bool] = ...) -> None: ...

class NarrateRequest(_message.Message):
    __slots__ = ("stream", "lines", "close", "options", "new_pipe")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    NEW_PIPE_FIELD_NUMBER: _ClassVar[int]
    stream: str
    lines: _containers.RepeatedScalarFieldContainer[str]
    close: bool
    options: DigestOptions
    new_pipe: bool
    def __init__(self, stream: _Optional[str] = ..., lines: _Optional[_Iterable[str]] = ..., close: _Optional[bool] = ..., options: _Optional[_Union[DigestOptions, _Mapping]] = ..., new_pipe: _Optional[bool] = ...) -> None: ...

class NarratedInterval(_message.Message):
    __slots__ = ("stream", "number", "last_number", "first_line", "last_line", "started", "ended", "incidents", "errors", "record_json", "support")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    LAST_NUMBER_FIELD_NUMBER: _ClassVar[int]
    FIRST_LINE_FIELD_NUMBER: _ClassVar[int]
    LAST_LINE_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    INCIDENTS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    RECORD_JSON_FIELD_NUMBER: _ClassVar[int]
    SUPPORT_FIELD_NUMBER: _ClassVar[int]
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
    support: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stream: _Optional[str] = ..., number: _Optional[int] = ..., last_number: _Optional[int] = ..., first_line: _Optional[int] = ..., last_line: _Optional[int] = ..., started: _Optional[float] = ..., ended: _Optional[float] = ..., incidents: _Optional[int] = ..., errors: _Optional[int] = ..., record_json: _Optional[str] = ..., support: _Optional[_Iterable[str]] = ...) -> None: ...

class NarrateResponse(_message.Message):
    __slots__ = ("closed", "lines", "pending")
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    closed: _containers.RepeatedCompositeFieldContainer[NarratedInterval]
    lines: int
    pending: int
    def __init__(self, closed: _Optional[_Iterable[_Union[NarratedInterval, _Mapping]]] = ..., lines: _Optional[int] = ..., pending: _Optional[int] = ...) -> None: ...

class NoteNarrationRequest(_message.Message):
    __slots__ = ("stream", "number", "sentence")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    SENTENCE_FIELD_NUMBER: _ClassVar[int]
    stream: str
    number: int
    sentence: str
    def __init__(self, stream: _Optional[str] = ..., number: _Optional[int] = ..., sentence: _Optional[str] = ...) -> None: ...

class NoteNarrationResponse(_message.Message):
    __slots__ = ("kept",)
    KEPT_FIELD_NUMBER: _ClassVar[int]
    kept: bool
    def __init__(self, kept: _Optional[bool] = ...) -> None: ...

class NarrationHistoryRequest(_message.Message):
    __slots__ = ("stream", "since", "until", "severity", "template", "limit")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    stream: str
    since: float
    until: float
    severity: str
    template: str
    limit: int
    def __init__(self, stream: _Optional[str] = ..., since: _Optional[float] = ..., until: _Optional[float] = ..., severity: _Optional[str] = ..., template: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class NarrationHistoryResponse(_message.Message):
    __slots__ = ("intervals",)
    INTERVALS_FIELD_NUMBER: _ClassVar[int]
    intervals: _containers.RepeatedCompositeFieldContainer[NarratedInterval]
    def __init__(self, intervals: _Optional[_Iterable[_Union[NarratedInterval, _Mapping]]] = ...) -> None: ...

class ListNarrationsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NarratedStream(_message.Message):
    __slots__ = ("name", "created", "updated", "intervals", "lines", "incidents")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    INTERVALS_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    INCIDENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    created: float
    updated: float
    intervals: int
    lines: int
    incidents: int
    def __init__(self, name: _Optional[str] = ..., created: _Optional[float] = ..., updated: _Optional[float] = ..., intervals: _Optional[int] = ..., lines: _Optional[int] = ..., incidents: _Optional[int] = ...) -> None: ...

class ListNarrationsResponse(_message.Message):
    __slots__ = ("streams",)
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedCompositeFieldContainer[NarratedStream]
    def __init__(self, streams: _Optional[_Iterable[_Union[NarratedStream, _Mapping]]] = ...) -> None: ...

class ForgetNarrationRequest(_message.Message):
    __slots__ = ("stream", "since", "until")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    stream: str
    since: float
    until: float
    def __init__(self, stream: _Optional[str] = ..., since: _Optional[float] = ..., until: _Optional[float] = ...) -> None: ...

class ForgetNarrationResponse(_message.Message):
    __slots__ = ("intervals", "purge_owed")
    INTERVALS_FIELD_NUMBER: _ClassVar[int]
    PURGE_OWED_FIELD_NUMBER: _ClassVar[int]
    intervals: int
    purge_owed: bool
    def __init__(self, intervals: _Optional[int] = ..., purge_owed: _Optional[bool] = ...) -> None: ...

class MuteNarrationRequest(_message.Message):
    __slots__ = ("stream", "template_id", "unmute")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_ID_FIELD_NUMBER: _ClassVar[int]
    UNMUTE_FIELD_NUMBER: _ClassVar[int]
    stream: str
    template_id: int
    unmute: bool
    def __init__(self, stream: _Optional[str] = ..., template_id: _Optional[int] = ..., unmute: _Optional[bool] = ...) -> None: ...

class MuteNarrationResponse(_message.Message):
    __slots__ = ("template_id", "template", "muted")
    TEMPLATE_ID_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    MUTED_FIELD_NUMBER: _ClassVar[int]
    template_id: int
    template: str
    muted: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, template_id: _Optional[int] = ..., template: _Optional[str] = ..., muted: _Optional[_Iterable[int]] = ...) -> None: ...

class MutedNarrationRequest(_message.Message):
    __slots__ = ("stream",)
    STREAM_FIELD_NUMBER: _ClassVar[int]
    stream: str
    def __init__(self, stream: _Optional[str] = ...) -> None: ...

class MutedTemplate(_message.Message):
    __slots__ = ("template_id", "template")
    TEMPLATE_ID_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    template_id: int
    template: str
    def __init__(self, template_id: _Optional[int] = ..., template: _Optional[str] = ...) -> None: ...

class MutedNarrationResponse(_message.Message):
    __slots__ = ("muted",)
    MUTED_FIELD_NUMBER: _ClassVar[int]
    muted: _containers.RepeatedCompositeFieldContainer[MutedTemplate]
    def __init__(self, muted: _Optional[_Iterable[_Union[MutedTemplate, _Mapping]]] = ...) -> None: ...

class NarrationAskRequest(_message.Message):
    __slots__ = ("stream", "question", "max_tokens")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    question: str
    max_tokens: int
    def __init__(self, stream: _Optional[str] = ..., question: _Optional[str] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class NarrationAnswer(_message.Message):
    __slots__ = ("stream", "held", "text", "dropped", "facts_text", "cites")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    FACTS_TEXT_FIELD_NUMBER: _ClassVar[int]
    CITES_FIELD_NUMBER: _ClassVar[int]
    stream: str
    held: bool
    text: str
    dropped: _containers.RepeatedScalarFieldContainer[str]
    facts_text: str
    cites: _containers.RepeatedCompositeFieldContainer[NarratedInterval]
    def __init__(self, stream: _Optional[str] = ..., held: _Optional[bool] = ..., text: _Optional[str] = ..., dropped: _Optional[_Iterable[str]] = ..., facts_text: _Optional[str] = ..., cites: _Optional[_Iterable[_Union[NarratedInterval, _Mapping]]] = ...) -> None: ...
