"""Prefix states on the real model: a second chat of a tenant with the same system prompt restores
it and reads only its own turn, and computes the bits of a daemon that keeps no prefixes (both
pinned models); another tenant reads it all; a kill -9 keeps the stored prefix, and a damaged one
is refused with its reason and the prompt read. The fast part (bounds, owners, side requests,
listing) is tests/test_prefix_states.py."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import openai
import pytest

from sinkd.daemon.node import Daemon
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc
from tests.support.cli import sinkd
from tests.support.daemons import http_serve_env, serve_subprocess, stop_without_snapshots
from tests.support.settings import settings
from tests.support.tokens import ALICE, BOB

pytestmark = pytest.mark.model

# ~600 tokens of SmolLM2 (the done-when's system prompt); Gemma 3's sessions hold at most 512
# cells before they must evict (its sliding-window layers: models.lock's max_budget), so its
# system prompt is ~420 tokens: a prefix never spans an eviction
RULES = {"smollm2-135m-instruct": 34, "gemma3-270m": 24}
GREEDY = pb.Sampling(temperature=0.0)
POLICY = pb.Policy(name="sink", fill_window=True)


def system_prompt(rules: int) -> str:
    return "You answer operators of a log pipeline. " + " ".join(
        f"Rule {i}: quote log line {i * 7} and name its host node-{i % 5}." for i in range(rules)
    )


def logits_of(s: Any, h: pb.Handle, md: Any) -> np.ndarray:
    r = s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=md)
    return np.frombuffer(r.logits, dtype="<f4").copy()


def second_chat(s: Any, system: str, md: Any) -> tuple[pb.Receipt, list[np.ndarray], list[int]]:
    """A chat with the system prompt: its receipt after the system prompt, its logits there and
    after its own first message, and its greedy reply."""
    created = s.Create(
        pb.CreateSessionRequest(policy=POLICY, sampling=GREEDY, system_prompt=system), metadata=md
    )
    h = created.handle
    logits = [logits_of(s, h, md)]
    s.Append(pb.AppendRequest(handle=h, text="\nUser: which host failed first?\n"), metadata=md)
    logits.append(logits_of(s, h, md))
    events = s.Generate(pb.GenerateRequest(handle=h, max_tokens=12), metadata=md)
    reply = [e.token.id for e in events if e.HasField("token")]
    return created.receipt, logits, reply


def engine(tmp: Path, model: str, **kw: Any) -> tuple[Daemon, Any]:
    d = Daemon(settings(tmp, model=model, n_ctx_seq=1024, max_sessions=2, **kw))
    d.start()
    d.wait_ready(120)
    return d, pb_grpc.SessionsStub(grpc.insecure_channel(d.addresses[0]))


@pytest.mark.parametrize("model", sorted(RULES))
def test_a_second_chat_restores_the_system_prompt_and_computes_the_same_bits(
    tmp_path: Path, model: str
) -> None:
    system = system_prompt(RULES[model])
    ref, s = engine(tmp_path / "off", model, prefix_ram_mb=0, durable=False)
    try:
        want_receipt, want_logits, want_reply = second_chat(s, system, ALICE)
    finally:
        ref.stop()
    n_system = want_receipt.system_prompt_tokens
    assert want_receipt.prefix_tokens == 0 and n_system >= 400

    d, s = engine(tmp_path / "on", model)
    try:
        first = s.Create(
            pb.CreateSessionRequest(policy=POLICY, system_prompt=system), metadata=ALICE
        )
        assert first.receipt.prefix_tokens == 0  # the first read keeps it
        receipt, logits, reply = second_chat(s, system, ALICE)
        assert receipt.prefix_tokens == n_system  # restored: nothing of it read again
        for got, want in zip(logits, want_logits, strict=True):
            assert np.array_equal(got, want)  # after the system prompt, and after reading on
        assert reply == want_reply and len(reply) >= 3
        other, _, other_reply = second_chat(s, system, BOB)
        assert other.prefix_tokens == 0  # another tenant's stored prefix never serves bob
        assert other_reply == want_reply
        listed(d)
        # a restored session, killed before anything else: resume replays its journal's chunks
        third = s.Create(
            pb.CreateSessionRequest(policy=POLICY, system_prompt=system), metadata=ALICE
        )
        assert third.receipt.prefix_tokens == n_system
        h = third.handle
        stop_without_snapshots(d)
        d, s = engine(tmp_path / "on", model)
        resumed = s.Inspect(pb.InspectRequest(handle=h), metadata=ALICE).receipt
        assert "replayed" in resumed.resume and resumed.n_seen == n_system
        assert np.array_equal(logits_of(s, h, ALICE), want_logits[0])
    finally:
        d.stop()


def listed(d: Daemon) -> None:
    """`sinkd sessions prefixes`: alice sees hers, the admin every tenant's; never text."""
    address = d.addresses[0]
    code, out, _ = sinkd("sessions", "prefixes", "--json", "--connect", address,
                         "--token", "alice-token")  # fmt: skip
    assert code == 0
    mine = json.loads(out)
    assert mine and {p["tenant"] for p in mine} == {"alice"} and all(p["hits"] >= 0 for p in mine)
    code, out, _ = sinkd("sessions", "prefixes", "--connect", address, "--token", "admin-token")
    assert code == 0 and "alice" in out and "bob" in out and "Rule" not in out


