"""A tenant's move between two real `sinkd serve` processes (the default model), cut by a kill -9:

- at each failpoint of a move (runtime/tenant_moves.py) the node that reaches it dies there
  (SINKD_FAILPOINT), and, separately, the other node is killed at that moment (the move's caller
  kills it between the steps around the point: the point's node is then inside or past it);
- the killed node restarts; before anything resolves, no two nodes answer the tenant;
- `moves.resolve` (what `sinkd nodes rebalance` runs) finishes the move or makes it again: the
  tenant is then whole on the destination alone (its two sessions with the logits they had, its
  memory across conversations with provenance, its prefix state restored), the source holds
  nothing of it and refuses its calls UNAVAILABLE.

And the operator's backup: `sinkd tenants export NAME > file` from one daemon, `sinkd tenants
import file` into another: the same memory search results, the same prefix hit, and the next turn
the same tokens and logits, bit for bit, on both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sinkd.cli import moves
from sinkd.daemon.rpc.client import Client
from sinkd.daemon.runtime.api import (
    ChatRequest,
    Done,
    GenerationOptions,
    Handle,
    PolicyRequest,
    TenantHeld,
    TokenEvent,
)
from sinkd.errors import SessionElsewhere
from tests.support.daemons import serve_subprocess
from tests.support.tokens import sha

pytestmark = pytest.mark.model

ADMIN = "admin-token"
SYSTEM = "You answer for the facilities team of the north campus, briefly and exactly. " * 2
FACT = "My locker code is 7351 and my cat is called Mr Whiskers."

# (failpoint, the node it is on)
POINTS = [
    ("tenant-leaving", "src"),
    ("tenant-exported", "src"),
    ("tenant-import-written", "dst"),
    ("tenant-imported", "dst"),
    ("tenant-released-sessions", "src"),
    ("tenant-released", "src"),
]
# the other node killed at that moment: (before or after, the caller's call)
OTHER_AT = {
    "tenant-leaving": ("before", "export_tenant"),  # the source is marked leaving
    "tenant-exported": ("before", "import_tenant"),  # the source has built the archive
    "tenant-import-written": ("before", "import_tenant"),  # the destination is importing
    "tenant-imported": ("after", "import_tenant"),  # the destination has it, committed
    "tenant-released-sessions": ("before", "release_tenant"),  # the source is releasing
    "tenant-released": ("after", "release_tenant"),  # the source has released
}
CASES = [(p, at, victim) for p, at in POINTS for victim in ("src", "dst")]
TENANTS = [f"t{i}" for i in range(len(CASES))] + ["backup"]


class Node:
    def __init__(self, root: Path, name: str, config: Path) -> None:
        self.name = name
        self.sock = root / f"{name}.sock"
        self.log = root / f"{name}.log"
        self.env = dict(
            os.environ, SINKD_CONFIG=str(config), SINKD_STATE_DIR=str(root / name),
            SINKD_NODE=name, SINKD_N_THREADS="1", SINKD_RECALL_DENSE="false",
        )  # fmt: skip
        self.env["SINKD_HTTP"] = "off"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"unix:{self.sock}"

    def start(self, failpoint: str = "") -> None:
        env = dict(self.env, SINKD_FAILPOINT=failpoint)
        self.proc = serve_subprocess(self.sock, env, log=self.log)

    def kill(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def died_at_its_failpoint(self) -> bool:
        assert self.proc is not None
        return self.proc.wait(60) == -signal.SIGKILL

    def client(self, token: str) -> Client:
        return Client(self.address, token, wait_s=10)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Node]]:
    root = tmp_path_factory.mktemp("tenant-moves")
    config = root / "sinkd.toml"
    config.write_text(
        f'admin_token_sha256 = "{sha(ADMIN)}"\nmemory_across_conversations = true\n'
        "n_ctx_seq = 512\nmax_sessions = 4\nmax_parked_sessions = 60\nprefix_min_tokens = 16\n"
        "purge_interval_s = 0\n"
        + "".join(f'[[tenants]]\nname = "{t}"\ntoken_sha256 = "{sha(t)}"\n' for t in TENANTS)
    )
    nodes = {name: Node(root, name, config) for name in ("src", "dst")}
    try:
        for n in nodes.values():
            n.start()
        yield nodes
    finally:
        for n in nodes.values():
            if n.proc is not None:
                n.kill()


def reply(client: Client, h: Handle, text: str) -> tuple[list[int], Done]:
    tokens, done = [], None
    for ev in client.chat(h, ChatRequest(text, GenerationOptions(4))):
        if isinstance(ev, TokenEvent):
            tokens.append(ev.id)
        else:
            done = ev
    assert done is not None
    return tokens, done


def settle(node: Node, tenant: str) -> tuple[list[Handle], list[np.ndarray]]:
    """Two conversations of the tenant on `node`: the first told its memory a fact, the second's
    system prompt was restored from the first's prefix state."""
    c = node.client(tenant)
    try:
        first = c.create(PolicyRequest(sinks=4, window=200), system_prompt=SYSTEM).handle
        reply(c, first, FACT)
        second = c.create(PolicyRequest(sinks=4, window=200), system_prompt=SYSTEM)
        assert second.prefix_tokens > 0
        handles = [first, second.handle]
        return handles, [logits(c, h) for h in handles]
    finally:
        c.shutdown()


