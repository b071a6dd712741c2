"""A fake engine: the runtime's logic without llama.cpp's numbers.

It has the engine's members as the runtime uses them (`vocab`, `cells`, `decode_batch`, the
identity and the checks) over a byte-level vocabulary with ChatML framing and a toy "model" whose
next token is a hash of what the sequence's cells hold, in cache order. So it is deterministic,
answers differently to different histories, and keeps the cache's bookkeeping honest: an eviction
or a shift the policy plans changes what the model sees. Good for the conversation layer, the
scheduler's admission and the turn operations; never for a claim about the real model (bits,
evictions' effect on quality, speed): those stay with the real-model tests.

    service = SinkdService(settings, open_engine=open_fake)
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable

import numpy as np

from sinkd.cachepolicy import Evict, PolicyConfig, Shift, SubBatch
from sinkd.daemon.config import Settings
from sinkd.daemon.engine import compat
from sinkd.daemon.engine.decoding import BatchItem, Next
from sinkd.daemon.engine.llama import EngineConfig
from sinkd.daemon.engine.sampler import greedy_token
from sinkd.daemon.engine.vocab import Vocabulary
from sinkd.daemon.models.registry import ModelEntry
from sinkd.daemon.runtime.sessions import ModelIdentity
from sinkd.errors import EngineError, InvalidInput, Unsupported

BOS, EOS, IM_START = 0, 1, 2
CONTROL = {"<|im_end|>": EOS, "<|im_start|>": IM_START}
BYTE0 = 3  # byte b is token BYTE0 + b
N_VOCAB = BYTE0 + 256
REPLY_ALPHABET = b"abcdefghijklmnopqrstuvwxyz "


class FakeVocabulary(Vocabulary):
    """Bytes as tokens, ChatML's two markers and BOS as control tokens; the real class's framing
    (`tokenize_framed`), guard and checks, over these."""

    def __init__(self) -> None:  # no llama.cpp vocabulary behind it
        self.n_vocab, self.adds_bos, self.bos = N_VOCAB, True, BOS
        self.chat_template = "chatml (fake)"
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._text_cond = threading.Condition()
        self._text_users = 0
        self._text_closed = False
        self.sha256 = hashlib.sha256(b"sinkd fake vocabulary 1").hexdigest()
        self._fim = None  # no fill-in-the-middle tokens

    def _tokenize(self, text: str, add_bos: bool, special: bool) -> list[int]:
        out = [BOS] if add_bos else []
        rest = text
        while rest:
            cut = min(
                ((rest.find(s), s) for s in CONTROL if special and s in rest),
                default=(len(rest), ""),
            )
            out += [BYTE0 + b for b in rest[: cut[0]].encode("utf-8", errors="replace")]
            if cut[1]:
                out.append(CONTROL[cut[1]])
            rest = rest[cut[0] + len(cut[1]) :]
        return out

    def _piece(self, token: int) -> bytes:
        if token >= BYTE0:
            return bytes([token - BYTE0])
        return {EOS: b"<|im_end|>", IM_START: b"<|im_start|>"}.get(token, b"")

    def _render_chat(self, messages: list[tuple[str, str]], add_assistant: bool) -> str:
        text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
        return text + ("<|im_start|>assistant\n" if add_assistant else "")

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def is_control(self, token: int) -> bool:
        return token < BYTE0


class FakeCells:
    """Each sequence's cells as {cache position: token}; the operations `SequenceCells` has."""

    def __init__(self, n_seq_max: int) -> None:
        self.n_seq_max = n_seq_max
        self.seqs: dict[int, dict[int, int]] = {q: {} for q in range(n_seq_max)}
        self._free = list(range(n_seq_max))

    def acquire_seq(self) -> int:
        if not self._free:
            raise Unsupported(f"all {self.n_seq_max} sequences of the context are in use")
        seq_id = min(self._free)
        self._free.remove(seq_id)
        return seq_id

    def release_seq(self, seq_id: int) -> None:
        self.clear(seq_id)
        if seq_id not in self._free:
            self._free.append(seq_id)

    def swap_seqs(self, a: int, b: int) -> None:
        self.seqs[a], self.seqs[b] = self.seqs[b], self.seqs[a]
        free_a, free_b = a in self._free, b in self._free
        if free_a != free_b:
            self._free.remove(a if free_a else b)
            self._free.append(b if free_a else a)

    def clear(self, seq_id: int) -> None:
        self.seqs[seq_id] = {}

    def copy(self, src: int, dst: int) -> None:
        self.seqs[dst] = dict(self.seqs[src])

    def cell_count(self, seq_id: int) -> int:
        return len(self.seqs[seq_id])

    def save_seq(self, seq_id: int) -> bytes:
        return json.dumps(sorted(self.seqs[seq_id].items())).encode()

    def restore_seq(self, seq_id: int, data: bytes) -> None:
        self.seqs[seq_id] = {int(p): int(t) for p, t in json.loads(data)}

    def compact(self, seq_id: int) -> None:
        """Nothing to pack: a dict has no holes."""

    def pos_range(self, seq_id: int) -> tuple[int, int]:
        cells = self.seqs[seq_id]
        return (min(cells), max(cells)) if cells else (-1, -1)

    def remove(self, seq_id: int, p0: int, p1: int) -> None:
        hi = p1 if p1 >= 0 else float("inf")
        self.seqs[seq_id] = {p: t for p, t in self.seqs[seq_id].items() if not p0 <= p < hi}

    def apply_ops(self, seq_id: int, sb: SubBatch, pos_offset: int = 0) -> None:
        for op in sb.ops:
            p0, p1 = op.p0 + pos_offset, op.p1 + pos_offset
            if isinstance(op, Evict):
                self.remove(seq_id, p0, p1)
            elif isinstance(op, Shift):
                cells = self.seqs[seq_id]
                self.seqs[seq_id] = {
                    (p + op.delta if p0 <= p < p1 else p): t for p, t in cells.items()
                }


