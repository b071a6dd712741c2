"""Decoding: a sequence's tokens through its policy (`feed`), and several sequences' tokens at
once (`decode_batch`), validated before llama.cpp sees them (it aborts the process on some misuse),
in pieces of at most `max_rows`, each item length apart (the NOTEs of `llama.py`).

The engine's `decoder` member, engine thread only. Every piece is all or none: a failed
`llama_decode` removes the cells the earlier pieces of the same call put in.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeVar

import llama_cpp as llama
import numpy as np

from sinkd.daemon import failpoints
from sinkd.daemon.engine.vocab import Vocabulary
from sinkd.errors import EngineError, InvalidInput

Outputs = Literal["none", "last", "all"]
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


# llama_get_logits(_ith) as plain addresses: the per-token read of the logits then builds no
# ctypes pointer and no array type (np.ctypeslib.as_array cost ~35 us a token right after a decode)
_logits_address = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(
    ctypes.cast(llama.llama_get_logits, ctypes.c_void_p).value or 0
)
_row_address = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(
    ctypes.cast(llama.llama_get_logits_ith, ctypes.c_void_p).value or 0
)


class Next(NamedTuple):
    """A decoded item's next-token logits, and their greedy token as llama.cpp's backend argmax
    computed it inside the decode (None where the engine runs without it)."""

    logits: np.ndarray
    greedy: int | None


@dataclass(frozen=True)
class BatchItem:
    """One sequence's tokens in a multi-sequence decode; `logits` asks for the last token's row."""

    seq_id: int
    tokens: list[int]
    pos0: int
    logits: bool = True


class Decoder:
    def __init__(
        self,
        ctx: Any,
        mem: Any,
        vocab: Vocabulary,
        n_seq_max: int,
        n_ctx_seq: int,
        max_rows: int,
        before_decode: Callable[[], None],
        backend_argmax: bool = False,
        solo: bool = False,
    ) -> None:
        self._ctx = ctx
        # one sequence per llama_decode: on a backend where a row's bits depend on the other
        # sequences in its pass (a GPU's kernels by the pass's shape), as alone and as replayed
        self.solo = solo
        # llama.cpp computes each output row's argmax in the decode's graph (a greedy sampler
        # chain per sequence, Engine): the greedy token without reading 49k floats here
        self.backend_argmax = backend_argmax
        self._mem = mem
        self.vocab = vocab
        self.n_vocab = vocab.n_vocab
        self.n_seq_max = n_seq_max
        self.n_ctx_seq = n_ctx_seq
        self.n_batch = int(llama.llama_n_batch(ctx))
        self.max_rows = max_rows  # of a sequence, per llama_decode
        self.before_decode = before_decode
        self._batch = llama.llama_batch_init(self.n_batch, 0, 1)
        # the rows of the last llama_decode: llama.cpp reuses its graph for a pass of the same
        # shape, and builds it anew (~0.9 ms here) for one of another (DecodeCosts)
        self.last_rows = 0
        self._greedy_ids: list[int] | None = None  # the sequences its slots hold (None: unknown)
        self._logits_views: tuple[int, dict[int, np.ndarray]] = (0, {})  # (address, n rows -> view)
        self._row_views: dict[int, np.ndarray] = {}  # address -> one row's view (backend argmax)
        # run before every llama_decode and at close: whoever holds lent rows (decode_batch's
        # `lend`) copies what it still needs, for the buffer is about to change
        self.before_overwrite: list[Callable[[], None]] = []

    def close(self) -> None:
        self._overwriting()
        llama.llama_batch_free(self._batch)

    def _overwriting(self) -> None:
        for hook in self.before_overwrite:
            hook()

    def decode_chunk(
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
        self._greedy_ids = None  # the slots change
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq_id
            b.logits[i] = outputs == "all" or (outputs == "last" and i == n - 1)
        self.before_decode()
        self._overwriting()
        rc = llama.llama_decode(self._ctx, b)
        self.last_rows = b.n_tokens
        if rc != 0:
            raise EngineError(f"llama_decode failed with code {rc} on sequence {seq_id}")

    def decode_batch(self, items: list[BatchItem], lend: bool = False) -> list[np.ndarray | None]:
        """Several sequences' tokens (continuous batching): `decode_next`'s logits alone."""
        return [None if n is None else n.logits for n in self.decode_next(items, lend)]

    def decode_next(self, items: list[BatchItem], lend: bool = False) -> list[Next | None]:
        """Several sequences' tokens (continuous batching); validated first, then one llama_decode
        per item length (`by_length`, the NOTE above), in pieces of at most `max_rows`.

        Returns, per item, a copy of its last token's logits and their greedy token (or None
        where not asked); with `lend` (items of one length) a view of llama.cpp's buffer instead,
        valid until the next llama_decode, before which `before_overwrite` runs: a row read once
        (a token sampled from it) is never copied (49k floats a session a step; the copy cost
        more than the argmax). All or nothing, as one llama_decode: a failed decode removes the
        cells the earlier ones put in.
        It runs once per token on the engine thread, right after a decode has swept the caches:
        plain loops, one pass (bench/README.md, "overhead.py").
        """
        self._validate(items)
        if len(items) == 1 or (not self.solo and len({len(it.tokens) for it in items}) == 1):
            return self._decode_same_length(items, first=True, lend=lend)
        out: list[Next | None] = [None] * len(items)
        decoded: list[BatchItem] = []
        groups = by_length(list(range(len(items))), lambda k: len(items[k].tokens))
        if self.solo:  # each alone, its rows copied before the next pass overwrites them
            groups = [[k] for group in groups for k in group]
        for group in groups:
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

    def _validate(self, items: list[BatchItem]) -> None:
        """What llama.cpp would abort on, refused first: sequence ids out of range or repeated,
        an empty item, a token outside the vocabulary, a batch past n_batch."""
        n_seq_max = self.n_seq_max
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
            self.vocab.check_tokens(tokens)
            total += len(tokens)
        if not 0 < total <= self.n_batch:
            raise InvalidInput(f"batch of {total} tokens is outside 1..n_batch ({self.n_batch})")

    def _decode_same_length(
        self, items: list[BatchItem], first: bool, lend: bool = False
    ) -> list[Next | None]:
        """Items of one length, in pieces of at most `max_rows` (flash attention's 63), each one
        llama_decode; a failed piece removes the earlier pieces' cells. `first`: no decode of this
        call came before (the failpoint marks every later one)."""
        n, r = len(items[0].tokens), self.max_rows
        if n <= r:
            if not first:
                failpoints.hit("decode-piece")
            return self._decode_items(items, lend)
        rows: list[Next | None] = [None] * len(items)
        for at in range(0, n, r):
            final = at + r >= n
            piece = [
                BatchItem(it.seq_id, it.tokens[at : at + r], it.pos0 + at, it.logits and final)
                for it in items
            ]
            try:
                if at or not first:
                    failpoints.hit("decode-piece")
                rows = self._decode_items(piece, lend)
            except EngineError:
                for it in items:
                    self._drop_pieces(it.seq_id, it.pos0, at)
                raise
        return rows

    def _decode_items(self, items: list[BatchItem], lend: bool = False) -> list[Next | None]:
        """One llama_decode of validated items: a copy of each asked row (`lend`: a view) and, with
        the backend argmax, its greedy token."""
        out_index = self._run(items, all_rows=False)
        if self.backend_argmax:
            return [None if idx is None else self._next_at(idx, lend) for idx in out_index]
        # the output rows are in batch order: one copy of them all, each item's row a view of it
        n_out = len(items) - out_index.count(None)
        if n_out == 0:
            return [None] * len(items)
        rows = self._logits_rows_view(n_out)
        if not lend:
            rows = rows.copy()
        row_of = {idx: r for r, idx in enumerate(sorted(x for x in out_index if x is not None))}
        return [None if idx is None else Next(rows[row_of[idx]], None) for idx in out_index]

    def _run(self, items: list[BatchItem], all_rows: bool) -> list[int | None]:
        """One llama_decode of validated items, by rising sequence id (llama.cpp puts only rising,
        consecutive ids in one ubatch), each item's last row asked where it asks (`all_rows`:
        every row); per item, the batch index of its last row if asked."""
        b = self._batch
        self._greedy_ids = None  # the slots change
        i = 0
        out_index: list[int | None] = [None] * len(items)
        for k in sorted(range(len(items)), key=lambda k: items[k].seq_id):
            item = items[k]
            q, pos0, last = item.seq_id, item.pos0, len(item.tokens) - 1
            for j, tok in enumerate(item.tokens):
                b.token[i] = tok
                b.pos[i] = pos0 + j
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = q
                b.logits[i] = all_rows or (item.logits and j == last)
                i += 1
            if item.logits or all_rows:
                out_index[k] = i - 1
        b.n_tokens = i
        self.before_decode()
        self._overwriting()
        rc = llama.llama_decode(self._ctx, b)
        self.last_rows = b.n_tokens
        if rc != 0:
            seqs = [it.seq_id for it in items]
            raise EngineError(f"llama_decode failed with code {rc} on sequences {seqs}")
        return out_index

    def decode_rows(self, items: list[BatchItem]) -> list[list[Next]]:
        """Items of one length, each asking every row: one llama_decode, and per item a row per
        token (row i predicting token i + 1), as views of llama.cpp's buffer valid until the next
        decode. A speculative verification: the pending token and its drafts (the executor).
        Validated as `decode_next`; at most `max_rows` tokens an item, so it is one piece."""
        if not items or len({len(it.tokens) for it in items}) != 1:
            raise InvalidInput("decode_rows takes items of one length")
        n = len(items[0].tokens)
        if n > self.max_rows:
            raise InvalidInput(f"{n} rows of a sequence in one decode: at most {self.max_rows}")
        if self.solo and len(items) > 1:
            raise InvalidInput("one sequence per pass on this backend: verify them one by one")
        self._validate(items)
        last = self._run(items, all_rows=True)
        view = None if self.backend_argmax else self._logits_rows_view(n * len(items))
        out: list[list[Next]] = []
        for end in last:
            assert end is not None
            first = end - n + 1
            if view is None:
                out.append([self._next_at(first + j, lend=True) for j in range(n)])
            else:
                out.append([Next(view[first + j], None) for j in range(n)])
        return out

    def decode_greedy(
        self,
        seq_ids: list[int],
        tokens: list[int],
        positions: list[int],
        prepared: bool = False,
        ahead: int = 0,
        lent: bool = True,
    ) -> list[int]:
        """One token for each sequence (ids rising) at `positions` + `ahead`, one llama_decode:
        each row's greedy token, from llama.cpp's backend argmax. No row is read (`row_at` reads
        one, until the next decode): the decode runs' loop (runtime/loop/runahead.py), where
        nothing else is needed between two decodes. Validated as `decode_batch` is.
        `prepared`: `before_decode` ran for this run of decodes already (it follows the cores'
        share, re-read once a second); `lent=False`: no row was lent since the last decode, so
        `before_overwrite` has nothing to copy."""
        n = len(seq_ids)
        if not self.backend_argmax:
            raise EngineError("greedy decodes need llama.cpp's backend argmax")
        if self.solo and n > 1:
            raise InvalidInput("one sequence per pass on this backend: decode runs one by one")
        if not 0 < n <= self.n_batch or len(tokens) != n or len(positions) != n:
            raise InvalidInput(f"batch of {n} tokens is outside 1..n_batch ({self.n_batch})")
        if seq_ids != self._greedy_ids:  # the sequences changed: their slots are set again
            last = -1
            for q in seq_ids:
                if not last < q < self.n_seq_max:
                    raise InvalidInput(f"greedy decode: sequence ids {seq_ids} do not rise")
                last = q
            b = self._batch
            for i, q in enumerate(seq_ids):
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = q
                b.logits[i] = True
            self._greedy_ids = list(seq_ids)
        b, n_vocab = self._batch, self.n_vocab
        token, pos = b.token, b.pos  # plain stores: cheaper than numpy's right after a decode
        for i in range(n):
            t = tokens[i]
            if not 0 <= t < n_vocab:
                raise InvalidInput(f"greedy decode: token {t} outside 0..{n_vocab - 1}")
            token[i] = t
            pos[i] = positions[i] + ahead
        b.n_tokens = n
        if not prepared:
            self.before_decode()
        if lent:
            self._overwriting()
        rc = llama.llama_decode(self._ctx, b)
        self.last_rows = b.n_tokens
        if rc != 0:
            raise EngineError(f"llama_decode failed with code {rc} on sequences {seq_ids}")
        sampled, ctx = llama.llama_get_sampled_token_ith, self._ctx
        out = []
        for i in range(n):
            t = sampled(ctx, i)
            if not 0 <= t < n_vocab:
                raise EngineError(f"llama.cpp sampled no token for row {i}")
            out.append(t)
        return out

    def row_at(self, index: int) -> Next:
        """The last decode's row at batch `index` (a view, valid until the next decode) and its
        greedy token."""
        return self._next_at(index, lend=True)

    def _next_at(self, index: int, lend: bool) -> Next:
        """Batch row `index`'s logits (a view, or a copy) and llama.cpp's argmax of them. With
        backend samplers llama.cpp keeps a row per batch position, not one per output: each row
        is found by its own address, and its view kept by that address."""
        address = _row_address(self._ctx, index)
        if not address:
            raise EngineError(f"no logits at batch index {index}")
        view = self._row_views.get(address)
        if view is None:
            if len(self._row_views) >= 4 * self.n_batch:  # the buffer moved: forget the old rows
                self._row_views.clear()
            buf = (ctypes.c_float * self.n_vocab).from_address(address)
            view = self._row_views[address] = np.ctypeslib.as_array(buf)
        token = int(llama.llama_get_sampled_token_ith(self._ctx, index))
        if not 0 <= token < self.n_vocab:
            raise EngineError(f"llama.cpp sampled no token at batch index {index}")
        return Next(view if lend else view.copy(), token)

    def _logits_rows_view(self, n_out: int) -> np.ndarray:
        """The last decode's `n_out` output rows, as a view of llama.cpp's buffer (valid until the
        next decode). Views are kept per row count while the buffer stays where it is. With the
        backend argmax llama.cpp keeps a row per batch position: only a decode whose every row
        is an output ("all") reads it this way, from row 0's address, the last row's proving it."""
        if self.backend_argmax:  # a row per batch position, at no fixed offset from the start
            address = _row_address(self._ctx, 0)
            if _row_address(self._ctx, n_out - 1) != address + 4 * (n_out - 1) * self.n_vocab:
                raise EngineError("llama.cpp's logits rows are not one after another")
        else:
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
