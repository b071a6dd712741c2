"""New chats that begin alike: sinkd's stored prefix states against llama-server's prompt cache,
same llama.cpp, same run.

    python bench/prefixes.py                -> bench/results/prefixes.json

SINKD_PEER_GPU_LAYERS offloads that many layers in both servers (bench/gpu_check.sh). Needs the
peer (`python bench/peer.py --build-only`) and, for Open WebUI's side requests, its task
templates as shipped: read from the open-webui 0.12.4 wheel, which it downloads once with
`pip download --no-deps` into ~/.cache/sinkd/open-webui (no install).

Every request goes over HTTP to /v1/chat/completions, streamed; time to first token is measured by
the client, tokens read by each server's own count (sinkd: `usage.prompt_tokens` less
`prompt_tokens_details.cached_tokens`; llama-server: `timings.prompt_n`). Three servers:
  - sinkd: tenants alice and bob, prefix states bounded at PREFIX_RAM_MB in RAM and
    PREFIX_DISK_MB on disk;
  - sinkd with prefix states off (`prefix_ram_mb = 0`): what each new chat read before;
  - llama-server as it ships (`--cache-ram` 8 GiB, slots auto), 4096 cells.
Workloads:
  1. a ~600-token system prompt: alice's first chat with it (read), alice's second chat with
     another first message (restored), bob's first chat with it (another tenant: sinkd reads it
     again, llama-server serves it from what alice left); ROUNDS system prompts;
  2. Open WebUI's side requests (title, tags, follow-ups) for CHATS chats of TURNS turns, as
     Open WebUI sends them: one user message, the task template with the chat so far.
Afterwards: each server's resident memory, and sinkd's prefix bytes against its bounds.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write
from peer import GPU_LAYERS, build, free_port, model_file

THREADS = int(os.environ.get("SINKD_PEER_THREADS", "2"))
ROUNDS = int(os.environ.get("SINKD_PREFIX_ROUNDS", "3"))
CHATS, TURNS = 3, 3
PREFIX_RAM_MB, PREFIX_DISK_MB = 64, 256
OWUI = "open-webui==0.12.4"
TOKENS = {"alice": "alice-bench-token", "bob": "bob-bench-token"}
MODEL = "smollm2-135m-instruct"


def system_prompt(round_: int) -> str:
    """~600 tokens: a deployment's assistant rules, different from its first words each round."""
    rules = [
        f"{i}. When asked about service {chr(65 + i % 26)}{i}, check its dashboard, quote the"
        f" relevant log line, and name the on-call owner of team {i % 7}."
        for i in range(18)
    ]
    return f"Deployment {round_} assistant. You help operators of the log pipeline.\n" + "\n".join(
        rules
    )


