"""The peer, side by side: llama.cpp's own server against sinkd at the same budget.

    python bench/peer.py --build-only     # once: ~25 min on 2 cores; never part of .ci/run
    python bench/peer.py                  -> bench/results/peer.json
    python bench/peer.py --perplexity-only -> bench/results/peer_perplexity.json (the schemes alone)
    python bench/peer.py --solo-only      -> bench/results/peer_solo_threads{N}.json (one session:
                                             llama-server, sinkd, sinkd --no-durable)
    python bench/peer.py --throughput-only -> bench/results/peer_throughput.json (those three at
                                             one session and at eight)

SINKD_PEER_CMAKE_ARGS adds CMake flags to the peer's build (its own cache folder), and
SINKD_PEER_GPU_LAYERS offloads that many layers in both servers: bench/gpu_check.sh's GPU run.

SINKD_PEER_THREADS (default 2, every core here) sets both servers' decoding threads; with 1 on
this 2-core machine the other core is free for each server's transport and its client.

The peer is built from the llama.cpp sources vendored in the llama-cpp-python sdist of the
installed version (downloaded from PyPI, or taken from SINKD_PEER_SDIST), into a cache directory
outside the repository (SINKD_PEER_CACHE, default ~/.cache/sinkd/peer): same llama.cpp, same
compiler, so the comparison is of the serving layers, not of two engines.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import percentile, session_default_k, table, together, write

TARGETS = ("llama-server", "llama-batched-bench")


def cache_dir() -> Path:
    return Path(os.environ.get("SINKD_PEER_CACHE", Path.home() / ".cache" / "sinkd" / "peer"))


# a GPU run (bench/gpu_check.sh): the peer built with these CMake flags (e.g. "-DGGML_CUDA=on
# -DCMAKE_CUDA_ARCHITECTURES=90"), and both servers offloading this many layers
CMAKE_EXTRA = os.environ.get("SINKD_PEER_CMAKE_ARGS", "").split()
GPU_LAYERS = int(os.environ.get("SINKD_PEER_GPU_LAYERS", "0"))


def installed_version() -> str:
    """The installed llama-cpp-python's version, or the given sdist's (SINKD_PEER_SDIST: a GPU
    check builds the peer while pip still builds the bindings)."""
    given = os.environ.get("SINKD_PEER_SDIST")
    if given and Path(given).name.startswith("llama_cpp_python-"):
        return Path(given).name.removeprefix("llama_cpp_python-").removesuffix(".tar.gz")
    from importlib.metadata import version

    return version("llama_cpp_python")


def sdist(version: str, into: Path) -> Path:
    """The sdist of the installed llama-cpp-python: SINKD_PEER_SDIST, else one pip downloads."""
    given = os.environ.get("SINKD_PEER_SDIST")
    if given:
        return Path(given)
    found = sorted(into.glob(f"llama_cpp_python-{version}.tar.gz"))
    if found:
        return found[0]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"llama-cpp-python=={version}",
            "-d",
            str(into),
        ],
        check=True,
    )
    return next(into.glob(f"llama_cpp_python-{version}.tar.gz"))


def build() -> dict[str, Path]:
    """The peer's binaries, built once per llama-cpp-python version; later calls reuse them."""
    version = installed_version()
    flavour = hashlib.sha256(" ".join(CMAKE_EXTRA).encode()).hexdigest()[:8] if CMAKE_EXTRA else ""
    root = cache_dir() / (f"{version}-{flavour}" if flavour else version)
    bins = {t: root / "build" / "bin" / t for t in TARGETS}
    if all(b.exists() for b in bins.values()):
        return bins
    root.mkdir(parents=True, exist_ok=True)
    src = root / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if not (src / "CMakeLists.txt").exists():
        with tarfile.open(sdist(version, root)) as tar:
            members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name]
            tar.extractall(root, members=members, filter="data")
        # the bindings' own build gets it too (docs/gpu.md): Vulkan on headers before 1.3.261
        patch = (
            Path(__file__).resolve().parent.parent
            / "deploy/vulkan/ggml-vulkan-layer-settings.patch"
        )
        subprocess.run(["patch", "-p1", "-i", str(patch)], cwd=src.parent.parent, check=True)
    build_dir = root / "build"
    subprocess.run(
        [
            "cmake",
            "-S",
            str(src),
            "-B",
            str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            *CMAKE_EXTRA,
        ],
        check=True,
    )
    subprocess.run(
        [
            "cmake",
            "--build",
            str(build_dir),
            "--target",
            *TARGETS,
            "-j",
            os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2),
        ],
        check=True,
    )
    return bins