def logits(c: Client, h: Handle) -> np.ndarray:
    got = c.inspect(h, include_logits=True).logits
    assert got is not None
    return np.array(got)


def held(node: Node, tenant: str) -> TenantHeld | None:
    c = node.client(ADMIN)
    try:
        return next((t for t in c.held_tenants()[0] if t.tenant == tenant), None)
    finally:
        c.shutdown()


def answers(node: Node, tenant: str, h: Handle) -> bool:
    """Whether the node serves the tenant's session; UNAVAILABLE (held elsewhere) otherwise."""
    c = node.client(tenant)
    try:
        c.inspect(h)
        return True
    except SessionElsewhere:
        return False
    finally:
        c.shutdown()


class Cutting:
    """The move's clients; `victim` is killed the moment the caller is `when` (before, after) its
    call `method` on any node (once)."""

    def __init__(self, nodes: dict[str, Node], victim: str | None, when: str, method: str) -> None:
        self.nodes, self.victim, self.when, self.method = nodes, victim, when, method
        self.opened: list[Client] = []

    def kill(self) -> None:
        if self.victim is not None:
            self.nodes[self.victim].kill()
            self.victim = None

    def __call__(self, name: str) -> Any:
        client = self.nodes[name].client(ADMIN)
        self.opened.append(client)
        cutting = self

        class Cut:
            def __getattr__(self, attr: str) -> Any:
                call: Callable[..., Any] = getattr(client, attr)
                if attr != cutting.method:
                    return call

                def around(*args: Any) -> Any:
                    if cutting.when == "before":
                        cutting.kill()
                    got = call(*args)
                    if cutting.when == "after":
                        cutting.kill()
                    return got

                return around

        return Cut()

    def close(self) -> None:
        for c in self.opened:
            c.shutdown()


