"""What a request asks for, resolved and checked before anything reaches the engine: the policy
(defaults from the model's entry and the daemon's settings, a pinned system prompt), the system
prompt's tokens, a generation's bounds."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sinkd.cachepolicy import PolicyConfig, PolicyName
from sinkd.cachepolicy.recall_plan import RecallConfig, RecallMode, check_recallable
from sinkd.daemon.config import Settings
from sinkd.daemon.engine import grammar
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.engine.sampler import SamplingParams
from sinkd.daemon.engine.vocab import content_mark
from sinkd.daemon.models.registry import ModelEntry
from sinkd.daemon.runtime.api import OutputFormat, PolicyRequest, RecallRequest, SamplingRequest
from sinkd.daemon.validation import validated
from sinkd.errors import InvalidInput

MAX_GENERATE_TOKENS = 4096
MIN_DEFAULT_BUDGET = 16  # a passage's smallest size: below it, recall is off unless asked
MAX_STOPS, MAX_STOP_CHARS = 16, 256


def resolve_recall(
    req: RecallRequest, policy: PolicyConfig, settings: Settings, across: bool = False
) -> RecallConfig:
    """Unset mode: the daemon's default for the sink policy, off for the controls (they stay
    what they were, for the comparisons). A full session cannot recall: asking is refused.
    Unset budget: the daemon's default, at most half the window (a window too small to hold a
    passage beside the question defaults to off). `across`: the tenant keeps a memory across
    its conversations; a session that stores and was not asked to be private takes part."""
    default_on = policy.policy is PolicyName.SINK and policy.window // 2 >= MIN_DEFAULT_BUDGET
    mode = req.mode or (settings.recall_mode if default_on else "off")
    config = RecallConfig.named(
        mode,
        # the default budget fits any window; a budget asked for is checked as asked
        budget=max(1, min(settings.recall_budget, policy.window // 2))
        if req.budget is None
        else req.budget,
        passages=settings.recall_passages if req.passages is None else req.passages,
        threshold=settings.recall_threshold if req.threshold is None else req.threshold,
        dense_threshold=settings.recall_dense_threshold,
        across=across and not req.private and mode != RecallMode.OFF.value,
    )
    if config.mode is not RecallMode.OFF:
        check_recallable(policy)
        config.check(policy)
    return config


def system_tokens(engine: Engine, system_prompt: str) -> list[int]:
    """The system prompt framed by the chat template (when the model has one), after the BOS."""
    if not system_prompt:
        return engine.vocab.tokenize("", add_bos=True)
    if not engine.chat_template:
        return engine.vocab.tokenize(system_prompt, add_bos=True)
    framed = engine.vocab.render_chat([("system", content_mark(0))], add_assistant=False)
    if content_mark(0) not in framed:
        # a template with no system turn (Gemma 3's folds it into the first user message, which
        # a session that pins its system prompt has not seen yet): a user turn of its own
        framed = engine.vocab.render_chat([("user", content_mark(0))], add_assistant=False)
    return engine.vocab.tokenize_framed(framed, [system_prompt], add_bos=True)


def resolve_policy(
    req: PolicyRequest,
    n_system: int,
    entry: ModelEntry,
    settings: Settings,
    position_limit: int | None,
    n_cells: int | None = None,
) -> tuple[PolicyConfig, int]:
    """The session's policy and how many system prompt tokens are sinks. An unset K defers the
    shift over `settings.evictions_per_shift` evictions, within `position_limit` (the model's).
    `fill_window` with no window: W takes what `n_cells` and `position_limit` leave after S."""
    window = req.window
    if window is None and req.fill_window and n_cells is not None:
        window = filled_window(req, n_system, entry, min(n_cells, position_limit or n_cells))
    config = PolicyConfig.resolve(
        req.name,
        sinks=req.sinks,
        window=window,
        evict_chunk=req.evict_chunk,
        compact_interval=req.compact_interval or 0,
        ingest_chunk=req.ingest_chunk,
        default_sinks=entry.default_sinks,
        default_window=entry.default_window,
        default_evict_chunk=settings.default_evict_chunk,
        default_ingest_chunk=settings.default_ingest_chunk,
    )
    pinned = min(config.sinks, n_system)
    if req.pin_system_prompt:
        if config.policy not in (PolicyName.SINK, PolicyName.SINK_NOSHIFT):
            raise InvalidInput("pin_system_prompt: only the sink policies have sinks to pin")
        bound = settings.max_pinned_system_tokens
        if n_system > bound:
            raise InvalidInput(
                f"pin_system_prompt: the system prompt is {n_system} tokens, above the bound"
                f" of {bound}"
            )
        config = dataclasses.replace(config, sinks=max(config.sinks, n_system))
        pinned = n_system
    if config.policy is PolicyName.WINDOW:
        pinned = 0
    if req.compact_interval is None:
        config = config.with_deferred_shift(settings.evictions_per_shift, position_limit)
    return config, pinned


def filled_window(req: PolicyRequest, n_system: int, entry: ModelEntry, span: int) -> int:
    """The window that fills `span` positions after the sinks (a pinned system prompt's too)."""
    if req.name == PolicyName.WINDOW.value:
        sinks = 0
    else:
        sinks = entry.default_sinks if req.sinks is None else req.sinks
        if req.pin_system_prompt:
            sinks = max(sinks, n_system)
    if span - sinks < 1:
        raise InvalidInput(
            f"fill_window: {sinks} sinks leave no window in the {span} positions this model and"
            " context allow"
        )
    return span - sinks


def sampling_params(request: SamplingRequest | None) -> SamplingParams | None:
    """A request's sampling fields as validated parameters (None: the session's own)."""
    if request is None:
        return None
    return validated(SamplingParams, **request.given(), chosen=True)


def chat_sampling(
    recommended: Mapping[str, Any], generation: str, n_seen: int, rewinds: int = 0
) -> SamplingParams | None:
    """The model's recommended sampling for one chat turn of a session that chose none, seeded
    from the generation and the stream's length: each turn draws differently, and the same turn
    of the same stream draws the same; a regenerated turn (`rewinds`) draws anew (None when the
    entry recommends nothing)."""
    if not recommended:
        return None
    salt = f"{generation}:{n_seen}" + (f":{rewinds}" if rewinds else "")
    digest = hashlib.sha256(salt.encode()).digest()
    return validated(
        SamplingParams, **{**recommended, "seed": int.from_bytes(digest[:4], "little")}
    )


def output_grammar(output: OutputFormat | None) -> str | None:
    """The grammar a structured reply is decoded under (InvalidInput naming what a schema asks
    that the grammar cannot enforce), or None for free text."""
    return None if output is None else _compiled(output)


@functools.lru_cache(maxsize=64)
def _compiled(output: OutputFormat) -> str:
    """Once per schema: a request checks it before any session and decodes under it, and a
    client sends the same schema (its tools) with every turn."""
    if output.schema_json is None:
        return grammar.json_object_grammar()
    return grammar.schema_grammar(json.loads(output.schema_json))


def check_generation_args(max_tokens: int, stops: tuple[str, ...]) -> None:
    if not 1 <= max_tokens <= MAX_GENERATE_TOKENS:
        raise InvalidInput(f"max_tokens: must be in 1..{MAX_GENERATE_TOKENS}, got {max_tokens}")
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise InvalidInput(
            f"stop: at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters"
        )
