"""Which sessions get which tokens in the next step: a pure decision, no llama.cpp, no clocks.

Decoding sessions (a sampled token waiting to be decoded) come first, one token each; the rest of the
step's budget goes to prefill chunks, round-robin. A session's prefill is cut into chunks of
`prefill_chunk` whatever the load (a chunk that does not fit waits for the next step), so its
sub-batches, hence its logits, are the same alone or batched: a solo replay is bit-identical.

NOTE: when prefill waits and the decoders alone would leave no room for a chunk, every other step
the decoders give up one chunk's worth of slots (rotating who gives them up): a long append is never
starved by many generating sessions, and every decoder still gets a token at least every other step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """What the planner needs to know of one head job."""

    key: int  # opaque, handed back in the plan
    decoding: bool  # a sampled token waits to be decoded
    remaining: int  # prefill tokens still to go (0 when decoding)


@dataclass(frozen=True)
class Slot:
    key: int
    n_tokens: int
    decoding: bool


@dataclass(frozen=True)
class StepPlan:
    slots: tuple[Slot, ...]
    next_rr: int  # the rotation to pass to the next step


def plan_step(
    candidates: list[Candidate], step_tokens: int, prefill_chunk: int, rr: int
) -> StepPlan:
    chunk = min(prefill_chunk, step_tokens)
    decoding = [c for c in candidates if c.decoding]
    prefilling = [c for c in candidates if not c.decoding and c.remaining > 0]
    next_rr = rr + 1
    if prefilling:
        k = rr % len(prefilling)
        prefilling = prefilling[k:] + prefilling[:k]
    decode_budget = step_tokens
    if prefilling and len(decoding) > step_tokens - chunk and rr % 2 == 1:
        decode_budget = max(step_tokens - chunk, 0)
        k = rr % len(decoding)
        decoding = decoding[k:] + decoding[:k]
    slots: list[Slot] = []
    budget = step_tokens
    for c in decoding[:decode_budget]:
        slots.append(Slot(c.key, 1, True))
        budget -= 1
    for c in prefilling:
        n = min(c.remaining, chunk)
        if n > budget:
            continue  # waits for the next step rather than taking a load-dependent piece
        slots.append(Slot(c.key, n, False))
        budget -= n
        if budget == 0:
            break
    return StepPlan(tuple(slots), next_rr)
