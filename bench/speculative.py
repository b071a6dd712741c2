"""Speculative decoding, on and off, in the same run: `sinkd serve` in its default configuration
(the default model, 1,024 cells, durable), once with `speculative = "off"` and once with "auto",
each workload through the client a user would run:

- chat: the default model's chat turns (gRPC Chat, its recommended sampling, seeded), a conversation;
- narrate: the real `sinkd narrate` over this machine's /var/log/dpkg.log;
- json: the logins in a dozen log lines extracted under a JSON schema, through the openai SDK
  (`response_format`, the HTTP front): structured output copying its input;
- code: a code-editing request (gRPC Chat): the reply restates most of the code it was given;
- log, log_sampled: a service's log lines continued (gRPC Append, then Generate: no chat
  template), greedy and sampled (temperature 0.7, top-k 40, top-p 0.95, seeded);
- records, records_sampled: JSON records, one a line, continued the same way;
- list_sampled: a numbered list of prose items asked for (gRPC Chat, the chat sampling), and list,
  the same greedy.

Each round starts both daemons and runs every workload as PAIRS pairs: on one daemon, then on
the other once the first has finished its work after the reply (`Daemon.settle`), who goes first
turned round pair by pair (off-on, on-off, ...) and by workload and round. This machine's speed
drifts by 10-15% over minutes and a single 2-second run swings by as much, while two runs back
to back mostly agree within a few percent: so the wall's gain is the median of the pairs' ratios
(since 2026-12-07: 3 rounds of 2 pairs, six pairs a workload).
Tokens/s is decode speed, from the daemon's own inter-token latency histogram (its sum is the
wall time from each reply's first token to its last), read before and after each workload.
"In run" is drafting's gain within the same run, free of the drift between the two: the tokens
the session's passes yielded at what a one-row pass after a one-row pass of that run cost (since
2026-12-07: one after a verification's pass rebuilds llama.cpp's graph, ~0.9 ms, a cost of the
drafts), over what its passes cost (`sinkd_solo_passes_total`, `sinkd_solo_pass_seconds_total` by
rows, less `sinkd_solo_rebuilt_pass*`: llama_decode alone, not the lookup's ~50 us a token or a
verification's Python).
Acceptance and draft length come from `sinkd_draft_tokens_total` and `sinkd_verifications_total`.
Same tokens: the gRPC replies' token ids, the narrator's printed output and the JSON replies'
text and token counts, compared between the two runs.

    python bench/speculative.py [--quick]   -> bench/results/speculative[_quick].json
    SINKD_BENCH_WORKLOADS=chat,json python bench/speculative.py -> results/speculative_some.json
    SINKD_BENCH_ROUNDS (3), SINKD_BENCH_PAIRS (pairs a workload a round: 2; --quick 1 and 1)

Its last line is a JSON object: `speedup` per workload (tok/s on over off) and `same_tokens`.
One-session speed against llama-server (plain and with its own ngram drafts) is bench/peer.py
--solo-only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import table, write

QUICK = "--quick" in sys.argv[1:]
ROUNDS = 1 if QUICK else int(os.environ.get("SINKD_BENCH_ROUNDS", "3"))
PAIRS = 1 if QUICK else int(os.environ.get("SINKD_BENCH_PAIRS", "2"))
LOG = Path("/var/log/dpkg.log")
LOG_LINES = 400 if QUICK else 520  # past line 520 its intervals are quiet: nothing printed
NARRATE_EVERY = 40  # lines an interval
SEED = 7
CHAT = [
    "Hi! I'm planning a weekend in Lisbon in October. What should I see?",
    "Which of those are good for a rainy day?",
    "And where could I eat well near the river?",
    "Thanks. Can you give me a short plan for Saturday?",
]
CODE = """Rename the variable `total` to `order_total` in this function and return the whole function:

def checkout(cart, coupon=None):
    total = 0
    for item in cart.items:
        price = item.unit_price * item.quantity
        if item.taxable:
            price = price * 1.2
        total = total + price
    if coupon is not None and coupon.valid:
        total = total - coupon.amount
    if total < 0:
        total = 0
    cart.total = total
    return total
