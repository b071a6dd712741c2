"""Sessions that move: a session exported from one daemon and imported into another (each with its
own state directory) keeps its handle, memory and logits bit for bit, and goes on as it would have;
an archive is refused, with the reason and nothing left behind, for another tenant, another model,
another attention kernel, a record that disagrees with its session, or any damage."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sinkd.daemon.runtime.api import (
    ChatRequest,
    Done,
    GenerationOptions,
    Handle,
    PolicyRequest,
    RecallRequest,
    SamplingRequest,
    TokenEvent,
)
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.daemon.store import archive
from sinkd.daemon.store.archive import Archive
from sinkd.errors import CorruptArchive, FailedPrecondition, NotFound, PermissionDenied
from tests.support.settings import settings
from tests.support.texts import LONG

pytestmark = pytest.mark.model

ALICE, BOB, ADMIN = Principal("alice"), Principal("bob"), Principal(None, admin=True)


def node(tmp: Path, **kw: Any) -> SinkdService:
    s = SinkdService(settings(tmp, **kw))
    s.start()
    s.wait_ready(120)
    return s


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SinkdService, SinkdService]]:
    a, b = node(tmp_path_factory.mktemp("a")), node(tmp_path_factory.mktemp("b"))
    yield a, b
    a.stop()
    b.stop()


def logits(s: SinkdService, p: Principal, h: Handle) -> np.ndarray:
    session = s.access.owned(p, h)
    assert session.last_logits is not None
    return session.last_logits.copy()


def planted(s: SinkdService) -> Handle:
    """A sink session with memory and a recalled copy in its window."""
    h = s.create(ALICE, PolicyRequest("sink", sinks=4, window=120), None,
                 recall=RecallRequest(mode="auto")).handle  # fmt: skip
    list(s.chat(ALICE, h, ChatRequest("The wifi password is tulip42.", GenerationOptions(4))))
    s.append(ALICE, h, LONG[:1400])
    done = [
        e
        for e in s.chat(ALICE, h, ChatRequest("What is the wifi password?", GenerationOptions(4)))
        if isinstance(e, Done)
    ]
    assert done[0].recall is not None and done[0].recall.recalled
    return h


def test_a_moved_session_keeps_its_handle_memory_and_logits_and_goes_on_the_same(
    nodes: tuple[SinkdService, SinkdService],
) -> None:
    a, b = nodes
    h = planted(a)
    before = logits(a, ALICE, h)
    data = b"".join(a.moves.export(ALICE, h))
    receipt = b.moves.import_(ALICE, data)
    # the same id and generation: the client's handle is valid here
    assert (receipt.session_id, receipt.generation) == (h.session_id, h.generation)
    assert np.array_equal(logits(b, ALICE, h), before)
    memory = [(p.passage_id, p.logical, p.text) for p in a.memory.memory(ALICE, h, "", 1000)]
    assert [
        (p.passage_id, p.logical, p.text) for p in b.memory.memory(ALICE, h, "", 1000)
    ] == memory
    assert (
        b.receipt(b.access.owned(ALICE, h)).recalled == a.receipt(a.access.owned(ALICE, h)).recalled
    )
    greedy = SamplingRequest(temperature=0.0)
    for s in (a, b):  # the same turn on both: the same tokens, the same logits after
        s.append(ALICE, h, LONG[1400:1700])
    said = [
        "".join(e.text for e in s.chat(ALICE, h, ChatRequest("And my password?", GenerationOptions(12, sampling=greedy)))
                if isinstance(e, TokenEvent))
        for s in (a, b)
    ]  # fmt: skip
    assert said[0] == said[1]
    assert np.array_equal(logits(a, ALICE, h), logits(b, ALICE, h))
    b.close(ALICE, h)
    a.close(ALICE, h)


def test_an_archive_is_refused_for_another_tenant_or_any_damage_and_nothing_stays(
    nodes: tuple[SinkdService, SinkdService],
) -> None:
    a, b = nodes
    h = planted(a)
    data = b"".join(a.moves.export(ALICE, h))
    with pytest.raises(NotFound):
        a.moves.export(BOB, h)  # another tenant cannot take it
    with pytest.raises(PermissionDenied, match="another tenant"):
        b.moves.import_(BOB, data)
    for damaged in (
        data[: len(data) // 2],
        data[:-1],
        data[:100] + bytes([data[100] ^ 1]) + data[101:],
    ):
        with pytest.raises(CorruptArchive):
            b.moves.import_(ALICE, damaged)
    # a record that disagrees with its session (its policy changed, re-packed with fresh checksums)
    a_ = archive.unpack(data)
    record = dict(a_.manifest["record"], policy={**a_.manifest["record"]["policy"], "sinks": 2})
    forged = b"".join(archive.pack(Archive({**a_.manifest, "record": record}, a_.members)))
    with pytest.raises(FailedPrecondition, match="generation hash"):
        b.moves.import_(ALICE, forged)
    assert not [s for s in b.registry.all() if s.id == h.session_id]
    assert not list((b.durability.dir / "snapshots").glob(f"{h.session_id}*"))  # type: ignore[union-attr]
    # the admin may move any tenant's session; then it is here, and a second import is refused
    b.moves.import_(ADMIN, b"".join(a.moves.export(ADMIN, h)))
    with pytest.raises(FailedPrecondition, match="already on this node"):
        b.moves.import_(ALICE, data)
    b.close(ALICE, h)
    a.close(ALICE, h)


@pytest.mark.parametrize(
    ("kw", "gate"),
    [({"model": "gemma3-270m"}, "model"), ({"flash_attn": "exact"}, "flash_attn"),
     ({"n_ctx_seq": 512}, "n_ctx_seq")],
)  # fmt: skip
def test_an_archive_from_another_model_or_kernel_is_refused_by_name(
    nodes: tuple[SinkdService, SinkdService], tmp_path: Path, kw: dict[str, Any], gate: str
) -> None:
    a, _ = nodes
    h = planted(a)
    data = b"".join(a.moves.export(ALICE, h))
    a.close(ALICE, h)
    other = node(tmp_path, **kw)
    try:
        with pytest.raises(FailedPrecondition, match=f"{gate} was"):
            other.moves.import_(ALICE, data)
        assert not other.registry.all()
        assert other.durability is not None
        assert not list((other.durability.dir / "snapshots").iterdir())
    finally:
        other.stop()


def test_an_archive_computed_on_another_backend_is_refused_naming_both(
    nodes: tuple[SinkdService, SinkdService],
) -> None:
    """A GPU backend computes other bits than the CPU's: an archive made where the layers were
    offloaded (its gates name the device; forged here, with fresh checksums: a CPU machine has
    none) is refused by a CPU node, and the reason names both backends. The real pair, a CPU
    daemon and a Vulkan one: tests/test_gpu_path.py."""
    a, b = nodes
    h = planted(a)
    made = archive.unpack(b"".join(a.moves.export(ALICE, h)))
    assert made.manifest["config"]["backend"] == "cpu"
    gpu = "Vulkan0 (llvmpipe (LLVM 15.0.6, 256 bits)): 31/31 layers"
    config = {**made.manifest["config"], "backend": gpu}
    forged = b"".join(archive.pack(Archive({**made.manifest, "config": config}, made.members)))
    with pytest.raises(
        FailedPrecondition, match=r"backend was 'Vulkan0 .*', this daemon runs 'cpu'"
    ):
        b.moves.import_(ALICE, forged)
    assert not [s for s in b.registry.all() if s.id == h.session_id]
    a.close(ALICE, h)


def test_the_cli_moves_a_session_over_grpc_and_refuses_by_its_exit_codes(tmp_path: Path) -> None:
    """`sinkd sessions export` writes the archive 0600 from one daemon, `import` loads it into
    another over gRPC (pieces of 1 MiB, the archive is megabytes), and the same handle answers
    there with the same logits; another tenant exits 11 (export) and 13 (import), a damaged
    archive 2, an existing file is never overwritten."""
    import stat

    import grpc

    from sinkd.daemon.node import Daemon
    from sinkd.proto.v1 import sinkd_pb2 as pb
    from tests.support.cli import sinkd
    from tests.support.clients import Client
    from tests.support.tokens import ALICE as ALICE_MD
    from tests.support.tokens import BOB as BOB_MD

    one, two = Daemon(settings(tmp_path / "one")), Daemon(settings(tmp_path / "two"))
    for d in (one, two):
        d.start()
        d.wait_ready(120)
    try:
        src, dst = Client(one.addresses[0]), Client(two.addresses[0])
        h = src.create(sinks=4, window=120).handle
        src.append(h, LONG[:1400])
        before = src.s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE_MD)
        path = tmp_path / "s.sinkd"
        conn = ["--connect", one.addresses[0], "--token", "alice-token"]
        code, out, err = sinkd("sessions", "export", h.session_id, "-o", str(path), *conn, "--json")
        assert code == 0, err
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and json.loads(out)["bytes"] > 1 << 20
        code, _, err = sinkd("sessions", "export", h.session_id, "-o", str(path), *conn)
        assert code == 2 and "exists" in err
        code, _, _ = sinkd("sessions", "export", h.session_id, "-o", str(tmp_path / "b"),
                           "--connect", one.addresses[0], "--token", "bob-token")  # fmt: skip
        assert code == 11 and not (tmp_path / "b").exists()
        damaged = tmp_path / "damaged.sinkd"
        damaged.write_bytes(path.read_bytes()[:-10])
        into = ["--connect", two.addresses[0]]
        code, _, err = sinkd("sessions", "import", str(damaged), *into, "--token", "alice-token")
        assert code == 2 and "checksum" in err, err
        code, _, err = sinkd("sessions", "import", str(path), *into, "--token", "bob-token")
        assert code == 13 and "another tenant" in err, err
        code, out, err = sinkd(
            "sessions", "import", str(path), *into, "--token", "alice-token", "--json"
        )
        assert code == 0, err
        assert json.loads(out)["generation"] == h.generation
        after = dst.s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE_MD)
        assert after.logits == before.logits and after.receipt.n_seen == before.receipt.n_seen
        with pytest.raises(grpc.RpcError) as refused:  # bob still cannot reach it on its new node
            dst.s.Inspect(pb.InspectRequest(handle=h), metadata=BOB_MD)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        code, out, err = sinkd("sessions", "release", h.session_id, *conn, "--json")
        assert code == 0 and json.loads(out) == {"released": h.session_id}, err
        with pytest.raises(grpc.RpcError) as moved:  # the old node: retry elsewhere, not gone
            src.s.Inspect(pb.InspectRequest(handle=h), metadata=ALICE_MD)
        assert moved.value.code() == grpc.StatusCode.UNAVAILABLE
        code, _, err = sinkd("sessions", "inspect", h.session_id, *conn)
        assert code == 10 and "moved" in err, err
        src.close()
        dst.close()
    finally:
        one.stop()
        two.stop()


def test_a_released_session_answers_unavailable_on_its_old_node_and_its_conversation_moves(
    tmp_path: Path,
) -> None:
    """Two named nodes sharing a conversations key: an HTTP conversation's session moves from
    `na` to `nb` and its next resent history continues there (only the new turn read); `na`
    answers UNAVAILABLE for it (its owner; another tenant: NOT_FOUND), also after a restart;
    `nb` answers UNAVAILABLE for an id `na` made that it never held, NOT_FOUND for one of its
    own; the session moved back is `na`'s again. A node with another key refuses the archive."""
    from sinkd.daemon.runtime.api import Turn
    from sinkd.daemon.runtime.conversations.chats import StatelessChatRequest
    from sinkd.errors import SessionElsewhere

    key = tmp_path / "conversations.key"
    key.write_text("one key for both nodes")
    key.chmod(0o600)

    def chat(s: SinkdService, turns: list[Turn]) -> tuple[str, str, str]:
        request = StatelessChatRequest(
            "", tuple(turns), GenerationOptions(6, sampling=SamplingRequest(temperature=0.0))
        )
        how, events = s.chats.turn(ALICE, request)
        text = "".join(e.text for e in events if isinstance(e, TokenEvent))
        return how.handle.session_id, how.how, text

    a = node(tmp_path / "a", node="na", conversations_key_file=key)
    b = node(tmp_path / "b", node="nb", conversations_key_file=key)
    try:
        turns = [Turn("user", "My name is Ada. Say OK.")]
        sid, how, reply = chat(a, turns)
        assert sid.startswith("s_na-") and how == "new"
        session = a.registry.get(sid)
        assert session is not None
        h = Handle(sid, session.generation)
        b.moves.import_(ALICE, b"".join(a.moves.export(ALICE, h)))
        a.moves.release(ALICE, h)
        turns += [Turn("assistant", reply), Turn("user", "What is my name?")]
        assert chat(b, turns)[:2] == (sid, "continued")  # the same session, on its new node
        with pytest.raises(SessionElsewhere, match="moved"):
            a.access.owned(ALICE, h)
        with pytest.raises(NotFound):
            a.access.owned(BOB, h)  # nothing tells another tenant it was there
        with pytest.raises(SessionElsewhere, match="made on node 'na'"):
            b.access.owned(ALICE, Handle("s_na-0123456789abcdef", "g"))
        with pytest.raises(NotFound):
            b.access.owned(ALICE, Handle("s_nb-0123456789abcdef", "g"))
        with pytest.raises(SessionElsewhere):  # a stored response made on a node not reached
            b.responses.get(ALICE, "resp_na-00112233445566778899aabbccddeeff")
        named = StatelessChatRequest(
            "", (Turn("user", "Hi."),), GenerationOptions(4), session_id="s_na-00ff00ff00ff00ff"
        )
        with pytest.raises(SessionElsewhere):  # an HTTP client naming a session of that node
            b.chats.turn(ALICE, named)
        a.stop()
        a = node(tmp_path / "a", node="na", conversations_key_file=key)  # the same state dir
        with pytest.raises(SessionElsewhere):
            a.access.owned(ALICE, h)
        back = b"".join(b.moves.export(ALICE, h))
        a.moves.import_(ALICE, back)
        b.moves.release(ALICE, h)
        assert a.access.owned(ALICE, h).id == sid
        other_key = tmp_path / "other.key"
        other_key.write_text("another key")
        other_key.chmod(0o600)
        c = node(tmp_path / "c", node="nc", conversations_key_file=other_key)
        try:
            with pytest.raises(FailedPrecondition, match="conversations key"):
                c.moves.import_(ALICE, back)
            assert not c.registry.all()
        finally:
            c.stop()
    finally:
        a.stop()
        b.stop()
