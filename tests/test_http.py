"""The HTTP front driven by the real clients (the `openai` SDK, the `ollama` client) on the default
model: chat completions streamed and not, with usage; a stateless client's history continuing its
session; errors in OpenAI's body with the right status."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ollama
import openai
import pytest

from sinkd.daemon.node import Daemon
from sinkd.daemon.runtime.api import Handle
from sinkd.daemon.runtime.sessions import Principal
from tests.support.disk import holders
from tests.support.settings import settings

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
SYSTEM = "You are a terse assistant."


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(
        settings(tmp_path_factory.mktemp("http"), http="127.0.0.1:0", max_message_bytes=64 * 1024)
    )
    d.start()
    d.wait_ready(120)
    yield d
    d.stop()


def start(tmp_path: Path) -> Daemon:
    """A durable daemon with its HTTP front on the state directory under `tmp_path`."""
    d = Daemon(settings(tmp_path, http="127.0.0.1:0"))
    d.start()
    d.wait_ready(120)
    return d


def sdk(daemon: Daemon, key: str = "alice-token") -> openai.OpenAI:
    assert daemon.http is not None
    return openai.OpenAI(base_url=f"{daemon.http.address}/v1", api_key=key, max_retries=0)


def ask(client: openai.OpenAI, messages: list[dict[str, str]], **kw: Any) -> Any:
    """The parsed completion and the response headers."""
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, **{"max_tokens": 12, "temperature": 0, **kw}
    )
    return raw.parse(), raw.headers


def test_models_are_listed(daemon: Daemon) -> None:
    assert [m.id for m in sdk(daemon).models.list()] == [MODEL, "minilm-l6-v2"]  # chat, embeddings


def test_the_front_answers_without_nagle_on_a_kept_alive_connection(daemon: Daemon) -> None:
    """Every connection the front accepts has TCP_NODELAY: with Nagle on, each answer after a
    connection's first waited ~40 ms for the client's delayed ACK (headers and body are two
    writes), and streamed tokens went out in bursts. Checked on the server's own sockets."""
    import socket

    assert daemon.http is not None and daemon.http._server is not None
    with httpx.Client(base_url=daemon.http.address) as client:
        for _ in range(2):
            assert client.get("/health").status_code == 200
        connections = list(daemon.http._server.server_state.connections)
        assert connections
        for c in connections:
            sock = c.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


def test_a_stateless_history_continues_its_session_with_only_the_new_turn(daemon: Daemon) -> None:
    client = sdk(daemon)
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]
    first, headers = ask(client, history)
    assert headers["x-sinkd-continuation"] == "new"
    reply = first.choices[0].message.content
    assert reply and first.usage.completion_tokens <= 12 and first.usage.prompt_tokens > 5
    session = headers["x-sinkd-session"]
    seen = first.model_extra["sinkd"]["receipt"]["n_seen"]
    assert seen == first.usage.prompt_tokens + first.usage.completion_tokens

    history += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Another."}]
    second, headers = ask(client, history)
    assert headers["x-sinkd-continuation"] == "continued" and headers["x-sinkd-session"] == session
    new_tokens = second.usage.prompt_tokens
    assert 0 < new_tokens < first.usage.prompt_tokens  # the new user turn alone, not the history
    assert second.model_extra["sinkd"]["receipt"]["n_seen"] == (
        seen + new_tokens + second.usage.completion_tokens
    )

    bob, headers = ask(sdk(daemon, "bob-token"), history)  # the same words, another tenant
    assert headers["x-sinkd-continuation"] == "new" and headers["x-sinkd-session"] != session
    assert bob.model_extra["sinkd"]["ingested_turns"] == 2  # its user and assistant turns


def test_streamed_with_usage(daemon: Daemon) -> None:
    stream = sdk(daemon).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to five."}],
        max_completion_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert text and finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 10
    same = sdk(daemon).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=10, temperature=0,
    )  # fmt: skip
    assert same.choices[0].message.content == text  # greedy: streamed or not, the same tokens


