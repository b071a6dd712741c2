"""One long conversation through the openai SDK, the whole history resent every turn (as Open WebUI,
LibreChat or Continue do), against sinkd's HTTP front and the servers a user would otherwise run:
llama.cpp's `llama-server` (built as bench/peer.py builds it) at the same cells and at the model's
trained context, and llama-cpp-python's own OpenAI server (`python -m llama_cpp.server`), all on
the same llama.cpp and model, greedy, 2 threads.

    python bench/peer.py --build-only    # once, for llama-server (~25 min on 2 cores)
    pip install starlette-context pydantic-settings sse-starlette   # llama_cpp.server's extras
    python bench/long_chat.py            -> bench/results/long_chat.json, long_chat_ttft.svg

SINKD_LONG_CHAT_TURNS (30), SINKD_LONG_CHAT_CELLS (1024), SINKD_LONG_CHAT_SERVERS (a comma list of
sinkd, sinkd-recall-off, llama-server, llama-server-ctx, llama-cpp-python; all but
sinkd-recall-off by default; a subset writes long_chat_<names>.json; a name may repeat: `sinkd,
sinkd-recall-off,sinkd` measures what recall adds to the turns that recall nothing, per turn,
against the same turn with recall off, in one run), SINKD_LONG_CHAT_WINDOW (sinkd's window; default the HTTP front's, every cell the sinks leave). A server that is not
installed is reported as such, not skipped silently. Per turn: time to first token, wall time,
prompt tokens the server processed (sinkd: the receipt's new tokens; llama-server: its
`timings.prompt_n`; llama-cpp-python reports only what it was sent), completion tokens/s, and the
failure if the turn failed (a failed turn is left out of the history, as a user retrying would).
At the end the first turn's facts are asked for.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common import RESULTS, table, write

TURNS = int(os.environ.get("SINKD_LONG_CHAT_TURNS", "30"))
CELLS = int(os.environ.get("SINKD_LONG_CHAT_CELLS", "1024"))
TRAINED = 8192
# sinkd's window: unset, the HTTP front's own (every cell the sinks leave: a chat's window)
WINDOW = os.environ.get("SINKD_LONG_CHAT_WINDOW")
MAX_TOKENS = 96
THREADS = 2
FACTS = "My name is Ada Lovelace and I keep bees in Lisbon. Please remember that."
FINAL = "What is my name, and in which city do I keep bees?"
TOPICS = [
    "how bees make honey", "why bees swarm", "what a queen bee does", "the life of a drone bee",
    "how to build a beehive", "what pollen is", "how bees see colour", "the waggle dance",
    "why bees sting", "how wax is made", "what propolis is", "winter in a beehive",
    "how to harvest honey", "the history of beekeeping", "wild bees and honey bees",
    "which flowers bees like", "how bees find water", "what a beekeeper wears",
    "how honey keeps so long", "bumblebees", "how many eggs a queen lays", "bees and weather",
    "what royal jelly is", "how bees cool the hive", "pests of the beehive", "mead",
    "bees in cities", "how bees navigate", "the parts of a bee", "why bees matter to farms",
]  # fmt: skip


def questions(n: int) -> list[str]:
    middle = [f"Tell me about {TOPICS[i % len(TOPICS)]}." for i in range(max(n - 2, 0))]
    return [FACTS, *middle, FINAL][:n] if n > 1 else [FACTS]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def model_file() -> Path:
    from sinkd.daemon.models.registry import load_lock, locate

    return locate(load_lock().get(None))


def rss_mib(pid: int) -> tuple[float, float]:
    """(resident now, peak) MiB of a process."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


class Server:
    name = ""
    cells = 0

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = free_port()
        self.key = "none"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def wait(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode})")
            try:
                req = urllib.request.Request(
                    f"{self.base_url}/models", headers={"Authorization": f"Bearer {self.key}"}
                )
                with urllib.request.urlopen(req, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"{self.name} did not answer in {timeout} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class SinkdHttp(Server):
    name = "sinkd"

    def __init__(self, recall: bool = True) -> None:
        super().__init__()
        self.name = "sinkd" if recall else "sinkd-recall-off"
        self.cells = CELLS
        self.tmp = Path(tempfile.mkdtemp())
        sock = self.tmp / "run" / "sinkd.sock"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sinkd.cli.main", "serve", "--socket", str(sock),
             "--ctx", str(CELLS), "--max-sessions", "2", "--threads", str(THREADS),
             "--state-dir", str(self.tmp / "state"), "--http", f"127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, **({"SINKD_HTTP_WINDOW": WINDOW} if WINDOW else {}),
                 **({} if recall else {"SINKD_RECALL_MODE": "off"})},

        )  # fmt: skip
        token = sock.parent / "http-token"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # /health: 200 once the model is loaded
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.3)
        self.key = token.read_text().strip()
        self.wait()


