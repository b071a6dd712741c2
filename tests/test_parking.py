"""Sessions beyond the cache on the real model: parked and restored sessions compute the bits of
never-parked ones, a kill -9 while sessions are parked resumes them all, and a stateless client's
conversations, more than the context holds, each continue over HTTP reading only the new message.
The fast part (who is parked, each operation on a parked session) is tests/test_residency.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import openai
import pytest

from sinkd.daemon.node import Daemon
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc
from tests.support.daemons import serve_subprocess
from tests.support.settings import settings
from tests.support.texts import TEXT
from tests.support.tokens import ALICE

pytestmark = pytest.mark.model

SESSIONS, ROUNDS = 4, 3
POLICY = pb.Policy(name="sink", sinks=4, window=60, evict_chunk=16)  # evicts and shifts
LOCAL: tuple[tuple[str, str], ...] = ()  # the subprocess has no tenants: its socket's owner
ENGINE = {"n_ctx_seq": 256, "max_sessions": 2, "step_tokens": 64}


def text_of(i: int, rnd: int) -> str:
    start = (i * 11 + rnd * 5) * 41 % (len(TEXT) - 240)
    return TEXT[start : start + 200]


def logits_of(s: Any, h: pb.Handle, md: Any = ALICE) -> np.ndarray:
    r = s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=md)
    return np.frombuffer(r.logits, dtype="<f4").copy()


def reference(tmp: Path) -> dict[tuple[int, int], np.ndarray]:
    """Each session's script alone, one at a time, nothing ever parked: its logits after each
    append, on the same engine configuration."""
    d = Daemon(settings(tmp, max_parked_sessions=0, **ENGINE))
    d.start()
    d.wait_ready(120)
    s = pb_grpc.SessionsStub(grpc.insecure_channel(d.addresses[0]))
    out = {}
    try:
        for i in range(SESSIONS):
            h = s.Create(pb.CreateSessionRequest(policy=POLICY), metadata=ALICE).handle
            for rnd in range(ROUNDS + 1):
                s.Append(pb.AppendRequest(handle=h, text=text_of(i, rnd)), metadata=ALICE)
                out[i, rnd] = logits_of(s, h)
            s.Close(pb.HandleRequest(handle=h), metadata=ALICE)
    finally:
        d.stop()
    return out


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], np.ndarray]:
    return reference(tmp_path_factory.mktemp("ref"))


def env_of(tmp: Path, **extra: str) -> dict[str, str]:
    return dict(
        os.environ,
        SINKD_STATE_DIR=str(tmp / "state"),
        SINKD_SNAPSHOT_EVERY_TOKENS="100000",  # a park writes the snapshot it needs itself
        **{f"SINKD_{k.upper()}": str(v) for k, v in ENGINE.items()},
        **extra,
    )


def test_parked_sessions_restore_bit_for_bit_and_survive_a_kill_9(
    tmp_path: Path, ref: dict[tuple[int, int], np.ndarray]
) -> None:
    sock = tmp_path / "d.sock"
    env = env_of(tmp_path)
    proc = serve_subprocess(sock, env)
    try:
        s = pb_grpc.SessionsStub(grpc.insecure_channel(f"unix:{sock}"))
        handles = [
            s.Create(pb.CreateSessionRequest(policy=POLICY), metadata=LOCAL).handle
            for _ in range(SESSIONS)
        ]
        restored = 0
        for rnd in range(ROUNDS):  # round robin: each append parks one and restores another
            for i, h in enumerate(handles):
                r = s.Append(pb.AppendRequest(handle=h, text=text_of(i, rnd)), metadata=LOCAL)
                restored += r.receipt.restored_ms > 0
                assert r.receipt.residency == "resident"
                got = logits_of(s, h, LOCAL)
                assert np.array_equal(got, ref[i, rnd]), f"session {i} round {rnd}"
                assert r.receipt.evictions > 0 or rnd == 0
        assert restored >= SESSIONS * (ROUNDS - 1)  # every visit after the first restored
        residency = [
            s.Inspect(pb.InspectRequest(handle=h), metadata=LOCAL).receipt.residency
            for h in handles
        ]
        assert sorted(residency) == ["parked", "parked", "resident", "resident"]
        proc.send_signal(signal.SIGKILL)  # two sessions parked, two resident with a journal tail
        proc.wait(30)
        proc = serve_subprocess(sock, env)
        s = pb_grpc.SessionsStub(grpc.insecure_channel(f"unix:{sock}"))
        for i, h in enumerate(handles):
            receipt = s.Inspect(pb.InspectRequest(handle=h), metadata=LOCAL).receipt
            assert receipt.state == "idle", receipt.stale_reason
            assert np.array_equal(
                logits_of(s, h, LOCAL), ref[i, ROUNDS - 1]
            ), f"session {i} resumed"
        for i, h in enumerate(handles):  # and they carry on as the never-parked ones did
            s.Append(pb.AppendRequest(handle=h, text=text_of(i, ROUNDS)), metadata=LOCAL)
            assert np.array_equal(
                logits_of(s, h, LOCAL), ref[i, ROUNDS]
            ), f"session {i} after resume"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(30)


@pytest.mark.parametrize("point", ["park-written", "restore-read"])
def test_a_kill_9_while_parking_or_restoring_resumes_every_session_bit_for_bit(
    tmp_path: Path, ref: dict[tuple[int, int], np.ndarray], point: str
) -> None:
    """kill -9 at `park-written` (a park's snapshot written, its sequence not yet freed: the
    third session's create parks the first) or at `restore-read` (a parked session's cells back in
    a sequence, not yet audited: the first session's next append). Restarted, every session that
    was acknowledged resumes with the logits of the one never parked, and carries on as it did;
    the call the kill cut was never acknowledged, and nothing of it is served."""
    sock = tmp_path / "d.sock"
    proc = serve_subprocess(sock, env_of(tmp_path, SINKD_FAILPOINT=point))
    s = pb_grpc.SessionsStub(grpc.insecure_channel(f"unix:{sock}"))
    try:
        handles = []
        for i in range(3 if point == "restore-read" else 2):  # the third parks the first
            handles.append(s.Create(pb.CreateSessionRequest(policy=POLICY), metadata=LOCAL).handle)
            s.Append(pb.AppendRequest(handle=handles[i], text=text_of(i, 0)), metadata=LOCAL)
        with pytest.raises(grpc.RpcError):  # the point kills the daemon mid-call
            if point == "park-written":
                s.Create(pb.CreateSessionRequest(policy=POLICY), metadata=LOCAL)
            else:
                s.Append(pb.AppendRequest(handle=handles[0], text=text_of(0, 1)), metadata=LOCAL)
        assert proc.wait(30) == -signal.SIGKILL
        proc = serve_subprocess(sock, env_of(tmp_path))
        s = pb_grpc.SessionsStub(grpc.insecure_channel(f"unix:{sock}"))
        listed = s.List(pb.ListSessionsRequest(), metadata=LOCAL).sessions
        assert sorted(r.session_id for r in listed) == sorted(h.session_id for h in handles)
        for i, h in enumerate(handles):
            receipt = s.Inspect(pb.InspectRequest(handle=h), metadata=LOCAL).receipt
            assert receipt.state == "idle", receipt.stale_reason
            assert np.array_equal(logits_of(s, h, LOCAL), ref[i, 0]), f"session {i} resumed"
        for i, h in enumerate(handles):
            s.Append(pb.AppendRequest(handle=h, text=text_of(i, 1)), metadata=LOCAL)
            assert np.array_equal(logits_of(s, h, LOCAL), ref[i, 1]), f"session {i} after"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(30)


def test_more_conversations_than_the_cache_holds_each_continue_over_http(tmp_path: Path) -> None:
    """Four conversations on two sequences through the openai SDK, visited round robin: every
    turn after a conversation's first continues its session, restored when it was parked, and
    reads only the new message."""
    d = Daemon(settings(tmp_path, http="127.0.0.1:0", **ENGINE))
    d.start()
    d.wait_ready(120)
    try:
        assert d.http is not None
        client = openai.OpenAI(
            base_url=f"{d.http.address}/v1", api_key="alice-token", max_retries=0
        )
        chats: list[list[dict[str, str]]] = []
        restored = []
        for rnd in range(ROUNDS):
            for i in range(SESSIONS):
                if rnd == 0:
                    chats.append([])
                chats[i].append({"role": "user", "content": f"Chat {i}, question {rnd}: why?"})
                raw = client.chat.completions.with_raw_response.create(
                    model="smollm2-135m-instruct",
                    messages=chats[i],
                    max_tokens=8,
                    temperature=0,  # type: ignore[arg-type]
                )
                reply = raw.parse()
                ext = reply.model_extra["sinkd"]  # type: ignore[index]
                if rnd:
                    assert ext["continuation"] == "continued", ext["why"]
                    assert reply.usage is not None and reply.usage.prompt_tokens < 30
                    restored.append(ext["receipt"]["restored_ms"] > 0)
                assert ext["receipt"]["residency"] == "resident"
                chats[i].append(
                    {"role": "assistant", "content": reply.choices[0].message.content or ""}
                )
        assert all(restored), restored  # two sequences, four chats: each visit restored one
        registry = d.service.registry
        assert (len(registry.resident()), len(registry.parked())) == (2, 2)
    finally:
        d.stop()
