"""Boot: open the engine the settings name, then (engine thread, before the daemon serves) open
the state directory under this configuration and resume the stored sessions."""

from __future__ import annotations

import logging
from typing import Any

from sinkd.daemon.config import Settings
from sinkd.daemon.engine.llama import Engine, EngineConfig
from sinkd.daemon.engine.loading import open_engine
from sinkd.daemon.models.registry import ModelEntry, load_lock, model_path
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.resume import Resumer
from sinkd.daemon.runtime.sessions import ModelIdentity
from sinkd.daemon.store.embedder import Embedder, EmbedderUnavailable
from sinkd.daemon.store.journal import made_under
from sinkd.daemon.validation import validated

log = logging.getLogger("sinkd.engine")


def engine_config(settings: Settings) -> EngineConfig:
    config = validated(
        EngineConfig,
        n_ctx_seq=settings.n_ctx_seq,
        n_seq_max=settings.max_sessions,
        n_batch=settings.n_batch,
        n_gpu_layers=settings.n_gpu_layers,
        kv_type=settings.kv_type,
        flash_attn=attention_for(settings),
        # decode runs take the decode's own argmax (runahead.py); without them it costs more
        # than the numpy argmax it saves (engine/llama.py, EngineConfig)
        backend_argmax=settings.decodes_per_pass > 1,
    )
    if settings.n_threads:
        config = config.model_copy(update={"n_threads": settings.n_threads})
    return config


def attention_for(settings: Settings) -> str:
    """The attention kernel the engine runs: the setting, except that "auto" keeps flash
    attention where exact while the state directory holds live sessions made under it (the
    default before 2026-12-07): an upgrade does not strand them as stale. Once none is left, the
    next start runs "auto"'s kernel; `flash_attn = "off"` switches at once (they go stale)."""
    if settings.flash_attn != "auto" or not settings.durable:
        return settings.flash_attn
    if True in made_under(settings.state_dir / "journal.db", "flash_attn"):
        log.info("stored sessions were made under flash attention: it stays on where exact")
        return "exact"
    return "auto"


BM25_ALONE = "bm25 alone"
DENSE = "bm25+dense"


def one_blas_thread() -> None:
    """numpy's BLAS (the embedder's matrix products) runs on the calling thread alone. Its pool
    of threads, one per core, ran at full priority beside llama.cpp's: a batch of evicted
    passages embedded on the recall worker slowed the next turn's prefill by half again
    (bench/README.md, "long_chat.py"). On one thread, at the worker's lower priority, the
    embedding takes what llama.cpp leaves."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")


def open_embedder(enabled: bool) -> tuple[Embedder | None, str]:
    """Recall's sentence encoder, and how recall searches: "bm25+dense", or "bm25 alone: why"
    (switched off, not pulled yet, damaged). Recall without it still works, on words alone."""
    if not enabled:
        return None, f"{BM25_ALONE}: recall_dense is off"
    entry = load_lock().default_embedder()
    if entry is None:
        return None, f"{BM25_ALONE}: models.lock names no embedder"
    path = model_path(entry)
    if not path.is_file():
        return None, (
            f"{BM25_ALONE}: the embedder {entry.name} is not pulled"
            f" (sinkd models pull {entry.name})"
        )
    try:
        embedder = Embedder.shared(path, entry.weights_sha256)
        one_blas_thread()
        # the first matrix product makes numpy's BLAS take its working buffers (~30 MiB, kept):
        # at load, not in the middle of a stream whose memory must stay flat
        embedder.embed(["sinkd"])
        return embedder, DENSE
    except (EmbedderUnavailable, ImportError) as e:
        return None, f"{BM25_ALONE}: the embedder {entry.name} did not load: {e}"


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
    log.info("model %s computes on %s", entry.name, engine.backend)
    return engine, identity


def gates(engine: Engine, entry: ModelEntry, identity: ModelIdentity) -> dict[str, Any]:
    """What stored cells are valid under: a snapshot's, a session's and a prefix state's."""
    return {
        "model": entry.name,
        "model_sha256": identity.sha256,
        "tokenizer_sha256": identity.tokenizer_sha256,
        "template_sha256": identity.template_sha256,
        "kv_type": engine.config.kv_type,
        "llama_cpp": engine.llama_cpp_version,
        "n_ctx_seq": engine.n_ctx_seq,
        "flash_attn": engine.flash_attn,
        "cpu_kernels": engine.cpu_kernels,
        "backend": engine.backend,
    }


def resume(
    engine: Engine,
    entry: ModelEntry,
    identity: ModelIdentity,
    durability: Durability,
    resumer: Resumer,
) -> None:
    """Open the state directory under this configuration (a session journalled under another is
    stale, with the reason) and resume what it holds."""
    durability.open(gates(engine, entry, identity))
    resumer.run(engine)
