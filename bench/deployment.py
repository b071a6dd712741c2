"""What HAProxy in front of sinkd nodes costs, and how long a drain takes.

    python bench/deployment.py [--requests 400] [--tokens 64] [--rounds 6] [--sessions 4,8,16]
        -> bench/results/deployment.json

Three `sinkd serve` nodes and one HAProxy (Debian's 2.6), as `sinkd nodes init` writes them, on
this machine's loopback. Every comparison alternates the same call sent to a node directly and
through the proxy, in the same run:

- per request: an authenticated call that does not touch the engine (HTTP `GET /v1/models`,
  gRPC `List`), each over one kept-alive connection: latency p50/p99 and the difference;
- per streamed token: the same greedy chat turn (a fresh conversation each time, so the same
  tokens) streamed over HTTP (`/v1/chat/completions`, SSE) and gRPC (`Chat`): the gaps between
  tokens p50/p99, the time to the first token, and HAProxy's own CPU per token (/proc);
- drain: S gRPC sessions of ~300 tokens each on one node, `sinkd nodes drain --no-stop` to the
  node the ring picks for their tenant (the tenant moves whole: one archive of its S sessions),
  then `sinkd nodes join` (which moves it back). `--drains-only` runs this part alone.

On two cores the three nodes and the proxy share the CPU: what this shows is the proxy's cost per
request and per token, not how N machines scale (docs/deployment.md does that on paper, from the
per-node figures measured here).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import percentile, table, write
from peer import free_port

REPO = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
TENANTS = [f"t{i}" for i in range(6)]
ADMIN = "admin-secret"
QUESTION = "Tell me a long story about a lighthouse keeper and the sea, in many sentences."


def token(t: str) -> str:
    return f"bench-token-{t}"


def sinkd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sinkd.cli.main", *args], capture_output=True,
                          text=True, env=env, check=False)  # fmt: skip


class Cluster:
    def __init__(self, nodes: int = 3) -> None:
        from sinkd.cli import deployment as deploy

        self.folder = Path(tempfile.mkdtemp(prefix="sinkd-deployment-"))
        sha = lambda s: hashlib.sha256(s.encode()).hexdigest()  # noqa: E731
        tenants = "".join(
            f'[[tenants]]\nname = "{t}"\ntoken_sha256 = "{sha(token(t))}"\n' for t in TENANTS
        )
        (self.folder / "base.toml").write_text(
            f'admin_token_sha256 = "{sha(ADMIN)}"\nn_ctx_seq = 512\nmax_sessions = 24\n{tenants}'
        )
        first = free_port() // 16 * 16 % 50000 + 10000
        done = sinkd("nodes", "init", str(self.folder), "--nodes", str(nodes), "--base-config",
                     str(self.folder / "base.toml"), "--proxy-http", f"127.0.0.1:{first}",
                     "--proxy-grpc", f"127.0.0.1:{first + 1}", "--first-port", str(first + 2))  # fmt: skip
        if done.returncode:
            raise RuntimeError(done.stderr)
        (self.folder / "run").mkdir(exist_ok=True)
        self.d = deploy.load(self.folder / "deployment.toml")
        self.procs = {}
        for node in self.d.nodes:
            env = dict(os.environ)
            for line in (self.folder / "nodes" / f"{node.name}.env").read_text().splitlines():
                k, _, v = line.partition("=")
                env[k] = v
            self.procs[node.name] = subprocess.Popen(
                [sys.executable, "-m", "sinkd.cli.main", "serve"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            )  # fmt: skip
        binary = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
        if binary is None:
            raise SystemExit("haproxy is not installed (apt-get install haproxy)")
        self.haproxy = subprocess.Popen([binary, "-f", str(self.folder / "haproxy.cfg")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        self.wait_up()

    def wait_up(self) -> None:
        from sinkd.cli.haproxy import RuntimeApi

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if all(RuntimeApi(self.d.admin_socket).status(n) == "UP" for n in self.d.names):
                    return
            except Exception:
                pass
            time.sleep(0.2)
        raise RuntimeError("the nodes did not come up")

    def home(self, tenant: str) -> str:
        from sinkd.cli.haproxy import where

        return where(self.d.proxy_http, hashlib.sha256(token(tenant).encode()).hexdigest())

    def stop(self) -> None:
        for p in [*self.procs.values(), self.haproxy]:
            p.terminate()
        for p in [*self.procs.values(), self.haproxy]:
            p.wait(60)
        shutil.rmtree(self.folder, ignore_errors=True)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- per request ---


def requests(c: Cluster, tenant: str, n: int) -> dict[str, Any]:
    import grpc

    from sinkd.daemon.rpc.client import CHANNEL_OPTIONS
    from sinkd.proto.v1 import sinkd_pb2 as pb
    from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc

    node = c.d.node(c.home(tenant))
    md = [("authorization", f"Bearer {token(tenant)}")]
    auth = {"authorization": f"Bearer {token(tenant)}"}
    ms: dict[str, list[float]] = {k: [] for k in ("http direct", "http proxy", "grpc direct",
                                                  "grpc proxy")}  # fmt: skip
    conns = {
        "http direct": http.client.HTTPConnection(*_host_port(node.http)),
        "http proxy": http.client.HTTPConnection(*_host_port(c.d.proxy_http)),
    }
    stubs = {
        "grpc direct": pb_grpc.SessionsStub(grpc.insecure_channel(node.grpc, options=CHANNEL_OPTIONS)),
        "grpc proxy": pb_grpc.SessionsStub(grpc.insecure_channel(c.d.proxy_grpc, options=CHANNEL_OPTIONS)),
    }  # fmt: skip
    for i in range(n + 20):  # the first 20 warm the connections
        for path in ("direct", "proxy") if i % 2 else ("proxy", "direct"):
            conn = conns[f"http {path}"]
            t0 = time.perf_counter()
            conn.request("GET", "/v1/models", headers=auth)
            conn.getresponse().read()
            t1 = time.perf_counter()
            stubs[f"grpc {path}"].List(pb.ListSessionsRequest(), metadata=md)
            t2 = time.perf_counter()
            if i >= 20:
                ms[f"http {path}"].append(1000 * (t1 - t0))
                ms[f"grpc {path}"].append(1000 * (t2 - t1))
    return {k: {"p50": percentile(v, 50), "p99": percentile(v, 99), "n": len(v)}
            for k, v in ms.items()}  # fmt: skip


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# --- per streamed token ---


def stream_http(base: str, tenant: str, n: int) -> tuple[float, list[float], int]:
    import openai

    client = openai.OpenAI(base_url=f"http://{base}/v1", api_key=token(tenant), max_retries=0)
    t0 = time.perf_counter()
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=n,
        temperature=0, stream=True,
    )  # fmt: skip
    arrivals = [
        time.perf_counter() for chunk in stream if chunk.choices and chunk.choices[0].delta.content
    ]
    return _gaps(t0, arrivals)


def stream_grpc(address: str, tenant: str, n: int) -> tuple[float, list[float], int]:
    from sinkd.daemon.rpc.client import Client
    from sinkd.daemon.runtime.api import (
        ChatRequest,
        GenerationOptions,
        PolicyRequest,
        SamplingRequest,
        TokenEvent,
    )

    c = Client(address, token(tenant))
    h = c.create(PolicyRequest(name="sink")).handle
    t0 = time.perf_counter()
    greedy = SamplingRequest(temperature=0.0, seed=0)
    arrivals = [time.perf_counter() for e in c.chat(h, ChatRequest(QUESTION, GenerationOptions(n, (), greedy)))
                if isinstance(e, TokenEvent)]  # fmt: skip
    c.close(h)
    c.shutdown()
    return _gaps(t0, arrivals)


def _gaps(t0: float, arrivals: list[float]) -> tuple[float, list[float], int]:
    gaps = [1000 * (b - a) for a, b in itertools.pairwise(arrivals)]
    return 1000 * (arrivals[0] - t0), gaps, len(arrivals)


def streams(c: Cluster, tenant: str, n: int, rounds: int) -> dict[str, Any]:
    node = c.d.node(c.home(tenant))
    out: dict[str, Any] = {}
    for edge, run, direct, proxy in (("http", stream_http, node.http, c.d.proxy_http),
                                     ("grpc", stream_grpc, node.grpc, c.d.proxy_grpc)):  # fmt: skip
        run(proxy, tenant, 8)  # warm
        ttft: dict[str, list[float]] = {"direct": [], "proxy": []}
        gaps: dict[str, list[float]] = {"direct": [], "proxy": []}
        proxy_cpu, proxy_tokens = 0.0, 0
        for r in range(rounds):
            for path in ("direct", "proxy") if r % 2 else ("proxy", "direct"):
                cpu0 = cpu_seconds(c.haproxy.pid)
                first, g, count = run(direct if path == "direct" else proxy, tenant, n)
                if path == "proxy":
                    proxy_cpu += cpu_seconds(c.haproxy.pid) - cpu0
                    proxy_tokens += count
                ttft[path].append(first)
                gaps[path].extend(g)
        out[edge] = {
            **{f"gap_{p}_{q}": percentile(gaps[p], q) for p in gaps for q in (50, 99)},
            **{f"ttft_{p}_median": statistics.median(ttft[p]) for p in ttft},
            "haproxy_cpu_ms_per_token": 1000 * proxy_cpu / max(proxy_tokens, 1),
            "tokens_per_stream": n,
            "rounds": rounds,
            "decode_tok_s_direct": 1000 / statistics.median(gaps["direct"]),
        }
    return out


# --- drain ---


def drains(c: Cluster, counts: list[int]) -> list[dict[str, Any]]:
    from sinkd.daemon.rpc.client import Client
    from sinkd.daemon.runtime.api import PolicyRequest

    text = (REPO / "evaluation" / "data" / "genesis.txt").read_text()[:1200]  # ~300 tokens
    env = dict(os.environ, SINKD_ADMIN_TOKEN=ADMIN)
    deployment = str(c.folder / "deployment.toml")
    results = []
    for s in counts:
        tenant = TENANTS[0]
        node = c.home(tenant)
        client = Client(c.d.proxy_grpc, token(tenant))
        handles = []
        for _ in range(s):
            h = client.create(PolicyRequest(name="sink", sinks=4, window=500)).handle
            client.append(h, text)
            handles.append(h)
        t0 = time.perf_counter()
        drained = sinkd("nodes", "drain", node, "--no-stop", "--json", "-d", deployment, env=env)
        drain_s = time.perf_counter() - t0
        if drained.returncode:
            raise RuntimeError(drained.stdout + drained.stderr)
        moved = [json.loads(x) for x in drained.stdout.splitlines()]
        target = c.home(tenant)
        t0 = time.perf_counter()
        joined = sinkd("nodes", "join", node, "--json", "-d", deployment, env=env)
        join_s = time.perf_counter() - t0
        if joined.returncode:
            raise RuntimeError(joined.stdout + joined.stderr)
        sizes = [m["archive_bytes"] for m in moved if m["event"] == "moved"]
        results.append({
            "sessions": s, "node": node, "target": target, "drain_s": drain_s,
            "join_s": join_s, "per_session_ms": 1000 * drain_s / s,
            "archive_mb_median": statistics.median(sizes) / 2**20,
        })  # fmt: skip
        for h in handles:
            client.close(h)
        client.shutdown()
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--sessions", default="4,8,16")
    ap.add_argument("--drains-only", action="store_true",
                    help="Only the drains -> bench/results/deployment_drains.json")  # fmt: skip
    args = ap.parse_args()
    c = Cluster()
    try:
        if args.drains_only:
            dr = drains(c, [int(x) for x in args.sessions.split(",")])
        else:
            req = requests(c, TENANTS[1], args.requests)
            tok = streams(c, TENANTS[1], args.tokens, args.rounds)
            dr = drains(c, [int(x) for x in args.sessions.split(",")])
    finally:
        c.stop()
    drain_table = ("drain and join: one tenant whose S sessions hold ~300 tokens each, 512 cells",
                   ["sessions", "drain s", "per session ms", "join s", "archive MiB"],
                   [[r["sessions"], r["drain_s"], r["per_session_ms"], r["join_s"],
                     r["archive_mb_median"]] for r in dr])  # fmt: skip
    if args.drains_only:
        table(*drain_table)
        print(write("deployment_drains", {"drains": dr}))
        return
    table(f"per request (no engine work), ms, {args.requests} alternating",
          ["path", "p50", "p99", "proxy adds p50", "proxy adds p99"],
          [[edge, req[f"{edge} proxy"]["p50"], req[f"{edge} proxy"]["p99"],
            req[f"{edge} proxy"]["p50"] - req[f"{edge} direct"]["p50"],
            req[f"{edge} proxy"]["p99"] - req[f"{edge} direct"]["p99"]] for edge in ("http", "grpc")])  # fmt: skip
    table(f"per streamed token, ms ({args.rounds} streams of {args.tokens} tokens each way)",
          ["edge", "gap p50 direct", "gap p50 proxy", "gap p99 direct", "gap p99 proxy",
           "TTFT direct", "TTFT proxy", "HAProxy CPU/token"],
          [[e, t["gap_direct_50"], t["gap_proxy_50"], t["gap_direct_99"], t["gap_proxy_99"],
            t["ttft_direct_median"], t["ttft_proxy_median"], t["haproxy_cpu_ms_per_token"]]
           for e, t in tok.items()])  # fmt: skip
    table(*drain_table)
    print(write("deployment", {"requests": req, "streams": tok, "drains": dr}))


if __name__ == "__main__":
    main()
