"""Daemon settings: one pydantic-settings model from a TOML file, SINKD_* variables and flags.

Precedence: flags (init arguments) > environment > TOML file > defaults. Invalid fields are reported
by name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from sinkd.errors import InvalidInput

DEFAULT_HTTP = "127.0.0.1:7812"  # not Ollama's 11434: both may run on one machine
THREADS_ENV = "SINKD_N_THREADS"  # what the daemon's setting `n_threads` reads too


def machine_threads() -> int:
    """llama.cpp threads for one engine alone on this machine: its cores, at most 8."""
    return max(1, min(os.cpu_count() or 1, 8))


def threads_given() -> int | None:
    """The thread count $SINKD_N_THREADS fixes (checked), or None: the engine shares the cores."""
    given = os.environ.get(THREADS_ENV)
    if given is None:
        return None
    try:
        n = int(given)
    except ValueError:
        n = 0
    if n < 1:
        raise InvalidInput(f"{THREADS_ENV}={given!r}: threads must be a whole number >= 1")
    return n


def default_socket() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/sinkd-{os.getuid()}"
    return Path(runtime) / "sinkd" / "sinkd.sock"


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sinkd"


class Tenant(BaseModel):
    """A tenant, and its overrides of the shares every tenant has (runtime/shares.py): a reserve
    is kept for it while it holds less; a cap bounds it. None: the defaults."""

    model_config = {"extra": "forbid"}

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    token_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    max_open_sessions: int | None = Field(default=None, ge=0)  # resident and parked
    reserved_sessions: int | None = Field(default=None, ge=0)
    max_stored_mb: float | None = Field(default=None, ge=0)  # snapshots, journal, memory
    reserved_stored_mb: float | None = Field(default=None, ge=0)
    max_stored_responses: int | None = Field(default=None, ge=0)  # the setting's, per tenant
    # the setting's, for this tenant (None: the daemon's)
    memory_across_conversations: bool | None = None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SINKD_", extra="forbid", env_nested_delimiter="__"
    )

    model: str | None = None  # models.lock name; None: the lock's default
    socket: Path = Field(default_factory=default_socket)
    tcp: str | None = None  # host:port; loopback only unless tls is set
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # set: TCP clients must show a certificate it signed
    # the HTTP front (OpenAI's and Ollama's APIs): host:port, loopback unless tls is set; None: off
    http: str | None = DEFAULT_HTTP
    # sinkd's own page at /ui on the HTTP front (docs/ui.md); false: no /ui route at all
    ui: bool = True
    # the window of the sessions the HTTP front makes (its clients cannot choose); None: the model's
    http_window: int | None = Field(default=None, ge=1)
    # a chat UI's side task (Open WebUI's title, tags, follow-ups) that asks in its prompt for a
    # JSON object and sends no format: decoded under that object's grammar, and said so
    ui_task_grammar: bool = True
    tenants: list[Tenant] = Field(default_factory=list)
    # a node of a deployment behind a proxy (docs/deployment.md): its name, in the ids of the
    # sessions it makes, so that another node answers UNAVAILABLE for them rather than NOT_FOUND
    node: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9-]{0,31}$")
    # the key of the stateless clients' hash chains; None: one of this daemon's own in state_dir.
    # Nodes that move sessions between them share one, or a moved conversation is read again
    conversations_key_file: Path | None = None
    admin_token_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    n_ctx_seq: int = Field(default=1024, ge=1, le=131072)  # a chat's window of 1,020 fits
    max_sessions: int = Field(default=4, ge=1, le=256)
    max_kv_bytes: int | None = Field(default=None, ge=1)
    # sessions beyond the resident ones (max_sessions): parked, their state on disk (a snapshot,
    # 23 MB for 1,020 cells of the default model), restored by their next call; 0: none parked
    # (a session past max_sessions is refused, or makes room by closing, as before)
    max_parked_sessions: int = Field(default=64, ge=0, le=65536)
    # what the state directory may hold, shared by the tenants as the open sessions are: each
    # has a reserve (half the pool split evenly, or its reserved_stored_mb) and may take what no
    # other's unused reserve claims (docs/daemon.md, "Shares"). None: the filesystem's size
    max_state_mb: float | None = Field(default=None, gt=0)
    # below this much free space on the state directory's filesystem nothing new is written:
    # calls that would write are refused by name until space returns (runtime/durable/disk_space.py)
    min_free_mb: float = Field(default=64.0, ge=0)
    # stored /v1/responses per tenant (each tenant its own; a tenant's max_stored_responses wins)
    max_stored_responses: int = Field(default=10_000, ge=0)
    n_batch: int = Field(default=256, ge=1, le=8192)
    step_tokens: int = Field(default=256, ge=1)
    # a session's prefill per step, whatever the load: 128 tokens (~0.8 s here) bound what a long
    # append adds to the other sessions' steps, and past the budget ingest at prompt speed
    prefill_chunk: int = Field(default=128, ge=1)
    # None: the cores (at most 8), shared with the other sinkd engines decoding on this machine
    n_threads: int | None = Field(default=None, ge=1)
    n_gpu_layers: int = Field(default=0, ge=0)
    # decodes a greedy session makes per scheduler pass, its bookkeeping (journal, reply, audit)
    # once for them all (runtime/loop/runahead.py): on a GPU that Python is what a step waits for
    # (bench/engine_cpu.py); the price is tokens streamed in groups. None: 16 with layers
    # offloaded, 1 on the CPU (there a step's Python is ~2% of it, and tokens stream one by one)
    decode_run: int | None = Field(default=None, ge=1, le=64)
    # ... and a run ends once it has decoded this long, so that a slower model's groups stay
    # small (16 SmolLM2 steps on a GPU take ~50 ms; 0: no bound)
    decode_run_ms: float = Field(default=50.0, ge=0)
    # speculative decoding (runtime/loop/drafting.py): "auto" drafts from a session's own text
    # where a row's bits do not depend on how many rows of its sequence share a pass (the engine
    # says; docs/determinism.md), so the tokens are plain decoding's; "off": a token at a time
    speculative: Literal["auto", "off"] = "auto"
    max_drafts: int = Field(default=8, ge=1, le=16)  # drafts verified with one token, at most
    kv_type: str = "f16"
    # "exact": flash attention where its sums are exact (CPU, below 512 cells per sequence, at most
    # 63 rows of a sequence per decode: the engine's NOTE; sinkd's default before 2026-12-07);
    # "off": the plain kernel everywhere; "auto": "off" on sinkd's patched build (faster, and as
    # exact), "exact" on another, and "exact" while the state directory holds live sessions made
    # under flash attention (boot.attention_for: an upgrade strands none)
    flash_attn: Literal["auto", "exact", "off"] = "auto"
    default_evict_chunk: int = Field(default=16, ge=1)
    # a session that leaves K unset shifts once per this many evictions (K = n x E, at most W and
    # within the model's positions): each shift re-rotates the whole context (bench/eviction.py);
    # 1: every one. 32 x E=16 is K=512 for a chat's W=1,020
    evictions_per_shift: int = Field(default=32, ge=1)
    # past the budget a long append decodes this many tokens per sub-batch, not E: prompt-processing
    # speed for a small perplexity cost (bench/ingest.py); 0: E at a time
    default_ingest_chunk: int = Field(default=128, ge=0)
    # a system prompt with its tools' descriptions (HTTP chats pin theirs up to half the cells)
    max_pinned_system_tokens: int = Field(default=512, ge=0)
    # prefix states (runtime/loop/prefixes.py): a new session that begins as an earlier one of
    # its tenant did (a system prompt, a chat UI's task template) starts from that prefix's stored
    # cells; RAM first, then state_dir/prefixes. A 600-token prefix of the default model is 14 MB.
    # prefix_ram_mb = 0: off
    prefix_ram_mb: int = Field(default=256, ge=0)
    prefix_disk_mb: int = Field(default=2048, ge=0)
    prefix_min_tokens: int = Field(default=64, ge=1)  # shorter beginnings are read
    # system prompts (their text, as sessions are created with it) whose prefix states serve every
    # tenant: a deployment's common prompt. Any other prefix serves its own tenant alone
    shared_system_prompts: list[str] = Field(default_factory=list)
    idle_timeout_s: float = Field(default=3600.0, gt=0)
    max_message_bytes: int = Field(default=4 * 2**20, ge=1024)
    # backpressure: calls that wait on the engine never hold the whole RPC pool
    rpc_workers: int = Field(default=32, ge=4, le=1024)
    rpc_reserved_workers: int = Field(default=4, ge=1)  # kept for health, admin and short calls
    max_calls_per_tenant: int = Field(default=8, ge=1)  # engine calls in flight per tenant
    max_calls_per_session: int = Field(default=2, ge=1)  # in flight on one session
    # a tenant below its fair share of the engine calls waits this long for a slot when all are
    # taken, while tenants past theirs are refused (0: refused at once); callers/limits.py
    fair_wait_s: float = Field(default=30.0, ge=0)
    call_timeout_s: float = Field(default=600.0, gt=0)  # a call without a deadline waits this long
    # a reply whose client names no max tokens runs to the end of its turn, at most this long (a
    # looping reply is cut sooner by the repetition guard); a chat UI sends none
    max_reply_tokens: int = Field(default=4096, ge=1, le=4096)
    # health Watch and reflection streams need no tenant and hold a worker while open: at most
    # this many at once, within the reserve (so Health.Check and tenants' calls always answer)
    max_tenantless_streams: int = Field(default=2, ge=0)
    # reflection: "token" answers callers with a valid token (anyone on a daemon without tenants,
    # which has only its owner's socket); "open": anyone who reaches a listener; "off": none
    reflection: Literal["token", "open", "off"] = "token"
    # connections: the daemon pings an idle peer every this many seconds and drops one that does not
    # answer within 20 s; a connection with no call for max_connection_idle_s is closed
    keepalive_s: float = Field(default=60.0, ge=1)
    max_connection_idle_s: float = Field(default=600.0, ge=1)
    max_streams_per_connection: int = Field(default=64, ge=1)
    # recall: evicted text is stored per session and brought back (see cachepolicy/recall_plan.py);
    # the mode applies to the sink policy, the controls default to off
    recall_mode: Literal["off", "manual", "auto"] = "auto"
    recall_budget: int = Field(default=96, ge=1)
    recall_passages: int = Field(default=2, ge=1, le=16)
    recall_threshold: float = Field(default=1.0, ge=0)
    # dense search beside BM25 (sentence vectors, daemon/store/embedder.py); off: BM25 alone
    recall_dense: bool = True
    recall_dense_threshold: float = Field(default=0.35, ge=-1, le=1)
    # where recalled text goes in a chat turn; "" = the model's entry in models.lock
    recall_presentation: Literal["", "system-after", "system-before", "quoted", "user-turn"] = ""
    memory_max_tokens: int = Field(default=1_000_000, ge=1)  # per session; oldest pruned first
    # a tenant's memory across its conversations (docs/recall.md, "Across conversations"): what
    # the user says in one conversation is kept, and a later conversation's turn may recall it.
    # Off unless a tenant opts in, here for every tenant or in its [[tenants]] table
    memory_across_conversations: bool = False
    memory_across_max_tokens: int = Field(default=200_000, ge=1)  # per tenant; oldest pruned
    memory_passages: Literal["text", "fixed"] = "text"  # cut at lines/sentences, or every 48
    # narrated streams (docs/narrate.md): a tenant's intervals older than this, or past this many
    # bytes, are folded into aggregates (never dropped without a trace)
    narrate_keep_days: float = Field(default=90.0, gt=0)
    narrate_keep_bytes: int = Field(default=64 << 20, ge=1 << 16)
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    verify_model_hash: bool = True
    allow_unchecked: bool = False  # run a KV dtype or backend the lock has not been checked with
    # durable sessions: journal and snapshots in state_dir; a restart resumes every session
    durable: bool = True
    state_dir: Path = Field(default_factory=default_state_dir)
    sync: Literal["full", "normal"] = "full"  # full: fsync per commit (power loss); normal: crash
    # sync=full: start an fsync no sooner than this after the previous one; the commits meanwhile
    # join it (fewer fsyncs beside the decode, replies up to this much later; 0: each at once)
    sync_interval_ms: float = Field(default=0.0, ge=0, le=1000)
    snapshot_every_tokens: int = Field(default=256, ge=1)
    snapshot_every_s: float = Field(default=300.0, gt=0)
    snapshots_kept: int = Field(default=2, ge=2, le=16)
    # what a forget, reset or close deleted leaves the full-text indexes at once, or this long
    # after the previous merge (a tenant forgetting in a loop must not stall every session's
    # steps: its replies wait instead); 0: always at once
    purge_interval_s: float = Field(default=2.0, ge=0, le=60)
    # a deletion's reply waits at most this long for its purge (the interval above, a reader of
    # journal.db holding the write-ahead log), then says the purge is owed (docs/security.md)
    purge_wait_s: float = Field(default=5.0, ge=0, le=60)

    def memory_across(self, tenant: str) -> bool:
        """Whether the tenant keeps a memory across its conversations."""
        for t in self.tenants:
            if t.name == tenant and t.memory_across_conversations is not None:
                return t.memory_across_conversations
        return self.memory_across_conversations

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = os.environ.get("SINKD_CONFIG")
        if toml and not Path(toml).is_file():  # a typo would run on defaults, sessions "gone"
            raise InvalidInput(f"config file {toml} does not exist (SINKD_CONFIG, --config)")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(toml)))
        return tuple(sources)

    @field_validator("http", mode="before")
    @classmethod
    def _http_off(cls, value: Any) -> Any:
        return None if isinstance(value, str) and value.strip().lower() in ("", "off") else value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.prefill_chunk > self.step_tokens and "prefill_chunk" not in self.model_fields_set:
            self.prefill_chunk = self.step_tokens  # the default yields to a smaller step
        if self.prefill_chunk > self.step_tokens:
            raise ValueError(
                f"prefill_chunk ({self.prefill_chunk}) must be <= step_tokens ({self.step_tokens})"
            )
        if self.step_tokens > self.n_batch:
            raise ValueError(
                f"step_tokens ({self.step_tokens}) must be <= n_batch ({self.n_batch})"
            )
        if self.tcp and not self.tenants:
            raise ValueError(
                "tcp: listening on TCP needs tenants (bearer tokens); without them sinkd serves only its Unix socket"
            )
        if self.tcp and not self.tls_cert:
            host = self.tcp.rsplit(":", 1)[0].strip("[]")
            if host not in ("127.0.0.1", "localhost", "::1"):
                raise ValueError(
                    f"tcp: {host} is not loopback; set tls_cert and tls_key to listen there"
                )
        if self.http and not self.tls_cert:
            host = self.http.rsplit(":", 1)[0].strip("[]")
            if host not in ("127.0.0.1", "localhost", "::1"):
                raise ValueError(
                    f"http: {host} is not loopback; set tls_cert and tls_key to listen there"
                )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError(
                "tls_client_ca needs tls_cert and tls_key (client certificates are TLS)"
            )
        if self.rpc_reserved_workers >= self.rpc_workers:
            raise ValueError(
                f"rpc_reserved_workers ({self.rpc_reserved_workers}) must be below rpc_workers"
                f" ({self.rpc_workers})"
            )
        if (
            self.max_tenantless_streams >= self.rpc_reserved_workers
            and "max_tenantless_streams" not in self.model_fields_set
        ):
            self.max_tenantless_streams = self.rpc_reserved_workers - 1  # the default yields
        if self.max_tenantless_streams >= self.rpc_reserved_workers:
            raise ValueError(
                f"max_tenantless_streams ({self.max_tenantless_streams}) must be below"
                f" rpc_reserved_workers ({self.rpc_reserved_workers})"
            )
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenants: names must be unique")
        hashes = [t.token_sha256 for t in self.tenants]
        if len(set(hashes)) != len(hashes):
            raise ValueError("tenants: two tenants share a token (one would act as the other)")
        reserved = sum(t.reserved_sessions or 0 for t in self.tenants)
        if reserved > self.max_sessions + self.max_parked_sessions:
            raise ValueError(
                f"tenants: reserved_sessions add up to {reserved}, more than the"
                f" {self.max_sessions + self.max_parked_sessions} sessions that may be open"
                " (max_sessions + max_parked_sessions)"
            )
        if self.admin_token_sha256 in hashes:
            raise ValueError("admin_token_sha256 is also a tenant's token: give the admin its own")
        return self

    @property
    def decodes_per_pass(self) -> int:
        """`decode_run`, or its default for where the model runs."""
        if self.decode_run is not None:
            return self.decode_run
        return 16 if self.n_gpu_layers > 0 else 1


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Settings from `config_file` (or $SINKD_CONFIG), the environment and explicit overrides."""
    if config_file is not None:
        os.environ["SINKD_CONFIG"] = str(config_file)
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
