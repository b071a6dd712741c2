"""Open an engine on a model from models.lock, refusing combinations nobody has checked."""

from __future__ import annotations

import os
from pathlib import Path

from sinkd.daemon.engine.devices import gpu_backend
from sinkd.daemon.engine.llama import Engine, EngineConfig, init_backend
from sinkd.daemon.models.registry import ModelEntry, ModelLock, load_lock, locate, verify_file
from sinkd.errors import ModelNotAllowed, Unsupported


def check_combination(
    entry: ModelEntry, config: EngineConfig, allow_unchecked: bool = False
) -> None:
    """KV dtype and backend must be ones this entry was checked with, unless explicitly allowed."""
    if allow_unchecked or os.environ.get("SINKD_ALLOW_UNCHECKED") == "1":
        return
    init_backend()  # ggml's devices are registered
    if config.kv_type not in entry.kv_types_checked:
        raise Unsupported(
            f"model {entry.name}: KV type {config.kv_type} is not checked (checked:"
            f" {', '.join(entry.kv_types_checked)}); pass --allow-unchecked to run it anyway"
        )
    backend = (gpu_backend() or "a GPU") if config.n_gpu_layers > 0 else "cpu"
    if backend not in entry.backends_checked:
        raise Unsupported(
            f"model {entry.name}: backend {backend} is not checked (checked:"
            f" {', '.join(entry.backends_checked)}); pass --allow-unchecked to run it anyway"
        )
    if entry.shift_requires.get("swa_full") and not config.swa_full:
        raise Unsupported(f"model {entry.name}: its cache shifts only with swa_full")


def open_engine(
    model: str | None = None,
    config: EngineConfig | None = None,
    *,
    lock: ModelLock | None = None,
    verify_hash: bool = True,
    allow_unchecked: bool = False,
) -> Engine:
    """Load a locked model: file hash, then vocabulary and template hashes, then the context."""
    lock = lock or load_lock()
    entry = lock.get(model)
    config = config or EngineConfig()
    check_combination(entry, config, allow_unchecked)
    path = locate(entry)
    if verify_hash:
        verify_file(entry, path)
    return Engine(path, entry, config)


def open_unlisted(path: Path, config: EngineConfig | None = None) -> Engine:
    """An explicit escape hatch: a GGUF not in the lock runs, but only under the full policy."""
    if not path.is_file():
        raise ModelNotAllowed(f"no model file at {path}")
    return Engine(path, None, config)
