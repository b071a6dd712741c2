"""Three `sinkd serve` nodes behind a real HAProxy (Debian's haproxy 2.6), as `sinkd nodes init`
writes them, six tenants talking over HTTP (the openai SDK) and gRPC:

- every request of a tenant reaches the same node (the proxy's `x-sinkd-node`, on every answer);
- kill -9 of a node: the other tenants notice nothing; the killed node's HTTP conversations go on
  on another node, rebuilt from the history their clients resend, and still know a fact of their
  first turn; its gRPC sessions answer UNAVAILABLE until it is back, then resume bit for bit, and
  its HTTP conversations come back to their own sessions (`caught-up`);
- `sinkd nodes drain` moves every session of a node to the node the ring now sends its tenant to,
  each going on there with the logits it had, and stops the node.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import openai
import pytest

from sinkd.cli import deployment as deploy
from sinkd.cli.haproxy import RuntimeApi
from sinkd.daemon.rpc.client import CHANNEL_OPTIONS
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc
from tests.support.disk import holders, token_needles

HAPROXY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        HAPROXY is None,
        reason="haproxy is not installed (`apt-get install haproxy`; .ci/run installs it)",
    ),
]

MODEL = "smollm2-135m-instruct"
TENANTS = ["alice", "bob", "carol", "dave", "erin", "frank"]
ADMIN_TOKEN = "admin-secret"
FACT = "My name is Ada and the secret code is 4417. Say OK."
ASK = "What is the secret code?"


def token(tenant: str) -> str:
    return f"token-of-{tenant}"


def free_block(n: int) -> int:
    """A first port with the n after it free on loopback."""
    for _ in range(200):
        base = 20000 + int.from_bytes(os.urandom(2), "big") % 30000
        try:
            held = []
            for p in range(base, base + n):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise AssertionError("no free block of ports")


def wait_for(what: str, check: Any, deadline_s: float = 120.0) -> None:
    end = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {deadline_s:g} s")
        time.sleep(0.1)


@dataclass
class Cluster:
    folder: Path
    d: deploy.Deployment
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    haproxy: subprocess.Popen[bytes] | None = None

    def start_node(self, name: str) -> None:
        env = dict(os.environ, SINKD_N_THREADS="1")
        env.pop("SINKD_HTTP", None)
        for line in (self.folder / "nodes" / f"{name}.env").read_text().splitlines():
            k, _, v = line.partition("=")
            env[k] = v
        log = (self.folder / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "sinkd.cli.main", "serve"], stdout=log, stderr=log, env=env
        )

    def proxy(self) -> RuntimeApi:
        return RuntimeApi(self.d.admin_socket)

    def status(self, name: str) -> str:
        try:
            return self.proxy().status(name)
        except Exception:  # the proxy not up yet
            return "?"

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("deployment")
    admin = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
    tenants = "".join(
        f'[[tenants]]\nname = "{t}"\ntoken_sha256 = "{deploy.route_key(token(t))}"\n'
        + ("memory_across_conversations = true\n" if t == "alice" else "")
        for t in TENANTS
    )
    base = folder / "base.toml"
    base.write_text(
        f'admin_token_sha256 = "{admin}"\nn_ctx_seq = 512\nmax_sessions = 12\n'
        f"http_window = 480\nprefix_min_tokens = 16\n{tenants}"
    )
    first = free_block(10)
    subprocess.run(
        [sys.executable, "-m", "sinkd.cli.main", "nodes", "init", str(folder), "--nodes", "3",
         "--base-config", str(base), "--proxy-http", f"127.0.0.1:{first}",
         "--proxy-grpc", f"127.0.0.1:{first + 1}", "--first-port", str(first + 2)],
        check=True, capture_output=True,
    )  # fmt: skip
    (folder / "run").mkdir(exist_ok=True)
    c = Cluster(folder, deploy.load(folder / "deployment.toml"))
    for name in c.d.names:
        c.start_node(name)
    c.haproxy = subprocess.Popen(
        [HAPROXY, "-f", str(folder / "haproxy.cfg")],
        stdout=subprocess.DEVNULL, stderr=(folder / "haproxy.log").open("ab"),
    )  # fmt: skip
    try:
        for name in c.d.names:
            wait_for(f"{name} UP in HAProxy", lambda n=name: c.status(n) == "UP")
        yield c
    finally:
        for p in [*c.procs.values(), c.haproxy]:
            p.kill()
            p.wait(30)


class Tenant:
    """One tenant's two clients through the proxy: the openai SDK (an HTTP conversation) and
    gRPC (a session of its own); every answer's node is recorded."""

    def __init__(self, c: Cluster, name: str) -> None:
        self.name = name
        self.sdk = openai.OpenAI(
            base_url=f"http://{c.d.proxy_http}/v1", api_key=token(name), max_retries=0
        )
        self.channel = grpc.insecure_channel(c.d.proxy_grpc, options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.SessionsStub(self.channel)  # type: ignore[no-untyped-call]
        self.md = [("authorization", f"Bearer {token(name)}")]
        self.history: list[dict[str, str]] = []
        self.nodes: list[str] = []  # the node of every answer, in order
        self.handle: pb.Handle | None = None  # its gRPC session

    # --- HTTP ---

    def say(self, text: str) -> tuple[str, dict[str, str]]:
        raw = self.sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=[*self.history, {"role": "user", "content": text}],
            max_tokens=10, temperature=0,
        )  # fmt: skip
        reply = raw.parse().choices[0].message.content or ""
        self.history += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        headers = {k.lower(): v for k, v in raw.headers.items()}
        self.nodes.append(headers["x-sinkd-node"])
        return reply, headers

    # --- gRPC ---

    def _unary(self, method: str, request: Any) -> Any:
        response, call = getattr(self.stub, method).with_call(request, metadata=self.md)
        self.nodes.append(dict(call.initial_metadata())["x-sinkd-node"])
        return response

    def create(self) -> None:
        policy = pb.Policy(name="sink", sinks=4, window=120)
        self.handle = self._unary("Create", pb.CreateSessionRequest(policy=policy)).handle

    def append(self, text: str) -> None:
        self._unary("Append", pb.AppendRequest(handle=self.handle, text=text))

    def generate(self, n: int = 4) -> list[int]:
        stream = self.stub.Generate(
            pb.GenerateRequest(handle=self.handle, max_tokens=n), metadata=self.md
        )
        self.nodes.append(dict(stream.initial_metadata())["x-sinkd-node"])
        return [ev.token.id for ev in stream if ev.HasField("token")]

    def logits(self, handle: pb.Handle | None = None) -> np.ndarray:
        r = self._unary(
            "Inspect", pb.InspectRequest(handle=handle or self.handle, include_logits=True)
        )
        return np.frombuffer(r.logits, dtype="<f4").copy()

    def code(self, handle: pb.Handle | None = None) -> grpc.StatusCode:
        with pytest.raises(grpc.RpcError) as err:
            self.stub.Inspect(pb.InspectRequest(handle=handle or self.handle), metadata=self.md)
        return err.value.code()


