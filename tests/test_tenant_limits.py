"""One tenant cannot take the daemon, on the wire and the real model: tenant A opens sessions (or
fills its stored bytes, or its stored responses) until refused with RESOURCE_EXHAUSTED / 429 naming
A's own limit and use; tenant B then opens a session, appends and generates. The admin reads each
tenant's use with `sinkd sessions tenants`. The rule alone: tests/test_shares.py; the service on
the fake engine: tests/test_tenant_shares.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest

from sinkd.daemon.node import Daemon
from sinkd.errors import ERROR_TRAILER
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc
from tests.support.cli import sinkd
from tests.support.daemons import http_daemon, openai_client
from tests.support.settings import settings
from tests.support.tokens import ALICE, BOB, sha

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
POLICY = pb.Policy(name="sink", sinks=4, window=200)


def tenants(**overrides: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"name": n, "token_sha256": sha(f"{n}-token"), **overrides.get(n, {})}
        for n in ("alice", "bob")
    ]


def open_until_refused(s: Any, md: Any, text: str) -> tuple[int, grpc.RpcError]:
    """Create and append, again and again, until refused: how many were made, and the refusal."""
    for made in range(40):
        try:
            h = s.Create(pb.CreateSessionRequest(policy=POLICY), metadata=md).handle
            s.Append(pb.AppendRequest(handle=h, text=text), metadata=md)
        except grpc.RpcError as e:
            return made, e
    raise AssertionError("never refused")


def bob_is_served(s: Any) -> None:
    h = s.Create(pb.CreateSessionRequest(policy=POLICY), metadata=BOB).handle
    s.Append(pb.AppendRequest(handle=h, text="Name three colours."), metadata=BOB)
    events = list(s.Generate(pb.GenerateRequest(handle=h, max_tokens=8), metadata=BOB))
    assert sum(e.HasField("token") for e in events) > 0
    assert events[-1].HasField("done")


def error_class(e: grpc.RpcError) -> str:
    return dict(e.trailing_metadata() or ()).get(ERROR_TRAILER, "")  # type: ignore[attr-defined]


def test_over_grpc_a_tenant_filling_sessions_then_stored_bytes_leaves_room_for_another(
    tmp_path: Path,
) -> None:
    """2 resident + 4 parked: each tenant is sure of 1, alice may hold 5. Then alice at 1 MiB
    stored: her parked sessions' snapshots fill it. Each time bob is served after."""
    d = Daemon(settings(tmp_path / "a", max_sessions=2, max_parked_sessions=4))
    d.start()
    d.wait_ready(120)
    try:
        s = pb_grpc.SessionsStub(grpc.insecure_channel(d.addresses[0]))
        made, refused = open_until_refused(s, ALICE, "A short note.")
        assert made == 5
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_class(refused) == "TenantLimit"
        assert refused.details().startswith(
            "tenant alice holds 5 open sessions, its limit now: of 6, 1 more are kept for other"
            " tenants' reserves (reserved_sessions)"
        )
        bob_is_served(s)
    finally:
        d.stop()

    caps = tenants(alice={"max_stored_mb": 1})
    d = Daemon(settings(tmp_path / "b", max_sessions=1, max_parked_sessions=16, tenants=caps))
    d.start()
    d.wait_ready(120)
    try:
        s = pb_grpc.SessionsStub(grpc.insecure_channel(d.addresses[0]))
        made, refused = open_until_refused(s, ALICE, "A longer note, of a few more words. " * 2)
        assert 1 <= made < 16
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "of its 1.0 MiB stored (max_stored_mb)" in refused.details()
        bob_is_served(s)  # alice's resident session is parked for bob: her bytes grow, not his
        address = d.addresses[0]
        code, out, err = sinkd(
            "sessions", "tenants", "--connect", address, "--token", "admin-token", "--json"
        )
        assert code == 0, err
        usage = {t["tenant"]: t for t in json.loads(out)}
        assert usage["alice"]["sessions"] == made and usage["bob"]["sessions"] == 1
        assert usage["alice"]["snapshot_bytes"] >= 2**20 > usage["bob"]["snapshot_bytes"]
        assert usage["alice"]["max_stored_bytes"] == 2**20
        code, out, _ = sinkd("sessions", "list", "--connect", address, "--token", "admin-token")
        assert code == 0 and "tenants at" in out and f"{made} / " in out
        code, _, _ = sinkd("sessions", "tenants", "--connect", address, "--token", "alice-token")
        assert code != 0  # a tenant reads no one's shares
    finally:
        d.stop()


def test_over_http_stored_responses_then_open_sessions_are_each_tenant_own(
    tmp_path: Path,
) -> None:
    """Alice keeps at most 4 stored responses, and 5 sessions (2 + 4 parked: 1 kept for bob).
    Each refusal is OpenAI's 429 naming her limit; bob chats and responds meanwhile."""
    caps = tenants(alice={"max_stored_responses": 4})
    d = http_daemon(tmp_path, max_sessions=2, max_parked_sessions=4, tenants=caps)
    try:
        alice, bob = openai_client(d), openai_client(d, "bob-token")

        def respond(client: Any, store: bool = True) -> Any:
            return client.responses.create(
                model=MODEL, input="Say hi.", max_output_tokens=4, temperature=0, store=store
            )

        kept = [respond(alice) for _ in range(4)]
        with pytest.raises(openai.RateLimitError) as refused:
            respond(alice)
        assert refused.value.status_code == 429
        assert "tenant alice stores 4 of its 4 responses (max_stored_responses)" in str(
            refused.value
        )
        assert respond(alice, store=False).output_text  # nothing stored: not refused
        alice.responses.delete(kept[0].id)  # its conversation stays open
        respond(alice)  # her fifth session
        alice.responses.delete(kept[1].id)
        with pytest.raises(openai.RateLimitError) as refused:
            respond(alice)
        assert "tenant alice holds 5 open sessions, its limit now" in str(refused.value)
        chat = bob.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi!"}], max_tokens=6
        )
        assert chat.choices[0].message.content
        assert respond(bob).output_text
    finally:
        d.stop()


def test_over_http_a_tenant_filling_its_stored_bytes_leaves_room_for_another(
    tmp_path: Path,
) -> None:
    """Alice at 1 MiB stored: each new stored conversation parks her previous one (its snapshot
    written), until her next is refused with OpenAI's 429 naming her stored bytes and the
    setting; bob's chat is served, alice's resident session parked for it."""
    caps = tenants(alice={"max_stored_mb": 1})
    d = http_daemon(tmp_path, max_sessions=1, max_parked_sessions=16, tenants=caps)
    try:
        alice, bob = openai_client(d), openai_client(d, "bob-token")
        made = 0
        with pytest.raises(openai.RateLimitError) as refused:
            for _ in range(16):
                alice.responses.create(
                    model=MODEL, input="Tell me about the sea. " * 4, max_output_tokens=4
                )
                made += 1
        assert 1 <= made < 16
        assert "of its 1.0 MiB stored (max_stored_mb)" in str(refused.value)
        chat = bob.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi!"}], max_tokens=6
        )
        assert chat.choices[0].message.content
    finally:
        d.stop()
