"""The one adapter around llama.cpp: the only module of sinkd that imports ``llama_cpp``.

It owns the model, one context with several sequences, one batch, and the samplers; it applies the
policy's plans with ``llama_memory_seq_rm``/``llama_memory_seq_add`` and checks every return value;
it validates every batch before ``llama_decode``, because llama.cpp aborts the whole process on some
misuse (a batch above ``n_batch`` hits a GGML_ASSERT).

NOTE: the context uses per-sequence KV streams (``kv_unified = false``). In a unified cache
``llama_memory_seq_cp`` shares cells between parent and child, so a child's ``seq_rm`` + ``seq_add``
would move the parent's positions too; with one stream per sequence the copy is physical and every
fork is safe. The price: each sequence gets ``n_ctx / n_seq_max`` cells, fixed at start.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import llama_cpp as llama
import numpy as np

from cachepolicy import (
    CacheSequence,
    ConfigError,
    Evict,
    PolicyConfig,
    PositionMode,
    Shift,
    SubBatch,
)
from daemon.errors import EngineError, InvalidInput, ModelMismatch, Unsupported
from daemon.models import ModelEntry

Outputs = Literal["none", "last", "all"]

KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "q4_0": 2, "bf16": 30}
KV_BYTES_PER_ELEMENT = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


@dataclass(frozen=True)
class BatchItem:
    """One sequence's tokens in a multi-sequence decode; `logits` asks for the last token's row."""

    seq_id: int
    tokens: list[int]
    pos0: int
    logits: bool = True


@dataclass(frozen=True)
class EngineConfig:
    """Context settings. Each sequence gets `n_ctx_seq` cells (llama.cpp rounds it up to a multiple
    of 256; `Engine.n_ctx_seq` is what it gave); the context holds `n_seq_max` sequences."""

    n_ctx_seq: int = 512
    n_seq_max: int = 4
    n_batch: int = 256
    n_threads: int = field(default_factory=lambda: max(1, min(os.cpu_count() or 1, 8)))
    n_gpu_layers: int = field(default_factory=lambda: int(os.environ.get("SINKD_GPU_LAYERS", "0")))
    kv_type: str = "f16"
    swa_full: bool = True  # a sliding-window cache can shift only at full size
    kv_unified: bool = False  # control only: a unified cache makes forks unsafe, batching inexact

    def validate(self) -> None:
        if self.n_ctx_seq < 1:
            raise InvalidInput(f"n_ctx_seq: must be >= 1, got {self.n_ctx_seq}")
        if not 1 <= self.n_seq_max <= MAX_SEQUENCES:
            raise InvalidInput(f"n_seq_max: must be in 1..{MAX_SEQUENCES}, got {self.n_seq_max}")
        if self.n_batch < 1:
            raise InvalidInput(f"n_batch: must be >= 1, got {self.n_batch}")
        if self.n_threads < 1:
            raise InvalidInput(f"n_threads: must be >= 1, got {self.n_threads}")
        if self.kv_type not in KV_TYPES:
            raise InvalidInput(
                f"kv_type: must be one of {', '.join(KV_TYPES)}, got {self.kv_type!r}"
            )


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = 0

    def validate(self) -> None:
        if not 0.0 <= self.temperature <= 5.0:
            raise InvalidInput(f"temperature: must be in [0, 5], got {self.temperature}")
        if not 0 <= self.top_k <= 1_000_000:
            raise InvalidInput(f"top_k: must be in 0..1000000 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidInput(f"top_p: must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise InvalidInput(f"min_p: must be in [0, 1), got {self.min_p}")
        if not 0 <= self.seed < 2**32:
            raise InvalidInput(f"seed: must be in [0, 2^32), got {self.seed}")


class _LlamaLog:
    """Routes llama.cpp's log through one callback that keeps only the KV allocation lines.

    Prompts never reach llama.cpp's log, but we keep nothing else anyway: ids and sizes only.
    """

    _kv_size = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kv_mib: list[tuple[float, int]] = []
        self.verbose = bool(os.environ.get("SINKD_LLAMA_LOG"))
        self.callback = llama.llama_log_callback(self._on_log)
        llama.llama_log_set(self.callback, ctypes.c_void_p(0))

    def _on_log(self, level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        line = text.decode("utf-8", errors="replace")
        if self.verbose:
            print(line, end="")
        match = self._kv_size.search(line)
        if match:
            with self.lock:
                self.kv_mib.append((float(match.group(1)), int(match.group(2))))

    def take_kv(self) -> list[tuple[float, int]]:
        with self.lock:
            taken, self.kv_mib = self.kv_mib, []
        return taken


_log: _LlamaLog | None = None
_backend_lock = threading.Lock()


def _init_backend() -> _LlamaLog:
    global _log
    with _backend_lock:
        if _log is None:
            _log = _LlamaLog()
            llama.llama_backend_init()
        return _log


class Sampler:
    """A llama.cpp sampler chain for one sequence: greedy at temperature 0, else k, p, min-p, temp,
    then one draw from a seeded PCG64 stream.

    The draw is ours, not llama.cpp's `dist`, because its state must survive a restart: a sampler is
    fully described by (params, draws), and `Sampler(params, draws=n)` continues where one that had
    drawn n times stopped (each draw consumes exactly one 64-bit step of the stream).
    """

    def __init__(self, params: SamplingParams, draws: int = 0) -> None:
        params.validate()
        self.params = params
        self.stochastic = params.temperature != 0.0
        chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
        if not chain:
            raise EngineError("llama_sampler_chain_init failed")
        self._chain = chain
        self._data: np.ndarray | None = None
        self._ids: np.ndarray | None = None
        self.draws = 0
        self._bits = np.random.PCG64(params.seed)
        self._rng = np.random.Generator(self._bits)
        if not self.stochastic:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_k(params.top_k))
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_p(params.top_p, 1))
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_min_p(params.min_p, 1))
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_temp(params.temperature))
        self.advance(draws)

    def advance(self, draws: int) -> None:
        if draws < 0:
            raise InvalidInput(f"sampler draws must be >= 0, got {draws}")
        self._bits.advance(draws)
        self.draws += draws

    def sample_logits(self, logits: np.ndarray) -> int:
        """Sample (and accept) a token from a stored next-token logits row with this chain."""
        n = len(logits)
        if self._data is None or len(self._data) != n:
            self._data = np.zeros(n, dtype=_TOKEN_DATA)
            self._ids = np.arange(n, dtype=np.int32)
        data = self._data
        data["id"] = self._ids
        data["logit"] = logits
        data["p"] = 0.0
        arr = llama.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(llama.llama_token_data)),
            size=n,
            selected=-1,
            sorted=False,
        )
        llama.llama_sampler_apply(self._chain, ctypes.byref(arr))
        if ctypes.cast(arr.data, ctypes.c_void_p).value != data.ctypes.data:
            raise EngineError("the sampler chain moved its candidates out of our buffer")
        if self.stochastic:
            arr.selected = self._draw(data["logit"][: arr.size])
        if not 0 <= arr.selected < arr.size:
            raise EngineError("the sampler chain selected no token")
        token = int(data["id"][arr.selected])
        llama.llama_sampler_accept(self._chain, token)
        return token

    def _draw(self, logits: np.ndarray) -> int:
        """One draw from softmax(logits) over the candidates the chain kept."""
        if len(logits) == 0:
            return -1
        z = np.exp(logits.astype(np.float64) - float(np.max(logits)))
        cdf = np.cumsum(z)
        u = self._rng.random()  # exactly one step of the stream, whatever the candidates
        self.draws += 1
        return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(cdf) - 1))

    def reset(self) -> None:
        llama.llama_sampler_reset(self._chain)
        self._bits = np.random.PCG64(self.params.seed)
        self._rng = np.random.Generator(self._bits)
        self.draws = 0

    def close(self) -> None:
        if self._chain:
            llama.llama_sampler_free(self._chain)
            self._chain = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class Engine:
    """One model, one context, `n_seq_max` sequences. Not thread-safe: one thread owns it."""

    def __init__(
        self,
        path: Path,
        entry: ModelEntry | None,
        config: EngineConfig | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.config.validate()
        self.entry = entry
        self.path = path
        log = _init_backend()
        self._stack = contextlib.ExitStack()
        try:
            self._load(log)
        except BaseException:
            self._stack.close()
            raise

    def _load(self, log: _LlamaLog) -> None:
        cfg = self.config
        mparams = llama.llama_model_default_params()
        mparams.n_gpu_layers = cfg.n_gpu_layers
        model = llama.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not model:
            raise EngineError(f"llama.cpp could not load {self.path.name} (not a valid GGUF?)")
        self._stack.callback(llama.llama_model_free, model)
        self._model = model
        self._vocab = llama.llama_model_get_vocab(model)
        self.n_vocab = int(llama.llama_vocab_n_tokens(self._vocab))
        self.adds_bos = bool(llama.llama_vocab_get_add_bos(self._vocab))
        self.bos = int(llama.llama_vocab_bos(self._vocab))
        self.n_layer = int(llama.llama_model_n_layer(model))
        self.n_head_kv = int(llama.llama_model_n_head_kv(model))
        n_head = int(llama.llama_model_n_head(model))
        self.architecture = self._meta("general.architecture") or "unknown"
        key_length = self._meta(f"{self.architecture}.attention.key_length")
        self.head_dim = (
            int(key_length) if key_length else int(llama.llama_model_n_embd(model)) // n_head
        )
        self.n_ctx_train = int(llama.llama_model_n_ctx_train(model))
        self.n_swa = int(llama.llama_model_n_swa(model))
        self.tokenizer_sha256 = self._tokenizer_hash()
        template = llama.llama_model_chat_template(model, None)
        self.chat_template = (template or b"").decode("utf-8", errors="replace")
        self.template_sha256 = hashlib.sha256(template or b"").hexdigest()
        if self.entry is not None:
            self._check_entry(self.entry)

        cparams = llama.llama_context_default_params()
        cparams.n_ctx = cfg.n_ctx_seq * cfg.n_seq_max
        cparams.n_batch = cfg.n_batch
        cparams.n_ubatch = (
            cfg.n_batch
        )  # one ubatch per decode: a failed decode leaves no partial batch
        cparams.n_seq_max = cfg.n_seq_max
        cparams.n_threads = cfg.n_threads
        cparams.n_threads_batch = cfg.n_threads
        cparams.kv_unified = cfg.kv_unified
        cparams.swa_full = cfg.swa_full
        cparams.type_k = KV_TYPES[cfg.kv_type]
        cparams.type_v = KV_TYPES[cfg.kv_type]
        cparams.no_perf = True
        log.take_kv()
        ctx = llama.llama_init_from_model(model, cparams)
        if not ctx:
            raise EngineError("llama.cpp could not create a context (out of memory? bad KV type?)")
        self._stack.callback(llama.llama_free, ctx)  # freed before the model (LIFO)
        self._ctx = ctx
        self.kv_allocations = log.take_kv()  # (MiB, cells) per KV cache llama.cpp allocated
        self._mem = llama.llama_get_memory(ctx)
        self.n_ctx_seq = int(llama.llama_n_ctx_seq(ctx))
        self.n_batch = int(llama.llama_n_batch(ctx))
        self.can_shift = bool(llama.llama_memory_can_shift(self._mem))
        batch = llama.llama_batch_init(self.n_batch, 0, 1)
        self._stack.callback(llama.llama_batch_free, batch)
        self._batch = batch
        self._free_seqs = list(range(cfg.n_seq_max - 1, -1, -1))
        self._scratch = (ctypes.c_uint8 * 0)()  # sequence images: read, packed, copied in place
        self._state_base, self._state_per_cell = self._calibrate_cell_size()

    def _calibrate_cell_size(self) -> tuple[int, int]:
        """Serialised sequence state grows by a fixed size per cell: measure it once, at load."""
        sizes = []
        for n in (0, 1, 2, 3):
            self.clear(0)
            if n:
                self.decode_batch([BatchItem(0, [0] * n, 0, logits=False)])
            sizes.append(int(llama.llama_state_seq_get_size(self._ctx, 0)))
        self.clear(0)
        self._state_empty = sizes[0]  # an empty sequence writes no per-layer headers
        per_cell = sizes[2] - sizes[1]
        if per_cell <= 0 or sizes[3] - sizes[2] != per_cell:
            raise EngineError(f"sequence state size is not linear in cells: {sizes}")
        return sizes[1] - per_cell, per_cell

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- identity and receipts ---

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = llama.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    def _tokenizer_hash(self) -> str:
        h = hashlib.sha256()
        for tok in range(self.n_vocab):
            h.update(llama.llama_vocab_get_text(self._vocab, tok) or b"")
            h.update(
                b"\0%d\0%r\n"
                % (
                    llama.llama_vocab_get_attr(self._vocab, tok),
                    llama.llama_vocab_get_score(self._vocab, tok),
                )
            )
        return h.hexdigest()

    def _check_entry(self, entry: ModelEntry) -> None:
        for name, actual in (
            ("tokenizer_sha256", self.tokenizer_sha256),
            ("template_sha256", self.template_sha256),
            ("n_layer", self.n_layer),
            ("n_head_kv", self.n_head_kv),
            ("head_dim", self.head_dim),
            ("n_ctx_train", self.n_ctx_train),
            ("adds_bos", self.adds_bos),
        ):
            expected = getattr(entry, name)
            if expected != actual:
                raise ModelMismatch(entry.name, name, expected, actual)

    @property
    def kv_bytes_per_token(self) -> float:
        return (
            self.n_layer
            * self.n_head_kv
            * self.head_dim
            * 2
            * KV_BYTES_PER_ELEMENT[self.config.kv_type]
        )

    # --- validation ---

    def check_policy(self, policy: PolicyConfig) -> None:
        """Refuse what this context cannot run: a budget above its cells, a shift it cannot apply."""
        policy.check_context(self.n_ctx_seq)
        if self.entry is None and policy.evicts:
            raise Unsupported(
                f"policy {policy.policy.value} needs a model from models.lock; an unlisted model runs"
                " with the full policy only"
            )
        if policy.position_mode is PositionMode.SHIFT and not self.can_shift:
            reason = (
                " (its sliding-window cache shifts only at full size: swa_full)"
                if self.n_swa
                else ""
            )
            raise Unsupported(
                f"policy {policy.policy.value} shifts positions, but this model's cache cannot shift{reason}"
            )
        bound = policy.max_cache_position()
        if (
            policy.position_mode is PositionMode.SHIFT
            and bound is not None
            and bound > self.n_ctx_train
        ):
            raise ConfigError(
                "compact_interval",
                f"sinks + window + compact_interval = {bound} would take positions past the model's"
                f" trained context of {self.n_ctx_train}",
            )
        if self.n_swa and policy.evicts and (bound is None or bound > self.n_swa):
            raise Unsupported(
                f"policy {policy.policy.value} lets cache positions reach "
                f"{'the transcript length' if bound is None else bound}, beyond the model's sliding"
                f" window of {self.n_swa}: its local layers would drop the sinks"
            )

    def check_tokens(self, tokens: list[int]) -> None:
        bad = next((t for t in tokens if not 0 <= t < self.n_vocab), None)
        if bad is not None:
            raise InvalidInput(f"token id {bad} is outside the vocabulary (0..{self.n_vocab - 1})")

    # --- sequences ---

    def acquire_seq(self) -> int:
        if not self._free_seqs:
            raise Unsupported(f"all {self.config.n_seq_max} sequences of the context are in use")
        return self._free_seqs.pop()

    def release_seq(self, seq_id: int) -> None:
        self.clear(seq_id)
        self._free_seqs.append(seq_id)

    def clear(self, seq_id: int) -> None:
        """Remove every cell of the sequence; verified physically (pos max -1)."""
        if not llama.llama_memory_seq_rm(self._mem, seq_id, -1, -1):
            raise EngineError(f"llama_memory_seq_rm refused to clear sequence {seq_id}")
        if self.pos_range(seq_id) != (-1, -1):
            raise EngineError(f"sequence {seq_id} still holds cells after clear")

    def copy(self, src: int, dst: int) -> None:
        """Physical copy of every cell: the copies are independent after.

        Through the sequence image, not `llama_memory_seq_cp`: across per-sequence streams that
        call copies the cell metadata at once but the K and V rows only at the next decode, so an
        image taken of `dst` before then (a fork's first snapshot) would hold stale rows.
        """
        self._write_seq(dst, *self._read_seq(src))
        if self.pos_range(dst) != self.pos_range(src):
            raise EngineError(f"copy of sequence {src} to {dst} is incomplete")

    def cell_count(self, seq_id: int) -> int:
        """How many cells llama.cpp really holds for the sequence (from its serialised size)."""
        size = int(llama.llama_state_seq_get_size(self._ctx, seq_id))
        if size == self._state_empty:
            return 0
        size -= self._state_base
        cells, rest = divmod(size, self._state_per_cell)
        if rest:
            raise EngineError(
                f"sequence {seq_id}: state size {size} is not a whole number of cells"
            )
        return cells

    def save_seq(self, seq_id: int) -> bytes:
        """The sequence's cells as llama.cpp serialises them (positions, K and V rows)."""
        buf, size = self._read_seq(seq_id)
        return bytes(memoryview(buf)[:size])

    def restore_seq(self, seq_id: int, data: bytes) -> None:
        """Replace the sequence's cells with a `save_seq` image; a refused image leaves it empty."""
        self._write_seq(seq_id, (ctypes.c_uint8 * len(data)).from_buffer_copy(data), len(data))

    def compact(self, seq_id: int) -> None:
        """Rewrite the sequence's cells into consecutive slots, in their order.

        Evictions leave holes between slots, and where the holes are changes the order of the float
        sums in attention: enough, on this CPU path, to move logits by ~0.7. A restored snapshot is
        always packed, so the daemon packs a sequence after each eviction: a live sequence and its
        restored snapshot then hold the same layout and compute the same bits.
        """
        self._write_seq(seq_id, *self._read_seq(seq_id))

    def _read_seq(self, seq_id: int) -> tuple[ctypes.Array[ctypes.c_uint8], int]:
        """The sequence's image in the reused scratch buffer (allocating zeroes megabytes)."""
        size = int(llama.llama_state_seq_get_size(self._ctx, seq_id))
        if len(self._scratch) < size:
            self._scratch = (ctypes.c_uint8 * size)()
        written = int(llama.llama_state_seq_get_data(self._ctx, self._scratch, size, seq_id))
        if written != size:
            raise EngineError(f"sequence {seq_id}: state wrote {written} of {size} bytes")
        return self._scratch, size

    def _write_seq(self, seq_id: int, buf: ctypes.Array[ctypes.c_uint8], size: int) -> None:
        self.clear(seq_id)
        read = int(llama.llama_state_seq_set_data(self._ctx, buf, size, seq_id))
        if read != size:
            self.clear(seq_id)
            raise EngineError(f"sequence {seq_id}: llama.cpp took {read} of {size} bytes")

    def pos_range(self, seq_id: int) -> tuple[int, int]:
        return (
            int(llama.llama_memory_seq_pos_min(self._mem, seq_id)),
            int(llama.llama_memory_seq_pos_max(self._mem, seq_id)),
        )

    # --- feeding tokens through a policy ---

    def feed(
        self,
        seq_id: int,
        seq: CacheSequence,
        tokens: list[int],
        outputs: Outputs = "last",
        pos_offset: int = 0,
    ) -> np.ndarray | None:
        """Append `tokens` to the sequence under its policy; return logits as `outputs` asks.

        "last": the next-token logits after the final token (n_vocab,); "all": one row per token
        (n_tokens, n_vocab), row i predicting token i+1. Nothing reaches llama.cpp unless the whole
        append is valid, and the policy's state is advanced op by op, so it always names what the
        cache holds, even if llama.cpp fails half way. `pos_offset` translates every position
        (relative positions, hence the exact-arithmetic result, are unchanged): it calibrates how far
        numerical noise alone moves the logits, the floor for comparing shifted and unshifted caches.
        """
        self.check_tokens(tokens)
        seq.config.check_context(
            self.n_ctx_seq
        )  # a budget above the stream: llama.cpp finds no slot
        plan = seq.plan(len(tokens), max_batch=self.n_batch)  # raises CacheFull before any change
        rows: list[np.ndarray] = []
        last: np.ndarray | None = None
        for i, sb in enumerate(plan.sub_batches):
            self.apply_ops(seq_id, sb, pos_offset)
            seq.adopt_ops(sb)
            is_last = i == len(plan.sub_batches) - 1
            want: Outputs = "none"
            if outputs == "all" or (outputs == "last" and is_last):
                want = outputs
            chunk = tokens[sb.offset : sb.offset + sb.n_tokens]
            self._decode_one(seq_id, chunk, sb.cache_pos + pos_offset, want)
            seq.adopt_tokens(sb)
            if want == "all":
                rows.append(self._logits_rows(sb.n_tokens))
            elif want == "last":
                last = self.logits(sb.n_tokens - 1)
        if outputs == "all":
            return np.concatenate(rows) if rows else np.empty((0, self.n_vocab), np.float32)
        return last

    def apply_ops(self, seq_id: int, sb: SubBatch, pos_offset: int = 0) -> None:
        """Apply a sub-batch's evictions and shifts to the sequence; a refused removal raises."""
        for op in sb.ops:
            p0, p1 = op.p0 + pos_offset, op.p1 + pos_offset
            if isinstance(op, Evict):
                if not llama.llama_memory_seq_rm(self._mem, seq_id, p0, p1):
                    raise EngineError(f"llama_memory_seq_rm({seq_id}, {p0}, {p1}) refused")
            elif isinstance(op, Shift):
                llama.llama_memory_seq_add(self._mem, seq_id, p0, p1, op.delta)

    def _decode_one(self, seq_id: int, tokens: list[int], pos0: int, outputs: Outputs) -> None:
        n = len(tokens)
        if not 0 < n <= self.n_batch:
            raise InvalidInput(f"batch of {n} tokens is outside 1..n_batch ({self.n_batch})")
        b = self._batch
        b.n_tokens = n
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq_id
            b.logits[i] = outputs == "all" or (outputs == "last" and i == n - 1)
        rc = llama.llama_decode(self._ctx, b)
        if rc != 0:
            raise EngineError(f"llama_decode failed with code {rc} on sequence {seq_id}")

    def decode_batch(self, items: list[BatchItem]) -> list[np.ndarray | None]:
        """One llama_decode over several sequences (continuous batching); validated first.

        Returns, per item, a copy of its last token's logits (or None where not asked).
        """
        total = sum(len(item.tokens) for item in items)
        if not 0 < total <= self.n_batch:
            raise InvalidInput(f"batch of {total} tokens is outside 1..n_batch ({self.n_batch})")
        seqs = [item.seq_id for item in items]
        if len(set(seqs)) != len(seqs) or not all(0 <= q < self.config.n_seq_max for q in seqs):
            raise InvalidInput(f"invalid or repeated sequence ids in one batch: {seqs}")
        for item in items:
            if not item.tokens:
                raise InvalidInput(f"empty batch item for sequence {item.seq_id}")
            self.check_tokens(item.tokens)
        b = self._batch
        i = 0
        out_index: list[int | None] = []
        for item in items:
            for j, tok in enumerate(item.tokens):
                b.token[i] = tok
                b.pos[i] = item.pos0 + j
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = item.seq_id
                b.logits[i] = item.logits and j == len(item.tokens) - 1
                i += 1
            out_index.append(i - 1 if item.logits else None)
        b.n_tokens = total
        rc = llama.llama_decode(self._ctx, b)
        if rc != 0:
            raise EngineError(f"llama_decode failed with code {rc} on sequences {seqs}")
        return [None if idx is None else self.logits(idx) for idx in out_index]

    def logits(self, index: int) -> np.ndarray:
        ptr = llama.llama_get_logits_ith(self._ctx, index)
        if not ptr:
            raise EngineError(f"no logits at batch index {index}")
        row: np.ndarray = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()
        return row

    def _logits_rows(self, n: int) -> np.ndarray:
        ptr = llama.llama_get_logits(self._ctx)
        rows: np.ndarray = np.ctypeslib.as_array(ptr, shape=(n, self.n_vocab)).copy()
        return rows

    def sample(self, sampler: Sampler, index: int = -1) -> int:
        """Sample (and accept) the next token from the logits of the last decode's `index`."""
        return sampler.sample_logits(self.logits(index))

    # --- text ---

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        """Tokenize with special tokens parsed; BOS only when asked and the model adds one."""
        data = text.encode("utf-8", errors="replace")
        cap = len(data) + 8
        buf = (llama.llama_token * cap)()
        n = llama.llama_tokenize(
            self._vocab, data, len(data), buf, cap, add_bos and self.adds_bos, True
        )
        if n < 0:
            cap = -n
            buf = (llama.llama_token * cap)()
            n = llama.llama_tokenize(
                self._vocab, data, len(data), buf, cap, add_bos and self.adds_bos, True
            )
        if n < 0:
            raise EngineError("tokenization failed")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        return buf.raw[: max(n, 0)]

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def render_chat(self, messages: list[tuple[str, str]], add_assistant: bool) -> str:
        """Frame messages with the model's own chat template (llama.cpp's built-in renderer)."""
        if not self.chat_template:
            raise Unsupported("this model has no chat template")
        keep = [(role.encode(), text.encode("utf-8", errors="replace")) for role, text in messages]
        chat = (llama.llama_chat_message * len(keep))(
            *(llama.llama_chat_message(role=r, content=c) for r, c in keep)
        )
        template = self.chat_template.encode()
        size = sum(len(c) for _, c in keep) * 2 + 256
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama.llama_chat_apply_template(template, chat, len(keep), add_assistant, buf, size)
            if n < 0:
                raise Unsupported("llama.cpp does not recognise this model's chat template")
            if n <= size:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = n
        raise EngineError("chat template rendering did not converge")

    def is_eog(self, token: int) -> bool:
        return bool(llama.llama_vocab_is_eog(self._vocab, token))
