"""The one adapter around llama.cpp: this package (`sinkd.daemon.engine`) is the only one of
sinkd that imports ``llama_cpp``, and `Engine` here is its front.

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
the engine can run it there (`flash_attn = "exact"`); above, and on a GPU backend (unverified), the
plain path runs. By default ("auto") it runs there only on a build whose sgemm takes no lone float
row: on sinkd's patched build the plain path is exact too, and on the 2-core Xeon measured it
decoded SmolLM2 1.3-2.0x as fast as flash attention over positions 100-356 (eight sequences 1.45x,
prefill 1.3x; Gemma 3 level: 0.97x decode, 1.09x prefill; bench/README.md, "attention.py").
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import llama_cpp as llama
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sinkd.cachepolicy import (
    CacheSequence,
    PolicyConfig,
)
from sinkd.daemon.config import machine_threads, threads_given
from sinkd.daemon.engine import compat, teams
from sinkd.daemon.engine.cells import SequenceCells
from sinkd.daemon.engine.cores import CoreShare
from sinkd.daemon.engine.decoding import BatchItem, Decoder, Next, Outputs
from sinkd.daemon.engine.devices import OFFLOADED, backend_name, offload_devices
from sinkd.daemon.engine.row_probe import rows_differ, sgemm_float_rows
from sinkd.daemon.engine.sampler import Sampler
from sinkd.daemon.engine.vocab import Vocabulary
from sinkd.daemon.models.registry import ModelEntry, kv_bytes_per_token
from sinkd.errors import EngineError, Unsupported

KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "q4_0": 2, "bf16": 30}
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ
FLASH_SPLIT_CELLS = 512  # from this attention span on, llama.cpp's CPU kernel splits a row's sums
FLASH_MAX_ROWS = 63  # from 64 rows of a stream on, it tiles them (GGML_FA_TILE_Q)
# a GPU backend multiplies up to this many rows by a matrix-vector kernel, more by a tiled matrix
# kernel, and each sums otherwise (ggml-vulkan's mul_mat_vec_max_cols, CUDA's MMVQ batch bound)
GPU_VECTOR_ROWS = 8


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


def cpu_kernels() -> str:
    """The CPU features llama.cpp's build compiled its kernels for (`llama_print_system_info`'s
    CPU section, e.g. "AVX AVX2 F16C FMA LLAMAFILE ..."), and the weight layout the engine loads:
    what else a journalled chunk's bits depend on. A state directory or an archive replayed where
    this differs would compute other bits."""
    info = (llama.llama_print_system_info() or b"").decode("utf-8", errors="replace")
    cpu = info.split("CPU :", 1)[1] if "CPU :" in info else ""
    on = [f.split("=")[0].strip() for f in cpu.split("|") if f.strip().endswith("= 1")]
    lone = ", lone float rows in sgemm" if "LLAMAFILE" in on and sgemm_float_rows() else ""
    return " ".join(on) + "; weights unrepacked, tiled off" + lone


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
    # "exact": on where its sums are exact, in pieces of at most FLASH_MAX_ROWS (the NOTE above);
    # "auto": "exact" on a build whose sgemm takes no lone float row, else off (the NOTE);
    # "on", tests and benches only: llama.cpp's kernel as it is, in any span and any piece
    flash_attn: Literal["auto", "exact", "off", "on"] = "auto"
    # llama.cpp computes each output row's argmax inside the decode (a greedy sampler chain per
    # sequence, "backend sampling"): a greedy token costs no read of the row here, and decode
    # runs need it (runtime/loop/runahead.py). On the CPU it costs the decode ~2% at 8 sessions
    # (1.3 of 65 ms), more than the numpy argmax it saves: off unless runs are on (boot.py)
    backend_argmax: bool = False


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
        self.offloaded: tuple[int, int] | None = None  # the last model load's layers on a GPU
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
        match = OFFLOADED.search(line)
        if match:
            with self.lock:
                self.offloaded = (int(match.group(1)), int(match.group(2)))

    def take_offloaded(self) -> tuple[int, int] | None:
        with self.lock:
            taken, self.offloaded = self.offloaded, None
        return taken

    def take_kv(self) -> list[tuple[float, int]]:
        with self.lock:
            taken, self.kv_mib = self.kv_mib, []
        return taken


_log: _LlamaLog | None = None
_backend_lock = threading.Lock()


def init_backend() -> _LlamaLog:
    global _log
    with _backend_lock:
        if _log is None:
            # the tiled K-quant kernel takes a batch of 8 rows or more: per-row kernels only (the
            # NOTE above); ggml reads this once, at its first matmul
            os.environ["GGML_CPU_TILED_MM"] = "0"
            _log = _LlamaLog()
            llama.llama_backend_init()
        return _log


class Engine:
    """One model, one context, `n_seq_max` sequences.

    Its parts are members: `vocab` (tokens and text, the chat template: the only part other
    threads may call; `close` waits for them), `cells` (each sequence's KV cells) and `decoder`
    (llama_decode). One thread owns the rest (the scheduler's).
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
        log = init_backend()
        self._stack = contextlib.ExitStack()
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
        log.take_offloaded()
        model = llama.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not model:
            raise EngineError(f"llama.cpp could not load {self.path.name} (not a valid GGUF?)")
        self._stack.callback(llama.llama_model_free, model)
        self._model = model
        self._place(log.take_offloaded(), int(llama.llama_model_n_layer(model)))
        vocab = Vocabulary(llama.llama_model_get_vocab(model))
        self.vocab = vocab
        self.n_vocab, self.adds_bos, self.bos = vocab.n_vocab, vocab.adds_bos, vocab.bos
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
        self.tokenizer_sha256 = vocab.sha256
        template = llama.llama_model_chat_template(model, None)
        vocab.chat_template = (template or b"").decode("utf-8", errors="replace")
        self.template_sha256 = hashlib.sha256(template or b"").hexdigest()
        if self.entry is not None:
            compat.check_entry(self, self.entry)
            if self.entry.template_name and not template:
                # the file has no template; the entry names one of llama.cpp's built-in ones, and
                # its name stands in for the file's template in every hash from here on
                vocab.chat_template = self.entry.template_name
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
        self.float_rows = "lone float rows" in self.cpu_kernels  # sinkd's patched sgemm
        wanted = cfg.flash_attn == "exact" or (cfg.flash_attn == "auto" and not self.float_rows)
        exact = wanted and flash_attention_exact(cells, cfg.n_gpu_layers)
        # what sessions are computed under (a resume gate); see the NOTE above
        self.flash_attn = cfg.flash_attn == "on" or exact
        self.flash_exact = exact
        self.max_rows = FLASH_MAX_ROWS if exact else cfg.n_batch  # of a sequence, per decode
        cparams.flash_attn_type = (
            llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if self.flash_attn
            else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        self.backend_argmax = cfg.backend_argmax and hasattr(llama, "llama_sampler_seq_config")
        if self.backend_argmax:
            self._argmax_samplers(cparams)
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
        self.can_shift = bool(llama.llama_memory_can_shift(self._mem))
        # where a row's bits depend on the other sequences in its pass, each passes alone (the
        # NOTE of docs/gpu.md); a piece of a stream sums like a longer one from `min_piece` rows
        offloaded = self.offloaded[0] > 0
        self.solo_passes = offloaded
        self.min_piece = GPU_VECTOR_ROWS + 1 if offloaded else 2
        self.decoder = Decoder(
            ctx,
            self._mem,
            vocab,
            cfg.n_seq_max,
            self.n_ctx_seq,
            self.max_rows,
            self._before_decode,
            self.backend_argmax,
            self.solo_passes,
        )
        self._stack.callback(self.decoder.close)
        self.n_batch = self.decoder.n_batch
        self.cells = SequenceCells(ctx, self._mem, cfg.n_seq_max, self._decode_calibration)
        # a build whose kernels may sum a lone row otherwise is asked on the model (row_probe.py),
        # once, when drafts are first weighed (`rows_not_exact`)
        self._rows_differ: str | None = None
        self.rows_settled = offloaded or "LLAMAFILE" not in self.cpu_kernels.split(";")[0].split()

    def _argmax_samplers(self, cparams: llama.llama_context_params) -> None:
        """A greedy chain for every sequence, in the context's parameters: llama.cpp then adds an
        argmax of each output row to the decode's graph (on the GPU where the model runs there).
        The chains outlive the context (freed after it: the stack is last in, first out)."""
        n = self.config.n_seq_max
        configs = (llama.llama_sampler_seq_config * n)()
        for seq_id in range(n):
            chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
            if not chain:
                raise EngineError("llama_sampler_chain_init failed")
            self._stack.callback(llama.llama_sampler_free, chain)
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
            configs[seq_id].seq_id = seq_id
            configs[seq_id].sampler = ctypes.cast(chain, ctypes.c_void_p)
        self._argmax_configs = configs  # kept alive while the context reads them
        cparams.samplers = configs
        cparams.n_samplers = n
        cparams.n_outputs_max_per_seq = self.config.n_batch  # a chunk's every row may be asked

    def close(self) -> None:
        """Free the context and the model, once no other thread is inside a vocabulary operation."""
        vocab: Vocabulary | None = self.__dict__.get("vocab")  # None: the model never loaded
        if vocab is not None:
            vocab.close()
        self._stack.close()

    @property
    def chat_template(self) -> str:
        return self.vocab.chat_template

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

    # --- decoding (the decoder's; here because it is what an engine is for) ---

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
        self.vocab.check_tokens(tokens)
        seq.config.check_context(
            self.n_ctx_seq
        )  # a budget above the stream: llama.cpp finds no slot
        plan = seq.plan(len(tokens), max_batch=self.n_batch)  # raises CacheFull before any change
        # "all": one array for every row, filled in place (no copy per piece, no concatenation:
        # a 128-token chunk's rows are 24 MiB, and copies of that size move the resident memory)
        rows = np.empty((len(tokens), self.n_vocab), np.float32) if outputs == "all" else None
        last: np.ndarray | None = None
        for i, sb in enumerate(plan.sub_batches):
            self.cells.apply_ops(seq_id, sb, pos_offset)
            seq.adopt_ops(sb)
            is_last = i == len(plan.sub_batches) - 1
            want: Outputs = "none"
            if outputs == "all" or (outputs == "last" and is_last):
                want = outputs
            chunk = tokens[sb.offset : sb.offset + sb.n_tokens]
            into = None if rows is None else rows[sb.offset : sb.offset + sb.n_tokens]
            got = self.decoder.decode_chunk(seq_id, chunk, sb.cache_pos + pos_offset, want, into)
            seq.adopt_tokens(sb)
            if want == "last":
                last = got
        return rows if rows is not None else last

    def decode_batch(self, items: list[BatchItem], lend: bool = False) -> list[np.ndarray | None]:
        return self.decoder.decode_batch(items, lend)

    def decode_next(self, items: list[BatchItem], lend: bool = False) -> list[Next | None]:
        return self.decoder.decode_next(items, lend)

    def decode_greedy(
        self,
        seq_ids: list[int],
        tokens: list[int],
        positions: list[int],
        prepared: bool = False,
        ahead: int = 0,
        lent: bool = True,
    ) -> list[int]:
        return self.decoder.decode_greedy(seq_ids, tokens, positions, prepared, ahead, lent)

    def decode_rows(self, items: list[BatchItem]) -> list[list[Next]]:
        return self.decoder.decode_rows(items)

    @property
    def last_rows(self) -> int:
        """The rows of the last `llama_decode` (0: none yet): a pass of another shape rebuilds
        llama.cpp's graph."""
        return self.decoder.last_rows

    def _place(self, offloaded: tuple[int, int] | None, n_layer: int) -> None:
        """Where the model's layers went (llama.cpp's own count, from its log), and the backend
        that makes a session's numbers (`devices.backend_name`: a gate of every stored state).
        Layers asked for where the build has no GPU device are refused, not run on the CPU."""
        used = offload_devices() if self.config.n_gpu_layers > 0 else []
        if self.config.n_gpu_layers > 0 and not used:
            raise Unsupported(
                f"n_gpu_layers is {self.config.n_gpu_layers} but this llama.cpp offers no GPU"
                " device: it was built without CUDA, Metal or Vulkan (make install-vulkan), or"
                " the driver found none (on Mesa's lavapipe, set GGML_VK_VISIBLE_DEVICES=0)"
            )
        self.offloaded = offloaded or (0, n_layer + 1)
        self.devices = used if self.offloaded[0] else []
        self.backend = backend_name(self.offloaded, self.devices)

    def rows_not_exact(self) -> str | None:
        """Why a row's bits here may depend on how many rows of its own sequence share its pass,
        or None where they do not: then decoding a token with drafts after it (speculative
        verification) gives it the bits it gets decoded alone (docs/determinism.md)."""
        if self.offloaded[0]:
            return (
                f"layers are offloaded to {', '.join(map(str, self.devices))}, where a row's bits"
                f" depend on how many rows share its pass (up to {GPU_VECTOR_ROWS} rows a"
                " matrix-vector kernel, more a tiled one: measured on Vulkan, docs/gpu.md)"
            )
        if not self.rows_settled:
            self._probe_rows()
            if not self.rows_settled:
                return "not probed yet: every sequence holds cells (row_probe.py)"
        if self._rows_differ is not None:  # measured on this model
            return f"on this build and CPU, {self._rows_differ} (row_probe.py)"
        if self.flash_exact or self.float_rows:
            return None  # every row summed whole, in order (flash: in pieces under FLASH_MAX_ROWS)
        if "LLAMAFILE" in self.cpu_kernels.split(";")[0].split():
            return (
                "llama.cpp was built with llamafile's sgemm, which sums a lone row of a sequence"
                " otherwise than 2 or more (make install builds it with sinkd's patch:"
                " deploy/llama.cpp/sgemm-float-rows.patch)"
            )
        return None

    def _probe_rows(self) -> None:
        """Decode the probe on a sequence that holds no cells (it is left so), if one does."""
        for seq_id in range(self.config.n_seq_max):
            if self.cells.pos_range(seq_id) == (-1, -1):
                self._rows_differ = rows_differ(self.decoder, self.cells, self.vocab, seq_id)
                self.rows_settled = True
                return

    def pieces_alike(self, a: int, b: int) -> bool:
        """Whether a piece of `a` rows of a stream and one of `b` rows give a row the same bits:
        pieces of `min_piece` rows or more sum alike (a lone row otherwise on the CPU, up to
        GPU_VECTOR_ROWS otherwise on a GPU: docs/determinism.md, docs/gpu.md)."""
        return a == b or (a >= self.min_piece and b >= self.min_piece)

    def before_decoding(self) -> None:
        """What every decode does first (the cores' share), once for a run of greedy decodes."""
        self._before_decode()

    def row_at(self, index: int) -> Next:
        return self.decoder.row_at(index)

    @property
    def before_overwrite(self) -> list[Callable[[], None]]:
        """Run before llama.cpp's logits buffer changes: whoever holds rows `decode_batch` lent
        copies what it still needs."""
        return self.decoder.before_overwrite

    def logits(self, index: int) -> np.ndarray:
        return self.decoder.logits(index)

    def sample(self, sampler: Sampler, index: int = -1) -> int:
        """Sample (and accept) the next token from the logits of the last decode's `index`."""
        return sampler.sample_logits(self.decoder.logits(index))

    def _decode_calibration(self, n: int) -> None:
        self.decode_batch([BatchItem(0, [0] * n, 0, logits=False)])
