"""Which sessions get which tokens in the next step: a pure decision, no llama.cpp, no clocks.

Decoding sessions (a sampled token waiting to be decoded) come first, one token each; the rest of the
step's budget goes to prefill chunks, round-robin. A session's prefill is cut into chunks of
`prefill_chunk` whatever the load (a chunk that does not fit waits for the next step), so its
sub-batches, hence its logits, are the same alone or batched: a solo replay is bit-identical.

Drafts (speculative decoding, drafting.py) take what is left once the decoders and the prefill
chunks have theirs, so they never delay a prefill; they are given only where every decoding session
of the step drafts, all the same number, so that the verifications share one `llama_decode` (a
pass per length: `by_length`) and never add one.

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
    drafts: int = 0  # draft tokens it asks to verify beside its decoded one


@dataclass(frozen=True)
class Slot:
    key: int
    n_tokens: int  # a decoding slot: its pending token, then n_tokens - 1 drafts
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
    return StepPlan(_with_drafts(slots, candidates, budget), next_rr)


def _with_drafts(slots: list[Slot], candidates: list[Candidate], budget: int) -> tuple[Slot, ...]:
    """Where every decoding slot's session asked for drafts, each gets one common number of them,
    as many as each asked and the budget left allows: their verifications then share one pass.
    Beside a decoder without drafts they would take a second pass, which costs more than they
    save: none then."""
    asked = {c.key: c.drafts for c in candidates if c.decoding and c.drafts > 0}
    drafting = [s for s in slots if s.decoding]
    if not drafting or any(s.key not in asked for s in drafting):
        return tuple(slots)
    k = min(min(asked[s.key] for s in drafting), budget // len(drafting))
    if k <= 0:
        return tuple(slots)
    return tuple(Slot(s.key, 1 + k, True) if s in drafting else s for s in slots)