# --- the run -------------------------------------------------------------------------------------

BUDGET, SINKS, SESSIONS = 256, 4, 8
ROUNDS = int(os.environ.get("SINKD_PEER_ROUNDS", "2"))
SOLO_TOKENS, EACH_TOKENS = 600, 300


def env_threads() -> int:
    """SINKD_PEER_THREADS: each server's decoding threads (default 2, every core here)."""
    given = os.environ.get("SINKD_PEER_THREADS", "2")
    if not given.isdigit() or int(given) < 1:
        sys.exit(f"SINKD_PEER_THREADS={given!r}: must be a whole number >= 1")
    return int(given)


THREADS = env_threads()
INTERVAL_ENV = "SINKD_SYNC_INTERVAL_MS"  # the daemon's setting sync_interval_ms
SPEC_ENV = "SINKD_SPECULATIVE"  # the daemon's setting speculative
RUN_ENV = "SINKD_DECODE_RUN"  # the daemon's setting decode_run
# llama-server's context shift as a sink policy: E = W/2, the shift at every eviction
SERVER_SCHEME = {"evict_chunk": (BUDGET - SINKS) // 2, "compact_interval": 0}


def model_file() -> Path:
    from sinkd.daemon.models.registry import load_lock, locate

    return locate(load_lock().get(None))


def prompts(n: int) -> list[list[int]]:
    """n prose prompts of 100 tokens each, from different places of the sample text."""
    from sinkd.daemon.engine.llama import EngineConfig
    from sinkd.daemon.engine.loading import open_engine
    from sinkd.evaluation import SAMPLE_TEXT

    with open_engine(None, EngineConfig(n_ctx_seq=256, n_seq_max=1)) as engine:
        ids = engine.vocab.tokenize(SAMPLE_TEXT * 4, add_bos=False)
    return [ids[i * 37 : i * 37 + 100] for i in range(n)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Stream:
    tokens: int = 0
    seconds: float = 0.0
    ended: float = 0.0  # perf_counter when its generation ended (before any close)
    itl_ms: list[float] = field(default_factory=list)
    first: threading.Event = field(default_factory=threading.Event)  # set at the first token
    _last: float | None = None

    def tick(self) -> None:
        """One more token arrived now."""
        now = time.perf_counter()
        self.tokens += 1
        if self._last is not None:
            self.itl_ms.append(1000 * (now - self._last))
        else:
            self.first.set()
        self._last = now


class Server:
    """llama-server with one slot per session and `BUDGET` cells each, context shift on."""

    def __init__(self, binary: Path, slots: int, extra: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        # --no-repack: the weights as sinkd loads them (and on an AMX CPU this llama.cpp's repacked
        # Q4_1 aborts at load); `extra`: e.g. its own speculative decoding
        self.proc = subprocess.Popen(
            [str(binary), "-m", str(model_file()), "-c", str(BUDGET * slots), "-np", str(slots),
             "--keep", str(SINKS), "--context-shift", "-t", str(THREADS), "-b", "256", "-ub", "256",
             "--port", str(self.port), "--host", "127.0.0.1", "--no-webui", "--no-repack",
             *(["-ngl", str(GPU_LAYERS)] if GPU_LAYERS else []), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("llama-server did not become healthy")

    def stream(self, prompt: list[int], n: int, out: Stream | None = None) -> Stream:
        body = json.dumps(
            {
                "prompt": prompt,
                "n_predict": n,
                "temperature": 0.0,
                "stream": True,
                "ignore_eos": True,
                "n_keep": SINKS,
                "cache_prompt": False,
            }
        ).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=body,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        out, t0 = out or Stream(), time.perf_counter()
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                if not line.startswith(b"data: "):
                    continue
                ev = json.loads(line[6:])
                if ev.get("stop"):
                    break
                out.tick()
        out.seconds = time.perf_counter() - t0
        out.ended = time.perf_counter()
        return out

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class Sinkd:
    """`sinkd serve` in its own process, as llama-server runs; sessions S=4 W=252 over gRPC."""

    def __init__(
        self,
        sessions: int,
        durable: bool = True,
        threads: int | None = THREADS,
        env: dict[str, str] | None = None,
        scheme: dict[str, int] | None = None,
    ) -> None:
        self.scheme = scheme or {}  # Policy fields beyond S and W (evict_chunk, compact_interval)
        self.tmp = Path(tempfile.mkdtemp())
        sock = self.tmp / "sinkd.sock"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sinkd.cli.main", "serve", "--socket", str(sock),
             "--max-sessions", str(sessions), "--ctx", str(BUDGET),
             *(["--threads", str(threads)] if threads else []),
             "--state-dir", str(self.tmp / "state"), "--durable" if durable else "--no-durable",
             *(["--gpu-layers", str(GPU_LAYERS)] if GPU_LAYERS else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
        )  # fmt: skip
        from sinkd.daemon.rpc.client import Client, daemon_answers

        self.client = Client(f"unix:{sock}")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if daemon_answers(f"unix:{sock}"):
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("sinkd serve did not become healthy")

    def stream(self, prompt: list[int], n: int, out: Stream | None = None) -> Stream:
        from sinkd.proto.v1 import sinkd_pb2 as pb

        s = self.client.s
        out, t0 = out or Stream(), time.perf_counter()
        h = s.Create(
            pb.CreateSessionRequest(
                policy=pb.Policy(name="sink", sinks=SINKS, window=BUDGET - SINKS, **self.scheme)
            )
        ).handle
        s.Append(pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=prompt)))
        for ev in s.Generate(pb.GenerateRequest(handle=h, max_tokens=n)):
            if ev.HasField("token"):
                out.tick()
        out.seconds = time.perf_counter() - t0
        out.ended = time.perf_counter()
        s.Close(pb.HandleRequest(handle=h))  # not timed: llama-server has none to make
        return out

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of a process, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_split(before: dict[int, float], after: dict[int, float]) -> tuple[float, float]:
    """The server's CPU seconds in its THREADS busiest threads (llama.cpp's decoding threads,
    spinning included) and in all the others (transport, journal, the rest)."""
    used = sorted((after[t] - before.get(t, 0.0) for t in after), reverse=True)
    return sum(used[:THREADS]), sum(used[THREADS:])


def measure(server: Server | Sinkd, work: list[list[int]], n: int) -> dict[str, Any]:
    """Every prompt of `work` generating n tokens at once; tok/s per session and aggregate, and
    the CPU per generated token of the server's decoding threads, its other threads and the
    clients (this process): on two busy cores any of it beside the decode lengthens the decode.
    The CPU is counted from the moment every session has its first token to the end, so that
    session setup and the prompts' prefill are not spread over the generated tokens."""
    streams = [Stream() for _ in work]
    results: list[Stream | None] = [None] * len(work)
    start: dict[str, Any] = {}  # the CPU and tokens when every session had its first token

    def run(i: int) -> None:
        results[i] = server.stream(work[i], n, streams[i])

    finished = threading.Event()

    def watch() -> None:
        for st in streams:
            st.first.wait()  # set at its first token, or by the run's end
        if not finished.is_set():  # else a session never started: the whole run counts
            start.update(threads=thread_cpu(server.proc.pid), client=os.times(),
                         tokens=sum(st.tokens for st in streams))  # fmt: skip

    threads0, client0 = thread_cpu(server.proc.pid), os.times()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    began = time.perf_counter()
    try:
        with_close = together([functools.partial(run, i) for i in range(len(work))])
    finally:
        finished.set()
        for st in streams:
            st.first.set()  # the watcher's waits end with the run
        watcher.join()
    threads1, client1 = thread_cpu(server.proc.pid), os.times()
    done = [r for r in results if r is not None]
    # to the last generated token: sinkd's Close, which waits for its purge (up to
    # purge_interval_s: a closed session's text leaves the files), is not generation
    wall = max(r.ended for r in done) - began
    itl = [x for r in done for x in r.itl_ms]
    generated = sum(r.tokens for r in done)
    counted = generated
    if start and generated > start["tokens"]:  # the decode alone
        threads0, client0, counted = start["threads"], start["client"], generated - start["tokens"]
    decoding, others = cpu_split(threads0, threads1)
    client = sum(client1[:2]) - sum(client0[:2])
    return {
        "sessions": len(work),
        "tokens_each": n,
        "generated": sum(r.tokens for r in done),
        "per_session_tok_s": sum(r.tokens / r.seconds for r in done) / len(done),
        "aggregate_tok_s": sum(r.tokens for r in done) / wall,
        "wall_s": wall,
        "wall_with_close_s": with_close,
        "itl_p50_ms": percentile(itl, 50),
        "itl_p99_ms": percentile(itl, 99),
        "cpu_ms_per_token": {
            "decoding_threads": 1000 * decoding / counted,
            "other_server_threads": 1000 * others / counted,
            "clients": 1000 * client / counted,
        },
        "cpu_counted_tokens": counted,
        "cpu_from_first_tokens": counted < generated,
    }


def batched_bench(binary: Path) -> list[dict[str, Any]]:
    """llama-batched-bench: the raw ceiling, 100-token prompts, 128 tokens generated per sequence."""
    out = subprocess.run(
        [str(binary), "-m", str(model_file()), "-c", str(BUDGET * SESSIONS), "-b", "256",
         "-ub", "256", "-npp", "100", "-ntg", "128", "-npl", "1,2,4,8", "-t", str(THREADS)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = []
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[0].isdigit():
            # PP TG B N_KV T_PP S_PP T_TG S_TG T S
            rows.append({"sequences": int(cells[2]), "tg_aggregate_tok_s": float(cells[7]),
                         "pp_tok_s": float(cells[5])})  # fmt: skip
    return rows


# where the perplexity runs read: (text, first character), 4,096 tokens from each. One stretch
# decides little: the schemes' order changes from one to the next (bench/README.md, "peer.py")
STRETCHES = (("kjv", 0), ("kjv", 1_000_000), ("kjv", 2_200_000), ("kjv", 3_400_000),
             ("jargon", 300_000))  # fmt: skip


def perplexities() -> list[dict[str, Any]]:
    """The eviction schemes on the same texts through the same llama.cpp: sinkd's session default
    (evict E=16, shift once per 32 evictions, at most W; long appends in ingest chunks), shifting at
    every eviction (K=0, the default before), and llama-server's context shift (keep n_keep,
    discard half of the rest, shift), which is the sink policy with E = W/2. One row per scheme
    and stretch of text (SINKD_PEER_STRETCHES of them, default all), and one with the geometric
    mean of its stretches."""
    from sinkd.cachepolicy import PolicyConfig
    from sinkd.daemon.config import Settings
    from sinkd.daemon.engine.llama import EngineConfig
    from sinkd.daemon.engine.loading import open_engine
    from sinkd.evaluation import SAMPLE_TEXT
    from sinkd.evaluation.ppl import score_policy

    texts = Path(__file__).resolve().parent / "texts"
    window = BUDGET - SINKS
    ingest = Settings.model_fields["default_ingest_chunk"].default
    eager = PolicyConfig.named("sink", sinks=SINKS, window=window, evict_chunk=16,
                               ingest_chunk=ingest)  # fmt: skip
    default = session_default_k(eager)
    schemes = {
        f"sinkd sink (E=16, K={default.compact_interval}: the default)": default,
        "sinkd sink (E=16, K=0)": eager,
        "llama-server context shift": PolicyConfig.named("sink", sinks=SINKS, window=window,
                                                         evict_chunk=window // 2),
    }  # fmt: skip
    n = int(4096 * float(os.environ.get("SINKD_BENCH_SCALE", "1")))
    stretches = STRETCHES[: int(os.environ.get("SINKD_PEER_STRETCHES", len(STRETCHES)))]
    files = {n: (texts / f"{n}.txt") for n, _ in stretches}
    whole = {n: path.read_text() for n, path in files.items() if path.exists()}  # each file once
    bodies = {
        f"{name}@{start:,}": whole[name][start : start + 400_000]
        for name, start in stretches
        if name in whole
    } or {"sample": SAMPLE_TEXT * 200}  # bench/texts.sh not run: the sample text alone
    rows = []
    with open_engine(None, EngineConfig(n_ctx_seq=BUDGET, n_seq_max=1)) as engine:
        for text, body in bodies.items():
            tokens = engine.vocab.tokenize(body, add_bos=False)[:n]
            for scheme, policy in schemes.items():
                # fed in the daemon's sub-batches past the budget: the ingest chunk, where set
                chunk = max(policy.ingest_chunk, 64)
                ppl = score_policy(engine, tokens, policy, chunk=chunk).perplexity
                rows.append({"scheme": scheme, "text": text, "tokens": n, "perplexity": ppl})
                print(f"{scheme}, {text}: perplexity {ppl:.4f}", flush=True)
    for scheme in schemes:
        mine = [r["perplexity"] for r in rows if r["scheme"] == scheme]
        mean = math.exp(statistics.fmean(math.log(x) for x in mine))
        rows.append({"scheme": scheme, "text": f"geometric mean of {len(mine)}", "tokens": n,
                     "perplexity": mean})  # fmt: skip
    return rows


def perplexity_table(rows: list[dict[str, Any]]) -> None:
    server = {
        r["text"]: r["perplexity"] for r in rows if r["scheme"] == "llama-server context shift"
    }
    table("perplexity of each eviction scheme (same texts, same llama.cpp; vs: over llama-server's)",
          ["scheme", "text", "tokens", "perplexity", "vs llama-server"],
          [[r["scheme"], r["text"], r["tokens"], f"{r['perplexity']:.4f}",
            f"{r['perplexity'] / server[r['text']]:.4f}"] for r in rows])  # fmt: skip


def main(solo_only: bool = False, throughput_only: bool = False, decode_runs: bool = False) -> None:
    """Every server at one session and at SESSIONS, then the ceiling and the perplexities; with
    `solo_only`, llama-server and sinkd (durable and not) at one session alone; with
    `throughput_only` (bench/gpu_check.sh), those three at one session and at SESSIONS; with
    `decode_runs`, llama-server and sinkd without drafts a token a pass and in decode runs of 4
    and 16 (the GPU's default) at one session and at SESSIONS."""
    bins = build()
    work = prompts(SESSIONS)
    runs: list[dict[str, Any]] = []
    servers = [
        ("llama-server", lambda k: Server(bins["llama-server"], k)),
        ("sinkd", lambda k: Sinkd(k)),
        # what durability costs (a journal commit per step, its fsync on a thread of its own):
        # llama-server keeps nothing across a restart
        ("sinkd --no-durable", lambda k: Sinkd(k, durable=False)),
        # speculative decoding: llama.cpp's own n-gram drafts, and sinkd's turned off
        (
            "llama-server --spec-type ngram-simple",
            lambda k: Server(bins["llama-server"], k, ("--spec-type", "ngram-simple")),
        ),
        ("sinkd speculative=off", lambda k: Sinkd(k, env={**os.environ, SPEC_ENV: "off"})),
        # a plain token's parts: without the journal, and with one fsync per 20 ms at most
        (
            "sinkd speculative=off --no-durable",
            lambda k: Sinkd(k, durable=False, env={**os.environ, SPEC_ENV: "off"}),
        ),
        (
            "sinkd speculative=off sync_interval_ms=20",
            lambda k: Sinkd(k, env={**os.environ, SPEC_ENV: "off", INTERVAL_ENV: "20"}),
        ),
        # durable, one journal fsync per 20 ms at most (each fsync slows the decode beside it)
        ("sinkd sync_interval_ms=20", lambda k: Sinkd(k, env={**os.environ, INTERVAL_ENV: "20"})),
        # llama-server's eviction scheme in sinkd (discard half the window, shift at once; its
        # cache holds 130-256 cells, sinkd's default 240-256): this row parts the scheme's speed
        # from the serving layer's
        (
            "sinkd --no-durable, llama-server's scheme",
            lambda k: Sinkd(k, durable=False, scheme=SERVER_SCHEME),
        ),
    ]
    # llama-server with the plain attention kernel, as sinkd runs it by default on its build
    # (daemon/engine/llama.py's NOTE): llama-server's default is flash attention
    plain_peer = ("llama-server -fa off", lambda k: Server(bins["llama-server"], k, ("-fa", "off")))
    if decode_runs:  # the engine's Python once per run of greedy decodes, not once per token
        servers = [servers[0]] + [
            (f"sinkd speculative=off decode_run={n}",
             lambda k, n=n: Sinkd(k, env={**os.environ, SPEC_ENV: "off", RUN_ENV: str(n)}))
            for n in (1, 4, 16)
        ]  # fmt: skip
    loads = ((1, SOLO_TOKENS),) if solo_only else ((1, SOLO_TOKENS), (SESSIONS, EACH_TOKENS))
    if solo_only or throughput_only:
        # one session: both servers with and without drafts; at eight: without, and sinkd's off
        servers = servers[:7] if solo_only else [*servers[:3], *servers[4:6]]
        servers.append(plain_peer)
    counts = [k for k, _ in loads]
    for rnd in range(ROUNDS):  # each set back to back, who goes first alternating by round
        for k, n in loads:
            for name, make in servers if rnd % 2 == 0 else servers[::-1]:
                server = make(k)
                try:
                    r = measure(server, work[:k], n)
                finally:
                    server.stop()
                runs.append({"server": name, "round": rnd, **r})
                print(
                    f"{name} round {rnd}: {k} x {n}: {r['aggregate_tok_s']:.1f} tok/s", flush=True
                )
    table(
        "CPU per generated token, ms (medians over the rounds): the server's decoding threads"
        f" ({THREADS}, llama.cpp's, spinning included), its other threads, the clients here",
        ["server", "sessions", "decoding threads", "other server threads", "clients"],
        [[name, k, *(statistics.median(r["cpu_ms_per_token"][f] for r in runs
                                       if r["server"] == name and r["sessions"] == k)
                     for f in ("decoding_threads", "other_server_threads", "clients"))]
         for name, _ in servers for k in counts],
    )  # fmt: skip
    rows = []
    for name, _ in servers:
        for k in counts:
            mine = [r for r in runs if r["server"] == name and r["sessions"] == k]
            rows.append(
                [
                    name,
                    k,
                    mine[0]["tokens_each"],
                    "-".join(f"{r['per_session_tok_s']:.1f}" for r in mine),
                    "-".join(f"{r['aggregate_tok_s']:.1f}" for r in mine),
                    max(r["itl_p50_ms"] for r in mine),
                    max(r["itl_p99_ms"] for r in mine),
                ]
            )
    table(
        f"{BUDGET} cells per session, S={SINKS}, greedy, 100-token prompts ({ROUNDS} rounds,"
        f" {THREADS} decoding threads)",
        ["server", "sessions", "tokens each", "tok/s per session", "aggregate tok/s",
         "ITL p50 ms", "ITL p99 ms"],
        rows,
    )  # fmt: skip
    ratios = []
    for name, _ in servers[1:]:
        for k in counts:
            mine = {(r["server"], r["round"]): r for r in runs if r["sessions"] == k}
            pairs = [(mine[name, i], mine["llama-server", i]) for i in range(ROUNDS)]
            per = sorted(a["per_session_tok_s"] / b["per_session_tok_s"] for a, b in pairs)
            agg = sorted(a["aggregate_tok_s"] / b["aggregate_tok_s"] for a, b in pairs)
            ratios.append({"server": name, "sessions": k, "per_session": per, "aggregate": agg,
                           "per_session_median": statistics.median(per),
                           "aggregate_median": statistics.median(agg)})  # fmt: skip
    table(
        "against llama-server, each round's runs back to back",
        ["server", "sessions", "per session (rounds)", "median", "aggregate (rounds)", "median"],
        [[r["server"], r["sessions"], " ".join(f"{x:.2f}" for x in r["per_session"]),
          r["per_session_median"], " ".join(f"{x:.2f}" for x in r["aggregate"]),
          r["aggregate_median"]] for r in ratios],
    )  # fmt: skip
    if solo_only or throughput_only or decode_runs:
        out = {"threads": THREADS, "gpu_layers": GPU_LAYERS, "runs": runs, "ratios": ratios}
        name = (
            "peer_decode_runs" if decode_runs
            else "peer_throughput" if throughput_only else f"peer_solo_threads{THREADS}"
        )  # fmt: skip
        print(f"wrote {write(name, out)}")
        return
    ceiling = batched_bench(bins["llama-batched-bench"])
    ppl = perplexities()
    table("llama-batched-bench (raw ceiling): 100-token prompts, 128 generated",
          ["sequences", "generation tok/s (aggregate)", "prompt tok/s"],
          [[r["sequences"], r["tg_aggregate_tok_s"], r["pp_tok_s"]] for r in ceiling])  # fmt: skip
    perplexity_table(ppl)
    print(
        f"wrote {write('peer', {'threads': THREADS, 'runs': runs, 'ratios': ratios, 'batched_bench': ceiling, 'perplexity': ppl})}"
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--build-only"]:
        print(build())
    elif sys.argv[1:] == ["--perplexity-only"]:  # the schemes' perplexity alone, no servers
        rows = perplexities()
        perplexity_table(rows)
        print(f"wrote {write('peer_perplexity', {'perplexity': rows})}")
    elif sys.argv[1:] == ["--solo-only"]:
        main(solo_only=True)
    elif sys.argv[1:] == ["--throughput-only"]:
        main(throughput_only=True)
    elif sys.argv[1:] == ["--decode-runs"]:
        main(decode_runs=True)
    elif sys.argv[1:]:
        sys.exit(
            f"usage: {sys.argv[0]} [--build-only | --perplexity-only | --solo-only | --throughput-only | --decode-runs]"
        )
    else:
        main()
