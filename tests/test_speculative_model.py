"""Speculative decoding on llama.cpp with the pinned models: the token ids of one token at a time,
greedy and seeded sampling, with a stop string and a repetition penalty, across evictions and
shifts, on the plain attention path (1,024 cells) and flash attention's (256); a JSON schema's
grammar and a tool call through the openai SDK; and a kill -9 in the middle of a verification
resumes bit for bit. The logic (what a draft may own) is tests/test_speculative.py."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import openai
import pytest
from pydantic import BaseModel

from sinkd.daemon.node import Daemon
from sinkd.daemon.runtime.api import (
    Done,
    GenerationOptions,
    PolicyRequest,
    SamplingRequest,
    TokenEvent,
)
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.proto.v1 import sinkd_pb2 as pb
from tests.support.clients import Client
from tests.support.daemons import http_daemon, openai_client, serve_subprocess
from tests.support.services import draft_counts, drafts_at_the_prior
from tests.support.settings import settings
from tests.support.tokens import ALICE, sha
from tests.support.tools import WEATHER

pytestmark = pytest.mark.model
WHO = Principal("alice")
LOG = "".join(
    f"Dec  5 10:{i:02d}:01 web sshd[{1000 + i}]: Accepted publickey for user{i % 3}"
    f" from 10.0.0.{i % 7} port {40000 + i}\n"
    for i in range(10)
)
PROMPT = LOG + "Dec  5 10:10:01 web sshd["  # a log goes on: its lines repeat themselves
CASES = [
    GenerationOptions(120, sampling=SamplingRequest(temperature=0.0)),
    GenerationOptions(80, stops=(" port ",), sampling=SamplingRequest(temperature=0.0)),
    GenerationOptions(120, sampling=SamplingRequest(temperature=0.7, seed=11, repeat_penalty=1.1)),
]


def replies(tmp: Path, speculative: str, model: str | None, cells: int) -> list[Any]:
    """Each case's ids, reason and receipt, in a session that evicts and shifts as it goes
    (S=4, W=200, E=16, K=32: the prompt alone is past its window); below 512 cells under flash
    attention where exact (the plain path is the default there too, and at 1,024 cells here)."""
    kw: dict[str, Any] = {"model": model} if model else {}
    if cells < 512:
        kw["flash_attn"] = "exact"
    service = SinkdService(
        settings(tmp, speculative=speculative, n_ctx_seq=cells, step_tokens=256, **kw)
    )
    drafts_at_the_prior(service)  # how many are drafted: the same under any load
    service.start()
    service.wait_ready(120)
    out: list[Any] = []
    try:
        engine = service.scheduler.engine
        assert engine is not None
        assert engine.rows_not_exact() is None, engine.rows_not_exact()  # the build drafts here
        for options in CASES:
            policy = PolicyRequest(
                name="sink", sinks=4, window=200, evict_chunk=16, compact_interval=32
            )
            handle = service.create(WHO, policy).handle
            service.append(WHO, handle, PROMPT, timeout=120)
            ids, done = [], None
            for event in service.generate(WHO, handle, options, timeout=120):
                if isinstance(event, TokenEvent):
                    ids.append(event.id)
                else:
                    assert isinstance(event, Done)
                    done = event
            assert done is not None
            r = done.receipt
            out.append((ids, done.reason, (r.n_seen, r.evictions, r.shifts, r.recent_cache)))
            service.close(WHO, handle)
        out.append(draft_counts(service))
    finally:
        service.stop()
    return out


@pytest.mark.parametrize(
    ("model", "cells"),
    [(None, 1024), (None, 256), ("gemma3-270m", 1024)],
    ids=["smollm2-plain-attention", "smollm2-flash-attention", "gemma3-270m"],
)
def test_speculation_gives_the_token_ids_of_one_at_a_time(
    tmp_path: Path, model: str | None, cells: int
) -> None:
    *plain, plain_drafts = replies(tmp_path / "off", "off", model, cells)
    *spoken, spoken_drafts = replies(tmp_path / "auto", "auto", model, cells)
    assert spoken == plain
    assert plain_drafts == (0, 0) and spoken_drafts[0] > 20  # drafts were verified and kept
    assert [reason for _, reason, _ in plain][1] == "stop"
    assert all(receipt[1] > 0 for _, _, receipt in plain)  # every reply evicted
    assert any(receipt[2] > 0 for _, _, receipt in plain)  # and shifted


class Event(BaseModel):
    user: str
    address: str
    port: int


class Events(BaseModel):
    events: list[Event]


def structured_and_tool(tmp: Path, speculative: str, model: str) -> list[Any]:
    """A JSON schema's reply and a tool call over HTTP (openai SDK), and every session's tokens."""
    d = http_daemon(tmp, model=model, n_ctx_seq=1024, speculative=speculative)
    drafts_at_the_prior(d.service)
    try:
        client = openai_client(d)
        ask = f"List the logins in these lines as JSON:\n{LOG}"
        try:
            parsed = client.beta.chat.completions.parse(
                model=model, response_format=Events, max_tokens=160, temperature=0,
                messages=[{"role": "user", "content": ask}],
            )  # fmt: skip
        except openai.LengthFinishReasonError as cut:  # valid so far: the grammar held as far
            parsed = cut.completion
        called = client.chat.completions.create(
            model=model, tools=[WEATHER], tool_choice="required", max_tokens=40,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            temperature=0,
        )  # fmt: skip
        (call,) = called.choices[0].message.tool_calls or []
        json.loads(call.function.arguments)
        message = parsed.choices[0].message
        if parsed.choices[0].finish_reason == "stop":
            Events.model_validate_json(message.content or "")
        sessions = sorted(s.retained.all() for s in d.service.registry.all())
        return [
            message.content,
            parsed.usage.completion_tokens if parsed.usage else None,
            call.function.name,
            call.function.arguments,
            sessions,
            draft_counts(d.service),
        ]
    finally:
        d.stop()


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "gemma3-270m"])
def test_a_schemas_grammar_and_a_tool_call_give_the_same_tokens(tmp_path: Path, model: str) -> None:
    *plain, plain_drafts = structured_and_tool(tmp_path / "off", "off", model)
    *spoken, spoken_drafts = structured_and_tool(tmp_path / "auto", "auto", model)
    assert spoken == plain
    assert plain_drafts == (0, 0) and spoken_drafts[0] > 0


def test_a_kill_9_in_the_middle_of_a_verification_resumes_bit_for_bit(tmp_path: Path) -> None:
    """`sinkd serve` dies (SIGKILL, no cleanup) at its first verification, its pending token
    decoded and its drafts' cells in. Restarted, the session holds what one at a time had
    acknowledged at that point: the same next-token logits, bit for bit, as a daemon that never
    drafted, fed the same tokens; and the two go on alike."""
    env = {
        **os.environ,
        "SINKD_STATE_DIR": str(tmp_path / "state"),
        "SINKD_N_CTX_SEQ": "1024",
        "SINKD_SNAPSHOT_EVERY_TOKENS": "100000",  # what resume finds is the journal
        "SINKD_HTTP": "off",
        "SINKD_TENANTS": json.dumps([{"name": "alice", "token_sha256": sha("alice-token")}]),
    }
    sock = tmp_path / "sinkd.sock"
    proc = serve_subprocess(sock, {**env, "SINKD_FAILPOINT": "verify-draft"})
    try:
        c = Client(f"unix:{sock}")
        handle = c.create(window=1000).handle
        prompt_seen = c.append(handle, PROMPT).receipt.n_seen
        with pytest.raises(grpc.RpcError):
            c.generate(handle, n=120)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    proc = serve_subprocess(sock, env)
    try:
        c = Client(f"unix:{sock}")
        (listed,) = c.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions
        handle = pb.Handle(session_id=listed.session_id, generation=listed.generation)
        request = pb.InspectRequest(handle=handle, include_logits=True)
        resumed = c.s.Inspect(request, metadata=ALICE)
        generated = resumed.receipt.n_seen - prompt_seen
        assert generated >= 1  # the pending token was journalled before its verification
        then, _ = c.generate(handle, n=40)
    finally:
        proc.terminate()
        proc.wait(30)
    plain = Daemon(settings(tmp_path / "plain", n_ctx_seq=1024, speculative="off"))
    plain.start()
    plain.wait_ready(120)
    try:
        c = Client(plain.addresses[0])
        h = c.create(window=1000).handle
        c.append(h, PROMPT)
        c.generate(h, n=generated)
        reference = c.s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE)
        assert reference.receipt.n_seen == resumed.receipt.n_seen
        a = np.frombuffer(resumed.logits, dtype="<f4")
        b = np.frombuffer(reference.logits, dtype="<f4")
        assert a.size and np.array_equal(a, b)
        assert c.generate(h, n=40)[0] == then
    finally:
        plain.stop()