def test_three_nodes_behind_haproxy_kill_9_and_drain(cluster: Cluster) -> None:
    c = cluster
    tenants = {t: Tenant(c, t) for t in TENANTS}
    conversations: dict[str, pb.Handle] = {}
    for t in tenants.values():
        reply, h = t.say(FACT)
        conversations[t.name] = pb.Handle(
            session_id=h["x-sinkd-session"], generation=h["x-sinkd-generation"]
        )
        t.create()
        t.append("The bees of the valley make a dark honey in the autumn.")
        t.generate()
    home = {t.name: t.nodes[0] for t in tenants.values()}
    for t in tenants.values():  # one node per tenant, both protocols
        assert set(t.nodes) == {home[t.name]}, (t.name, t.nodes)
        assert t.handle is not None and t.handle.session_id.startswith(f"s_{home[t.name]}-")

    # --- kill -9 of the node that holds the most tenants ---
    victim = max(c.d.names, key=lambda n: sum(h == n for h in home.values()))
    lost = [t for t in tenants.values() if home[t.name] == victim]
    kept = [t for t in tenants.values() if home[t.name] != victim]
    assert lost and kept
    before = {t.name: t.logits() for t in lost}
    c.procs[victim].send_signal(signal.SIGKILL)
    c.procs[victim].wait(30)
    wait_for(f"{victim} DOWN in HAProxy", lambda: c.status(victim) == "DOWN", 30)

    for t in kept:  # nothing changed for them
        n = len(t.nodes)
        _, h = t.say("Say yes.")
        assert h["x-sinkd-continuation"] == "continued", h["x-sinkd-why"]
        t.append("A second line.")
        t.generate()
        assert set(t.nodes[n:]) == {home[t.name]}
    for t in lost:
        reply, h = t.say(ASK)  # goes on elsewhere, rebuilt from the resent history
        assert h["x-sinkd-node"] != victim and h["x-sinkd-continuation"] == "new"
        assert "4417" in reply, reply
        assert t.code() == grpc.StatusCode.UNAVAILABLE  # not NOT_FOUND: it lives on the victim

    # --- the victim restarts and resumes from its disk ---
    c.start_node(victim)
    wait_for(f"{victim} UP again", lambda: c.status(victim) == "UP")
    for t in lost:
        n = len(t.nodes)
        assert np.array_equal(t.logits(), before[t.name])  # bit for bit after kill -9
        t.generate()
        _, h = t.say("Say yes.")  # back to the session that began it, the turns it missed read
        assert h["x-sinkd-continuation"] == "caught-up", h["x-sinkd-why"]
        assert h["x-sinkd-session"] == conversations[t.name].session_id
        assert set(t.nodes[n:]) == {victim}, t.nodes

    # --- alice, with memory across conversations on, tells her node a fact ---
    drained = home["alice"]
    http = httpx.Client(base_url=f"http://{c.d.proxy_http}", timeout=120,
                        headers={"authorization": f"Bearer {token('alice')}"})  # fmt: skip
    first, told = conversation(http, [ALICE_SYSTEM, ALICE_FACT])
    assert told.headers["x-sinkd-node"] == drained
    old_state = c.d.node(drained).state_dir
    needles = alice_needles(old_state, wait_for_vector=True)
    assert holders(old_state, needles)  # her text, token ids and vector are there, before

    # --- drain her node: every tenant it holds moves whole, alice's memory and prefixes too ---
    mine = [t for t in tenants.values() if home[t.name] == drained]
    handles = {t.name: [t.handle, conversations[t.name]] for t in mine}
    state = {t.name: [t.logits(h) for h in handles[t.name]] for t in mine}
    events = nodes_cli(c, "drain", drained)
    moved = [e for e in events if e["event"] == "moved"]
    assert not [e for e in events if e.get("error")], events
    target_of = {e["tenant"]: e["target"] for e in moved}
    assert all(target_of[e["tenant"]] == e["target"] for e in moved)  # one node per tenant
    assert c.procs[drained].wait(60) == 0  # stopped cleanly
    for t in mine:
        target = target_of[t.name]
        assert target != drained
        for h, logits in zip(handles[t.name], state[t.name], strict=True):
            assert h is not None
            assert np.array_equal(t.logits(h), logits)  # the same bits on its new node
            assert t.nodes[-1] == target
        _, h = t.say("Say yes.")
        assert h["x-sinkd-continuation"] == "continued", h["x-sinkd-why"]
        t.generate()
        assert t.nodes[-1] == target
    new_home = target_of["alice"]
    (alice_moved,) = [e for e in moved if e["tenant"] == "alice" and e["passages"]]
    assert alice_moved["prefixes"] >= 1, alice_moved

    # on her new node: a new conversation recalls the fact, with where and when she said it, and
    # its system prompt is restored from the prefix state that came with her
    asked, answer = conversation(http, [ALICE_SYSTEM, "What is my locker code?"])
    assert answer.headers["x-sinkd-node"] == new_home
    recalled = [p for p in asked["recall"]["recalled"] if p["conversation"] == first["session_id"]]
    assert recalled, asked["recall"]
    assert abs(recalled[0]["said_unix_time"] - told_at(told)) < 120
    assert asked["prefix_tokens"] > 0, asked
    (where,) = nodes_cli(c, "where", "alice")  # the operator's view: one node holds her
    assert where["ring"] == {"alice": new_home}
    assert {n: [(h["tenant"], h["state"]) for h in held] for n, held in where["held"].items()
            if held} == {new_home: [("alice", "")]}  # fmt: skip
    # the old node's files hold nothing of hers (the drain deleted and purged them)
    assert holders(old_state, needles) == []

    # --- she forgets it on her new node; the old node rejoins and the ring sends her back ---
    found = http.get("/v1/sinkd/memory", params={"search": "locker code"}).json()["data"]
    (fact,) = [p for p in found if "7351" in p["text"]]
    gone = http.delete(f"/v1/sinkd/memory/{fact['id']}")
    assert gone.status_code == 200 and not gone.json().get("purge_owed"), gone.text
    c.start_node(drained)
    back = nodes_cli(c, "join", drained)
    assert {e["tenant"] for e in back if e["event"] == "moved"} >= {"alice"}, back
    asked, answer = conversation(http, [ALICE_SYSTEM, "What is my locker code? Remind me."])
    assert answer.headers["x-sinkd-node"] == drained  # home again
    assert not [p for p in asked["recall"]["recalled"] if p["conversation"] == first["session_id"]]
    assert not [p for p in http.get("/v1/sinkd/memory", params={"search": "locker code"})
                .json()["data"] if "7351" in p["text"]]  # fmt: skip
    for name in c.d.names:  # no node keeps the forgotten passage's text, ids or vector
        assert holders(c.d.node(name).state_dir, ["Whiskers", needles[-1]]) == [], name
    http.close()


