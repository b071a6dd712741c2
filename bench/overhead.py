"""2. One session decoding through the daemon against a bare llama-cpp-python loop on the same model,
threads and budget, in the same run, layer by layer: the daemon's service called in process (no
gRPC, no journal), the same over gRPC, and over gRPC with the journal (durable, sync=full: the
default and the headline ratio). The bare loop runs attention as the engine does (at these 256
cells, flash attention: the engine's NOTE; the other kernel is timed beside it), in a child
process: beside the daemon's engine thread in this one, libgomp would throttle both
(`common.in_child`); the daemons run one at a time.

    python bench/overhead.py [--tokens 200] [--rounds 5]   -> bench/results/overhead.json
    python bench/overhead.py --threads 1  -> bench/results/overhead_threads1.json
    python bench/overhead.py --threads 1 --sync normal -> .../overhead_threads1_sync_normal.json

`--threads N` fixes the engine's and the bare loop's thread count (SINKD_N_THREADS). With one
decoding thread on this 2-core machine the other core is free for the transport and the journal:
the run that parts what the daemon's threads cost the decode from what its engine thread adds.
`--sync normal` journals without an fsync per commit (survives a crash, not a power loss): what the
fsync costs, apart from the journal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import llama_cpp as llama
from common import DecodeClock, daemon_settings, default_threads, in_child, table, write

from sinkd.daemon.config import THREADS_ENV
from sinkd.daemon.engine.llama import EngineConfig, cells_per_stream, flash_attention_exact
from sinkd.daemon.models.registry import load_lock, model_path
from sinkd.daemon.node import Daemon
from sinkd.daemon.rpc.client import Client
from sinkd.daemon.runtime.api import GenerationOptions, PolicyRequest, TokenEvent
from sinkd.daemon.runtime.sessions import Principal
from sinkd.evaluation import SAMPLE_TEXT as TEXT
from sinkd.proto.v1 import sinkd_pb2 as pb

DecodeClock.install()  # here and in the bare loop's child (it imports this module)
FLASH = flash_attention_exact(cells_per_stream(256, 1), EngineConfig().n_gpu_layers)  # the engine's


def bare(
    prompt: list[int], tokens: int, threads: int, flash: bool
) -> tuple[float, dict[str, float]]:
    """The minimal loop: one context, one sequence, greedy sampler, one token per llama_decode;
    with or without flash attention (the daemon's engine runs it at 256 cells)."""
    mp = llama.llama_model_default_params()
    mp.use_extra_bufts = False  # as the engine loads it: no repacked weights (on this machine's
    # AMX build, a repacked model segfaults in llama_decode; the engine never repacks: its NOTE)
    model = llama.llama_model_load_from_file(str(model_path(load_lock().get(None))).encode(), mp)
    cp = llama.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 256, 256, 256, 1
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = (
        llama.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    ctx = llama.llama_init_from_model(model, cp)
    smpl = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
    llama.llama_sampler_chain_add(smpl, llama.llama_sampler_init_greedy())
    batch = llama.llama_batch_init(256, 0, 1)

    def decode(toks: list[int], pos: int) -> None:
        batch.n_tokens = len(toks)
        for i, t in enumerate(toks):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(toks) - 1
        assert llama.llama_decode(ctx, batch) == 0

    decode(prompt, 0)
    tok = llama.llama_sampler_sample(smpl, ctx, -1)
    mark = DecodeClock.mark()
    t0 = time.perf_counter()
    for i in range(tokens):
        decode([tok], len(prompt) + i)
        tok = llama.llama_sampler_sample(smpl, ctx, -1)
    seconds = time.perf_counter() - t0
    llama.llama_batch_free(batch)
    llama.llama_sampler_free(smpl)
    llama.llama_free(ctx)
    llama.llama_model_free(model)
    return tokens / seconds, DecodeClock.since(mark, STEADY(tokens))


def STEADY(tokens: int) -> int:
    """The decodes a layer's decode and gap times are taken from: the last three quarters."""
    return tokens * 3 // 4


def daemon_run(client: Client, prompt: list[int], tokens: int) -> float:
    md: list[tuple[str, str]] = []  # the daemon has no tenants: its socket's user
    h = client.s.Create(
        pb.CreateSessionRequest(policy=pb.Policy(name="sink", sinks=4, window=252)), metadata=md
    ).handle
    client.s.Append(pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=prompt)), metadata=md)
    stamps = [
        time.perf_counter()
        for ev in client.s.Generate(
            pb.GenerateRequest(handle=h, max_tokens=tokens + 1), metadata=md
        )
        if ev.HasField("token")
    ]
    client.s.Close(pb.HandleRequest(handle=h), metadata=md)
    return tokens / (stamps[-1] - stamps[0])  # from the first token on: decode steps only


def service_run(svc: Any, prompt: list[int], tokens: int) -> float:
    """The same session through the daemon's service in process: its scheduler, no gRPC."""
    me = Principal("local")
    h = svc.create(me, PolicyRequest("sink", sinks=4, window=252), None).handle
    svc.append(me, h, None, prompt)
    stamps = [time.perf_counter() for e in svc.generate(me, h, GenerationOptions(tokens + 1))
              if isinstance(e, TokenEvent)]  # fmt: skip
    svc.close(me, h)
    return tokens / (stamps[-1] - stamps[0])


