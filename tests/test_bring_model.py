"""Bringing a model: `sinkd models qualify | add | import ollama`.

Refusals are built with the `gguf` package (files written here, refused from their header before
llama.cpp reads them). The qualification itself runs on copies of the pinned models, whose entries
it must reproduce, and a user entry then serves through the daemon and survives a restart.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
from typer.testing import CliRunner

from sinkd.cli.main import app
from sinkd.daemon.models.gguf import read_header
from sinkd.daemon.models.ollama import find
from sinkd.daemon.models.registry import load_lock, locate, read_user_entries
from sinkd.errors import InvalidInput, ModelMismatch, ModelMissing

runner = CliRunner()
TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"


def synthetic(
    path: Path,
    arch: str,
    template: str | None = TEMPLATE,
    sliding_window: int = 0,
    keys: dict[str, int] | None = None,
) -> Path:
    """A small GGUF as a converter writes one: the metadata a loader reads, and one tensor."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(2048)
    w.add_block_count(2)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    if sliding_window:
        w.add_sliding_window(sliding_window)
    if template is not None:
        w.add_chat_template(template)
    for key, value in (keys or {}).items():
        w.add_uint32(key, value)
    w.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def add(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["models", "add", *args])
    return result.exit_code, result.output


@pytest.fixture
def user_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    lock = tmp_path / "user-models.lock"
    monkeypatch.setenv("SINKD_USER_LOCK", str(lock))
    return lock


@pytest.mark.unit
def test_the_header_reader_finds_what_the_writer_wrote(tmp_path: Path) -> None:
    h = read_header(synthetic(tmp_path / "m.gguf", "gemma3", sliding_window=512))
    assert h.architecture == "gemma3" and h.arch("attention.sliding_window") == 512
    assert h.metadata["tokenizer.chat_template"] == TEMPLATE
    assert [t.name for t in h.tensors] == ["token_embd.weight"]
    assert not h.truncated and h.data_end == h.file_size


@pytest.mark.unit
@pytest.mark.parametrize(
    ("arch", "kw", "check"),
    [
        ("gpt2", {}, "rotary positions"),  # learned absolute positions
        ("mpt", {}, "rotary positions"),  # ALiBi
        ("mamba", {}, "attention cache (not recurrent or hybrid)"),  # recurrent
        (
            "newhybrid",
            {"keys": {"newhybrid.ssm.state_size": 16}},
            "attention cache (not recurrent or hybrid)",
        ),
        ("llama", {"template": None}, "chat template"),
        ("gemma3", {"sliding_window": 32}, "room under the sliding window"),
    ],
)
def test_a_model_that_cannot_stream_is_refused_with_its_reason_and_nothing_written(
    tmp_path: Path, user_lock: Path, arch: str, kw: dict[str, object], check: str
) -> None:
    path = synthetic(tmp_path / f"{arch}.gguf", arch, **kw)  # type: ignore[arg-type]
    code, out = add(str(path), "--name", "candidate")
    assert code == 5, out
    assert f"{check}:" in out and "FAIL" in out
    assert not user_lock.exists()


@pytest.mark.unit
def test_a_truncated_or_foreign_file_is_refused(tmp_path: Path, user_lock: Path) -> None:
    whole = synthetic(tmp_path / "whole.gguf", "llama")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:-200])  # the tensor's bytes are short
    code, out = add(str(cut))
    assert code == 5 and "whole file:" in out, out
    header_cut = tmp_path / "header-cut.gguf"
    header_cut.write_bytes(whole.read_bytes()[:60])  # inside the metadata
    code, out = add(str(header_cut))
    assert code == 2 and "truncated" in out, out
    foreign = tmp_path / "notes.gguf"
    foreign.write_bytes(b"not a model at all, just some bytes" * 4)
    code, out = add(str(foreign))
    assert code == 2 and "not a GGUF" in out, out
    assert not user_lock.exists()


def _raw_gguf(path: Path, kv: bytes, n_kv: int = 1) -> Path:
    """A GGUF header written by hand: what no writer makes, a crafted file can hold."""
    import struct

    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, n_kv) + kv + b"\0" * 64)
    return path


def _key(name: str) -> bytes:
    import struct

    return struct.pack("<Q", len(name)) + name.encode()


@pytest.mark.unit
def test_a_crafted_header_is_refused_not_a_traceback(tmp_path: Path, user_lock: Path) -> None:
    import struct

    zero = _raw_gguf(tmp_path / "zero.gguf", _key("general.alignment") + struct.pack("<II", 4, 0))
    code, out = add(str(zero))
    assert code == 2 and "general.alignment 0 is not a power of two" in out, out
    deep = struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 5000 + struct.pack("<IQ", 4, 0)
    nested = _raw_gguf(tmp_path / "nested.gguf", _key("x") + deep)  # arrays 5,000 deep
    code, out = add(str(nested))
    assert code == 2 and "array of arrays" in out, out
    assert not user_lock.exists()


