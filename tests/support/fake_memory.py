"""A recording fake of llama.cpp's per-sequence memory calls, for pure policy tests only.

It applies `seq_rm`/`seq_add` and decodes the way llama.cpp does to cell positions, so a plan can be
checked op by op against the policy's own account. It backs no claim about the engine.
"""

from __future__ import annotations

from sinkd.cachepolicy import AppendPlan, Evict, Shift


class RecordingMemory:
    def __init__(self) -> None:
        self.cells: dict[int, int] = {}  # cache position -> logical position
        self.calls: list[tuple[object, ...]] = []
        self.max_cells = 0

    def seq_rm(self, p0: int, p1: int) -> None:
        self.calls.append(("seq_rm", p0, p1))
        self.cells = {p: lp for p, lp in self.cells.items() if not p0 <= p < p1}

    def seq_add(self, p0: int, p1: int, delta: int) -> None:
        self.calls.append(("seq_add", p0, p1, delta))
        moved = {p + delta if p0 <= p < p1 else p: lp for p, lp in self.cells.items()}
        assert len(moved) == len(self.cells), "a shift collided two cells"
        self.cells = moved

    def decode(self, cache_pos: int, logical_pos: int, n: int) -> None:
        self.calls.append(("decode", cache_pos, n))
        for i in range(n):
            assert cache_pos + i not in self.cells, "decode overwrote a live cell"
            self.cells[cache_pos + i] = logical_pos + i
        self.max_cells = max(self.max_cells, len(self.cells))

    def apply(self, plan: AppendPlan, on_sub_batch=None) -> None:  # type: ignore[no-untyped-def]
        for sb in plan.sub_batches:
            for op in sb.ops:
                if isinstance(op, Evict):
                    self.seq_rm(op.p0, op.p1)
                elif isinstance(op, Shift):
                    self.seq_add(op.p0, op.p1, op.delta)
            self.decode(sb.cache_pos, sb.logical_pos, sb.n_tokens)
            if on_sub_batch is not None:
                on_sub_batch(sb)

    def sorted_cells(self) -> list[tuple[int, int]]:
        return sorted(self.cells.items())
