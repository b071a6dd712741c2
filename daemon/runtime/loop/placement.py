"""Which sequence ids a step's sessions should hold so that llama.cpp decodes them in one pass.

With per-sequence KV streams llama.cpp splits a batch into ubatches with `split_equal(sequential)`:
one ubatch holds only sequences whose ids rise by one (0, 1, 2 ... but not 0, 2 or 2, 1). A step
whose sessions hold scattered ids is decoded as several ubatches, each a full pass over the weights:
eight sessions at ids 7, 6, ..., 0 decode no faster than eight solo steps. The engine orders a batch
by id; this module says which ids to exchange so the step's ids form one run. Pure: no llama.cpp.
"""

from __future__ import annotations


def runs(ids: list[int]) -> int:
    """How many ubatches llama.cpp makes of one token per sequence at these ids (sorted first)."""
    ordered = sorted(ids)
    return sum(1 for i, q in enumerate(ordered) if i == 0 or q != ordered[i - 1] + 1)


def swaps_for_one_run(ids: list[int], n_seq: int) -> list[tuple[int, int]]:
    """The fewest exchanges (a, b) of sequence contents after which `ids` (the step's sessions'
    ids, distinct, in 0..n_seq-1) form one run: the run is the window of len(ids) ids that already
    holds most of them (the lowest such window), and each id outside it is exchanged with a slot
    of the window that holds none of them (a free sequence, or an idle session's)."""
    if len(ids) == 1 and 0 <= ids[0] < n_seq:
        return []  # one session: the common step, and always one run
    if len(set(ids)) != len(ids) or not all(0 <= q < n_seq for q in ids):
        raise ValueError(f"sequence ids must be distinct and in 0..{n_seq - 1}: {ids}")
    k = len(ids)
    if runs(ids) <= 1:
        return []
    held = set(ids)
    best_start, best_inside = 0, -1
    for start in range(n_seq - k + 1):
        inside = sum(1 for q in range(start, start + k) if q in held)
        if inside > best_inside:
            best_start, best_inside = start, inside
    window = range(best_start, best_start + k)
    outside = sorted(q for q in ids if q not in window)
    targets = [q for q in window if q not in held]
    return list(zip(outside, targets, strict=True))
