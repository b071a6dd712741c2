"""The HTTP front's edges: what a client asks that is off (no tokens, an option sinkd lacks) is
refused naming it; a bug answers in the API's own error body, a stream ends with an error and
[DONE]; the local token is compared in constant time; the per-session call limit holds over HTTP as
over gRPC; a new conversation's history ingest stops when its client goes away or its deadline
passes. Races are held at failpoints, never timed."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from sinkd.daemon import failpoints
from sinkd.daemon.http import calls as calls_module
from sinkd.daemon.http import front as front_module
from sinkd.daemon.node import Daemon
from sinkd.daemon.runtime.api import CancelToken, Handle, TokenEvent
from sinkd.daemon.runtime.conversations.chats import Continuation
from sinkd.proto.v1 import sinkd_pb2 as pb
from tests.support.clients import Client
from tests.support.settings import settings
from tests.support.texts import TEXT
from tests.support.tokens import ALICE

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
KEY = "alice-token"
WAIT_S = 60  # every wait ends; none is reached unless something is broken


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(
        settings(
            tmp_path_factory.mktemp("edges"),
            http="127.0.0.1:0",
            max_calls_per_session=1,
            prefill_chunk=32,
            step_tokens=32,
        )
    )
    d.start()
    d.wait_ready(120)
    yield d
    d.stop()


def url(d: Daemon) -> str:
    assert d.http is not None
    return d.http.address


def sdk(d: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url(d)}/v1", api_key=KEY, max_retries=0)


def post(d: Daemon, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"authorization": f"Bearer {KEY}"}
    return httpx.post(f"{url(d)}{path}", json=body, headers=headers, timeout=WAIT_S)


def hello(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], **kw}


# --- refused by name ---


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", hello(max_tokens=0), "max_tokens"),
        ("/v1/chat/completions", hello(max_completion_tokens=0), "max_completion_tokens"),
        ("/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 0},
         "max_output_tokens"),
        ("/api/chat", hello(options={"num_predict": 0}, stream=False), "options.num_predict"),
        ("/api/chat", hello(options={"num_ctx": 4096}, stream=False), "options.num_ctx"),
        ("/api/chat", hello(options={"mirostat": 2}, stream=False), "options.mirostat"),
        ("/api/chat", hello(options={"made_up": 1}, stream=False), "options.made_up"),
        ("/api/chat", hello(stream=False, made_up=True), "made_up"),
        ("/api/generate", {"model": MODEL, "prompt": "Hi", "made_up": 1}, "made_up"),
    ],
)  # fmt: skip
def test_what_sinkd_would_not_do_is_refused_naming_it(
    daemon: Daemon, path: str, body: dict[str, Any], param: str
) -> None:
    r = post(daemon, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    message = error if isinstance(error, str) else error["message"]
    assert message.startswith(f"{param}:"), message
    if not path.startswith("/api/"):
        assert error["param"] == param


def test_ollama_sampling_options_are_honoured(daemon: Daemon) -> None:
    """top_k 1 leaves one token to draw from: any temperature and seed give the greedy text."""
    client = ollama.Client(host=url(daemon), headers={"authorization": f"Bearer {KEY}"})
    say = [{"role": "user", "content": "Name three colours."}]
    plain = {"num_predict": 8, "repeat_penalty": 1.0, "repeat_last_n": 0}
    greedy = client.chat(MODEL, say, options={"temperature": 0, **plain})
    for seed in (1, 2):
        hot = client.chat(
            MODEL, say,
            options={"temperature": 1.5, "top_k": 1, "seed": seed, "min_p": 0.0, **plain},
        )  # fmt: skip
        assert hot.message.content == greedy.message.content
        assert hot.eval_count == greedy.eval_count <= 8


def test_a_model_says_the_same_creation_time_alone_and_listed(daemon: Daemon) -> None:
    client = sdk(daemon)
    listed = client.models.list().data[0]
    assert listed.created > 0 and client.models.retrieve(MODEL).created == listed.created


# --- a bug answers in the API's convention ---


def test_an_unexpected_error_is_answered_in_each_apis_error_body(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert daemon.http is not None

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug whose message quotes the request: Hello!")

    monkeypatch.setattr(daemon.http.calls.chats, "turn", broken)
    r = post(daemon, "/v1/chat/completions", hello())
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "InternalError"
    assert "Hello" not in error["message"] and "RuntimeError" in error["message"]
    r = post(daemon, "/api/chat", hello(stream=False))
    assert r.status_code == 500 and "RuntimeError" in r.json()["error"]


def test_a_stream_torn_by_a_bug_ends_with_an_error_and_done(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert daemon.http is not None

    def torn(*args: Any, **kwargs: Any) -> Any:
        def events() -> Iterator[Any]:
            yield TokenEvent(1, "Hi", 0, 1.0)
            raise RuntimeError("torn")

        return Continuation(Handle("s_x", "g"), "new", "a test", 0), events()

    monkeypatch.setattr(daemon.http.calls.chats, "turn", torn)
    r = post(daemon, "/v1/chat/completions", hello(stream=True))
    assert r.status_code == 200
    datas = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    last = json.loads(datas[-2])
    assert last["error"]["code"] == "InternalError"
    r = post(daemon, "/api/chat", hello(stream=True))
    lines = [json.loads(x) for x in r.text.splitlines() if x.strip()]
    assert lines[0]["message"]["content"] == "Hi" and "RuntimeError" in lines[-1]["error"]


# --- who may call, and how many at once ---


def test_the_local_token_is_compared_in_constant_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = Daemon(settings(tmp_path, tenants=[], admin_token_sha256=None, http="127.0.0.1:0"))
    d.start()
    d.wait_ready(120)
    compared: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(calls_module.hmac, "compare_digest", spy)
    try:
        token = front_module.local_token(d.settings.socket.parent)
        r = httpx.get(f"{url(d)}/v1/models", headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 200
        digest = hashlib.sha256(token.encode()).hexdigest()
        assert (digest, digest) in compared
        r = httpx.get(f"{url(d)}/v1/models", headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401
    finally:
        d.stop()


def test_the_per_session_call_limit_holds_over_http(daemon: Daemon) -> None:
    """max_calls_per_session = 1: while a turn on a session is in flight (held at its end), a
    second call naming that session is refused with 429, as over gRPC."""
    first = sdk(daemon).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    session = first.headers["x-sinkd-session"]
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:  # the first turn's end, in the thread that reads its events
        if not inside.is_set():
            inside.set()
            release.wait(WAIT_S)

    again = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "x"},
             {"role": "user", "content": "And?"}]  # fmt: skip
    answers: list[int] = []

    def call() -> httpx.Response:
        return httpx.post(f"{url(daemon)}/v1/chat/completions",
                          json={"model": MODEL, "messages": again, "max_tokens": 2},
                          headers={"authorization": f"Bearer {KEY}", "x-sinkd-session": session},
                          timeout=WAIT_S)  # fmt: skip

    with failpoints.armed("generation-done", hold):
        held = threading.Thread(target=lambda: answers.append(call().status_code))
        held.start()
        try:
            assert inside.wait(WAIT_S)
            r = call()  # refused at admission: it never reaches the failpoint
        finally:
            release.set()
            held.join(WAIT_S)
    assert r.status_code == 429 and "max_calls_per_session" in r.json()["error"]["message"]
    assert answers == [200]


def test_a_tenant_flooding_the_pool_over_http_leaves_another_answered(tmp_path: Path) -> None:
    """Alice's four turns hold the whole pool (at a failpoint at their end) and her flood is
    refused with 429; bob's turn, below his fair share, waits for a slot and is answered."""
    d = Daemon(
        settings(tmp_path, http="127.0.0.1:0", rpc_workers=6, rpc_reserved_workers=2,
                 max_calls_per_tenant=8)
    )  # fmt: skip
    d.start()
    d.wait_ready(120)
    try:
        held, release = threading.Semaphore(0), threading.Event()
        holding = iter(range(4))

        def hold() -> None:  # alice's first four turns wait at their end; any later one passes
            if next(holding, None) is not None:
                held.release()
                release.wait(WAIT_S)

        def turn(key: str, text: str) -> int:
            r = httpx.post(f"{url(d)}/v1/chat/completions",
                           json={"model": MODEL, "max_tokens": 2,
                                 "messages": [{"role": "user", "content": text}]},
                           headers={"authorization": f"Bearer {key}"}, timeout=WAIT_S)  # fmt: skip
            return r.status_code

        answers: list[int] = []
        with failpoints.armed("generation-done", hold):
            mine = [
                threading.Thread(target=lambda i=i: answers.append(turn(KEY, f"Alice {i}.")))
                for i in range(4)
            ]
            for t in mine:
                t.start()
            for _ in mine:
                assert held.acquire(timeout=WAIT_S)  # the pool's four slots: alice's
            assert [turn(KEY, "More.") for _ in range(6)] == [429] * 6  # her flood
            bobs: list[int] = []
            bob = threading.Thread(target=lambda: bobs.append(turn("bob-token", "Bob here.")))
            bob.start()
            assert d.limits.await_waiting(1, WAIT_S)  # bob waits for a slot, not refused
            release.set()
            for t in [*mine, bob]:
                t.join(WAIT_S)
        assert bobs == [200] and answers == [200] * 4
    finally:
        d.stop()