def owui_templates() -> dict[str, str]:
    """Open WebUI's default title, tags and follow-up templates, from its wheel as shipped."""
    cache = Path.home() / ".cache" / "sinkd" / "open-webui"
    wheels = sorted(cache.glob("open_webui-0.12.4-*.whl"))
    if not wheels:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", OWUI, "-d",
                        str(cache)], check=True)  # fmt: skip
        wheels = sorted(cache.glob("open_webui-0.12.4-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        source = z.read("open_webui/config.py").decode()
    wanted = {
        "title": "DEFAULT_TITLE_GENERATION_PROMPT_TEMPLATE",
        "tags": "DEFAULT_TAGS_GENERATION_PROMPT_TEMPLATE",
        "follow_ups": "DEFAULT_FOLLOW_UP_GENERATION_PROMPT_TEMPLATE",
    }
    found: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for kind, name in wanted.items():
                if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                    found[kind] = str(node.value.value)
    assert found.keys() == wanted.keys(), f"templates not found: {wanted.keys() - found.keys()}"
    return found


def render(template: str, messages: list[dict[str, str]]) -> str:
    """Open WebUI's {{MESSAGES:END:n}} (utils/task.py): the last n messages, 'ROLE: content'."""
    import re

    def messages_of(match: re.Match[str]) -> str:
        picked = messages[-int(match.group(1)) :]
        return "\n".join(f"{m['role'].upper()}: {m['content']}" for m in picked)

    return re.sub(r"\{\{MESSAGES:END:(\d+)\}\}", messages_of, template)


QUESTIONS = [
    "How do I rotate the logs of the ingest service without losing lines?",
    "Why does the parser drop lines longer than 64 KiB, and how do I raise the limit?",
    "Which metrics tell me that the shipper is falling behind the producers?",
]
REPLY = (
    "Rotate with copytruncate off: the shipper follows the file by inode, so rename the file,"
    " send the service SIGHUP to reopen it, and let the shipper drain the renamed file before it"
    " is compressed. Check the lag gauge afterwards; it should fall back to zero within a minute."
    " If it does not, the shipper lost its place and must be restarted with the saved offset."
)


def side_requests(templates: dict[str, str]) -> list[tuple[str, str]]:
    """Open WebUI's side requests of CHATS chats of TURNS turns, in order: after the first reply a
    title, tags and follow-ups; after each later reply, follow-ups."""
    out = []
    for c in range(CHATS):
        history: list[dict[str, str]] = []
        for t in range(TURNS):
            history.append({"role": "user", "content": f"{QUESTIONS[c]} (part {t + 1})"})
            history.append({"role": "assistant", "content": f"{REPLY} Step {t + 1} of {TURNS}."})
            kinds = ["title", "tags", "follow_ups"] if t == 0 else ["follow_ups"]
            out += [(k, render(templates[k], history)) for k in kinds]
    return out


class Server:
    """One server's process and port; `chat` streams a chat completion and measures it."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]

    def wait(self, url: str) -> None:
        """Until the server answers 200 (sinkd: 503 while it loads its model)."""
        deadline = time.monotonic() + 180
        auth = {"Authorization": f"Bearer {TOKENS['alice']}"}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.proc.returncode}")
            try:
                with urllib.request.urlopen(urllib.request.Request(url, headers=auth), timeout=1):
                    return
            except OSError:  # refused, or an HTTP error while loading
                time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not come up")

    def chat(self, tenant: str, messages: list[dict[str, str]]) -> dict[str, Any]:
        body = json.dumps({
            "model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True},
        }).encode()  # fmt: skip
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/chat/completions", data=body,
            headers={"Content-Type": "application/json",
                     "Authorization": f"Bearer {TOKENS[tenant]}"},
        )  # fmt: skip
        t0 = time.perf_counter()
        ttft, last = None, {}
        try:
            r = urllib.request.urlopen(req, timeout=600)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{self.name}: {e.code} {e.read().decode()[:300]}") from None
        with r:
            for line in r:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                choices = ev.get("choices") or []
                if ttft is None and choices and (choices[0].get("delta") or {}).get("content"):
                    ttft = time.perf_counter() - t0
                if ev.get("usage") or ev.get("timings"):
                    last = ev
        return {"ttft_s": ttft if ttft is not None else time.perf_counter() - t0,
                "read": self.read(last), "prompt": last.get("usage", {}).get("prompt_tokens")}  # fmt: skip

    def read(self, last: dict[str, Any]) -> int:
        raise NotImplementedError

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


class LlamaServer(Server):
    """As it ships, but for `--no-repack`: sinkd loads weights unrepacked too (engine/llama.py's
    NOTE), and on this machine's AMX CPU the repacked path crashes llama-server at load."""

    def __init__(self, binary: Path) -> None:
        self.name, self.port = "llama-server", free_port()
        self.proc = subprocess.Popen(
            [str(binary), "-m", str(model_file()), "-c", "4096", "-t", str(THREADS),
             "--port", str(self.port), "--host", "127.0.0.1", "--no-webui", "--no-repack",
             *(["-ngl", str(GPU_LAYERS)] if GPU_LAYERS else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.wait(f"http://127.0.0.1:{self.port}/health")

    def read(self, last: dict[str, Any]) -> int:
        return int(last["timings"]["prompt_n"])


class Sinkd(Server):
    def __init__(self, name: str, prefix_ram_mb: int, extra: str = "") -> None:
        self.name, self.port = name, free_port()
        self.tmp = Path(tempfile.mkdtemp())
        self.metrics_port = free_port()
        tenants = "".join(
            f'[[tenants]]\nname = "{t}"\ntoken_sha256 = "{hashlib.sha256(k.encode()).hexdigest()}"\n'
            for t, k in TOKENS.items()
        )
        config = self.tmp / "sinkd.toml"
        config.write_text(
            f"prefix_ram_mb = {prefix_ram_mb}\nprefix_disk_mb = {PREFIX_DISK_MB}\n"
            f"metrics_port = {self.metrics_port}\n{extra}{tenants}"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sinkd.cli.main", "serve", "--config", str(config),
             "--socket", str(self.tmp / "sinkd.sock"), "--http", f"127.0.0.1:{self.port}",
             "--state-dir", str(self.tmp / "state"), "--threads", str(THREADS),
             *(["--gpu-layers", str(GPU_LAYERS)] if GPU_LAYERS else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.wait(f"http://127.0.0.1:{self.port}/health")

    def read(self, last: dict[str, Any]) -> int:
        usage = last["usage"]
        return int(usage["prompt_tokens"]) - int(usage["prompt_tokens_details"]["cached_tokens"])

    def prefix_bytes(self) -> dict[str, int]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("sinkd_prefix_bytes{"):
                tier = line.split('tier="')[1].split('"')[0]
                out[tier] = int(float(line.split()[-1]))
        return out


def system_workload(server: Server) -> list[dict[str, Any]]:
    rows = []
    for r in range(ROUNDS):
        system = {"role": "system", "content": system_prompt(r)}
        for case, tenant, message in (
            ("first chat (read)", "alice", "Which service failed first tonight?"),
            ("same tenant, new chat", "alice", "Who owns the parser, and where is its dashboard?"),
            ("other tenant, new chat", "bob", "Who owns the parser, and where is its dashboard?"),
        ):
            m = server.chat(tenant, [system, {"role": "user", "content": message}])
            rows.append({"server": server.name, "round": r, "case": case, **m})
    return rows


def side_workload(server: Server, requests: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [
        {"server": server.name, "kind": kind, **server.chat("alice", [{"role": "user", "content": text}])}
        for kind, text in requests
    ]  # fmt: skip


def main() -> None:
    binary = build()["llama-server"]
    # SINKD_PREFIX_SIDE=0: no side requests (a machine without the registry: the GPU check)
    with_side = os.environ.get("SINKD_PREFIX_SIDE", "1") != "0"
    requests = side_requests(owui_templates()) if with_side else []
    rows: list[dict[str, Any]] = []
    side: list[dict[str, Any]] = []
    memory: dict[str, Any] = {}
    for make in (
        lambda: Sinkd("sinkd", PREFIX_RAM_MB),
        lambda: Sinkd("sinkd, prefix states off", 0),
        lambda: LlamaServer(binary),
    ):
        server = make()
        try:
            rows += system_workload(server)
            side += side_workload(server, requests)
            memory[server.name] = {"rss_mib": round(server.rss_mib(), 1)}
            if isinstance(server, Sinkd) and server.name == "sinkd":
                memory[server.name]["prefix_bytes"] = server.prefix_bytes()
        finally:
            server.stop()

    def med(server: str, case: str, key: str) -> float:
        return statistics.median(
            r[key] for r in rows if r["server"] == server and r["case"] == case
        )

    names = ["sinkd", "sinkd, prefix states off", "llama-server"]
    cases = ["first chat (read)", "same tenant, new chat", "other tenant, new chat"]
    table(
        f"a new chat whose ~600-token system prompt was used before (median of {ROUNDS})",
        ["server", "case", "TTFT s", "tokens read"],
        [[n, c, med(n, c, "ttft_s"), med(n, c, "read")] for n in names for c in cases],
    )
    restored, cold = med("sinkd", cases[1], "ttft_s"), med("sinkd", cases[0], "ttft_s")
    peer = med("llama-server", cases[1], "ttft_s")
    ratios = {
        "sinkd restored / sinkd read": restored / cold,
        "sinkd restored / llama-server cached": restored / peer,
        "sinkd other tenant / sinkd read": med("sinkd", cases[2], "ttft_s") / cold,
        "llama-server other tenant / llama-server cached": med("llama-server", cases[2], "ttft_s")
        / peer,
    }
    table("ratios, same run", ["ratio", "value"], [[k, v] for k, v in ratios.items()])

    kinds = ["title", "tags", "follow_ups"]

    def total(server: str, kind: str, key: str) -> float:
        return sum(r[key] for r in side if r["server"] == server and r["kind"] == kind)

    side_saved = None
    if requests:
        table(
            f"Open WebUI's side requests ({len(requests)}: {CHATS} chats of {TURNS} turns): tokens"
            " read and summed TTFT",
            ["server", *[f"{k} read" for k in kinds], "all read", "all TTFT s"],
            [[n, *[total(n, k, "read") for k in kinds], sum(total(n, k, "read") for k in kinds),
              sum(total(n, k, "ttft_s") for k in kinds)] for n in names],
        )  # fmt: skip
        side_saved = 1 - sum(total("sinkd", k, "read") for k in kinds) / sum(
            total("sinkd, prefix states off", k, "read") for k in kinds
        )
        print(
            f"side requests: sinkd read {side_saved:.0%} fewer tokens than with prefix states off"
        )
    held = memory["sinkd"]["prefix_bytes"]
    table(
        "memory afterwards",
        ["server", "RSS MiB", "prefix RAM MiB (bound)", "prefix disk MiB (bound)"],
        [[n, memory[n]["rss_mib"],
          f"{held.get('ram', 0) / 2**20:.1f} ({PREFIX_RAM_MB})" if n == "sinkd" else "-",
          f"{held.get('disk', 0) / 2**20:.1f} ({PREFIX_DISK_MB})" if n == "sinkd" else "-"]
         for n in names],
    )  # fmt: skip
    path = write(
        "prefixes",
        {"rounds": ROUNDS, "threads": THREADS, "system_prompt": rows, "side_requests": side,
         "ratios": ratios, "side_requests_fewer_tokens": side_saved, "memory": memory,
         "bounds_mib": {"ram": PREFIX_RAM_MB, "disk": PREFIX_DISK_MB}},
    )  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