def nodes_cli(c: Cluster, command: str, arg: str) -> list[dict[str, Any]]:
    """`sinkd nodes COMMAND ARG --json` with the admin's token: its JSON lines, once it succeeded."""
    run = subprocess.run(
        [sys.executable, "-m", "sinkd.cli.main", "nodes", command, arg, "--json",
         "--deployment", str(c.folder / "deployment.toml")],
        capture_output=True, env=dict(os.environ, SINKD_ADMIN_TOKEN=ADMIN_TOKEN), timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr.decode()[-2000:] + run.stdout.decode()[-2000:]
    return [json.loads(line) for line in run.stdout.decode().splitlines()]


ALICE_SYSTEM = (
    "You are the front desk assistant of the north campus gym. Answer in one short sentence,"
    " politely, and never invent a number you were not told."
)
ALICE_FACT = "My locker code is 7351 and my cat is called Mr Whiskers."


def conversation(http: httpx.Client, texts: list[str]) -> tuple[dict[str, Any], httpx.Response]:
    """A new conversation through the proxy: a system prompt and one user message; its `sinkd`
    field and the answer."""
    system, user = texts
    answer = http.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    })  # fmt: skip
    assert answer.status_code == 200, answer.text
    return answer.json()["sinkd"], answer


def told_at(answer: httpx.Response) -> float:
    return float(answer.json()["created"])


def alice_needles(state_dir: Path, wait_for_vector: bool) -> list[bytes | str]:
    """What of alice's fact the node's journal holds, as the file scan looks for it: its words,
    a run of its token ids, and a piece of its vector (made in the background: waited for)."""
    journal = state_dir / "journal.db"

    def row() -> Any:
        with contextlib.closing(sqlite3.connect(journal, timeout=10)) as db:
            return db.execute(
                "SELECT tokens, vector FROM passages WHERE tenant='alice' AND text LIKE '%7351%'"
            ).fetchone()

    wait_for("alice's fact kept, with its vector",
             lambda: (r := row()) is not None and (r[1] is not None or not wait_for_vector))  # fmt: skip
    tokens, vector = row()
    ids = [int(i) for i in np.frombuffer(tokens, dtype="<i4")]
    return ["Whiskers", "7351", *token_needles(ids), bytes(vector[64:96])]