"""
LOGINS = "".join(
    f"Dec  5 10:{i:02d}:{7 * i % 60:02d} web sshd[{1000 + 37 * i}]: Accepted publickey for"
    f" {('alice', 'bob', 'carol', 'dave')[i % 4]} from 10.0.{i % 3}.{20 + i} port {40000 + 113 * i}\n"
    for i in range(12)
)
EVENTS = {
    "type": "object",
    "properties": {
        "logins": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "time": {"type": "string"},
                    "user": {"type": "string"},
                    "address": {"type": "string"},
                    "port": {"type": "integer"},
                },
                "required": ["time", "user", "address", "port"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["logins"],
    "additionalProperties": False,
}
JSON_ASK = f"Extract every login from these log lines as JSON:\n{LOGINS}"
SERVICE_LOG = "".join(
    f"2026-12-05T10:{i // 6:02d}:{7 * i % 60:02d}Z api[{311 + i % 3}]: {method} /v1/{path} {status}"
    f" {12 + 17 * i % 230}ms user={('alice', 'bob', 'carol')[i % 3]} bytes={800 + 97 * i}\n"
    for i, (method, path, status) in enumerate(
        [("GET", "orders", 200), ("POST", "orders", 201), ("GET", "users/42", 200),
         ("GET", "orders", 304), ("DELETE", "carts/7", 204), ("GET", "health", 200)] * 5
    )
)  # fmt: skip
RECORDS = "".join(
    json.dumps({"id": 1000 + i, "user": ("alice", "bob", "carol", "dave")[i % 4],
                "action": ("login", "view", "buy", "logout")[i % 4], "items": i % 3,
                "total": round(9.5 * (i % 5), 2)}) + "\n"
    for i in range(16)
)  # fmt: skip
LIST_ASK = "Write a numbered list of 15 short tips for keeping a small vegetable garden healthy."
COUNTED = {  # the daemon's samples read, by the name used here
    "sinkd_inter_token_latency_seconds_sum": "itl_sum",
    "sinkd_inter_token_latency_seconds_count": "tokens",
    'sinkd_draft_tokens_total{outcome="accepted"}': "accepted",
    'sinkd_draft_tokens_total{outcome="rejected"}': "rejected",
    "sinkd_verifications_total": "verifications",
}


SOLO = "sinkd_solo_"
REBUILT = "sinkd_solo_rebuilt_passes_total"


def engine_gain(delta: dict[str, float], accepted: float, plain_rebuilt: float = 0) -> float | None:
    """Drafting's gain within the run, free of the machine's drift between two runs: the
    tokens the session's passes yielded, at what a one-row pass of this same run cost, over
    what its passes cost (1.0 where nothing was drafted). `plain_rebuilt`: the one-row passes that
    built llama.cpp's graph again in the run without drafts (the first after each prefill),
    charged at their own cost here too: they are not the drafts'."""

    def by_rows(kind: str) -> dict[int, float]:
        prefix = f'sinkd_solo_{kind}_total{{rows="'
        return {int(k[len(prefix) : -2]): v for k, v in delta.items() if k.startswith(prefix)}

    passes, seconds = by_rows("passes"), by_rows("pass_seconds")
    # a plain token's pass: one after a one-row pass (llama.cpp's graph reused); one after a
    # verification builds it again, a cost of drafting (bench/README.md, "speculative.py")
    rebuilt = delta.get("sinkd_solo_rebuilt_passes_total", 0)
    steady = passes.get(1, 0) - rebuilt
    if steady <= 0:
        return None
    one_row = (seconds[1] - delta.get("sinkd_solo_rebuilt_pass_seconds_total", 0.0)) / steady
    rebuilt_cost = (
        delta.get("sinkd_solo_rebuilt_pass_seconds_total", 0.0) / rebuilt if rebuilt else 0
    )
    plain = min(plain_rebuilt, rebuilt)
    yielded = (sum(passes.values()) + accepted - plain) * one_row + plain * rebuilt_cost
    return yielded / sum(seconds.values())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    """`sinkd serve` with its defaults, but for `speculative`, a metrics port and an HTTP port."""

    def __init__(self, speculative: str) -> None:
        self.tmp = Path(tempfile.mkdtemp())
        self.sock = self.tmp / "sinkd.sock"
        self.metrics_port, self.http_port = free_port(), free_port()
        env = {
            **os.environ,
            "SINKD_SPECULATIVE": speculative,
            "SINKD_METRICS_PORT": str(self.metrics_port),
            "SINKD_HTTP": f"127.0.0.1:{self.http_port}",
            "SINKD_STATE_DIR": str(self.tmp / "state"),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sinkd.cli.main", "serve", "--socket", str(self.sock)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
        )  # fmt: skip
        from sinkd.daemon.rpc.client import daemon_answers

        deadline = time.monotonic() + 120
        while not daemon_answers(f"unix:{self.sock}"):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("sinkd serve did not start")
            time.sleep(0.2)
        self.env = env
        self.key = (self.tmp / "http-token").read_text().strip()  # beside the socket

    def metrics(self) -> dict[str, float]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name in COUNTED:
                out[COUNTED[name]] = float(value)
            elif name.startswith(SOLO):  # sinkd_solo_[rebuilt_]pass[es|_seconds]_total...
                out[name] = float(value)
        return out

    def cpu_seconds(self) -> float:
        """The daemon's CPU time so far, every thread's (utime + stime, /proc)."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def settle(self, quiet: float = 0.02, every: float = 0.25, limit: float = 15.0) -> float:
        """Wait until the daemon's work after a reply is done (a closed session's files, an idle
        snapshot, the recall index): less than `quiet` of a core for two looks `every` apart, so
        that none of it runs beside the other daemon's run. A pair's second run read ~5% slower
        than its first whichever daemon it was (2026-12-07); waiting (0.5-1.8 s) did not change
        that, so the cause is elsewhere. Returns the seconds waited."""
        started, last, calm = time.monotonic(), self.cpu_seconds(), 0
        while calm < 2 and time.monotonic() - started < limit:
            time.sleep(every)
            now = self.cpu_seconds()
            calm = calm + 1 if now - last < quiet * every else 0
            last = now
        return time.monotonic() - started

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def chat_turns(d: Daemon, messages: list[str], max_tokens: int) -> list[list[int]]:
    """One session, a turn per message, seeded: each reply's ids."""
    from sinkd.daemon.models.registry import load_lock
    from sinkd.daemon.rpc.client import Client
    from sinkd.proto.v1 import sinkd_pb2 as pb

    s = Client(f"unix:{d.sock}").s
    h = s.Create(pb.CreateSessionRequest(policy=pb.Policy(name="sink", fill_window=True))).handle
    # the model's recommended chat sampling, as a chat turn takes it, with a seed of our own
    # (a turn's own seed comes from its session's generation: another in each run)
    sampling = pb.Sampling(**dict(load_lock().get(None).sampling), seed=SEED)
    replies = []
    for message in messages:
        ids = []
        request = pb.ChatRequest(
            handle=h, message=message, max_tokens=max_tokens, sampling=sampling
        )
        for ev in s.Chat(request):
            if ev.HasField("token"):
                ids.append(ev.token.id)
        replies.append(ids)
    s.Close(pb.HandleRequest(handle=h))
    return replies


