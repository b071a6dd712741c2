"""Sequence memory: the KV cells of each sequence, removed, shifted, copied, saved, packed.

The engine's `cells` member (its memory operations, engine thread only): every return code is checked, and a
refused removal raises rather than leave the cache unlike the policy's account of it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import llama_cpp as llama

from sinkd.cachepolicy import Evict, Shift, SubBatch
from sinkd.daemon import failpoints
from sinkd.errors import EngineError, Unsupported


class SequenceCells:
    """The context's `n_seq_max` sequences: which are free, and their cells. `calibrate(n)`
    decodes n tokens into sequence 0 (the cell size is measured once, at load)."""

    def __init__(
        self, ctx: Any, mem: Any, n_seq_max: int, calibrate: Callable[[int], None]
    ) -> None:
        self._ctx = ctx
        self._mem = mem
        self.n_seq_max = n_seq_max
        self._free_seqs = list(range(n_seq_max - 1, -1, -1))
        self._scratch = (ctypes.c_uint8 * 0)()  # sequence images: read, packed, copied in place
        self._decode_calibration = calibrate
        self._state_empty = 0
        self._state_base, self._state_per_cell = self._calibrate_cell_size()

    def acquire_seq(self) -> int:
        """The lowest free sequence id: sessions stay packed at low ids, so the sessions of a step
        tend to hold one run of ids, which llama.cpp decodes in one pass (see runtime/placement)."""
        if not self._free_seqs:
            raise Unsupported(f"all {self.n_seq_max} sequences of the context are in use")
        seq_id = min(self._free_seqs)
        self._free_seqs.remove(seq_id)
        return seq_id

    def swap_seqs(self, a: int, b: int) -> None:
        """Exchange the cells of two sequences (either may be empty or free), through their
        images: each ends packed, as a restored snapshot is, and computes the same bits."""
        if a == b:
            return
        ranges = self.pos_range(a), self.pos_range(b)
        image_a = self.save_seq(a) if ranges[0] != (-1, -1) else b""
        image_b = self.save_seq(b) if ranges[1] != (-1, -1) else b""
        self.clear(a)
        self.clear(b)
        failpoints.hit("swap-cleared")  # both emptied, the images in hand: the worst moment
        if image_b:
            self.restore_seq(a, image_b)
        if image_a:
            self.restore_seq(b, image_a)
        if (self.pos_range(a), self.pos_range(b)) != (ranges[1], ranges[0]):
            raise EngineError(f"exchanging sequences {a} and {b} left them incomplete")
        free_a, free_b = a in self._free_seqs, b in self._free_seqs
        if free_a != free_b:
            self._free_seqs.remove(a if free_a else b)
            self._free_seqs.append(b if free_a else a)

    def release_seq(self, seq_id: int) -> None:
        """Back to the pool, even if clearing it fails (the next acquire clears it, verified)."""
        try:
            self.clear(seq_id)
        finally:
            if seq_id not in self._free_seqs:
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

    def remove(self, seq_id: int, p0: int, p1: int) -> None:
        """Remove cache positions [p0, p1) of the sequence (a rewind); a refusal raises."""
        if not llama.llama_memory_seq_rm(self._mem, seq_id, p0, p1):
            raise EngineError(f"llama_memory_seq_rm({seq_id}, {p0}, {p1}) refused")

    def apply_ops(self, seq_id: int, sb: SubBatch, pos_offset: int = 0) -> None:
        """Apply a sub-batch's evictions and shifts to the sequence; a refused removal raises."""
        for op in sb.ops:
            p0, p1 = op.p0 + pos_offset, op.p1 + pos_offset
            if isinstance(op, Evict):
                if not llama.llama_memory_seq_rm(self._mem, seq_id, p0, p1):
                    raise EngineError(f"llama_memory_seq_rm({seq_id}, {p0}, {p1}) refused")
            elif isinstance(op, Shift):
                llama.llama_memory_seq_add(self._mem, seq_id, p0, p1, op.delta)

    def _calibrate_cell_size(self) -> tuple[int, int]:
        """Serialised sequence state grows by a fixed size per cell: measure it once, at load."""
        sizes = []
        for n in (0, 1, 2, 3):
            self.clear(0)
            if n:
                self._decode_calibration(n)
            sizes.append(int(llama.llama_state_seq_get_size(self._ctx, 0)))
        self.clear(0)
        self._state_empty = sizes[0]  # an empty sequence writes no per-layer headers
        per_cell = sizes[2] - sizes[1]
        if per_cell <= 0 or sizes[3] - sizes[2] != per_cell:
            raise EngineError(f"sequence state size is not linear in cells: {sizes}")
        return sizes[1] - per_cell, per_cell