@pytest.mark.parametrize(
    ("kw", "status", "param"),
    [
        ({"n": 2}, 400, "n"),
        ({"tools": [{"type": "web_search"}]}, 400, "tools[0]"),  # functions only
        ({"functions": [{"name": "f", "parameters": {}}]}, 400, "functions"),
        ({"logprobs": True}, 400, "logprobs"),
        ({"response_format": {"type": "xml"}}, 400, "response_format.type"),
        ({"model": "gpt-4o"}, 404, "model"),
        ({"messages": []}, 400, None),
        ({"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].tool_call_id"),
        ({"messages": [{"role": "critic", "content": "x"}]}, 400, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "   "}]}, 400, None),
    ],
)
def test_what_sinkd_does_not_do_is_refused_naming_the_field(
    daemon: Daemon, kw: dict[str, Any], status: int, param: str | None
) -> None:
    args = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kw}
    with pytest.raises(openai.APIStatusError) as e:
        sdk(daemon).chat.completions.create(**args)
    assert e.value.status_code == status
    error = e.value.body
    assert isinstance(error, dict) and error["message"] and error["type"]
    if param is not None:
        assert error["param"] == param


def test_a_wrong_key_is_401(daemon: Daemon) -> None:
    with pytest.raises(openai.AuthenticationError):
        sdk(daemon, "nobody").models.list()


@pytest.mark.parametrize(
    ("content", "headers", "status"),
    [
        (b"{not json", {}, 400),
        (b'{"model": "x", "messages": "\xff\xfe"}', {}, 400),
        (b"[1, 2]", {}, 400),
        (
            b'{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": 5}]}',
            {},
            400,
        ),
        (b"x" * 70_000, {}, 413),
    ],
    ids=["malformed", "not-utf8", "not-an-object", "wrong-type", "too-large"],
)
def test_bad_bodies_get_openai_errors(
    daemon: Daemon, content: bytes, headers: dict[str, str], status: int
) -> None:
    assert daemon.http is not None
    r = httpx.post(
        f"{daemon.http.address}/v1/chat/completions",
        content=content,
        headers={"authorization": "Bearer alice-token", "content-type": "application/json"},
    )
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]


def test_an_ollama_client_lists_and_chats(daemon: Daemon) -> None:
    assert daemon.http is not None
    client = ollama.Client(
        host=daemon.http.address, headers={"Authorization": "Bearer alice-token"}
    )
    assert [m.model for m in client.list().models] == [MODEL, "minilm-l6-v2"]  # chat, embeddings
    shown = client.show(MODEL)  # what a client sizes its trimming by: the trained context
    assert shown.modelinfo == {"general.architecture": "llama", "llama.context_length": 8192}
    assert shown.capabilities == ["completion", "tools"]
    assert client.show("minilm-l6-v2").capabilities == ["embedding"]
    loaded = client.ps().models  # what `ollama ps` and Open WebUI read
    assert [m.model for m in loaded] == [MODEL, "minilm-l6-v2"]
    assert loaded[0].size == daemon.service.entry.size and loaded[0].size_vram == 0
    assert loaded[0].expires_at is not None and loaded[0].expires_at.year > 2100  # "forever"
    assert loaded[0].context_length == daemon.service.settings.n_ctx_seq
    parts = list(
        client.chat(
            model=MODEL,
            messages=[{"role": "user", "content": "Say hello."}],
            stream=True,
            options={"temperature": 0, "num_predict": 8},
        )
    )
    assert parts[-1].done and parts[-1].eval_count <= 8
    assert "".join(p.message.content for p in parts)
    whole = client.chat(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
        options={"temperature": 0, "num_predict": 8}, stream=False,
    )  # fmt: skip
    assert whole.message.content == "".join(p.message.content for p in parts)


def test_an_ollama_client_generates_and_its_keep_alive_is_the_sessions_expiry(
    daemon: Daemon,
) -> None:
    import time

    assert daemon.http is not None
    client = ollama.Client(
        host=daemon.http.address, headers={"Authorization": "Bearer alice-token"}
    )
    opts = {"temperature": 0, "num_predict": 8}
    parts = list(client.generate(model=MODEL, prompt="Say hello.", options=opts, stream=True))
    assert parts[-1].done and "".join(p.response for p in parts)
    whole = client.generate(model=MODEL, prompt="Say hello.", options=opts, keep_alive="5m")
    assert whole.response == "".join(p.response for p in parts)
    kept = [s for s in daemon.service.registry.all() if s.idle_timeout_s == 300.0]
    assert len(kept) == 1  # the session that answered
    with pytest.raises(ollama.ResponseError) as raw:  # text never chooses its own framing
        client.generate(model=MODEL, prompt="<|im_start|>system", raw=True)
    assert raw.value.status_code == 400 and "raw" in raw.value.error
    with pytest.raises(ollama.ResponseError) as bad:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}], keep_alive="soon")
    assert bad.value.status_code == 400 and "keep_alive" in bad.value.error

    gone = client.chat(
        model=MODEL, messages=[{"role": "user", "content": "One more."}], options=opts,
        keep_alive=0, stream=False,
    )  # fmt: skip
    assert gone.message.content
    scheduler = daemon.service.scheduler
    sessions = [s.id for s in daemon.service.registry.all() if s.idle_timeout_s is not None]
    scheduler.call(lambda e: scheduler.expire_idle(time.monotonic() + 1))
    left = {s.id for s in daemon.service.registry.all()}
    assert kept[0].id in left  # 5 minutes are not up
    assert [s for s in sessions if s not in left]  # keep_alive 0: closed once it answered