def daemon_round(
    durable: bool, prompt: list[int], tokens: int, sync: str = "full"
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """One daemon (durable or not), started for the round and stopped after it: tokens/s by layer,
    and the layer's median decode and gap between decodes (ms)."""
    d = Daemon(
        daemon_settings(
            Path(tempfile.mkdtemp()),
            max_sessions=1,
            n_ctx_seq=256,
            durable=durable,
            sync=sync,
            speculative="off",  # a plain token, as the bare loop decodes it
        )
    )
    d.start()
    d.wait_ready(60)
    try:
        mark = DecodeClock.mark()
        out = {"grpc": daemon_run(Client(d.addresses[0]), prompt, tokens)}
        clocks = {"grpc": DecodeClock.since(mark, STEADY(tokens))}
        if not durable:
            mark = DecodeClock.mark()
            out["service"] = service_run(d.service, prompt, tokens)
            clocks["service"] = DecodeClock.since(mark, STEADY(tokens))
        return out, clocks
    finally:
        d.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="fixed, for the engine and bare loop")
    p.add_argument(
        "--sync", choices=("full", "normal"), default="full", help="the durable daemon's"
    )
    a = p.parse_args()
    if a.threads is not None:
        if a.threads < 1:
            p.error("--threads must be at least 1")
        os.environ[THREADS_ENV] = str(a.threads)  # the daemons here, and the children spawned
    threads = default_threads()  # the daemon's engine, alone here, takes as many
    prompt = in_child(sample_prompt, 40)
    layers = ["service", "grpc", "grpc_durable"]
    rows, results = [], []
    for r in range(a.rounds):  # interleaved: the machine's noise hits all alike
        b, bare_clock = in_child(bare, prompt, a.tokens, threads, FLASH)  # as the engine runs
        other, _ = in_child(bare, prompt, a.tokens, threads, not FLASH)
        (plain, plain_clock) = daemon_round(False, prompt, a.tokens)
        (durable, durable_clock) = daemon_round(True, prompt, a.tokens, a.sync)
        tok_s = {
            "service": plain["service"],
            "grpc": plain["grpc"],
            "grpc_durable": durable["grpc"],
        }
        clocks = {"bare": bare_clock, "service": plain_clock["service"],
                  "grpc": plain_clock["grpc"], "grpc_durable": durable_clock["grpc"]}  # fmt: skip
        results.append({"bare_tok_s": b, **{f"{k}_tok_s": v for k, v in tok_s.items()},
                        **{f"{k}_ratio": v / b for k, v in tok_s.items()},
                        "ratio": tok_s["grpc_durable"] / b, "decode_and_gap_ms": clocks,
                        "bare_other_kernel_tok_s": other})  # fmt: skip
        rows.append([r + 1, b, *(tok_s[k] for k in layers), *(tok_s[k] / b for k in layers)])
    medians = {k: statistics.median(x[f"{k}_ratio"] for x in results) for k in layers}
    rows.append(["median", "", "", "", "", *(medians[k] for k in layers)])
    table(
        f"decode tokens/s, {a.tokens} tokens after a 40-token prompt, {threads} threads: bare loop,"
        f" the daemon's service in process, over gRPC, over gRPC durable (sync={a.sync})",
        ["round", "bare", "service", "gRPC", "gRPC durable", "service/bare", "gRPC/bare",
         "durable/bare"],
        rows,
    )  # fmt: skip
    timing = {
        k: {f: statistics.median(x["decode_and_gap_ms"][k][f] for x in results)
            for f in ("decode_ms", "gap_ms")}
        for k in ["bare", *layers]
    }  # fmt: skip
    table(
        "where a token's time goes (medians over the rounds, ms): llama_decode, and the gap between"
        " two decodes on the decoding thread (sampling, bookkeeping, the daemon's Python)",
        ["layer", "decode", "gap", "decode + gap"],
        [[k, t["decode_ms"], t["gap_ms"], t["decode_ms"] + t["gap_ms"]] for k, t in timing.items()],
    )
    other_ratio = statistics.median(x["bare_other_kernel_tok_s"] / x["bare_tok_s"] for x in results)
    print(f"flash attention in the engine and the bare loop: {FLASH}; the bare loop with the other"
          f" kernel / with the engine's: {other_ratio:.3f}")  # fmt: skip
    name = "overhead" if a.threads is None else f"overhead_threads{a.threads}"
    write(
        name if a.sync == "full" else f"{name}_sync_{a.sync}",
        {
            "sync": a.sync,
            "tokens": a.tokens,
            "threads": threads,
            "rounds": results,
            "median_ratio": medians["grpc_durable"],
            "median_ratio_by_layer": medians,
            "median_decode_and_gap_ms": timing,
            "flash_attn": FLASH,
            "bare_other_kernel_over_bare": other_ratio,
        },
    )


def sample_prompt(n: int) -> list[int]:
    """The first n tokens of the sample text (tokenized in a child: an engine opened here would
    keep an OpenMP team beside the daemons')."""
    from sinkd.daemon.engine.loading import open_engine

    with open_engine(None, EngineConfig(n_ctx_seq=256, n_seq_max=1)) as engine:
        return engine.vocab.tokenize(TEXT)[:n]


if __name__ == "__main__":
    main()