@pytest.mark.unit
def test_a_user_entry_round_trips_and_never_takes_a_shipped_name(
    tmp_path: Path, user_lock: Path
) -> None:
    from sinkd.daemon.models.registry import write_user_entry
    from sinkd.errors import ModelNotAllowed

    shipped = load_lock().get("smollm2-135m-instruct")
    mine = shipped.model_copy(
        update={
            "name": "mine",
            "parts": (),
            "path": str(tmp_path / 'weird "name".gguf'),
            "origin": "user",
            "qualification": {"checks": [{"name": "x", "passed": True}], "sink_over_full": 1.05},
        }
    )
    write_user_entry(mine)
    lock = load_lock()
    assert lock.get("mine") == mine and lock.get("mine").origin == "user"
    assert lock.get("smollm2-135m-instruct").origin == "shipped"
    with pytest.raises(ModelNotAllowed, match="shipped model's name"):
        write_user_entry(shipped.model_copy(update={"parts": (), "path": "/x.gguf"}))
    assert set(read_user_entries(user_lock)) == {"mine"}


def ollama_store(root: Path, model: Path, reference: str = "smollm2:135m") -> Path:
    """An Ollama store as Ollama lays it out: the blob named by its digest, a manifest naming it."""
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    blobs = root / "blobs"
    blobs.mkdir(parents=True)
    shutil.copyfile(model, blobs / f"sha256-{digest}")
    config = b'{"model_format":"gguf"}'
    config_digest = hashlib.sha256(config).hexdigest()
    (blobs / f"sha256-{config_digest}").write_bytes(config)
    name, tag = reference.split(":")
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {
                    "mediaType": "application/vnd.docker.container.image.v1+json",
                    "digest": f"sha256:{config_digest}",
                    "size": len(config),
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.ollama.image.model",
                        "digest": f"sha256:{digest}",
                        "size": model.stat().st_size,
                    },
                ],
            }
        )
    )
    return blobs / f"sha256-{digest}"


@pytest.mark.unit
def test_the_ollama_store_is_read_as_ollama_lays_it_out(tmp_path: Path) -> None:
    model = synthetic(tmp_path / "m.gguf", "llama")
    blob = ollama_store(tmp_path / "store", model, "tiny:q4")
    found = find("tiny:q4", tmp_path / "store")
    assert found.blob == blob and found.reference == "tiny:q4" and found.entry_name == "tiny-q4"
    assert find("library/tiny:q4", tmp_path / "store").blob == blob
    with pytest.raises(ModelMissing, match="no Ollama model tiny:latest"):
        find("tiny", tmp_path / "store")
    with pytest.raises(InvalidInput):
        find("../../etc:passwd", tmp_path / "store")
    data = blob.read_bytes()
    blob.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit off: not the digest's bytes
    with pytest.raises(ModelMismatch, match="Ollama manifest"):
        find("tiny:q4", tmp_path / "store")


# --- on the real models ---


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """The pinned SmolLM2 file, imported from an Ollama store into a user lock (one qualification
    for the tests below: it is the slow part)."""
    tmp = tmp_path_factory.mktemp("bring")
    shipped = load_lock().get("smollm2-135m-instruct")
    store = tmp / "ollama"
    blob = ollama_store(store, locate(shipped))
    lock = tmp / "user-models.lock"
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(store))
    mp.setenv("SINKD_USER_LOCK", str(lock))
    result = runner.invoke(
        app, ["models", "import", "ollama", "smollm2:135m", "--stream-tokens", "768", "--json"]
    )
    mp.undo()
    assert result.exit_code == 0, result.output
    yield lock, blob


@pytest.mark.model
def test_an_imported_copy_of_a_pinned_model_equals_its_shipped_entry(
    imported: tuple[Path, Path],
) -> None:
    from sinkd.evaluation.qualify import fingerprint

    lock, blob = imported
    entries = read_user_entries(lock)
    entry = entries["smollm2-135m"]
    assert entry.origin == "user" and entry.path == str(blob) and not entry.parts
    assert fingerprint(entry) == fingerprint(load_lock().get("smollm2-135m-instruct"))
    figures = entry.qualification
    assert figures["ppl_after_budget_sink"] < figures["ppl_after_budget_window"]
    assert figures["sink_over_full"] <= 1.25
    assert all(c["passed"] for c in figures["checks"])


