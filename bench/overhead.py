"""2. A session decoding through the daemon (gRPC, scheduler, policy) against a bare llama-cpp-python
loop on the same model, threads and budget, in the same run; and the same daemon with the journal's
fsync back on the engine thread (what the syncer thread saves). The bare loop runs in a child
process: beside the daemon's engine thread in this one, libgomp would throttle both (`in_child`).

    python bench/overhead.py [--tokens 200] [--rounds 3]   -> bench/results/overhead.json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import llama_cpp as llama
from common import daemon_settings, default_threads, in_child, table, write

from sinkd.daemon.engine.models import load_lock, model_path
from sinkd.daemon.rpc.client import Client
from sinkd.daemon.rpc.server import Daemon
from sinkd.evaluation import SAMPLE_TEXT as TEXT
from sinkd.proto.v1 import sinkd_pb2 as pb


def bare(prompt: list[int], tokens: int, threads: int) -> float:
    """The minimal loop: one context, one sequence, greedy sampler, one token per llama_decode."""
    model = llama.llama_model_load_from_file(
        str(model_path(load_lock().get(None))).encode(), llama.llama_model_default_params()
    )
    cp = llama.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 256, 256, 256, 1
    cp.n_threads = cp.n_threads_batch = threads
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
    t0 = time.perf_counter()
    for i in range(tokens):
        decode([tok], len(prompt) + i)
        tok = llama.llama_sampler_sample(smpl, ctx, -1)
    seconds = time.perf_counter() - t0
    llama.llama_batch_free(batch)
    llama.llama_sampler_free(smpl)
    llama.llama_free(ctx)
    llama.llama_model_free(model)
    return tokens / seconds


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    threads = default_threads()  # the daemon's engine, alone here, takes as many

    d = Daemon(daemon_settings(Path(tempfile.mkdtemp()), max_sessions=1, n_ctx_seq=256))
    d.start()
    d.wait_ready(60)
    client = Client(d.addresses[0])
    prompt = d.service.engine.tokenize(TEXT)[:40]
    gate = d.service.scheduler.gate
    rows, results = [], []
    for r in range(a.rounds):  # interleaved: the machine's noise hits all alike
        b = in_child(bare, prompt, a.tokens, threads)
        s = daemon_run(client, prompt, a.tokens)
        gate._defer = False  # the journal's fsync on the engine thread, as before the syncer
        inline = daemon_run(client, prompt, a.tokens)
        gate._defer = True
        results.append({"bare_tok_s": b, "daemon_tok_s": s, "ratio": s / b,
                         "fsync_inline_tok_s": inline, "fsync_inline_ratio": inline / b})  # fmt: skip
        rows.append([r + 1, b, s, s / b, inline / b])
    d.stop()
    ratios = sorted(x["ratio"] for x in results)
    inline_ratios = sorted(x["fsync_inline_ratio"] for x in results)
    rows.append(["median", "", "", ratios[len(ratios) // 2], inline_ratios[len(ratios) // 2]])
    table(
        f"decode tokens/s, {a.tokens} tokens after a 40-token prompt, {threads} threads (durable"
        " daemon, sync=full)",
        ["round", "bare loop", "daemon", "daemon/bare", "fsync on the engine thread/bare"],
        rows,
    )
    write(
        "overhead",
        {
            "tokens": a.tokens,
            "threads": threads,
            "rounds": results,
            "median_ratio": ratios[len(ratios) // 2],
            "median_ratio_fsync_inline": inline_ratios[len(ratios) // 2],
        },
    )


if __name__ == "__main__":
    main()