def chat_sampling(sampled: bool) -> Any:
    """The default model's chat sampling with our seed, or greedy."""
    from sinkd.daemon.models.registry import load_lock
    from sinkd.proto.v1 import sinkd_pb2 as pb

    if not sampled:
        return pb.Sampling(temperature=0.0, seed=SEED)
    return pb.Sampling(**dict(load_lock().get(None).sampling), seed=SEED)


def plain_sampling(sampled: bool, seed: int = SEED) -> Any:
    """A continuation's sampling: greedy, or temperature 0.7 with top-k 40 and top-p 0.95, seeded
    and without a repetition penalty (which would steer a log away from its own lines)."""
    from sinkd.proto.v1 import sinkd_pb2 as pb

    if not sampled:
        return pb.Sampling(temperature=0.0, seed=seed)
    return pb.Sampling(temperature=0.7, top_k=40, top_p=0.95, seed=seed)


def continued(
    d: Daemon, text: str, max_tokens: int, sampled: bool, times: int = 1
) -> list[list[int]]:
    """Raw text read into a fresh session (no chat template), then continued, `times` times
    with seeds of their own (a sampled continuation may end early): the ids of each."""
    from sinkd.daemon.rpc.client import Client
    from sinkd.proto.v1 import sinkd_pb2 as pb

    s = Client(f"unix:{d.sock}").s
    out = []
    for i in range(times):
        policy = pb.Policy(name="sink", fill_window=True)
        h = s.Create(pb.CreateSessionRequest(policy=policy)).handle
        s.Append(pb.AppendRequest(handle=h, text=text))
        request = pb.GenerateRequest(
            handle=h, max_tokens=max_tokens, sampling=plain_sampling(sampled, SEED + i)
        )
        out.append([ev.token.id for ev in s.Generate(request) if ev.HasField("token")])
        s.Close(pb.HandleRequest(handle=h))
    return out


