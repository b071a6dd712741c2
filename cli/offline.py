"""The explicit offline backend of the CLI: the commands that run the model in this process
without sessions or a daemon (`receipt`, `stream`, `eval ppl`, `models verify`) call these, and the
CLI itself never touches the engine."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from sinkd.cachepolicy import CacheSequence, PolicyConfig
from sinkd.daemon.engine.llama import Engine, EngineConfig
from sinkd.daemon.engine.loading import open_engine, open_unlisted
from sinkd.daemon.models.registry import ModelEntry, locate, verify_file
from sinkd.daemon.validation import validated
from sinkd.evaluation.ppl import PolicyRun, run_ppl
from sinkd.evaluation.textstream import ChunkReport, stream_text


def engine_config(budget: int, threads: int | None = None, kv_type: str = "f16") -> EngineConfig:
    """One sequence of `budget` cells (validated: a bad KV type names the field)."""
    kw: dict[str, Any] = {"n_ctx_seq": budget, "n_seq_max": 1, "kv_type": kv_type}
    if threads is not None:
        kw["n_threads"] = threads
    return validated(EngineConfig, **kw)


def tensor_receipt(entry: ModelEntry, policy: PolicyConfig, kv_type: str) -> dict[str, Any]:
    """What one session's cache costs, by the tensor-shape formula and as llama.cpp allocated it."""
    with open_engine(entry.name, engine_config(policy.budget, None, kv_type)) as engine:
        engine.check_policy(policy)
        payload = policy.budget * engine.kv_bytes_per_token
        return {
            "model": entry.name,
            "sha256": entry.sha256,
            "layers": engine.n_layer,
            "kv_heads": engine.n_head_kv,
            "head_dim": engine.head_dim,
            "kv_dtype": kv_type,
            "bytes_per_token": engine.kv_bytes_per_token,
            "sinks": policy.sinks,
            "window": policy.window,
            "retained": policy.budget,
            "payload_bytes_per_session": payload,
            "formula": "retained x layers x kv_heads x head_dim x 2 (K,V) x bytes per element",
            "allocated_cells_per_session": engine.n_ctx_seq,
            "allocated_kv_mib_per_session": round(
                sum(mib for mib, _ in engine.kv_allocations) / engine.config.n_seq_max, 2
            ),
            "allocations": [{"mib": mib, "cells": cells} for mib, cells in engine.kv_allocations],
        }


def stream(
    model: str | None,
    model_file: Path | None,
    policy: PolicyConfig,
    texts: Iterable[str],
    chunk_tokens: int,
    threads: int | None,
    kv_type: str,
) -> Iterator[tuple[ChunkReport, CacheSequence]]:
    """Feed text through a policy on a locked model (or an unlisted GGUF: full policy only)."""
    config = engine_config(policy.budget, threads, kv_type)
    opened = open_unlisted(model_file, config) if model_file else open_engine(model, config)
    with opened as engine:
        yield from stream_text(engine, policy, texts, chunk_tokens=chunk_tokens)


def perplexity(
    entry: ModelEntry,
    raw_text: str,
    tokens: int,
    names: list[str],
    policy: PolicyConfig,
    stride: int,
    progress: Callable[[str, int], Callable[[int], None]] | None,
) -> tuple[list[int], int, list[PolicyRun]]:
    """Tokens of the text, the model's trained context, and one run per policy on them."""

    def factory(config: EngineConfig) -> Engine:
        return open_engine(entry.name, config)

    with factory(engine_config(256)) as probe:
        ids = probe.vocab.tokenize(raw_text, add_bos=True)[:tokens]
        n_ctx_train = probe.n_ctx_train
    runs = run_ppl(
        factory, ids, names, policy.sinks, policy.window, policy.evict_chunk,
        policy.compact_interval, stride, min(n_ctx_train, len(ids)), progress,
    )  # fmt: skip
    return ids, n_ctx_train, runs


def verify(entry: ModelEntry) -> dict[str, Any]:
    """The file's size and sha256, then its vocabulary and template hashes, loaded."""
    path = locate(entry)
    verify_file(entry, path)
    with contextlib.closing(Engine(path, entry, engine_config(256))) as engine:
        return {
            "name": entry.name,
            "path": str(path),
            "sha256": entry.sha256,
            "tokenizer_sha256": engine.tokenizer_sha256,
            "template_sha256": engine.template_sha256,
            "can_shift": engine.can_shift,
            "ok": True,
        }