TASK = (
    "### Task:\nSuggest 3-5 relevant follow-up questions the user might ask next, as JSON.\n"
    + "".join(f"- Guideline {i}: keep each question short, specific and in the chat's language.\n"
              for i in range(12))
    + "### Chat History:\n<chat_history>\n"
)  # fmt: skip
CHATS = ["USER: why did node-3 fail?", "USER: what filled the disk?", "USER: when was it?"]


def side_request(s: Any, chat: str) -> tuple[pb.Receipt, np.ndarray]:
    h = s.Create(pb.CreateSessionRequest(policy=POLICY), metadata=ALICE).handle
    r = s.Append(pb.AppendRequest(handle=h, text=TASK + chat + "\n</chat_history>"), metadata=ALICE)
    return r.receipt, logits_of(s, h, ALICE)


def test_a_side_request_starts_from_the_task_another_read_and_computes_the_same_bits(
    tmp_path: Path,
) -> None:
    """A chat UI's side requests: one task template, then each its own chat. Each keeps its
    prompt; the next restores the part it shares with an earlier one (the longer prefix's cells
    past it removed), reads on from there, and its logits are a whole read's."""
    model = "smollm2-135m-instruct"
    ref, s = engine(tmp_path / "off", model, prefix_ram_mb=0, durable=False)
    try:
        want, want_logits = side_request(s, CHATS[2])
    finally:
        ref.stop()
    d, s = engine(tmp_path / "on", model)
    try:
        assert side_request(s, CHATS[0])[0].prefix_tokens == 0
        assert side_request(s, CHATS[1])[0].prefix_tokens > 0
        got, logits = side_request(s, CHATS[2])
    finally:
        d.stop()
    assert got.n_seen == want.n_seen and got.prefix_tokens >= want.n_seen * 3 // 4
    assert np.array_equal(logits, want_logits)


def written(folder: Path) -> None:
    """Until the prefix files kept are renamed into place by their writer (none half-written)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if list(folder.glob("*.prefix")) and not list(folder.glob(".*.tmp")):
            return
        time.sleep(0.05)
    raise AssertionError(f"the prefix files were not written in {folder}")


def chat(port: int, key: str, system: str, message: str) -> Any:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
    return client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": message}],
        max_tokens=4,
        temperature=0,
    )


def test_a_stored_prefix_survives_kill_minus_nine_and_a_damaged_one_is_refused(
    tmp_path: Path,
) -> None:
    """Over HTTP with the openai SDK: chat 1, kill -9, chat 2 after the restart starts from the
    stored prefix (`cached_tokens`); a prefix file damaged on disk is refused with its reason,
    the prompt read normally, and the prefix kept anew."""
    system = system_prompt(RULES["smollm2-135m-instruct"])
    env, port = http_serve_env(tmp_path)
    sock = tmp_path / "sinkd.sock"
    prefixes = tmp_path / "state" / "prefixes"

    def serve() -> Any:
        return serve_subprocess(sock, env)

    def kill(proc: Any) -> str:
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(60) == -signal.SIGKILL
        return proc.stderr.read().decode() if proc.stderr else ""

    def key() -> str:
        return (tmp_path / "http-token").read_text().strip()

    proc = serve()
    try:
        one = chat(port, key(), system, "Which host failed first?")
        written(prefixes)  # kept off the engine thread: on disk before the kill
    finally:
        kill(proc)
    assert one.usage.prompt_tokens_details.cached_tokens == 0
    assert one.usage.prompt_tokens >= 600

    proc = serve()
    try:
        two = chat(port, key(), system, "And which one recovered?")
    finally:
        kill(proc)
    cached = two.usage.prompt_tokens_details.cached_tokens
    assert cached >= 600 and two.usage.prompt_tokens - cached < 40  # its own turn alone read

    damaged = []
    for stored in prefixes.glob("*.prefix"):  # a flipped byte in each one's cells
        data = bytearray(stored.read_bytes())
        data[len(data) // 2] ^= 0xFF
        stored.write_bytes(bytes(data))
        damaged.append(bytes(data))
    proc = serve()
    try:
        three = chat(port, key(), system, "Which host recovered last?")
        written(prefixes)
    finally:
        log = kill(proc)
    assert three.usage.prompt_tokens_details.cached_tokens == 0  # read, not restored
    assert three.usage.prompt_tokens >= 600
    assert "dropped: checksum mismatch" in log
    left = [f for f in prefixes.glob("*.prefix") if f.read_bytes() in damaged]
    assert len(left) < len(damaged)  # the one it tried is gone (any other: refused when tried)