@pytest.mark.unit
@pytest.mark.parametrize(
    ("given", "seconds"),
    [(None, None), (300, 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25), ("0", 0.0),
     (-1, None), ("-1m", None), ("2.5", 2.5)],
)  # fmt: skip
def test_keep_alive_reads_as_ollama_writes_it(given: Any, seconds: float | None) -> None:
    from sinkd.daemon.http.ollama_api import keep_alive_seconds

    assert keep_alive_seconds(given) == seconds


def test_a_conversation_continues_after_a_restart_and_a_reset_one_does_not(tmp_path: Path) -> None:
    d = start(tmp_path)
    try:
        history = [{"role": "user", "content": "Name a fruit."}]
        first, headers = ask(sdk(d), history)
        session = headers["x-sinkd-session"]
        history += [{"role": "assistant", "content": first.choices[0].message.content}]
    finally:
        d.stop()
    d = start(tmp_path)
    try:
        history += [{"role": "user", "content": "And a vegetable?"}]
        second, headers = ask(sdk(d), history)
        assert headers["x-sinkd-continuation"] == "continued"
        assert headers["x-sinkd-session"] == session
        assert second.usage.prompt_tokens < first.usage.prompt_tokens + 12
        history += [{"role": "assistant", "content": second.choices[0].message.content}]
        h = d.service.registry.get(session)
        assert h is not None
        d.service.reset(Principal("alice"), Handle(session, h.generation))
        history += [{"role": "user", "content": "One more."}]
        _, headers = ask(sdk(d), history)  # the reset session holds none of it: a new one
        assert headers["x-sinkd-continuation"] == "new" and headers["x-sinkd-session"] != session
    finally:
        d.stop()


def test_without_tenants_a_local_token_guards_the_port(tmp_path: Path) -> None:
    """A loopback port is open to every user of the machine: a daemon with no tenants makes a
    token at first start, 0600 beside its socket, and asks for it."""
    import stat

    d = Daemon(settings(tmp_path, http="127.0.0.1:0", tenants=[], admin_token_sha256=None))
    d.start()
    d.wait_ready(120)
    try:
        token_file = tmp_path / "http-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        with pytest.raises(openai.AuthenticationError):
            sdk(d, "guess").models.list()
        listed = sdk(d, token_file.read_text().strip()).models.list()
        assert listed.data[0].id == MODEL
    finally:
        d.stop()


def test_a_client_that_goes_away_mid_stream_cancels_its_generation(daemon: Daemon) -> None:
    import time

    assert daemon.http is not None
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 400, "temperature": 0, "stream": True}  # fmt: skip
    with httpx.stream(
        "POST", f"{daemon.http.address}/v1/chat/completions", json=body,
        headers={"authorization": "Bearer alice-token"},
    ) as r:  # fmt: skip
        assert r.status_code == 200, (r.status_code, r.read())
        session = r.headers["x-sinkd-session"]
        lines = r.iter_lines()
        for _ in range(6):  # the role chunk and a few tokens, then the client leaves
            next(lines)
    scheduler = daemon.service.scheduler
    deadline = time.monotonic() + 30
    while scheduler.queues.busy(session) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not scheduler.queues.busy(session), "the generation ran on after its client left"
    s = daemon.service.registry.get(session)
    assert s is not None and s.seq.state.n_seen < 100  # far from the 400 tokens it asked for


QUESTIONS = [
    "My name is Ada and I keep bees.", "What is a hive?", "Name a flower.", "Why do bees dance?",
    "What is honey made of?", "Say something short.", "What colour is pollen?", "Count to three.",
    "What is wax?", "Tell me a fact.",
]  # fmt: skip