@pytest.mark.parametrize(("point", "at", "victim"), CASES)
def test_a_kill_9_at_each_step_of_a_move_leaves_the_tenant_whole_on_one_node(
    pair: dict[str, Node], point: str, at: str, victim: str
) -> None:
    tenant = TENANTS[CASES.index((point, at, victim))]
    src, dst = pair["src"], pair["dst"]
    for n in (src, dst):  # a case before that failed may have left it dead
        if n.proc is None or n.proc.poll() is not None:
            n.start()
    handles, before = settle(src, tenant)

    if victim == at:  # it dies at the point itself
        pair[victim].kill()
        pair[victim].start(failpoint=point)
        cut = Cutting(pair, None, "", "")
    else:
        when, method = OTHER_AT[point]
        cut = Cutting(pair, victim, when, method)
    try:
        first = moves.move_tenant(cut, tenant, "src", "dst")
    finally:
        cut.close()
    # cut short, unless the node killed had acknowledged all it had to (the move then ends)
    assert first.error or (victim == "dst" and OTHER_AT[point][1] == "release_tenant"), first
    if victim == at:
        assert pair[victim].died_at_its_failpoint()
    pair[victim].start()

    # restarted, nothing resolved yet: never both nodes answering the tenant
    assert not (answers(src, tenant, handles[0]) and answers(dst, tenant, handles[0]))

    resolving = Cutting(pair, None, "", "")
    try:
        done = moves.resolve(resolving, ["src", "dst"], lambda t: "dst")
    finally:
        resolving.close()
    assert not [m for m in done if m.error], done

    # whole on the destination, nothing on the source
    there, here = held(dst, tenant), held(src, tenant)
    assert there is not None and (there.sessions, there.passages, there.state) == (2, 1, "")
    assert there.prefixes >= 1
    assert here is None or (here.sessions, here.passages, here.prefixes) == (0, 0, 0), here
    c = dst.client(tenant)
    try:
        for h, was in zip(handles, before, strict=True):
            assert np.array_equal(logits(c, h), was)  # parked there, restored bit for bit
        (kept,) = c.kept(search="locker code")
        assert "7351" in kept.text and kept.conversation == handles[0].session_id
        made = c.create(PolicyRequest(sinks=4, window=200), system_prompt=SYSTEM)
        assert made.prefix_tokens > 0  # its prefix state came along
        reply(c, handles[0], "And my cat?")
    finally:
        c.shutdown()
    assert not answers(src, tenant, handles[0])


def cli(*args: str, stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, SINKD_TOKEN=ADMIN)
    run = subprocess.run(
        [sys.executable, "-m", "sinkd.cli.main", *args], stdout=stdout,
        stderr=subprocess.PIPE, env=env, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    return run


def test_a_tenants_backup_restores_it_bit_for_bit_on_another_daemon(
    pair: dict[str, Node], tmp_path: Path
) -> None:
    src, dst = pair["src"], pair["dst"]
    for n in (src, dst):  # a case before that failed may have left it dead
        if n.proc is None or n.proc.poll() is not None:
            n.start()
    handles, before = settle(src, "backup")
    backup = tmp_path / "backup.sinkd"
    with backup.open("wb") as f:
        cli("tenants", "export", "backup", "--connect", src.address, stdout=f)
    run = cli("tenants", "import", str(backup), "--connect", dst.address, "--json")
    there = held(src, "backup")
    assert there is not None and there.prefixes >= 1
    assert json.loads(run.stdout) == {"tenant": "backup", "sessions": 2, "passages": 1,
                                      "prefixes": there.prefixes}  # fmt: skip

    a, b = src.client("backup"), dst.client("backup")
    try:
        found = [[(p.text, p.conversation, p.created_unix_time, p.score)
                  for p in c.kept(search="what is my locker code")] for c in (a, b)]  # fmt: skip
        assert found[0] == found[1] and found[0]
        hits = [c.create(PolicyRequest(sinks=4, window=200), system_prompt=SYSTEM) for c in (a, b)]
        assert hits[0].prefix_tokens == hits[1].prefix_tokens > 0
        for h, was in zip(handles, before, strict=True):
            assert np.array_equal(logits(a, h), was) and np.array_equal(logits(b, h), was)
        # the next turn, on both: the same tokens and logits
        turns = [reply(c, handles[0], "What is the name of my cat?")[0] for c in (a, b)]
        assert turns[0] == turns[1] and turns[0]
        assert np.array_equal(logits(a, handles[0]), logits(b, handles[0]))
    finally:
        a.shutdown()
        b.shutdown()