@pytest.mark.model
def test_verify_names_the_lock_an_entry_comes_from(
    imported: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    lock, _ = imported
    monkeypatch.setenv("SINKD_USER_LOCK", str(lock))
    mine = runner.invoke(app, ["models", "verify", "smollm2-135m"])
    assert mine.exit_code == 0, mine.output
    assert "match its user entry (user-models.lock)" in mine.output
    shipped = runner.invoke(app, ["models", "verify", "smollm2-135m-instruct"])
    assert shipped.exit_code == 0, shipped.output
    assert "match models.lock" in shipped.output


@pytest.mark.model
def test_a_qualified_gemma_copy_equals_its_shipped_entry_and_proposes_its_template(
    tmp_path: Path,
) -> None:
    from sinkd.evaluation.qualify import fingerprint, qualify

    shipped = load_lock().get("gemma3-270m")
    copy = tmp_path / "gemma-copy.gguf"
    shutil.copyfile(locate(shipped), copy)
    q = qualify(copy, "gemma-copy", stream_tokens=512)
    assert q.passed, [c for c in q.checks if not c.passed]
    assert q.entry is not None and fingerprint(q.entry) == fingerprint(shipped)
    assert any("built-in 'gemma'" in n for n in q.notes)


@pytest.mark.model
def test_a_user_entry_streams_through_the_daemon_and_resumes(
    imported: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sinkd.daemon.node import Daemon
    from tests.support.clients import Client
    from tests.support.settings import settings
    from tests.support.texts import TEXT

    lock, _ = imported
    monkeypatch.setenv("SINKD_USER_LOCK", str(lock))
    d = Daemon(settings(tmp_path, model="smollm2-135m"))
    d.start()
    d.wait_ready(120)
    client = Client(d.addresses[0])
    try:
        h = client.create(sinks=4, window=120).handle
        client.append(h, TEXT * 2)
        before = client.inspect(h).receipt
        assert before.evicted_tokens > 0 and before.retained <= 124
        assert before.model == "smollm2-135m"
    finally:
        client.close()
        d.stop()
    d = Daemon(settings(tmp_path, model="smollm2-135m"))
    d.start()
    d.wait_ready(120)
    client = Client(d.addresses[0])
    try:
        after = client.inspect(h).receipt
        assert (after.n_seen, after.retained) == (before.n_seen, before.retained)
        assert len(client.generate(h, n=4)[0]) == 4
    finally:
        client.close()
        d.stop()


@pytest.mark.model
def test_gemma_chats_with_its_named_template_embedded_and_through_the_daemon(
    tmp_path: Path,
) -> None:
    """The file has no chat template; its lock entry names llama.cpp's built-in `gemma` one."""
    from sinkd.daemon.node import Daemon
    from sinkd.proto.v1 import sinkd_pb2 as pb
    from tests.support.clients import Client
    from tests.support.settings import settings
    from tests.support.tokens import ALICE

    result = runner.invoke(
        app,
        ["chat", "--embedded", "-m", "gemma3-270m", "--window", "120", "--max-tokens", "8"],
        input="Hello! My name is Ada.\nWhat is my name?\n",
    )
    assert result.exit_code == 0, result.stderr
    assert len([line for line in result.stdout.splitlines() if line.strip()]) >= 2  # two replies
    d = Daemon(settings(tmp_path, model="gemma3-270m"))
    d.start()
    d.wait_ready(120)
    client = Client(d.addresses[0])
    try:
        h = client.create(sinks=4, window=120).handle
        events = list(
            client.s.Chat(
                pb.ChatRequest(handle=h, message="Say hello.", max_tokens=8), metadata=ALICE
            )
        )
        assert any(e.HasField("token") for e in events) and events[-1].HasField("done")
        r = client.inspect(h, text=True)
        assert "<start_of_turn>user" in r.retained_text  # the built-in template framed the turn
        assert r.receipt.model == "gemma3-270m"
    finally:
        client.close()
        d.stop()


@pytest.mark.model
def test_the_first_message_survives_a_long_reply_in_a_default_chat(tmp_path: Path) -> None:
    """`sinkd chat`'s window (filling the session's cells) holds the first message through a
    256-token reply; the model's default budget (4 + 252 cells) loses it."""
    from sinkd.daemon.runtime.api import ChatRequest, GenerationOptions, PolicyRequest
    from sinkd.daemon.runtime.service import SinkdService
    from sinkd.daemon.runtime.sessions import Principal
    from tests.support.settings import settings
    from tests.support.texts import TEXT

    me = Principal("local")
    svc = SinkdService(settings(tmp_path, durable=False, n_ctx_seq=1024))
    svc.start()
    svc.wait_ready(120)
    try:
        reply = svc.engine.vocab.tokenize(TEXT * 4, add_bos=False)[:256]  # a reply of 256 tokens
        kept = {}
        for fill in (True, False):
            h = svc.create(me, PolicyRequest("sink", fill_window=fill), None).handle
            list(
                svc.chat(
                    me,
                    h,
                    ChatRequest("Hi! My name is Ada and I live in Lisbon.", GenerationOptions(4)),
                )
            )
            svc.append(me, h, None, reply)
            seen = svc.reads.inspect(me, h, include_text=True)
            kept[fill] = "Lisbon" in seen.retained_text
            if fill:
                assert seen.receipt.policy.window == 1020 and seen.receipt.evicted_tokens == 0
        assert kept == {True: True, False: False}
    finally:
        svc.stop()