def test_sixty_turns_resent_whole_each_turn_read_only_their_new_tokens(tmp_path: Path) -> None:
    """The history grows past S+W = 4+252 many times over; each turn still appends only its own
    tokens (the receipt's n_seen grows by exactly usage's prompt + completion), across a restart
    in the middle and a regenerate, and another tenant's identical history starts a session of its
    own."""

    d = start(tmp_path)
    history: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    session, seen, evicted = "", 0, 0
    try:
        for turn in range(60):
            if turn == 30:  # a restart mid-conversation
                d.stop()
                d = start(tmp_path)
            history.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
            reply, headers = ask(sdk(d), history, max_tokens=16)
            ext = reply.model_extra["sinkd"]
            if turn == 0:
                assert headers["x-sinkd-continuation"] == "new"
                session = headers["x-sinkd-session"]
            else:
                assert headers["x-sinkd-continuation"] == "continued", (
                    turn,
                    headers["x-sinkd-why"],
                )
                assert headers["x-sinkd-session"] == session
                recalled = bool(ext["recall"] and ext["recall"]["recalled"])
                budget = 96 if recalled else 0  # a recall adds at most its budget (frames included)
                assert (
                    reply.usage.prompt_tokens < 40 + budget
                ), turn  # its own turn, never the history
            assert ext["receipt"]["n_seen"] == seen + reply.usage.total_tokens, turn
            seen, evicted = ext["receipt"]["n_seen"], ext["receipt"]["evicted_tokens"]
            assert ext["receipt"]["retained"] <= 256
            history.append({"role": "assistant", "content": reply.choices[0].message.content})
            if turn == 45:  # regenerate the last reply: taken back, nothing read again
                before = seen - reply.usage.total_tokens
                again, headers = ask(sdk(d), history[:-1], max_tokens=16, temperature=0.8)
                assert headers["x-sinkd-continuation"] == "regenerated"
                assert headers["x-sinkd-session"] == session
                assert again.usage.prompt_tokens < 40 + 96
                seen = again.model_extra["sinkd"]["receipt"]["n_seen"]
                assert seen == before + again.usage.total_tokens
                history[-1] = {"role": "assistant", "content": again.choices[0].message.content}
        assert seen > 3 * 256 and evicted > 2 * 256  # the window turned over many times
        history.append({"role": "user", "content": "Thanks."})
        _, headers = ask(sdk(d, "bob-token"), history, max_tokens=4)
        assert headers["x-sinkd-continuation"] == "new" and headers["x-sinkd-session"] != session
    finally:
        d.stop()


def test_a_dead_http_thread_takes_the_daemons_health_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    from sinkd.daemon.rpc.client import daemon_answers

    def broken(self: Any, sockets: Any = None) -> None:
        raise RuntimeError("a bug in the front")

    monkeypatch.setattr(uvicorn.Server, "run", broken)
    d = Daemon(settings(tmp_path, durable=False, http="127.0.0.1:0"))
    d.start()
    try:
        assert d.http is not None and d.died.wait(10)
        d.wait_ready(120)  # the model loads, and still nothing says SERVING
        assert not d.http.alive() and not daemon_answers(d.addresses[0])
    finally:
        d.stop()


def test_new_conversations_past_the_resident_sessions_park_the_least_recent_one(
    daemon: Daemon,
) -> None:
    """Stateless clients never close their sessions: past the resident sessions a new
    conversation parks the least recently used one (never closes it), and a client that comes
    back to that one continues it, restored, nothing read again; another tenant's session is never
    closed either. (Closing, past the parked ones too, is tests/test_conversations.py's.)"""
    client = sdk(daemon)
    limit = daemon.settings.max_sessions
    bob = sdk(daemon, "bob-token")
    _, bob_headers = ask(bob, [{"role": "user", "content": "Bob's own conversation."}])
    first: list[dict[str, str]] = []
    notes = []
    for i in range(limit + 2):
        history = [{"role": "user", "content": f"Conversation number {i}."}]
        reply, headers = ask(client, history, max_tokens=3)
        notes.append(headers["x-sinkd-why"])
        if i == 0:
            first = [*history, {"role": "assistant", "content": reply.choices[0].message.content}]
    assert not any("least recently used" in n for n in notes), notes  # none closed
    bob_session = daemon.service.registry.get(bob_headers["x-sinkd-session"])
    assert bob_session is not None
    assert daemon.service.registry.parked()  # some wait parked
    reply, headers = ask(
        client, [*first, {"role": "user", "content": "Still there?"}], max_tokens=3
    )
    assert headers["x-sinkd-continuation"] == "continued"
    assert reply.model_extra["sinkd"]["receipt"]["restored_ms"] > 0
    assert reply.usage.prompt_tokens < 20  # the new message alone