class LlamaServer(Server):
    def __init__(self, cells: int) -> None:
        super().__init__()
        from peer import cache_dir, installed_version

        binary = cache_dir() / installed_version() / "build" / "bin" / "llama-server"
        if not binary.exists():
            raise FileNotFoundError(f"{binary} (python bench/peer.py --build-only)")
        self.cells = cells
        self.name = "llama-server" if cells == CELLS else "llama-server-ctx"
        self.proc = subprocess.Popen(
            [str(binary), "-m", str(model_file()), "-c", str(cells), "-np", "1", "--keep", "4",
             "--context-shift", "--no-repack", "-t", str(THREADS), "--port", str(self.port),
             "--host", "127.0.0.1", "--no-webui"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.wait()


# llama.cpp's repacked weights crash a multi-token decode of this Q4_1 model on some CPUs (a
# segfault seen on an AVX-512/AMX Xeon, in llama-server and llama-cpp-python alike); sinkd loads
# weights unrepacked (docs/determinism.md), so both peers run so too: llama-server with
# --no-repack, llama_cpp.server through this wrapper (it has no such option)
NO_REPACK_SERVER = """
import runpy, sys
import llama_cpp, llama_cpp.llama_cpp as low
default = low.llama_model_default_params
def unrepacked():
    p = default()
    p.use_extra_bufts = False
    return p
llama_cpp.llama_model_default_params = low.llama_model_default_params = unrepacked
sys.argv[0] = "llama_cpp.server"
runpy.run_module("llama_cpp.server", run_name="__main__")
"""


class LlamaCppPython(Server):
    name = "llama-cpp-python"

    def __init__(self) -> None:
        super().__init__()
        import importlib.util

        if importlib.util.find_spec("starlette_context") is None:
            raise FileNotFoundError("llama_cpp.server's extras (pip install starlette-context ...)")
        self.cells = CELLS
        self.proc = subprocess.Popen(
            [sys.executable, "-c", NO_REPACK_SERVER, "--model", str(model_file()),
             "--n_ctx", str(CELLS), "--n_threads", str(THREADS), "--port", str(self.port),
             "--host", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.wait()


@dataclass
class Turn:
    n: int
    ok: bool
    ttft_s: float | None
    wall_s: float
    prompt_sent: int | None  # what the client's usage says the prompt was
    prompt_processed: int | None  # what the server says it decoded of it
    completion: int
    tokens_per_s: float | None
    recalled: int  # sinkd: passages the turn recalled
    error: str = ""
    retained: int | None = None  # sinkd: cells its session retains after the turn


def one_turn(
    client: Any, server: Server, n: int, history: list[dict[str, str]]
) -> tuple[Turn, str]:
    t0 = time.perf_counter()
    ttft, text, usage, extra = None, [], None, {}
    try:
        stream = client.chat.completions.create(
            model="smollm2-135m-instruct" if server.name.startswith("sinkd") else "model",
            messages=history, max_tokens=MAX_TOKENS, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    ttft = ttft or time.perf_counter() - t0
                    text.append(choice.delta.content)
            usage = chunk.usage or usage
            extra.update(chunk.model_extra or {})
    except Exception as e:  # a peer's failure is data: counted, not hidden
        wall = time.perf_counter() - t0
        return Turn(
            n, False, None, wall, None, None, 0, None, 0, f"{type(e).__name__}: {e}"[:160]
        ), ""
    wall = time.perf_counter() - t0
    reply = "".join(text)
    completion = usage.completion_tokens if usage else len(text)
    sent = usage.prompt_tokens if usage else None
    processed = None
    if server.name.startswith("sinkd"):
        processed = sent  # the new tokens alone: the receipt's count
    elif "timings" in extra:
        processed = int(extra["timings"].get("prompt_n", 0))
    ours = extra.get("sinkd") or {}
    recalled = len((ours.get("recall") or {}).get("recalled") or [])
    retained = (ours.get("receipt") or {}).get("retained")
    rate = completion / (wall - ttft) if ttft and wall > ttft and completion > 1 else None
    ok = bool(reply.strip())
    return Turn(n, ok, ttft, wall, sent, processed, completion, rate, recalled,
                "" if ok else "empty reply", retained), reply  # fmt: skip


def conversation(server: Server) -> dict[str, Any]:
    import openai

    client = openai.OpenAI(base_url=server.base_url, api_key=server.key, max_retries=0,
                           timeout=600)  # fmt: skip
    history: list[dict[str, str]] = [{"role": "system", "content": "You are a helpful assistant."}]
    turns, final = [], ""
    for i, q in enumerate(questions(TURNS), start=1):
        ask = [*history, {"role": "user", "content": q}]
        turn, reply = one_turn(client, server, i, ask)
        turns.append(turn)
        if turn.ok:
            history = [*ask, {"role": "assistant", "content": reply}]
        final = reply if i == TURNS else final
        print(f"  {server.name} turn {i}: {'ok' if turn.ok else turn.error}", file=sys.stderr)
    assert server.proc is not None
    rss, peak = rss_mib(server.proc.pid)
    kv = server.cells * 23040 / 2**20  # SmolLM2: 30 layers x 2 x 3 heads x 64 x f16
    return {
        "server": server.name,
        "cells": server.cells,
        "kv_mib": kv,
        "rss_mib": rss,
        "peak_rss_mib": peak,
        "turns": [asdict(t) for t in turns],
        "failed": sum(not t.ok for t in turns),
        "final_answer_has_name": "ada" in final.lower(),
        "final_answer_has_city": "lisbon" in final.lower(),
    }


def compare(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    """From the first turn where the peer's context is full (its history past its cells, or its
    first failure): how often the peer failed, and how often sinkd's TTFT was lower."""
    full = next(
        (t["n"] for t in peer["turns"]
         if not t["ok"] or (t["prompt_sent"] or 0) + MAX_TOKENS > peer["cells"]),
        None,
    )  # fmt: skip
    if full is None:
        return {"peer": peer["server"], "full_from": None, "turns": 0, "peer_failed": 0,
                "sinkd_faster": 0}  # fmt: skip
    pairs = [(a, b) for a, b in zip(ours["turns"], peer["turns"], strict=True) if a["n"] >= full]
    faster = sum(
        1 for a, b in pairs if a["ok"] and (not b["ok"] or (a["ttft_s"] or 0) < (b["ttft_s"] or 0))
    )
    return {"peer": peer["server"], "full_from": full, "turns": len(pairs),
            "peer_failed": sum(not b["ok"] for _, b in pairs), "sinkd_faster": faster}  # fmt: skip


def recall_added(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each recall-on run of sinkd against the recall-off run: on the turns (2 on) where it
    recalled nothing, its TTFT over the same turn's with recall off; medians and maxima, over all
    such turns and over those after the window filled (the session held 90% of its cells)."""
    off = next((r for r in runs if r["server"] == "sinkd-recall-off"), None)
    if off is None:
        return []
    out = []
    for i, on in enumerate(r for r in runs if r["server"] == "sinkd"):
        pairs = [
            (a, b) for a, b in zip(on["turns"], off["turns"], strict=True)
            if a["n"] >= 2 and a["ok"] and b["ok"] and not a["recalled"] and a["ttft_s"]
            and b["ttft_s"]
        ]  # fmt: skip
        filled = next(  # the first turn after which the session held 90% of its cells
            (t["n"] for t in on["turns"] if (t["retained"] or 0) >= 0.9 * on["cells"]), TURNS
        )
        full = [(a, b) for a, b in pairs if a["n"] > filled]
        ratio = [a["ttft_s"] / b["ttft_s"] for a, b in pairs]
        full_ratio = [a["ttft_s"] / b["ttft_s"] for a, b in full]
        out.append({
            "run": i + 1, "turns": len(ratio),
            "median": round(statistics.median(ratio), 3) if ratio else None,
            "max": round(max(ratio), 3) if ratio else None,
            "full_turns": len(full_ratio),
            "full_median": round(statistics.median(full_ratio), 3) if full_ratio else None,
            "full_max": round(max(full_ratio), 3) if full_ratio else None,
            "recalling_turns": sum(1 for t in on["turns"] if t["recalled"]),
        })  # fmt: skip
    return out


SERVERS = {
    "sinkd": SinkdHttp,
    "sinkd-recall-off": lambda: SinkdHttp(recall=False),
    "llama-server": lambda: LlamaServer(CELLS),
    "llama-server-ctx": lambda: LlamaServer(TRAINED),
    "llama-cpp-python": LlamaCppPython,
}


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """TTFT against the turn number, one line per server (a failed turn: a cross on the axis),
    as a plain SVG (no plotting library needed)."""
    w, h, m = 720, 360, 50
    top = max([t["ttft_s"] or 0 for r in runs for t in r["turns"]] + [0.1]) * 1.1
    colours = ["#1f77b4", "#d62728", "#ff7f0e", "#2ca02c"]

    def xy(n: int, v: float) -> tuple[float, float]:
        return m + (n - 1) / max(TURNS - 1, 1) * (w - 2 * m), h - m - v / top * (h - 2 * m)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-size="11">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
           f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
           f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">turn</text>',
           f'<text x="12" y="{m - 12}">TTFT (s), {CELLS} cells; x: failed turn</text>']  # fmt: skip
    for k in range(5):
        v = top * k / 4
        _, y = xy(1, v)
        out.append(f'<text x="{m - 6}" y="{y + 4}" text-anchor="end">{v:.2f}</text>')
    for n in range(1, TURNS + 1, max(TURNS // 10, 1)):
        x, _ = xy(n, 0)
        out.append(f'<text x="{x}" y="{h - m + 14}" text-anchor="middle">{n}</text>')
    for i, r in enumerate(runs):
        c = colours[i % len(colours)]
        pts = [xy(t["n"], t["ttft_s"]) for t in r["turns"] if t["ok"] and t["ttft_s"]]
        if pts:
            line = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{line}"/>')
        for t in r["turns"]:
            if not t["ok"]:
                x, y = xy(t["n"], 0)
                out.append(f'<text x="{x}" y="{y - 2}" fill="{c}" text-anchor="middle">x</text>')
        out.append(f'<text x="{w - m - 120}" y="{m + 14 * i}" fill="{c}">{r["server"]}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out))


def main() -> None:
    default = ",".join(n for n in SERVERS if n != "sinkd-recall-off")
    wanted = os.environ.get("SINKD_LONG_CHAT_SERVERS", default).split(",")
    runs, missing = [], {}
    for name in wanted:
        try:
            server = SERVERS[name]()
        except (FileNotFoundError, RuntimeError) as e:
            missing[name] = str(e)
            print(f"{name}: not run: {e}", file=sys.stderr)
            continue
        try:
            runs.append(conversation(server))
        finally:
            server.stop()
    rows = []
    for r in runs:
        ok = [t for t in r["turns"] if t["ok"]]
        second = next((t["ttft_s"] for t in r["turns"] if t["n"] == 2 and t["ok"]), None)
        plain = [t["ttft_s"] for t in ok if not t["recalled"] and t["ttft_s"] and t["n"] >= 2]
        recalling = [t["ttft_s"] for t in ok if t["recalled"] and t["ttft_s"]]
        processed = [t["prompt_processed"] for t in ok if t["prompt_processed"] is not None]
        rows.append([
            r["server"], r["cells"], f"{len(ok)}/{len(r['turns'])}", second or "-",
            max(plain) if plain else "-", max(plain) / second if plain and second else "-",
            max(recalling) if recalling else "-", max(t["wall_s"] for t in ok) if ok else "-",
            sum(processed) if processed else "n/a", f"{r['kv_mib']:.0f}",
            f"{r['peak_rss_mib']:.0f}",
            f"{'name' if r['final_answer_has_name'] else '-'}/"
            f"{'city' if r['final_answer_has_city'] else '-'}",
        ])  # fmt: skip
    table(
        f"one conversation of {TURNS} turns, history resent, max_tokens {MAX_TOKENS}",
        ["server", "cells", "answered", "TTFT t2 s", "max TTFT s (no recall)", "/ t2",
         "max TTFT recalling s", "max wall s", "prompt tok processed", "KV MiB",
         "peak RSS MiB", "facts at end"],
        rows,
    )  # fmt: skip
    added = recall_added(runs)
    if added:
        table(
            "recall on against off: TTFT of the turns that recalled nothing / the same turn, recall off",
            ["recall-on run", "turns", "median", "max", "window full: turns", "median", "max"],
            [[a["run"], a["turns"], a["median"], a["max"], a["full_turns"], a["full_median"],
              a["full_max"]] for a in added],
        )  # fmt: skip
    ours = next((r for r in runs if r["server"] == "sinkd"), None)
    comparison = [
        compare(ours, peer) for peer in runs if ours and not peer["server"].startswith("sinkd")
    ]
    if comparison:
        table(
            "sinkd against each peer from the turn the peer's context is full",
            ["peer", "full from turn", "turns since", "peer failed", "sinkd faster"],
            [[c["peer"], c["full_from"] or "-", c["turns"], c["peer_failed"], c["sinkd_faster"]]
             for c in comparison],
        )  # fmt: skip
    name = "long_chat" if wanted == default.split(",") else "long_chat_" + "_".join(wanted)
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(runs, RESULTS / f"{name}_ttft.svg")
    print(write(name, {"turns": TURNS, "cells": CELLS, "max_tokens": MAX_TOKENS,
                              "runs": runs, "against_peers": comparison,
                              "recall_added": added,
                              "not_run": missing}))  # fmt: skip


if __name__ == "__main__":
    main()
