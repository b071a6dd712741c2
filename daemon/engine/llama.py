"""The one adapter around llama.cpp: the only module of sinkd that imports ``llama_cpp``.

It owns the model, one context with several sequences, one batch, and the samplers; it applies the
policy's plans with ``llama_memory_seq_rm``/``llama_memory_seq_add`` and checks every return value;
it validates every batch before ``llama_decode``, because llama.cpp aborts the whole process on some
misuse (a batch above ``n_batch`` hits a GGML_ASSERT).

NOTE: the context uses per-sequence KV streams (``kv_unified = false``). In a unified cache
``llama_memory_seq_cp`` shares cells between parent and child, so a child's ``seq_rm`` + ``seq_add``
would move the parent's positions too; with one stream per sequence the copy is physical and every
fork is safe. The price: each sequence gets ``n_ctx / n_seq_max`` cells, fixed at start.

NOTE: a sequence's bits depend on its own tokens alone, never on what shares its llama_decode,
whichever x86-64 kernels the build has (tested for both pinned models; docs/determinism.md).
llama.cpp's CPU backend picks a matmul kernel by the shape it is handed, and each sums otherwise:
- the attention products (f16 K and V) go through llamafile's sgemm when a stream has 2 rows or more
  in a ubatch and through ggml's vec_dot for 1 (`llamafile_sgemm` refuses n < 2), and llama.cpp cuts
  a batch of unequal items into ubatches that take as many tokens from each stream (`split_equal`:
  a 64-token chunk beside a lone token is decoded as 1 + 1, then 63). So `decode_batch` decodes
  each length apart (`by_length`): every stream then has exactly its item's rows, alone or not;
- repacked weights (Q4_0, Q4_K, Q6_K, Q8_0, IQ4_NL, ...: `REPACK`) take a gemm from 4 rows of the
  whole batch and a gemv below, and the tiled K-quant kernel takes 8 rows or more: a token's bits
  would follow how many other sessions' tokens share its step. The engine loads weights unrepacked
  (`use_extra_bufts = false`) and turns the tiled kernel off (`GGML_CPU_TILED_MM=0`): every weight
  product is then per row (vec_dot, or sgemm, whose sums per row do not depend on the tile);
- what stays shape-dependent is a lone row against the same token inside a longer piece of its
  own stream (vec_dot against sgemm): so the step plan cuts a session's prefill by its own length
  alone, and resume replays each journalled chunk with the cut it had.
The kernels themselves come from the build (GGML_NATIVE: the CPU it was built on), so the journal
gates a session on them (`cpu_kernels`).

NOTE: flash attention runs only where its sums are exact in any company (`flash_attention_exact`),
and there each llama_decode carries at most `FLASH_MAX_ROWS` tokens of a sequence. llama.cpp's CPU
flash-attention kernel (ggml-cpu ops.cpp) splits the cache across threads when a ubatch holds one
token of one stream and the attention spans 512 cells or more (`use_split_kv_path`), and it tiles
64 rows or more of one stream (`GGML_FA_TILE_Q`): a token's logits would then depend on the thread
count and on what else shared its batch, and a prompt chunk's on how the step cut it. Below 512
cells per stream and in pieces under 64 rows the kernel sums every row whole, in order, over the
cells it may see, alike alone, batched, on any thread count and however a chunk is cut (tested), so
the engine turns it on there (bench/README.md, "peer.py"); above, and on a GPU backend (unverified),
the plain path runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import llama_cpp as llama
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sinkd.cachepolicy import (
    CacheSequence,
    PolicyConfig,
)
from sinkd.daemon import failpoints
from sinkd.daemon.config import machine_threads, threads_given
from sinkd.daemon.engine import compat, teams
from sinkd.daemon.engine.cores import CoreShare
from sinkd.daemon.engine.memory import SequenceOps
from sinkd.daemon.engine.sampler import Sampler
from sinkd.daemon.engine.vocab import VocabularyOps
from sinkd.daemon.models.registry import ModelEntry, kv_bytes_per_token
from sinkd.errors import EngineError, InvalidInput

Outputs = Literal["none", "last", "all"]

KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "q4_0": 2, "bf16": 30}
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ
FLASH_SPLIT_CELLS = 512  # from this attention span on, llama.cpp's CPU kernel splits a row's sums
FLASH_MAX_ROWS = 63  # from 64 rows of a stream on, it tiles them (GGML_FA_TILE_Q)


def cells_per_stream(n_ctx_seq: int, n_seq_max: int, kv_unified: bool = False) -> int:
    """The cells each KV stream gets, as llama-context.cpp computes them: the context rounded up to
    a multiple of 256, then (per-sequence streams) its share rounded up to a multiple of 256."""

    def pad(n: int) -> int:
        return -(-n // 256) * 256

    n_ctx = pad(n_ctx_seq * n_seq_max)
    return n_ctx if kv_unified else pad(n_ctx // n_seq_max)


def flash_attention_exact(cells: int, n_gpu_layers: int) -> bool:
    """Whether llama.cpp's flash attention gives a row the same bits alone, batched and on any
    thread count (in pieces of at most FLASH_MAX_ROWS): on the CPU backend with every stream below
    `FLASH_SPLIT_CELLS` (the NOTE above)."""
    return n_gpu_layers == 0 and cells < FLASH_SPLIT_CELLS


T = TypeVar("T")


def by_length(items: list[T], length: Callable[[T], int]) -> list[list[T]]:
    """The items grouped by how many tokens each decodes, shortest first: one `llama_decode` each.

    Within a group llama.cpp keeps every item whole in one ubatch (as many rows from each stream),
    so each stream computes exactly its own rows, as alone (the NOTE above). The pieces llama.cpp
    would cut a mixed batch into were as many passes as the groups are, so this costs no pass.
    """
    groups: dict[int, list[T]] = {}
    for item in items:
        groups.setdefault(length(item), []).append(item)
    return [groups[n] for n in sorted(groups)]


def cpu_kernels() -> str:
    """The CPU features llama.cpp's build compiled its kernels for (`llama_print_system_info`'s
    CPU section, e.g. "AVX AVX2 F16C FMA LLAMAFILE ..."), and the weight layout the engine loads:
    what else a journalled chunk's bits depend on. A state directory or an archive replayed where
    this differs would compute other bits."""
    info = (llama.llama_print_system_info() or b"").decode("utf-8", errors="replace")
    cpu = info.split("CPU :", 1)[1] if "CPU :" in info else ""
    on = [f.split("=")[0].strip() for f in cpu.split("|") if f.strip().endswith("= 1")]
    return " ".join(on) + "; weights unrepacked, tiled off"


# llama_get_logits as a plain address: the per-token read of the logits then builds no ctypes
# pointer and no array type (np.ctypeslib.as_array cost ~35 us a token right after a decode)
_logits_address = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(
    ctypes.cast(llama.llama_get_logits, ctypes.c_void_p).value or 0
)


@dataclass(frozen=True)
class BatchItem:
    """One sequence's tokens in a multi-sequence decode; `logits` asks for the last token's row."""

    seq_id: int
    tokens: list[int]
    pos0: int
    logits: bool = True


class EngineConfig(BaseModel):
    """Context settings. Each sequence gets `n_ctx_seq` cells (llama.cpp rounds it up to a multiple
    of 256; `Engine.n_ctx_seq` is what it gave); the context holds `n_seq_max` sequences."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_ctx_seq: int = Field(default=512, ge=1)
    n_seq_max: int = Field(default=4, ge=1, le=MAX_SEQUENCES)
    n_batch: int = Field(default=256, ge=1)
    # None: this machine's cores (at most 8), shared with the other engines decoding on it (see
    # cores.py) unless $SINKD_N_THREADS fixes a count; a number: that many, whatever else runs
    n_threads: int | None = Field(default=None, ge=1)
    cores_dir: Path | None = None  # where engines register to share the cores (None: the default)
    n_gpu_layers: int = Field(
        default_factory=lambda: int(os.environ.get("SINKD_GPU_LAYERS", "0")), ge=0
    )
    kv_type: Literal["f32", "f16", "q8_0", "q4_0", "bf16"] = "f16"
    swa_full: bool = True  # a sliding-window cache can shift only at full size
    kv_unified: bool = False  # control only: a unified cache makes forks unsafe, batching inexact
    # "auto": on where its sums are exact, in pieces of at most FLASH_MAX_ROWS (the NOTE above);
    # "on", tests and benches only: llama.cpp's kernel as it is, in any span and any piece
    flash_attn: Literal["auto", "off", "on"] = "auto"