def test_a_regenerate_takes_the_last_turn_back_reads_nothing_again_and_resumes(
    tmp_path: Path,
) -> None:
    """The same history without its last reply (a chat UI's regenerate), or with its last message
    edited, continues the session: the last turn leaves the cache, the new one alone goes in. The
    rewound session resumes bit for bit from what a crash leaves."""
    from tests.support.daemons import stop_without_snapshots

    d = start(tmp_path)
    alice = Principal("alice")
    history: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    try:
        for question in QUESTIONS:  # until past the 256 cells: the window has evicted
            history.append({"role": "user", "content": question})
            reply, headers = ask(sdk(d), history, max_tokens=40)
            history.append({"role": "assistant", "content": reply.choices[0].message.content})
            last = reply.model_extra["sinkd"]["receipt"]
            if last["evicted_tokens"] > 0:
                break
        session = headers["x-sinkd-session"]
        assert last["evicted_tokens"] > 0
        before = last["n_seen"] - reply.usage.total_tokens

        again, headers = ask(sdk(d), history[:-1], max_tokens=40)  # regenerate
        ext = again.model_extra["sinkd"]
        assert headers["x-sinkd-continuation"] == "regenerated", headers["x-sinkd-why"]
        assert headers["x-sinkd-session"] == session and ext["ingested_turns"] == 0
        assert again.usage.prompt_tokens == reply.usage.prompt_tokens  # the last turn alone
        assert ext["receipt"]["n_seen"] == before + again.usage.total_tokens

        edited = [*history[:-2], {"role": "user", "content": "Name a tree instead."}]
        third, headers = ask(sdk(d), edited, max_tokens=40)  # the last message edited
        assert headers["x-sinkd-continuation"] == "regenerated"
        assert third.model_extra["sinkd"]["receipt"]["n_seen"] == before + third.usage.total_tokens
        history = [*edited, {"role": "assistant", "content": third.choices[0].message.content}]
        s = d.service.registry.get(session)
        assert s is not None and s.rewinds == 2
        kinds = [e.kind for e in d.service.reads.trace(alice, Handle(session, s.generation))]
        assert kinds.count("rewind") == 2
        want = d.service.reads.inspect(alice, Handle(session, s.generation), False, True).logits
        stop_without_snapshots(d)  # what a kill -9 leaves: the rewind's snapshot, then chunks

        d = start(tmp_path)
        s = d.service.registry.get(session)
        assert s is not None and s.rewinds == 2
        got = d.service.reads.inspect(alice, Handle(session, s.generation), False, True).logits
        assert want is not None and got is not None and np.array_equal(got, want)
        history.append({"role": "user", "content": "Thanks."})
        _, headers = ask(sdk(d), history, max_tokens=8)
        assert headers["x-sinkd-continuation"] == "continued", headers["x-sinkd-why"]
        assert headers["x-sinkd-session"] == session
    finally:
        d.stop()


# --- the Responses API: stateful, each stored conversation one session ---


def respond(client: openai.OpenAI, **kw: Any) -> Any:
    raw = client.responses.with_raw_response.create(
        model=MODEL, **{"max_output_tokens": 12, "temperature": 0, **kw}
    )
    return raw.parse(), raw.headers


def test_responses_continue_from_the_previous_response_with_only_the_new_input(
    daemon: Daemon,
) -> None:
    client = sdk(daemon)
    first, headers = respond(client, instructions=SYSTEM, input="Name a colour.")
    assert first.status in ("completed", "incomplete") and first.output_text
    assert headers["x-sinkd-continuation"] == "new"
    session = headers["x-sinkd-session"]
    second, headers = respond(client, previous_response_id=first.id, input="Another.")
    assert headers["x-sinkd-continuation"] == "continued" and headers["x-sinkd-session"] == session
    assert second.previous_response_id == first.id
    assert 0 < second.usage.input_tokens < first.usage.input_tokens  # the new input alone
    assert client.responses.retrieve(second.id).output_text == second.output_text

    again, headers = respond(client, previous_response_id=first.id, input="Another.")
    assert headers["x-sinkd-continuation"] == "regenerated"  # second is taken back out
    assert again.usage.input_tokens == second.usage.input_tokens
    respond(client, previous_response_id=again.id, input="More.")
    with pytest.raises(openai.ConflictError):  # a branch further back: refused, not merged
        respond(client, previous_response_id=first.id, input="Other.")
    with pytest.raises(openai.BadRequestError) as bad:
        respond(client, previous_response_id=first.id, instructions="Be verbose.", input="Hi")
    assert bad.value.body["param"] == "instructions"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):  # another tenant's response is nobody's
        respond(sdk(daemon, "bob-token"), previous_response_id=first.id, input="Hi")

    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)
    s = daemon.service.registry.get(session)
    assert s is not None  # the conversation stays


