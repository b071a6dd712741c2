"""`sinkd models qualify | add`: whether a GGUF can stream with sinks here, measured on this backend.

The checks are the engine tests' claims, run on the candidate file: first what its header says
(whole file, an architecture with rotary positions and an attention cache, a chat template, room
under its sliding window), with nothing loaded; then, loaded, that its cache can shift, that `sink`
is bit-identical to `full` until the first eviction, that a shifted window stays within twice the
floor a pure translation of positions costs (mean KL, measured in the same run), and that on a
shipped text sinks beat the window-only control and stay near the full cache after the budget. A
model that passes gets an entry equal in form to the shipped ones, with the figures measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from sinkd.cachepolicy import CacheSequence, PolicyConfig
from sinkd.daemon.engine.compat import check_policy
from sinkd.daemon.engine.llama import Engine, EngineConfig, builtin_templates
from sinkd.daemon.models.gguf import GGUFHeader, read_header
from sinkd.daemon.models.ollama import OllamaModel, find
from sinkd.daemon.models.registry import ModelEntry, sha256_file
from sinkd.errors import InvalidInput, SinkdError
from sinkd.evaluation.ppl import score_policy

# Architectures whose positions are not rotary (learned, ALiBi, relative bias): a shift cannot
# re-assign them. Recurrent and hybrid ones keep a state, not a cache of positions to evict from.
ROPELESS = {"gpt2", "bloom", "mpt", "starcoder", "jais", "refact", "bert", "t5", "t5encoder"}
RECURRENT = {"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"}
HYBRID = {"jamba", "falcon-h1", "granitehybrid", "lfm2", "nemotron_h", "plamo2", "qwen3next"}
# a built-in llama.cpp template for files that carry none, by architecture
TEMPLATE_FOR = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma"}
DEFAULT_SINKS = 4
DEFAULT_WINDOW = 252
MIN_WINDOW = 64  # below this a window holds too little of a conversation to be worth streaming
GENERIC_SAMPLING = {
    "temperature": 0.7,
    "top_k": 40,
    "top_p": 0.9,
    "min_p": 0.05,
    "repeat_penalty": 1.1,
    "repeat_last_n": 64,
}
NEAR_FULL = 1.25  # sink's perplexity after the budget, at most this times full's
QUALIFY_TEXT = "data/genesis.txt"


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    measured: str
    needed: str


@dataclass
class Qualification:
    path: Path
    name: str
    checks: list[Check] = field(default_factory=list)
    entry: ModelEntry | None = None
    notes: list[str] = field(default_factory=list)

    def check(self, name: str, passed: bool, measured: str, needed: str) -> bool:
        """Record a check; its result, so that checks chain with `and` and stop at a failure."""
        self.checks.append(Check(name, passed, measured, needed))
        return passed

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def failed(self) -> Check | None:
        return next((c for c in self.checks if not c.passed), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "name": self.name,
            "passed": self.passed,
            "checks": [c.__dict__ for c in self.checks],
            "notes": self.notes,
            "entry": self.entry.model_dump(exclude={"origin"}) if self.entry else None,
        }


def find_ollama(reference: str) -> OllamaModel:
    """The GGUF blob of an Ollama model, digest checked (the CLI reaches the store through here)."""
    return find(reference)


def default_name(path: Path) -> str:
    stem = path.name.removesuffix(".gguf").lower()
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in stem) or "model"


def qualify(
    path: Path,
    name: str | None = None,
    template: str | None = None,
    stream_tokens: int = 2048,
    threads: int | None = None,
    progress: Callable[[str], None] = lambda s: None,
) -> Qualification:
    """Run every check that applies, stopping at the first failure (its number is in the check)."""
    q = Qualification(path, name or default_name(path))
    header = read_header(path)
    if not _header_checks(q, header, template):
        return q
    progress("header checked; hashing the file")
    sha = sha256_file(path)
    template_name = (
        ""
        if header.metadata.get("tokenizer.chat_template")
        else template or TEMPLATE_FOR.get(header.architecture, "")
    )
    if template_name and not template:
        q.notes.append(
            f"the file has no chat template: proposed llama.cpp's built-in {template_name!r} for"
            f" {header.architecture} (pass --template to choose another)"
        )
    n_swa = int(header.arch("attention.sliding_window", 0) or 0)
    n_ctx_train = int(header.arch("context_length", 0) or 0)
    sinks = DEFAULT_SINKS
    window = min(DEFAULT_WINDOW, (n_swa or 10**9) - sinks, max(n_ctx_train - sinks, 1))
    policy = PolicyConfig.named("sink", sinks=sinks, window=window)
    kw: dict[str, Any] = {} if threads is None else {"n_threads": threads}
    progress("loading: shift, sink == full, shifted window vs the translation floor")
    small = EngineConfig(n_ctx_seq=256, n_seq_max=5, n_batch=64, swa_full=True, **kw)
    with Engine(path, None, small) as engine:
        if not _engine_checks(q, engine, policy):
            return q
        facts = _facts(engine)
    progress(f"perplexity on {stream_tokens} tokens of a shipped text: sink, window, full")
    big = EngineConfig(n_ctx_seq=stream_tokens + 64, n_seq_max=1, n_batch=256, swa_full=True, **kw)
    with Engine(path, None, big) as engine:
        figures = _stream_check(q, engine, policy, stream_tokens)
    if not q.passed:
        return q
    q.entry = ModelEntry(
        name=q.name,
        file=path.name,
        sha256=sha,
        size=path.stat().st_size,
        path=str(path.resolve()),
        architecture=header.architecture,
        n_ctx_train=facts["n_ctx_train"],
        positional="rope" + (f" (local layers: sliding window {n_swa})" if n_swa else ""),
        n_layer=facts["n_layer"],
        n_head_kv=facts["n_head_kv"],
        head_dim=facts["head_dim"],
        adds_bos=facts["adds_bos"],
        quantization=_quantization(header),
        tokenizer_sha256=facts["tokenizer_sha256"],
        template_sha256=facts["template_sha256"],
        template_name=template_name or "",
        can_shift=True,
        shift_requires={"swa_full": True, "max_budget": n_swa} if n_swa else {},
        kv_types_checked=(small.kv_type,),
        backends_checked=("gpu" if small.n_gpu_layers > 0 else "cpu",),
        default_sinks=sinks,
        default_window=window,
        notes="Qualified by sinkd models add. " + " ".join(q.notes),
        origin="user",
        qualification={"checks": [c.__dict__ for c in q.checks], **figures},
        sampling=_sampling(header),
    )
    return q


def _header_checks(q: Qualification, h: GGUFHeader, template: str | None) -> bool:
    """What the file says, before llama.cpp reads it; False at the first failure."""
    arch = h.architecture
    keys = list(h.metadata)
    check = q.check
    n_swa = int(h.arch("attention.sliding_window", 0) or 0)
    has_template = bool(h.metadata.get("tokenizer.chat_template"))
    known = builtin_templates()
    proposal = template or TEMPLATE_FOR.get(arch)
    return (
        check(
            "whole file",
            not h.truncated,
            f"{h.file_size} of {h.data_end} bytes",
            "every tensor's bytes present",
        )
        and check("architecture", bool(arch), arch or "none", "general.architecture set")
        and check(
            "attention cache (not recurrent or hybrid)",
            arch not in RECURRENT | HYBRID
            and not any(k.startswith((f"{arch}.ssm.", f"{arch}.wkv.")) for k in keys),
            arch,
            "a transformer whose cache holds positions",
        )
        and check(
            "rotary positions",
            arch not in ROPELESS,
            arch,
            "RoPE (a shift re-rotates keys; learned or ALiBi positions cannot move)",
        )
        and check(
            "chat template",
            has_template or (proposal is not None and proposal in known),
            "in the file"
            if has_template
            else (f"built-in {proposal!r}" if proposal else "none (pass --template NAME)"),
            "the file's, or one of llama.cpp's built-in templates by name",
        )
        and check(
            "room under the sliding window",
            not n_swa or n_swa - DEFAULT_SINKS >= MIN_WINDOW,
            f"sliding window {n_swa}" if n_swa else "no sliding-window layers",
            f"S+W within the window, W >= {MIN_WINDOW}",
        )
    )


def _engine_checks(q: Qualification, engine: Engine, policy: PolicyConfig) -> bool:
    check = q.check
    if not (
        check(
            "llama.cpp: rotary, attention cache",
            engine.rope_type != -1 and not engine.is_recurrent and not engine.is_hybrid,
            f"rope type {engine.rope_type}, recurrent {engine.is_recurrent},"
            f" hybrid {engine.is_hybrid}",
            "rope type set, neither recurrent nor hybrid",
        )
        and check(
            "llama_memory_can_shift",
            engine.can_shift,
            str(engine.can_shift),
            "true (with swa_full where the model has sliding-window layers)",
        )
    ):
        return False
    try:
        check_policy(engine, policy, listed=False)
        fits, why = True, f"S={policy.sinks} W={policy.window}"
    except SinkdError as e:
        fits, why = False, str(e)
    if not check(
        "S+W within the trained context and the sliding window",
        fits,
        why,
        f"positions below {engine.n_ctx_train}" + (f" and {engine.n_swa}" if engine.n_swa else ""),
    ):
        return False
    same = _sink_equals_full(engine)
    if not check(
        "sink == full before the first eviction", same, "bit-identical" if same else "differ", "="
    ):
        return False
    shift, floor = _shift_vs_floor(engine)
    return check(
        "shifted window vs unshifted",
        floor > 0 and shift <= 2 * floor,
        f"mean KL {shift:.4f} nats, translation floor {floor:.4f}",
        "KL <= 2 x floor",
    )


def _prompt(engine: Engine, n: int) -> list[int]:
    text = (resources.files("sinkd.evaluation") / QUALIFY_TEXT).read_text()
    tokens = engine.vocab.tokenize(text, add_bos=True)
    if len(tokens) < n:
        raise InvalidInput(f"the shipped text holds {len(tokens)} tokens, {n} asked")
    return tokens[:n]


def _sink_equals_full(engine: Engine) -> bool:
    tokens = _prompt(engine, 60)
    full = CacheSequence(PolicyConfig.named("full", sinks=0, window=128))
    sink = CacheSequence(PolicyConfig.named("sink", sinks=4, window=60))
    engine.cells.clear(0)
    engine.cells.clear(1)
    a = engine.feed(0, full, tokens[:40])
    b = engine.feed(1, sink, tokens[:40])
    same = a is not None and b is not None and bool(np.array_equal(a, b))
    for t in tokens[40:]:
        a, b = engine.feed(0, full, [t]), engine.feed(1, sink, [t])
        same = same and a is not None and b is not None and bool(np.array_equal(a, b))
    engine.cells.clear(0)
    engine.cells.clear(1)
    return same and sink.receipt().evictions == 0


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    lp = p.astype(np.float64) - p.max()
    lp -= math.log(float(np.exp(lp).sum()))
    lq = q.astype(np.float64) - q.max()
    lq -= math.log(float(np.exp(lq).sum()))
    return float((np.exp(lp) * (lp - lq)).sum())


def _shift_vs_floor(engine: Engine) -> tuple[float, float]:
    """Mean KL of a shifted window against the unshifted one, and of a pure translation of every
    position against it (the floor: relative positions are equal, so only numerics differ)."""
    tokens = _prompt(engine, 230)
    runs = {
        "shift": (CacheSequence(PolicyConfig.named("window", window=64)), 0),
        "noshift": (CacheSequence(PolicyConfig.named("sink-noshift", sinks=0, window=64)), 0),
        "translated": (CacheSequence(PolicyConfig.named("sink-noshift", sinks=0, window=64)), 37),
    }
    for i, (cseq, off) in enumerate(runs.values()):
        engine.cells.clear(i)
        engine.feed(i, cseq, tokens[:64], pos_offset=off)
    kls: dict[str, list[float]] = {"shift": [], "translated": []}
    for t in tokens[64:]:
        out = {
            name: engine.feed(i, cseq, [t], pos_offset=off)
            for i, (name, (cseq, off)) in enumerate(runs.items())
        }
        for name in kls:
            kls[name].append(_kl(out[name], out["noshift"]))  # type: ignore[arg-type]
    for i in range(len(runs)):
        engine.cells.clear(i)
    return float(np.mean(kls["shift"])), float(np.mean(kls["translated"]))


def _stream_check(
    q: Qualification, engine: Engine, policy: PolicyConfig, n: int
) -> dict[str, float]:
    tokens = _prompt(engine, n)
    budget = policy.budget
    if n <= budget + 64:
        raise InvalidInput(f"a stream of {n} tokens does not pass the budget of {budget}")
    runs = {
        "sink": policy,
        "window": PolicyConfig.named("window", window=budget),
        "full": PolicyConfig.named("full", sinks=0, window=n),
    }
    after = {}
    for name, p in runs.items():
        run = score_policy(engine, tokens, p)
        after[name] = math.exp(float(run.nll[budget:].mean()))
    figures = {
        "stream_tokens": n,
        "ppl_after_budget_sink": round(after["sink"], 4),
        "ppl_after_budget_window": round(after["window"], 4),
        "ppl_after_budget_full": round(after["full"], 4),
        "sink_over_full": round(after["sink"] / after["full"], 4),
        "window_over_sink": round(after["window"] / after["sink"], 4),
    }
    q.check(
        "sinks beat the window-only control",
        after["sink"] < after["window"],
        f"perplexity after the budget: sink {after['sink']:.2f}, window {after['window']:.2f}",
        "sink < window",
    )
    q.check(
        "sinks stay near the full cache",
        after["sink"] <= NEAR_FULL * after["full"],
        f"sink / full = {after['sink'] / after['full']:.3f}",
        f"<= {NEAR_FULL}",
    )
    return figures


def _facts(engine: Engine) -> dict[str, Any]:
    return {
        "n_ctx_train": engine.n_ctx_train,
        "n_layer": engine.n_layer,
        "n_head_kv": engine.n_head_kv,
        "head_dim": engine.head_dim,
        "adds_bos": engine.adds_bos,
        "tokenizer_sha256": engine.tokenizer_sha256,
        "template_sha256": engine.template_sha256,
    }


def _sampling(h: GGUFHeader) -> dict[str, Any]:
    """The file's own recommended sampling (general.sampling.*) over a generic default."""
    out: dict[str, Any] = dict(GENERIC_SAMPLING)
    for key, field_name in (("temp", "temperature"), ("top_k", "top_k"), ("top_p", "top_p"),
                            ("min_p", "min_p"), ("penalty_repeat", "repeat_penalty"),
                            ("penalty_last_n", "repeat_last_n")):  # fmt: skip
        value = h.metadata.get(f"general.sampling.{key}")
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[field_name] = value
    return out


def _quantization(h: GGUFHeader) -> str:
    from gguf import LlamaFileType

    ft = h.metadata.get("general.file_type")
    try:
        return LlamaFileType(int(ft)).name.removeprefix("MOSTLY_") if ft is not None else "unknown"
    except ValueError:
        return f"file type {ft}"


def fingerprint(entry: ModelEntry) -> dict[str, Any]:
    """The facts a qualification must reproduce for a shipped model (figures aside)."""
    keys = (
        "sha256",
        "size",
        "architecture",
        "n_ctx_train",
        "n_layer",
        "n_head_kv",
        "head_dim",
        "adds_bos",
        "quantization",
        "tokenizer_sha256",
        "template_sha256",
        "template_name",
        "can_shift",
        "shift_requires",
        "default_sinks",
        "default_window",
    )
    return {k: getattr(entry, k) for k in keys}