def template_name_sha256(name: str) -> str:
    """The hash a named built-in chat template contributes where a file's template would."""
    return hashlib.sha256(b"llama.cpp built-in template: " + name.encode()).hexdigest()


def builtin_templates() -> list[str]:
    """The chat template names llama.cpp renders without a template in the file."""
    n = int(llama.llama_chat_builtin_templates(None, 0))
    names = (ctypes.c_char_p * n)()
    llama.llama_chat_builtin_templates(names, n)
    return [(x or b"").decode() for x in names]


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
            # the tiled K-quant kernel takes a batch of 8 rows or more: per-row kernels only (the
            # NOTE above); ggml reads this once, at its first matmul
            os.environ["GGML_CPU_TILED_MM"] = "0"
            _log = _LlamaLog()
            llama.llama_backend_init()
        return _log


class Engine(VocabularyOps, SequenceOps):
    """One model, one context, `n_seq_max` sequences.

    One thread owns it (the scheduler's): decoding and every memory operation happen there. Only the
    vocabulary operations (`VocabularyOps`) may run on other threads; `close` waits for them.
    """

    def __init__(
        self,
        path: Path,
        entry: ModelEntry | None,
        config: EngineConfig | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.entry = entry
        self.path = path
        log = _init_backend()
        self._stack = contextlib.ExitStack()
        self._init_text_guard()
        self.llama_cpp_version = str(llama.__version__)
        self.cpu_kernels = cpu_kernels()
        try:
            self._load(log)
        except BaseException:
            self._stack.close()
            raise

    def _load(self, log: _LlamaLog) -> None:
        cfg = self.config
        mparams = llama.llama_model_default_params()
        mparams.n_gpu_layers = cfg.n_gpu_layers
        mparams.use_extra_bufts = False  # no repacked weights: their gemm starts at 4 rows (NOTE)
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
        self.rope_type = int(llama.llama_model_rope_type(model))  # LLAMA_ROPE_TYPE_NONE: -1
        self.is_recurrent = bool(llama.llama_model_is_recurrent(model))
        self.is_hybrid = bool(llama.llama_model_is_hybrid(model))
        self.tokenizer_sha256 = self._tokenizer_hash()
        template = llama.llama_model_chat_template(model, None)
        self.chat_template = (template or b"").decode("utf-8", errors="replace")
        self.template_sha256 = hashlib.sha256(template or b"").hexdigest()
        if self.entry is not None:
            compat.check_entry(self, self.entry)
            if self.entry.template_name and not template:
                # the file has no template; the entry names one of llama.cpp's built-in ones, and
                # its name stands in for the file's template in every hash from here on
                self.chat_template = self.entry.template_name
                self.template_sha256 = template_name_sha256(self.entry.template_name)

        cparams = llama.llama_context_default_params()
        cparams.n_ctx = cfg.n_ctx_seq * cfg.n_seq_max
        cparams.n_batch = cfg.n_batch
        cparams.n_ubatch = (
            cfg.n_batch
        )  # one ubatch per decode: a failed decode leaves no partial batch
        cparams.n_seq_max = cfg.n_seq_max
        fixed = cfg.n_threads or threads_given()
        self._cores: CoreShare | None = None
        if fixed:
            self._n_threads = fixed
        else:  # counted by the other engines while it decodes
            self._cores = CoreShare(machine_threads(), cfg.cores_dir)
            self._stack.callback(self._cores.close)
            self._n_threads = self._cores.cores
        cparams.n_threads = self._n_threads
        cparams.n_threads_batch = self._n_threads
        cparams.kv_unified = cfg.kv_unified
        cparams.swa_full = cfg.swa_full
        cparams.type_k = KV_TYPES[cfg.kv_type]
        cparams.type_v = KV_TYPES[cfg.kv_type]
        cparams.no_perf = True
        cells = cells_per_stream(cfg.n_ctx_seq, cfg.n_seq_max, cfg.kv_unified)
        exact = cfg.flash_attn == "auto" and flash_attention_exact(cells, cfg.n_gpu_layers)
        # what sessions are computed under (a resume gate); see the NOTE above
        self.flash_attn = cfg.flash_attn == "on" or exact
        self.max_rows = FLASH_MAX_ROWS if exact else cfg.n_batch  # of a sequence, per decode
        cparams.flash_attn_type = (
            llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if self.flash_attn
            else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        log.take_kv()
        ctx = llama.llama_init_from_model(model, cparams)
        if not ctx:
            raise EngineError("llama.cpp could not create a context (out of memory? bad KV type?)")
        self._stack.callback(llama.llama_free, ctx)  # freed before the model (LIFO)
        self._ctx = ctx
        self.kv_allocations = log.take_kv()  # (MiB, cells) per KV cache llama.cpp allocated
        self._mem = llama.llama_get_memory(ctx)
        self.n_ctx_seq = int(llama.llama_n_ctx_seq(ctx))
        if self.n_ctx_seq != cells:
            raise EngineError(  # the flash-attention choice rests on this count
                f"llama.cpp gave {self.n_ctx_seq} cells per sequence where {cells} were computed"
            )
        self.n_batch = int(llama.llama_n_batch(ctx))
        self.can_shift = bool(llama.llama_memory_can_shift(self._mem))
        batch = llama.llama_batch_init(self.n_batch, 0, 1)
        self._stack.callback(llama.llama_batch_free, batch)
        self._batch = batch
        self._logits_views: tuple[int, dict[int, np.ndarray]] = (0, {})  # (address, n rows -> view)
        self._free_seqs = list(range(cfg.n_seq_max - 1, -1, -1))
        self._scratch = (ctypes.c_uint8 * 0)()  # sequence images: read, packed, copied in place
        self._state_base, self._state_per_cell = self._calibrate_cell_size()

    def close(self) -> None:
        """Free the context and the model, once no other thread is inside a vocabulary operation."""
        self._close_text_guard()
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

    @property
    def threads(self) -> int:
        """The CPU threads llama.cpp decodes with, as the context reports them."""
        return int(llama.llama_n_threads(self._ctx))

    def idle(self) -> None:
        """Nothing to decode now (the scheduler's idle loop): stop counting for the shared cores
        after a second of it."""
        if self._cores is not None:
            self._cores.idle()

    def _before_decode(self) -> None:
        """Follow this engine's share of the cores (re-read every second; cores.py) and note the
        calling thread's OpenMP team (teams.py)."""
        if self._cores is not None:
            n = self._cores.threads()
            if n != self._n_threads:
                llama.llama_set_n_threads(self._ctx, n, n)
                self._n_threads = n
        teams.decoding(self._n_threads)

    @property
    def kv_bytes_per_token(self) -> float:
        return kv_bytes_per_token(self.n_layer, self.n_head_kv, self.head_dim, self.config.kv_type)

    @property
    def position_limit(self) -> int:
        """The most cache positions a shifting policy may use: the trained context, and the
        sliding window where the model has one (`compat.check_policy` refuses beyond it)."""
        return min(self.n_ctx_train, self.n_swa) if self.n_swa else self.n_ctx_train

    # --- validation ---

    def check_policy(self, policy: PolicyConfig) -> None:
        """Refuse what this context cannot run (see `compat.check_policy`)."""
        compat.check_policy(self, policy)

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
        # "all": one array for every row, filled in place (no copy per piece, no concatenation:
        # a 128-token chunk's rows are 24 MiB, and copies of that size move the resident memory)
        rows = np.empty((len(tokens), self.n_vocab), np.float32) if outputs == "all" else None
        last: np.ndarray | None = None
        for i, sb in enumerate(plan.sub_batches):
            self.apply_ops(seq_id, sb, pos_offset)
            seq.adopt_ops(sb)
            is_last = i == len(plan.sub_batches) - 1
            want: Outputs = "none"
            if outputs == "all" or (outputs == "last" and is_last):
                want = outputs
            chunk = tokens[sb.offset : sb.offset + sb.n_tokens]
            into = None if rows is None else rows[sb.offset : sb.offset + sb.n_tokens]
            got = self._decode_chunk(seq_id, chunk, sb.cache_pos + pos_offset, want, into)
            seq.adopt_tokens(sb)
            if want == "last":
                last = got
        return rows if rows is not None else last

    def _decode_chunk(
        self,
        seq_id: int,
        tokens: list[int],
        pos0: int,
        outputs: Outputs,
        into: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """One sequence's tokens in pieces of at most `max_rows` (the NOTE above), each one
        llama_decode. "last": returns a copy of the last token's logits; "all": writes a row per
        token into `into`. A failed piece removes the earlier pieces' cells: the chunk is in the
        cache whole or not at all."""
        last: np.ndarray | None = None
        for at in range(0, len(tokens), self.max_rows):
            piece = tokens[at : at + self.max_rows]
            final = at + len(piece) == len(tokens)
            try:
                if at:
                    failpoints.hit("decode-piece")
                self._decode_one(
                    seq_id, piece, pos0 + at, outputs if outputs == "all" or final else "none"
                )
            except EngineError:
                self._drop_pieces(seq_id, pos0, at)
                raise
            if outputs == "all" and into is not None:
                into[at : at + len(piece)] = self._logits_rows_view(len(piece))
            elif outputs == "last" and final:
                last = self.logits(len(piece) - 1)
        return last

    def _drop_pieces(self, seq_id: int, pos0: int, n: int) -> None:
        """A later piece failed: remove the `n` tokens the earlier ones put in from `pos0`, so the
        cache again holds what the policy says (a whole sub-batch or none of it)."""
        if n and not llama.llama_memory_seq_rm(self._mem, seq_id, pos0, pos0 + n):
            raise EngineError(f"llama_memory_seq_rm({seq_id}, {pos0}, {pos0 + n}) refused")

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
        self._before_decode()
        rc = llama.llama_decode(self._ctx, b)
        if rc != 0:
            raise EngineError(f"llama_decode failed with code {rc} on sequence {seq_id}")

    def decode_batch(self, items: list[BatchItem]) -> list[np.ndarray | None]:
        """Several sequences' tokens (continuous batching); validated first, then one llama_decode
        per item length (`by_length`, the NOTE above), in pieces of at most `max_rows`.

        Returns, per item, a copy of its last token's logits (or None where not asked). All or
        nothing, as one llama_decode: a failed decode removes the cells the earlier ones put in.
        It runs once per token on the engine thread, right after a decode has swept the caches:
        plain loops, one pass (bench/README.md, "overhead.py").
        """
        n_seq_max = self.config.n_seq_max
        total = 0
        seen: set[int] = set()
        for item in items:
            q, tokens = item.seq_id, item.tokens
            if q in seen or not 0 <= q < n_seq_max:
                seqs = [it.seq_id for it in items]
                raise InvalidInput(f"invalid or repeated sequence ids in one batch: {seqs}")
            seen.add(q)
            if not tokens:
                raise InvalidInput(f"empty batch item for sequence {q}")
            self.check_tokens(tokens)
            total += len(tokens)
        if not 0 < total <= self.n_batch:
            raise InvalidInput(f"batch of {total} tokens is outside 1..n_batch ({self.n_batch})")
        if len({len(item.tokens) for item in items}) == 1:
            return self._decode_same_length(items, first=True)
        out: list[np.ndarray | None] = [None] * len(items)
        decoded: list[BatchItem] = []
        for group in by_length(list(range(len(items))), lambda k: len(items[k].tokens)):
            same = [items[k] for k in group]
            try:
                rows = self._decode_same_length(same, first=not decoded)
            except EngineError:
                for item in decoded:
                    self._drop_pieces(item.seq_id, item.pos0, len(item.tokens))
                raise
            decoded += same
            for k, row in zip(group, rows, strict=True):
                out[k] = row
        return out

    def _decode_same_length(self, items: list[BatchItem], first: bool) -> list[np.ndarray | None]:
        """Items of one length, in pieces of at most `max_rows` (flash attention's 63), each one
        llama_decode; a failed piece removes the earlier pieces' cells. `first`: no decode of this
        call came before (the failpoint marks every later one)."""
        n, r = len(items[0].tokens), self.max_rows
        if n <= r:
            if not first:
                failpoints.hit("decode-piece")
            return self._decode_items(items)
        rows: list[np.ndarray | None] = [None] * len(items)
        for at in range(0, n, r):
            final = at + r >= n
            piece = [
                BatchItem(it.seq_id, it.tokens[at : at + r], it.pos0 + at, it.logits and final)
                for it in items
            ]
            try:
                if at or not first:
                    failpoints.hit("decode-piece")
                rows = self._decode_items(piece)
            except EngineError:
                for it in items:
                    self._drop_pieces(it.seq_id, it.pos0, at)
                raise
        return rows

    def _decode_items(self, items: list[BatchItem]) -> list[np.ndarray | None]:
        """One llama_decode of validated items: a copy of each asked row."""
        b = self._batch
        i = 0
        out_index: list[int | None] = [None] * len(items)
        # by sequence id: llama.cpp puts only rising, consecutive ids in one ubatch
        for k in sorted(range(len(items)), key=lambda k: items[k].seq_id):
            item = items[k]
            q, pos0, last = item.seq_id, item.pos0, len(item.tokens) - 1
            for j, tok in enumerate(item.tokens):
                b.token[i] = tok
                b.pos[i] = pos0 + j
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = q
                b.logits[i] = item.logits and j == last
                i += 1
            if item.logits:
                out_index[k] = i - 1
        b.n_tokens = i
        self._before_decode()
        rc = llama.llama_decode(self._ctx, b)
        if rc != 0:
            seqs = [it.seq_id for it in items]
            raise EngineError(f"llama_decode failed with code {rc} on sequences {seqs}")
        # the output rows are in batch order: one copy of them all, each item's row a view of it
        n_out = len(items) - out_index.count(None)
        if n_out == 0:
            return [None] * len(items)
        rows = self._logits_rows_view(n_out).copy()
        row_of = {idx: r for r, idx in enumerate(sorted(x for x in out_index if x is not None))}
        return [None if idx is None else rows[row_of[idx]] for idx in out_index]

    def _logits_rows_view(self, n_out: int) -> np.ndarray:
        """The last decode's `n_out` output rows, as a view of llama.cpp's buffer (valid until the
        next decode). Views are kept per row count while the buffer stays where it is."""
        address = _logits_address(self._ctx)
        if not address:
            raise EngineError("llama.cpp returned no logits")
        at, views = self._logits_views
        if at != address:
            views = {}
            self._logits_views = (address, views)
        view = views.get(n_out)
        if view is None:
            buf = (ctypes.c_float * (n_out * self.n_vocab)).from_address(address)
            view = views[n_out] = np.ctypeslib.as_array(buf).reshape(n_out, self.n_vocab)
        return view

    def logits(self, index: int) -> np.ndarray:
        ptr = llama.llama_get_logits_ith(self._ctx, index)
        if not ptr:
            raise EngineError(f"no logits at batch index {index}")
        row: np.ndarray = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()
        return row

    def sample(self, sampler: Sampler, index: int = -1) -> int:
        """Sample (and accept) the next token from the logits of the last decode's `index`."""
        return sampler.sample_logits(self.logits(index))

    def _decode_calibration(self, n: int) -> None:
        self.decode_batch([BatchItem(0, [0] * n, 0, logits=False)])