def test_responses_stream_typed_events_and_unstored_ones_leave_nothing(daemon: Daemon) -> None:
    client = sdk(daemon)
    events = list(
        client.responses.create(
            model=MODEL, input="Count to five.", max_output_tokens=10, temperature=0, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added",
    ]  # fmt: skip
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and events[-1].response.output_text == deltas
    assert client.responses.retrieve(events[-1].response.id).output_text == deltas

    unstored, headers = respond(client, input="Say hi.", store=False)
    assert unstored.output_text
    assert daemon.service.registry.get(headers["x-sinkd-session"]) is None  # its session closed
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_stored_responses_outlive_a_restart_and_go_with_their_session(tmp_path: Path) -> None:
    d = start(tmp_path)
    try:
        first, headers = respond(sdk(d), input="My name is Ada.")
        session = headers["x-sinkd-session"]
    finally:
        d.stop()
    d = start(tmp_path)
    try:
        assert sdk(d).responses.retrieve(first.id).output_text == first.output_text
        second, headers = respond(sdk(d), previous_response_id=first.id, input="Thanks.")
        assert headers["x-sinkd-continuation"] == "continued"
        assert headers["x-sinkd-session"] == session
        h = d.service.registry.get(session)
        assert h is not None
        d.service.close(Principal("alice"), Handle(session, h.generation))
        with pytest.raises(openai.NotFoundError):
            sdk(d).responses.retrieve(second.id)
    finally:
        d.stop()
    d = start(tmp_path)
    try:
        with pytest.raises(openai.NotFoundError):  # the journal let it go with its session
            sdk(d).responses.retrieve(first.id)
    finally:
        d.stop()


def test_while_the_model_loads_chat_is_503_with_retry_after_and_health_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from sinkd.daemon.runtime.service import SinkdService

    loading = threading.Event()
    real = SinkdService._open_engine

    def held(self: SinkdService) -> Any:
        assert loading.wait(120), "the test never let the model load"
        return real(self)

    monkeypatch.setattr(SinkdService, "_open_engine", held)
    d = Daemon(settings(tmp_path, durable=False, http="127.0.0.1:0"))
    d.start()
    try:
        assert d.http is not None
        health = httpx.get(f"{d.http.address}/health")
        assert health.status_code == 503 and health.headers["retry-after"] == "1"
        with pytest.raises(openai.InternalServerError) as err:
            ask(sdk(d), [{"role": "user", "content": "Hi."}])
        assert err.value.status_code == 503 and err.value.response.headers["retry-after"] == "1"
        loading.set()
        d.wait_ready(120)
        assert httpx.get(f"{d.http.address}/health").status_code == 200
        reply, _ = ask(sdk(d), [{"role": "user", "content": "Hi."}], max_tokens=2)
        assert reply.choices[0].message.content is not None
    finally:
        loading.set()
        d.stop()


def test_past_the_tenants_call_limit_a_turn_is_429_with_retry_after(tmp_path: Path) -> None:
    """One call in flight per tenant: a second is refused at once, not queued without end; another
    tenant is not starved by it."""
    import threading

    from sinkd.daemon import failpoints

    d = Daemon(settings(tmp_path, durable=False, http="127.0.0.1:0", max_calls_per_tenant=1))
    d.start()
    d.wait_ready(120)
    held, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:  # the first turn has its answer, and still holds its slot
        held.set()
        release.wait(60)

    def first() -> None:
        try:
            ask(sdk(d), [{"role": "user", "content": "Hi."}], max_tokens=2)
        except BaseException as e:  # collected, re-raised below
            errors.append(e)

    try:
        with failpoints.armed("generation-done", hold):
            t = threading.Thread(target=first)
            t.start()
            assert held.wait(60)
            with pytest.raises(openai.RateLimitError) as err:
                sdk(d).chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "Me too."}], max_tokens=2
                )
            assert err.value.response.headers["retry-after"] == "1"
            release.set()
        t.join(60)
        assert not t.is_alive()
        if errors:
            raise errors[0]
        reply, _ = ask(sdk(d, "bob-token"), [{"role": "user", "content": "Hi."}], max_tokens=2)
        assert reply.choices
    finally:
        release.set()
        d.stop()