class FakeEngine:
    """The engine's surface as the runtime uses it; `decoded` counts the tokens it decoded."""

    def __init__(self, config: EngineConfig, entry: ModelEntry | None) -> None:
        self.config = config
        self.entry = entry
        self.vocab = FakeVocabulary()
        self.cells = FakeCells(config.n_seq_max)
        self.n_ctx_seq = config.n_ctx_seq
        self.n_batch = self.max_rows = config.n_batch
        self.n_vocab, self.adds_bos, self.bos = N_VOCAB, True, BOS
        self.n_ctx_train, self.n_swa, self.can_shift = 8192, 0, True
        self.llama_cpp_version = self.cpu_kernels = "fake"
        self.backend, self.devices, self.offloaded = "cpu", [], (0, 1)
        self.solo_passes, self.min_piece = False, 2
        self.flash_attn = False
        self.kv_allocations: list[tuple[float, int]] = []
        self.tokenizer_sha256 = self.vocab.sha256
        self.template_sha256 = hashlib.sha256(self.vocab.chat_template.encode()).hexdigest()
        self.decoded = 0
        self.last_rows = 0  # the rows of the last decode (Engine.last_rows)
        # the toy model looks at the last `markov` tokens alone (0: all of them): its text then
        # repeats itself, as a log's or a JSON reply's does, and drafts from it are often right
        self.markov = 0
        # lent rows live in one buffer that the next decode overwrites, as llama.cpp's do: a
        # holder that forgot to copy one reads another step's numbers
        self.before_overwrite: list[Callable[[], None]] = []
        self._buffer = np.zeros((config.n_batch, N_VOCAB), dtype=np.float32)

    @property
    def chat_template(self) -> str:
        return self.vocab.chat_template

    @property
    def kv_bytes_per_token(self) -> float:
        return 1024.0

    @property
    def position_limit(self) -> int:
        return self.n_ctx_train

    def check_policy(self, policy: PolicyConfig) -> None:
        compat.check_policy(self, policy)  # type: ignore[arg-type]

    def idle(self) -> None:
        """Nothing to share: no cores are held."""

    def close(self) -> None:
        for hook in self.before_overwrite:
            hook()
        self._buffer[:] = np.nan
        self.vocab.close()

    def decode_batch(self, items: list[BatchItem], lend: bool = False) -> list[np.ndarray | None]:
        """The real decoder's checks (a batch past n_batch would abort llama.cpp), then each
        item's tokens into its cells and, where asked, the next-token row (`lend`: a view of
        the buffer the next decode overwrites)."""
        if not 0 < sum(len(it.tokens) for it in items) <= self.n_batch:
            raise InvalidInput(f"batch outside 1..n_batch ({self.n_batch})")
        if len({it.seq_id for it in items}) != len(items):
            raise InvalidInput("repeated sequence ids in one batch")
        for hook in self.before_overwrite:
            hook()
        self._buffer[:] = np.nan  # what a lent row held is gone
        rows = self._decode(items)
        if not lend:
            return rows
        lent: list[np.ndarray | None] = []
        for k, row in enumerate(rows):
            if row is not None:
                self._buffer[k] = row
                row = self._buffer[k]
            lent.append(row)
        return lent

    def decode_next(self, items: list[BatchItem], lend: bool = False) -> list[Next | None]:
        """`decode_batch`'s rows with their greedy token, as llama.cpp's backend argmax gives it."""
        rows = self.decode_batch(items, lend)
        return [None if row is None else Next(row, greedy_token(row)) for row in rows]

    def decode_rows(self, items: list[BatchItem]) -> list[list[Next]]:
        """Items of one length, every row asked (a speculative verification): per item a row per
        token, from the cells up to it (lent: the next decode overwrites them)."""
        if len({len(it.tokens) for it in items}) != 1:
            raise InvalidInput("decode_rows takes items of one length")
        n = len(items[0].tokens)
        if not 0 < n * len(items) <= self.n_batch:
            raise InvalidInput(f"batch outside 1..n_batch ({self.n_batch})")
        for hook in self.before_overwrite:
            hook()
        self._buffer[:] = np.nan
        out: list[list[Next]] = []
        for k, it in enumerate(items):
            self.vocab.check_tokens(it.tokens)
            cells = self.cells.seqs[it.seq_id]
            rows = []
            for j, token in enumerate(it.tokens):
                if it.pos0 + j in cells:
                    raise EngineError(f"sequence {it.seq_id}: position {it.pos0 + j} is taken")
                cells[it.pos0 + j] = token
                self._buffer[k * n + j] = self._logits(cells)
                row = self._buffer[k * n + j]
                rows.append(Next(row, greedy_token(row)))
            self.decoded += n
            out.append(rows)
        self.last_rows = n * len(items)
        return out

    def _logits(self, cells: dict[int, int]) -> np.ndarray:
        """The toy model's row (a test may replace `next_token_logits` with one of its own)."""
        return next_token_logits(cells, self.markov) if self.markov else next_token_logits(cells)

    rows_settled = True  # nothing to probe

    def rows_not_exact(self) -> str | None:
        """A row here is a hash of its cells: the same however many share its pass."""
        return None

    def before_decoding(self) -> None:
        pass

    def decode_greedy(
        self,
        seq_ids: list[int],
        tokens: list[int],
        positions: list[int],
        prepared: bool = False,
        ahead: int = 0,
        lent: bool = True,
    ) -> list[int]:
        """One token a sequence (ids rising), each row's greedy token; `row_at` reads a row.
        `lent=False` promises nothing is lent: a row that is (the run's bug) is spoilt here."""
        if seq_ids != sorted(set(seq_ids)):
            raise InvalidInput("greedy decode: sequence ids must rise")
        if not lent:
            self.before_overwrite, hooks = [], self.before_overwrite
        items = [
            BatchItem(q, [t], p + ahead) for q, t, p in zip(seq_ids, tokens, positions, strict=True)
        ]
        try:
            rows = self.decode_batch(items, lend=True)
        finally:
            if not lent:
                self.before_overwrite = hooks
        return [greedy_token(row) for row in rows if row is not None]

    def row_at(self, index: int) -> Next:
        row = self._buffer[index]
        return Next(row, greedy_token(row))

    def _decode(self, items: list[BatchItem]) -> list[np.ndarray | None]:
        rows: list[np.ndarray | None] = []
        for it in items:
            self.vocab.check_tokens(it.tokens)
            cells = self.cells.seqs[it.seq_id]
            for k, token in enumerate(it.tokens):
                if it.pos0 + k in cells:
                    raise EngineError(f"sequence {it.seq_id}: position {it.pos0 + k} is taken")
                cells[it.pos0 + k] = token
            self.decoded += len(it.tokens)
            rows.append(self._logits(cells) if it.logits else None)
        self.last_rows = sum(len(it.tokens) for it in items)
        return rows