# --- a new conversation's ingest ends with its client or its deadline ---

LONG_HISTORY = [
    m
    for i in range(12)
    for m in ({"role": "user", "content": f"{i}: {TEXT[:600]}"}, {"role": "assistant", "content": "Noted."})
] + [{"role": "user", "content": "Summarise."}]  # fmt: skip


def raw_request(d: Daemon, body: dict[str, Any]) -> socket.socket:
    """A chat completion sent on a bare socket, to close it mid-call."""
    assert d.http is not None
    host, port = d.http.address.removeprefix("http://").rsplit(":", 1)
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"authorization: Bearer {KEY}\r\ncontent-length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def new_session_seen(daemon: Daemon, before: set[str]) -> int:
    client = Client(daemon.addresses[0])
    try:
        sessions = client.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions
        (made,) = [s for s in sessions if s.session_id not in before]
        return int(made.n_seen)
    finally:
        client.channel.close()


def listed(daemon: Daemon) -> set[str]:
    client = Client(daemon.addresses[0])
    try:
        return {
            s.session_id for s in client.s.List(pb.ListSessionsRequest(), metadata=ALICE).sessions
        }
    finally:
        client.channel.close()


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_gone_during_a_history_ingest_stops_it(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    before = listed(daemon)
    ingesting, cancelled = threading.Event(), threading.Event()
    real = CancelToken.cancel

    def spy(self: CancelToken) -> None:
        real(self)
        cancelled.set()

    def hold() -> None:  # the engine thread, the ingest's first chunk decoded
        if not ingesting.is_set():
            ingesting.set()
            cancelled.wait(WAIT_S)

    monkeypatch.setattr(CancelToken, "cancel", spy)
    with failpoints.armed("prefill-chunk", hold):
        sock = raw_request(daemon, {"model": MODEL, "messages": LONG_HISTORY, "stream": stream})
        assert ingesting.wait(WAIT_S)
        sock.close()  # the client goes away while its history is read
        assert cancelled.wait(WAIT_S), "the front noticed the client gone"
    seen = new_session_seen(daemon, before)
    whole = sum(len(m["content"]) for m in LONG_HISTORY) // 6  # tokens, at most ~6 bytes each
    assert 0 < seen < whole // 2, (seen, whole)


def test_a_history_ingest_ends_at_the_calls_deadline(tmp_path: Path) -> None:
    d = Daemon(settings(tmp_path, http="127.0.0.1:0", call_timeout_s=1, prefill_chunk=32,
                        step_tokens=32))  # fmt: skip
    d.start()
    d.wait_ready(120)
    answered, ingesting = threading.Event(), threading.Event()

    def hold() -> None:  # the ingest's first chunk: the engine waits until the caller gave up
        if not ingesting.is_set():
            ingesting.set()
            answered.wait(WAIT_S)

    try:
        before = listed(d)
        with failpoints.armed("prefill-chunk", hold):
            r = post(d, "/v1/chat/completions", {"model": MODEL, "messages": LONG_HISTORY})
            answered.set()
        assert ingesting.is_set()
        assert r.status_code == 504, r.text
        seen = new_session_seen(d, before)
        assert 0 < seen <= 2 * 32
    finally:
        d.stop()