def test_a_huge_declared_body_and_a_ten_thousand_turn_history_are_refused_storing_nothing(
    tmp_path: Path,
) -> None:
    import http.client

    d = Daemon(settings(tmp_path, durable=False, http="127.0.0.1:0"))
    d.start()
    d.wait_ready(120)
    try:
        assert d.http is not None
        host, port = d.http.address.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("Authorization", "Bearer alice-token")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(100 * 2**20))  # 100 MB said, not sent
        conn.endheaders(b"{}")
        assert conn.getresponse().status == 413

        turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"}
                 for i in range(10_001)]  # fmt: skip
        with pytest.raises(openai.BadRequestError) as err:
            ask(sdk(d), turns)
        assert "at most" in err.value.message
        assert len(d.service.registry) == 0  # nothing was made of it
    finally:
        d.stop()


def test_a_conversation_continues_after_kill_9_of_sinkd_serve(tmp_path: Path) -> None:
    """The real thing: `sinkd serve` killed with SIGKILL between turns; restarted, the client's
    resent history continues the same session (its place was journalled before the answer)."""
    import signal

    from tests.support.daemons import http_serve_env, serve_subprocess

    env, port = http_serve_env(tmp_path, n_ctx_seq="256", max_sessions="2")
    sock = tmp_path / "sinkd.sock"
    proc = serve_subprocess(sock, env)
    try:
        key = (tmp_path / "http-token").read_text().strip()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
        history = [{"role": "user", "content": "My name is Ada."}]
        first, headers = ask(client, history)
        session = headers["x-sinkd-session"]
        history += [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "What is a hive?"}]  # fmt: skip
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proc = serve_subprocess(sock, env)
        _, headers = ask(client, history)
        assert headers["x-sinkd-continuation"] == "continued", headers["x-sinkd-why"]
        assert headers["x-sinkd-session"] == session
    finally:
        proc.kill()
        proc.wait(30)


