"""Boot: open the engine the settings name, then (engine thread, before the daemon serves) open
the state directory under this configuration and resume the stored sessions."""

from __future__ import annotations

from sinkd.daemon.config import Settings
from sinkd.daemon.engine.llama import Engine, EngineConfig
from sinkd.daemon.engine.loading import open_engine
from sinkd.daemon.models.registry import ModelEntry
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.resume import Resumer
from sinkd.daemon.runtime.sessions import ModelIdentity
from sinkd.daemon.validation import validated


def engine_config(settings: Settings) -> EngineConfig:
    config = validated(
        EngineConfig,
        n_ctx_seq=settings.n_ctx_seq,
        n_seq_max=settings.max_sessions,
        n_batch=settings.n_batch,
        n_gpu_layers=settings.n_gpu_layers,
        kv_type=settings.kv_type,
        flash_attn=settings.flash_attn,
    )
    if settings.n_threads:
        config = config.model_copy(update={"n_threads": settings.n_threads})
    return config


def open_for(settings: Settings, entry: ModelEntry) -> tuple[Engine, ModelIdentity]:
    engine = open_engine(
        entry.name,
        engine_config(settings),
        verify_hash=settings.verify_model_hash,
        allow_unchecked=settings.allow_unchecked,
    )
    identity = ModelIdentity(
        entry.name, entry.sha256, engine.tokenizer_sha256, engine.template_sha256
    )
    return engine, identity


def resume(
    engine: Engine,
    entry: ModelEntry,
    identity: ModelIdentity,
    durability: Durability,
    resumer: Resumer,
) -> None:
    """Open the state directory under this configuration (a session journalled under another is
    stale, with the reason) and resume what it holds."""
    durability.open(
        {
            "model": entry.name,
            "model_sha256": identity.sha256,
            "tokenizer_sha256": identity.tokenizer_sha256,
            "template_sha256": identity.template_sha256,
            "kv_type": engine.config.kv_type,
            "llama_cpp": engine.llama_cpp_version,
            "n_ctx_seq": engine.n_ctx_seq,
            "flash_attn": engine.flash_attn,
            "cpu_kernels": engine.cpu_kernels,
        }
    )
    resumer.run(engine)