def next_token_logits(cells: dict[int, int], markov: int = 0) -> np.ndarray:
    """The toy model: a hash of what the cells hold, in cache order (their last `markov` alone,
    if set), picks the likeliest token (a letter or a space, now and then the end of the turn);
    the others share a small slope, so sampling at a temperature draws among them."""
    seen = np.array([cells[p] for p in sorted(cells)][-markov:], dtype=np.int64)
    digest = hashlib.sha256(seen.tobytes()).digest()
    logits = np.frombuffer(hashlib.sha256(digest).digest() * 9, dtype=np.uint8)[:N_VOCAB]
    row = logits.astype(np.float32) / 255.0
    best = EOS if digest[0] % 13 == 0 else BYTE0 + REPLY_ALPHABET[digest[1] % len(REPLY_ALPHABET)]
    if markov:  # the repetitive model never ends a turn, and now and then (every 7 cells) goes
        shift = int(len(cells) % 7 == 0)  # on with another letter: a draft made then is wrong
        best = BYTE0 + REPLY_ALPHABET[(digest[1] + shift) % len(REPLY_ALPHABET)]
    row[best] += 8.0
    return row


def open_fake(settings: Settings, entry: ModelEntry) -> tuple[FakeEngine, ModelIdentity]:
    """`SinkdService`'s engine opener, for a fake engine of the settings' shape."""
    config = EngineConfig(
        n_ctx_seq=settings.n_ctx_seq, n_seq_max=settings.max_sessions, n_batch=settings.n_batch
    )
    engine = FakeEngine(config, entry)
    identity = ModelIdentity(
        entry.name, entry.sha256, engine.tokenizer_sha256, engine.template_sha256
    )
    return engine, identity