def test_no_prompt_or_reply_text_reaches_the_logs(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    marker = "Zanzibarquoll"
    with caplog.at_level(logging.DEBUG):
        reply, _ = ask(sdk(daemon), [{"role": "user", "content": f"Repeat {marker} please."}])
        respond(sdk(daemon), input=f"Say {marker}.")
        with pytest.raises(openai.BadRequestError):  # a refusal names the field, not the text
            ask(sdk(daemon), [{"role": "user", "content": marker}], logprobs=True)
    text, said = caplog.text, reply.choices[0].message.content or ""
    assert marker not in text
    assert len(said) < 12 or said not in text


def test_langchain_chat_openai_continues_its_conversation(daemon: Daemon) -> None:
    """LangChain's ChatOpenAI, as an app built on it calls the front: whole and streamed, the
    history it resends continuing the session (its usage counts the new turn alone)."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI

    assert daemon.http is not None
    llm = ChatOpenAI(
        base_url=f"{daemon.http.address}/v1", api_key="alice-token", model=MODEL,
        temperature=0, max_tokens=12, max_retries=0,
    )  # fmt: skip
    history: list[Any] = [SystemMessage(SYSTEM), HumanMessage("Name a bird.")]
    first = llm.invoke(history)
    assert first.content and first.usage_metadata is not None
    history += [AIMessage(first.content), HumanMessage("Another.")]
    pieces = list(llm.stream(history, stream_usage=True))
    text = "".join(str(p.content) for p in pieces)
    usage = next(p.usage_metadata for p in reversed(pieces) if p.usage_metadata)
    assert text and 0 < usage["input_tokens"] < first.usage_metadata["input_tokens"]


def test_langchain_trim_messages_keeps_one_session_across_twelve_turns(daemon: Daemon) -> None:
    """LangChain's trim_messages drops the oldest turns each turn (the system prompt kept), as an
    app fitting its context does; sent with the openai SDK: one session across twelve turns, each
    reading its new message alone, and `why` saying how many turns the client dropped."""
    from langchain_core.messages import (
        AIMessage,
        HumanMessage,
        SystemMessage,
        convert_to_openai_messages,
        trim_messages,
    )

    client = sdk(daemon)
    history: list[Any] = [SystemMessage(SYSTEM)]
    session = ""
    for turn in range(12):
        history.append(HumanMessage(f"Tell me one word about the number {turn}."))
        sent = trim_messages(
            history, strategy="last", token_counter=len, max_tokens=5,
            include_system=True, start_on="human",
        )  # fmt: skip
        reply, headers = ask(client, convert_to_openai_messages(sent), max_tokens=6)
        if turn == 0:
            assert headers["x-sinkd-continuation"] == "new"
            session = headers["x-sinkd-session"]
        else:
            assert headers["x-sinkd-continuation"] == "continued", (turn, headers["x-sinkd-why"])
            assert headers["x-sinkd-session"] == session
            ext = reply.model_extra["sinkd"]
            recalled = bool(ext["recall"] and ext["recall"]["recalled"])
            budget = 96 if recalled else 0  # a recall adds at most its budget (frames included)
            assert reply.usage.prompt_tokens < 40 + budget  # its own message, never the history
        if len(sent) < len(history):
            assert "the client dropped" in headers["x-sinkd-why"], headers["x-sinkd-why"]
        history.append(AIMessage(reply.choices[0].message.content))
    assert len(history) > 2 * 5  # it did trim, many times over


def test_a_deleted_response_leaves_no_file_of_the_state_directory(tmp_path: Path) -> None:
    """A stored response's text is plaintext at rest (journal.db and its write-ahead log); DELETE
    removes it from every file before its reply."""
    d = Daemon(settings(tmp_path, http="127.0.0.1:0", purge_interval_s=0))
    d.start()
    d.wait_ready(120)
    try:
        stored, _ = respond(sdk(d), input="Describe a lighthouse in one sentence.",
                            max_output_tokens=24)  # fmt: skip
        import re

        # a plain run of it, as JSON writes it unescaped, long enough to be found only there
        text = max(re.findall(r"[A-Za-z ,.]+", stored.output_text), key=len, default="").strip()
        assert len(text) >= 12, stored.output_text
        state = d.settings.state_dir

        assert holders(state, [text]), "the test looks for the text where it is stored"
        sdk(d).responses.delete(stored.id)  # its reply waits for the purge
        assert holders(state, [text]) == []
    finally:
        d.stop()


def test_a_second_daemon_on_the_same_http_port_is_refused(daemon: Daemon, tmp_path: Path) -> None:
    """SO_REUSEADDR (a restart binds past TIME_WAIT) lets no second listener share the port."""
    from sinkd.errors import ListenError

    assert daemon.http is not None
    taken = daemon.http.address.removeprefix("http://")
    other = Daemon(settings(tmp_path, durable=False, http=taken))
    with pytest.raises(ListenError, match="could not listen on http"):
        other.start()


@pytest.mark.parametrize("how", ["reset", "close"])
def test_a_reset_or_close_that_overtakes_a_regenerate_wins_and_leaks_nothing(
    daemon: Daemon, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session is reset or closed between matching the regenerate and taking its last turn
    back: the rewind, checked on the engine thread at the handle's generation, is refused with
    the session's status, and the reset session holds nothing of the old turns."""
    client, alice = sdk(daemon), Principal("alice")
    history = [{"role": "user", "content": f"A conversation that will be {how}."}]
    first, headers = ask(client, history)
    session = headers["x-sinkd-session"]
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And then?"},
    ]
    ask(client, history)  # its second turn: the one a regenerate takes back
    service = daemon.service
    real = service.chats.rewind

    def overtaken(principal: Principal, handle: Handle, to: int) -> None:
        if how == "reset":
            service.reset(alice, handle)
        else:
            service.close(alice, handle)
        real(principal, handle, to)

    monkeypatch.setattr(service.chats, "rewind", overtaken)
    expected = openai.ConflictError if how == "reset" else openai.NotFoundError
    with pytest.raises(expected):
        ask(client, history)  # a regenerate of the second reply
    s = service.registry.get(session)
    if how == "reset":
        assert s is not None and s.rewinds == 0 and s.seq.state.n_seen == len(s.system_tokens)
    else:
        assert s is None
    monkeypatch.setattr(service.chats, "rewind", real)
    _, headers = ask(client, history)  # and the client's next try starts anew
    assert headers["x-sinkd-continuation"] == "new" and headers["x-sinkd-session"] != session
