"""Quality over stream position: per-token losses through the engine for each policy, and controls.

Every policy scores the same tokens: the loss of token t given what that policy's cache holds when
t arrives. `full` runs until its context is full and says where it stopped. `recompute` is the
sliding window with re-computation (the quality reference): every block of `stride` tokens is
scored after freshly encoding the S+W tokens before the block's end, so each scored token sees
between S+W-stride and S+W tokens, all at dense positions from 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sinkd.cachepolicy import CacheFull, CacheSequence, PolicyConfig
from sinkd.cachepolicy.recall_plan import RecallConfig, RecalledSpan, in_any, plan_recall, select
from sinkd.daemon.engine.llama import Engine, EngineConfig
from sinkd.daemon.store.memory import MemoryStore
from sinkd.daemon.store.passages import SessionKey
from sinkd.evaluation.plotting import pyplot
from sinkd.evaluation.textstream import chunk_nll, token_nll

Progress = Callable[[int], None]
EngineFactory = Callable[[EngineConfig], Engine]


@dataclass
class PolicyRun:
    name: str
    nll: np.ndarray  # nll[i]: loss of token i+1 (token 0 is never scored)
    seconds: float
    stopped_at: int | None = None  # tokens scored before the context was full (full only)
    note: str = ""
    receipt: dict[str, Any] = field(default_factory=dict)

    @property
    def perplexity(self) -> float:
        return math.exp(float(self.nll.mean())) if len(self.nll) else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return len(self.nll) / self.seconds if self.seconds else float("nan")


def score_policy(
    engine: Engine,
    tokens: list[int],
    policy: PolicyConfig,
    chunk: int = 64,
    progress: Progress | None = None,
) -> PolicyRun:
    """Stream `tokens` through one sequence under `policy`, scoring every token as it arrives."""
    seq = CacheSequence(policy)
    engine.cells.clear(0)
    losses: list[np.ndarray] = []
    prev: np.ndarray | None = None
    stopped = None
    t0 = time.perf_counter()
    for start in range(0, len(tokens), chunk):
        piece = tokens[start : start + chunk]
        try:
            rows = engine.feed(0, seq, piece, outputs="all")
        except CacheFull:
            stopped = start
            break
        assert rows is not None
        losses.append(chunk_nll(prev, rows, piece))
        prev = rows[-1].copy()
        if progress:
            progress(len(piece))
    seconds = time.perf_counter() - t0
    nll = np.concatenate(losses) if losses else np.zeros(0)
    note = (
        f"stopped at {stopped} tokens: the context holds {policy.budget}"
        if stopped is not None
        else ""
    )
    return PolicyRun(policy.policy.value, nll, seconds, stopped, note, seq.receipt().as_dict())


def score_recall(
    engine: Engine,
    tokens: list[int],
    policy: PolicyConfig,
    recall: RecallConfig,
    every: int = 512,
    query_tokens: int = 48,
    chunk: int = 64,
    progress: Progress | None = None,
    frame: tuple[str, str] = ("", "\n"),
) -> PolicyRun:
    """As `score_policy`, with the daemon's recall in the stream: every evicted token is stored
    (the daemon's MemoryStore), and every `every` tokens a Recall with the last `query_tokens`
    of text as its query decodes the chosen passages (unscored) before the stream goes on. Only
    the stream's own tokens are scored, so the runs with and without recall compare directly."""
    seq = CacheSequence(policy)
    engine.cells.clear(0)
    store = MemoryStore.temporary()
    transcript: list[int] = []  # every token fed, by logical position (recalled copies too)
    spans: list[RecalledSpan] = []
    losses: list[np.ndarray] = []
    prev: np.ndarray | None = None
    evicted_to = policy.sinks
    recalled_tokens = 0
    t0 = time.perf_counter()

    def feed(piece: list[int], outputs: str) -> np.ndarray | None:
        nonlocal evicted_to
        rows = engine.feed(0, seq, piece, outputs=outputs)  # type: ignore[arg-type]
        transcript.extend(piece)
        start = max(seq.state.window_start, policy.sinks)
        if start > evicted_to:
            gone = transcript[evicted_to:start]
            skip = [in_any(evicted_to + i, spans) for i in range(len(gone))]
            store.add_evicted(SessionKey("eval", 0), evicted_to, gone, skip, engine.vocab.piece)
            evicted_to = start
        return rows

    for start in range(0, len(tokens), chunk):
        if start and start % every == 0:
            query = engine.vocab.detokenize(tokens[max(0, start - query_tokens) : start])
            found = store.search(SessionKey("eval", 0), query, 16)
            chosen = select(found, recall, 1)
            if chosen:
                by_id = {
                    p.id: p
                    for p in store.passages(SessionKey("eval", 0), [c.passage_id for c in chosen])
                }
                head = engine.vocab.tokenize_framed(frame[0], []) if frame[0] else []
                tail = engine.vocab.tokenize_framed(frame[1], []) if frame[1] else []
                plan = plan_recall(policy, seq.state, chosen, len(head), len(tail), 0.0)
                spans += plan.spans
                body = [t for c in chosen for t in [*head, *by_id[c.passage_id].tokens, *tail]]
                last = feed(body, "last")
                recalled_tokens += len(body)
                prev = None if last is None else last.copy()
        piece = tokens[start : start + chunk]
        rows = feed(piece, "all")
        assert rows is not None
        losses.append(chunk_nll(prev, rows, piece))
        prev = rows[-1].copy()
        if progress:
            progress(len(piece))
    store.close()
    nll = np.concatenate(losses) if losses else np.zeros(0)
    note = f"recall every {every} tokens: {recalled_tokens} tokens recalled"
    return PolicyRun(
        f"{policy.policy.value}+recall", nll, time.perf_counter() - t0, None, note,
        seq.receipt().as_dict(),
    )  # fmt: skip


def score_recompute(
    engine: Engine, tokens: list[int], window: int, stride: int, progress: Progress | None = None
) -> PolicyRun:
    """Sliding window with re-computation: quadratic, hence the stride."""
    if not 1 <= stride <= window:
        raise ValueError(f"stride must be in 1..{window}, got {stride}")
    losses: list[np.ndarray] = []
    t0 = time.perf_counter()
    end = min(window, len(tokens))
    scored_to = 0
    first = True
    while True:
        start = max(0, end - window)
        seq = CacheSequence(PolicyConfig.named("full", sinks=0, window=window))
        engine.cells.clear(0)
        rows = engine.feed(0, seq, tokens[start:end], outputs="all")
        assert rows is not None
        if first:  # the first window is scored whole (it is the full cache)
            losses.append(token_nll(rows[:-1], tokens[start + 1 : end]))
            scored = end - start
            first = False
        else:
            k = end - scored_to  # the tokens new since the last block, each scored once
            losses.append(token_nll(rows[-k - 1 : -1], tokens[end - k : end]))
            scored = k
        scored_to = end
        if progress:
            progress(scored)
        if end >= len(tokens):
            break
        end = min(end + stride, len(tokens))
    return PolicyRun(
        "recompute", np.concatenate(losses), time.perf_counter() - t0, note=f"stride {stride}"
    )


def buckets(nll: np.ndarray, size: int) -> list[dict[str, float]]:
    """Perplexity per bucket of stream positions (position = index of the predicted token)."""
    out = []
    for start in range(0, len(nll), size):
        part = nll[start : start + size]
        out.append(
            {"start": start + 1, "end": start + 1 + len(part), "ppl": math.exp(float(part.mean()))}
        )
    return out


def run_ppl(
    factory: EngineFactory,
    tokens: list[int],
    policies: list[str],
    sinks: int,
    window: int,
    evict: int = 1,
    compact: int = 0,
    stride: int = 64,
    full_context: int | None = None,
    progress: Callable[[str, int], Progress] | None = None,
) -> list[PolicyRun]:
    """One run per policy on the same tokens, each on its own context sized to its budget."""
    runs = []
    for name in policies:
        report = progress(name, len(tokens)) if progress else None
        if name == "recompute":
            budget = sinks + window
            with factory(
                EngineConfig(n_ctx_seq=budget, n_seq_max=1, n_batch=max(256, budget))
            ) as engine:
                runs.append(score_recompute(engine, tokens, budget, stride, report))
            continue
        if name == "full":
            with factory(
                EngineConfig(n_ctx_seq=full_context or len(tokens), n_seq_max=1)
            ) as engine:
                capacity = min(full_context or len(tokens), engine.n_ctx_seq)
                policy = PolicyConfig.named("full", sinks=0, window=capacity)
                runs.append(score_policy(engine, tokens, policy, progress=report))
            continue
        policy = PolicyConfig.named(
            name,
            sinks=sinks,
            window=window,
            evict_chunk=evict,
            compact_interval=compact if name != "sink-noshift" else 0,
        )
        with factory(EngineConfig(n_ctx_seq=policy.budget, n_seq_max=1)) as engine:
            engine.check_policy(policy)
            runs.append(score_policy(engine, tokens, policy, progress=report))
    return runs


def summary(run: PolicyRun, bucket: int) -> dict[str, Any]:
    b = buckets(run.nll, bucket)
    return {
        "policy": run.name,
        "scored_tokens": len(run.nll),
        "ppl": run.perplexity,
        "ppl_last_bucket": b[-1]["ppl"] if b else float("nan"),
        "tokens_per_s": run.tokens_per_s,
        "seconds": run.seconds,
        "stopped_at": run.stopped_at,
        "note": run.note,
        "buckets": b,
        "receipt": run.receipt,
    }


def plot(results: dict[str, Any], path: str, title: str) -> None:
    """x: stream position; y: perplexity (log); one line per policy; budget and trained context marked."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    for run in results["runs"]:
        xs = [(b["start"] + b["end"]) / 2 for b in run["buckets"]]
        ax.plot(
            xs,
            [b["ppl"] for b in run["buckets"]],
            marker=".",
            label=f"{run['policy']} ({run['ppl']:.1f})",
        )
    budget = results["sinks"] + results["window"]
    ax.axvline(budget, color="grey", linestyle=":", label=f"budget S+W={budget}")
    if results.get("n_ctx_train") and results["n_ctx_train"] <= results["tokens"]:
        ax.axvline(
            results["n_ctx_train"],
            color="black",
            linestyle="--",
            label=f"trained context {results['n_ctx_train']}",
        )
    ax.set_yscale("log")
    ax.set_xlabel("stream position (tokens)")
    ax.set_ylabel(f"perplexity per {results['bucket']}-token bucket")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