def listed(d: Daemon, sampled: bool) -> list[int]:
    """A numbered list asked for in a chat turn: the reply's ids."""
    from sinkd.daemon.rpc.client import Client
    from sinkd.proto.v1 import sinkd_pb2 as pb

    s = Client(f"unix:{d.sock}").s
    h = s.Create(pb.CreateSessionRequest(policy=pb.Policy(name="sink", fill_window=True))).handle
    request = pb.ChatRequest(
        handle=h, message=LIST_ASK, max_tokens=300, sampling=chat_sampling(sampled)
    )
    ids = [ev.token.id for ev in s.Chat(request) if ev.HasField("token")]
    s.Close(pb.HandleRequest(handle=h))
    return ids


def json_replies(d: Daemon, n: int) -> list[Any]:
    import openai

    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{d.http_port}/v1", api_key=d.key, max_retries=0
    )
    out = []
    for i in range(n):
        reply = client.chat.completions.create(
            model="smollm2-135m-instruct",
            messages=[{"role": "user", "content": JSON_ASK + "\n" * i}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "logins", "schema": EVENTS, "strict": True},
            },
            max_tokens=600,
            seed=SEED,
        )
        usage = reply.usage.completion_tokens if reply.usage else None
        out.append([reply.choices[0].message.content, usage])
    return out


def narrate(d: Daemon) -> list[str]:
    """The real `sinkd narrate`, fed an interval's lines at a time: each next batch once the last
    is printed, intervals cut by line counts alone (no clock), so that both runs phrase the same
    intervals; its output without the timestamps."""
    lines = LOG.read_text(errors="replace").splitlines(keepends=True)[:LOG_LINES]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sinkd.cli.main", "narrate", "--connect", f"unix:{d.sock}",
         "--every-lines", str(NARRATE_EVERY), "--incident-lines", "100000",
         "--every-seconds", "100000", "--incident-seconds", "100000", "--gap-seconds", "100000"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**d.env, "PYTHONUNBUFFERED": "1"}, text=True,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    out: list[str] = []
    for start in range(0, len(lines) - NARRATE_EVERY + 1, NARRATE_EVERY):
        proc.stdin.write("".join(lines[start : start + NARRATE_EVERY]))
        proc.stdin.flush()
        header = f"Log lines {start + 1}-{start + NARRATE_EVERY}:"
        while True:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(proc.stderr.read() if proc.stderr else "narrate ended")
            out.append(line.split(" ", 1)[1] if line[:4].isdigit() else line)  # no timestamp
            if header in line:
                break
    proc.stdin.close()
    out += [line for line in proc.stdout]
    if proc.wait(120) != 0:
        raise RuntimeError(proc.stderr.read() if proc.stderr else "narrate failed")
    return out


WORKLOADS = {
    "chat": lambda d: chat_turns(d, CHAT if not QUICK else CHAT[:3], 200),
    "narrate": narrate,
    "json": lambda d: json_replies(d, 1 if QUICK else 3),
    "code": lambda d: chat_turns(d, [CODE], 400),
    "log": lambda d: continued(d, SERVICE_LOG, 200, False),
    "log_sampled": lambda d: continued(d, SERVICE_LOG, 200, True, 2),
    "records": lambda d: continued(d, RECORDS, 200, False),
    "records_sampled": lambda d: continued(d, RECORDS, 200, True, 6),
    "list": lambda d: listed(d, False),
    "list_sampled": lambda d: listed(d, True),
}


# SINKD_BENCH_WORKLOADS=chat,narrate: those alone (results/speculative_some.json), for more rounds
# of the ones in doubt than a whole run affords
CHOSEN = [w for w in os.environ.get("SINKD_BENCH_WORKLOADS", "").split(",") if w]
if unknown := set(CHOSEN) - set(WORKLOADS):
    raise SystemExit(f"SINKD_BENCH_WORKLOADS: no workload {sorted(unknown)}; {sorted(WORKLOADS)}")
if CHOSEN:
    WORKLOADS = {name: WORKLOADS[name] for name in CHOSEN}


