"""Whether a model and a context can run a policy, and whether a file is the one its models.lock
entry pins: the checks the engine makes before llama.cpp could misbehave."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinkd.cachepolicy import ConfigError, PolicyConfig, PositionMode
from sinkd.daemon.models.registry import ModelEntry
from sinkd.errors import ModelMismatch, Unsupported

if TYPE_CHECKING:
    from sinkd.daemon.engine.llama import Engine


def check_entry(engine: Engine, entry: ModelEntry) -> None:
    """The loaded file's vocabulary, template and shapes are the entry's, or ModelMismatch."""
    for name, actual in (
        ("tokenizer_sha256", engine.tokenizer_sha256),
        ("template_sha256", engine.template_sha256),
        ("n_layer", engine.n_layer),
        ("n_head_kv", engine.n_head_kv),
        ("head_dim", engine.head_dim),
        ("n_ctx_train", engine.n_ctx_train),
        ("adds_bos", engine.adds_bos),
    ):
        expected = getattr(entry, name)
        if expected != actual:
            raise ModelMismatch(entry.name, name, expected, actual, entry.lock_name)


def check_policy(engine: Engine, policy: PolicyConfig, listed: bool = True) -> None:
    """Refuse what this context cannot run: a budget above its cells, a shift it cannot apply,
    positions past the trained context or the sliding window. `listed=False` skips the lock's gate
    (an unlisted model runs `full` only): the qualification asks what the model itself allows."""
    policy.check_context(engine.n_ctx_seq)
    if listed and engine.entry is None and policy.evicts:
        raise Unsupported(
            f"policy {policy.policy.value} needs a model from models.lock; an unlisted model runs"
            " with the full policy only"
        )
    if policy.position_mode is PositionMode.SHIFT and not engine.can_shift:
        reason = (
            " (its sliding-window cache shifts only at full size: swa_full)" if engine.n_swa else ""
        )
        raise Unsupported(
            f"policy {policy.policy.value} shifts positions, but this model's cache cannot shift{reason}"
        )
    bound = policy.max_cache_position()
    if (
        policy.position_mode is PositionMode.SHIFT
        and bound is not None
        and bound > engine.n_ctx_train
    ):
        raise ConfigError(
            "compact_interval",
            f"sinks + window + compact_interval = {bound} would take positions past the model's"
            f" trained context of {engine.n_ctx_train}",
        )
    if engine.n_swa and policy.evicts and (bound is None or bound > engine.n_swa):
        raise Unsupported(
            f"policy {policy.policy.value} lets cache positions reach "
            f"{'the transcript length' if bound is None else bound}, beyond the model's sliding"
            f" window of {engine.n_swa}: its local layers would drop the sinks"
        )