def run_workload(d: Daemon, name: str) -> dict[str, Any]:
    """One workload on one daemon: its decode speed and drafts, from the daemon's metrics."""
    before = d.metrics()
    result = WORKLOADS[name](d)
    after = d.metrics()
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in {*COUNTED.values(), *after}}
    drafted = delta["accepted"] + delta["rejected"]
    return {
        "tokens": int(delta["tokens"]),
        "tok_s": delta["tokens"] / delta["itl_sum"],
        "engine_gain": None,  # the pair's (measure_round)
        "delta": delta,
        "accepted": delta["accepted"],
        "acceptance": delta["accepted"] / drafted if drafted else None,
        "draft_length": drafted / delta["verifications"] if delta["verifications"] else None,
        "verifications": int(delta["verifications"]),
        "result": result,
    }


def measure_round(rnd: int) -> list[dict[str, Any]]:
    """Both daemons up at once (the idle one waits without decoding), each workload run on one
    then the other back to back, PAIRS times, who goes first turned round pair by pair and by
    workload and round: this machine's speed drifts by 10-15% over minutes, and a pair minutes
    apart would measure that."""
    daemons = {mode: Daemon(mode) for mode in ("off", "auto")}
    pairs: list[dict[str, Any]] = []
    try:
        for i, name in enumerate(WORKLOADS):
            for pair in range(PAIRS):
                order = ("off", "auto") if (i + rnd + pair) % 2 == 0 else ("auto", "off")
                runs = {}
                for mode in order:
                    runs[mode] = r = run_workload(daemons[mode], name)
                    r["settled_s"] = daemons[mode].settle()  # before the other daemon's run
                    print(f"{mode} {name}: {r['tok_s']:.1f} tok/s over {r['tokens']} tokens",
                          flush=True)  # fmt: skip
                off, on = runs["off"], runs["auto"]
                on["engine_gain"] = engine_gain(on.pop("delta"), on["accepted"],
                                                off["delta"].get(REBUILT, 0))  # fmt: skip
                del off["delta"], off["engine_gain"]
                pairs.append({"workload": name, "round": rnd, "pair": pair, "first": order[0],
                              "off": off, "auto": on})  # fmt: skip
    finally:
        for d in daemons.values():
            d.stop()
    return pairs


def main() -> None:
    pairs: list[dict[str, Any]] = []
    for rnd in range(ROUNDS):
        pairs += measure_round(rnd)
    speedup: dict[str, float] = {}
    in_run: dict[str, float] = {}
    same = True
    rows = []
    for name in WORKLOADS:
        ratios, gains = [], []
        mine = [p for p in pairs if p["workload"] == name]
        for p in mine:
            on, off = p["auto"], p["off"]
            ratios.append(on["tok_s"] / off["tok_s"])
            gains.append(on["engine_gain"] or 1.0)
            alike = on["result"] == off["result"]
            same = same and alike
            rows.append([name, f"{p['round']}.{p['pair']}", p["first"], off["tok_s"], on["tok_s"],
                         ratios[-1], gains[-1],
                         on["acceptance"] if on["acceptance"] is not None else "-",
                         on["draft_length"] if on["draft_length"] is not None else "-",
                         on["tokens"], alike])  # fmt: skip
        speedup[name] = statistics.median(ratios)
        in_run[name] = statistics.median(gains)
    table(
        "speculative decoding, same run: sinkd serve's defaults, decode tok/s (the daemon's ITL)",
        ["workload", "round.pair", "first", "off tok/s", "on tok/s", "on / off", "in run",
         "acceptance", "draft length", "tokens", "same tokens"],
        rows,
    )  # fmt: skip
    table(
        f"medians of {ROUNDS * PAIRS} pairs a workload",
        ["workload", "on / off (wall)", "in run"],
        [[name, speedup[name], in_run[name]] for name in WORKLOADS],
    )
    name = "speculative_quick" if QUICK else "speculative_some" if CHOSEN else "speculative"
    kept = {"rounds": ROUNDS, "pairs_a_round": PAIRS, "pairs": pairs, "speedup": speedup,
            "in_run": in_run}  # fmt: skip
    print(f"wrote {write(name, {**kept, 'same_tokens': same})}")
    print(json.dumps({"speedup": speedup, "in_run": in_run, "same_tokens": same}))


if __name__ == "__main__":
    main()
