"""The GPU path, run: every layer of the default model offloaded, each claim of the CPU path checked
again against the same GPU backend (the bits of one backend are never compared with another's).
In CI on llama.cpp's Vulkan backend over Mesa's lavapipe (`make test-vulkan`: its own virtual
environment, GGML_VK_VISIBLE_DEVICES=0), ~2 tokens/s decoding, ~8 prefilling: a few hundred tokens
a test. Skipped, saying so, where llama.cpp has no GPU device (the main suite's build).

What a row's bits depend on there (bench/backend_rows.py, docs/gpu.md): the other sequences in its
pass, and how many rows of its own stream (up to 8 a matrix-vector kernel, more a tiled one). So
sinkd decodes one sequence a pass, cuts and restores reads only where the pieces sum alike, and
does not draft; these tests hold it to its promises under those rules."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from sinkd.daemon.engine.decoding import BatchItem
from sinkd.daemon.engine.devices import offload_devices
from sinkd.daemon.engine.llama import init_backend
from sinkd.daemon.node import Daemon
from sinkd.daemon.runtime.api import Handle
from sinkd.daemon.runtime.sessions import Principal
from sinkd.daemon.store import archive
from sinkd.errors import FailedPrecondition
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc
from tests.support.clients import Client
from tests.support.daemons import serve_subprocess, stop_without_snapshots
from tests.support.settings import settings
from tests.support.texts import TEXT
from tests.support.tokens import ADMIN, ALICE, sha


def _no_gpu() -> str:
    """Why the group cannot run here ("" where it can)."""
    init_backend()
    if offload_devices():
        return ""
    return (
        "llama.cpp here has no GPU device: the main install is CPU-only (make test-vulkan builds"
        " the Vulkan one); on Mesa's lavapipe set GGML_VK_VISIBLE_DEVICES=0"
    )


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(_no_gpu()), reason=_no_gpu() or "-")]

GPU = {"n_gpu_layers": 99, "n_ctx_seq": 256, "step_tokens": 64}
WHO = Principal("alice")
PROMPT = TEXT[:160]  # ~40 tokens
SYSTEM = "You are the operator's assistant for the storage cluster. " * 6  # ~70 tokens


def daemon(tmp: Path, **kw: Any) -> Daemon:
    d = Daemon(settings(tmp, **{**GPU, **kw}))
    d.start()
    d.wait_ready(300)
    return d


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """Every layer offloaded, as a user runs it: decode runs of 16 (the GPU default), prefix
    states kept, two sequences and room to park."""
    d = daemon(tmp_path_factory.mktemp("gpu"), max_sessions=2, max_parked_sessions=4)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def step(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """The same backend, a step at a time, no prefix states, nothing parked: the reference."""
    d = daemon(tmp_path_factory.mktemp("step"), decode_run=1, prefix_ram_mb=0, max_sessions=2)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def cpu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """The same build's CPU backend (no layer offloaded)."""
    d = daemon(tmp_path_factory.mktemp("cpu"), n_gpu_layers=0, max_sessions=2)
    yield d
    d.stop()


def client(d: Daemon) -> Client:
    return Client(d.addresses[0])


def logits_of(c: Client, h: pb.Handle) -> np.ndarray:
    r = c.s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE)
    return np.frombuffer(r.logits, dtype="<f4").copy()


def test_every_layer_is_offloaded_to_a_named_device_and_nothing_drafts(gpu: Daemon) -> None:
    engine = gpu.service.scheduler.engine
    assert engine is not None and engine.devices
    assert engine.backend.endswith(f"{engine.n_layer + 1}/{engine.n_layer + 1} layers")
    assert engine.devices[0].name in engine.backend
    assert engine.solo_passes and engine.min_piece == 9
    why = engine.rows_not_exact()
    assert why is not None and engine.devices[0].name in why
    assert not gpu.service.scheduler.executor.verifier.drafting()
    admin = pb_grpc.AdminStub(grpc.insecure_channel(gpu.addresses[0]))
    models = admin.ListModels(pb.ListModelsRequest(), metadata=ADMIN).models
    assert [m.backend for m in models if m.loaded] == [engine.backend]


def test_sinkds_passes_give_a_row_the_bits_it_has_alone(make_engine: Any) -> None:
    """One sequence a pass (its company never changes its rows), pieces of 9 rows or more alike,
    cells saved and restored alike: what resume, parking, prefixes and batched == alone rest on
    here. (What llama.cpp's own batching would give instead: bench/backend_rows.py.)"""
    engine = make_engine(n_gpu_layers=99, n_ctx_seq=128, n_seq_max=3, n_batch=128)
    toks = engine.vocab.tokenize(TEXT)
    for s in range(3):
        engine.decode_batch([BatchItem(s, toks[s * 7 : s * 7 + 24], 0)])
    saved = [engine.cells.save_seq(s) for s in range(3)]

    def last_rows(items: list[BatchItem]) -> list[np.ndarray]:
        for s in range(3):
            engine.cells.restore_seq(s, saved[s])
        rows = []
        for piece in items:  # each a separate call: a cut
            row = engine.decode_batch([piece])[0]
            assert row is not None
            rows.append(row.copy())
        return rows

    def together(items: list[BatchItem]) -> np.ndarray:
        for s in range(3):
            engine.cells.restore_seq(s, saved[s])
        row = engine.decode_batch(items)[0]
        assert row is not None
        return row.copy()

    alone = together([BatchItem(0, [toks[60]], 24)])
    company = [BatchItem(1, [toks[61]], 24), BatchItem(2, toks[62:80], 24)]
    assert np.array_equal(together([BatchItem(0, [toks[60]], 24), *company]), alone)
    chunk = toks[60:80]
    whole = last_rows([BatchItem(0, chunk, 24)])[-1]
    assert np.array_equal(
        last_rows([BatchItem(0, chunk[:9], 24), BatchItem(0, chunk[9:], 33)])[-1], whole
    )
    assert np.array_equal(
        last_rows([BatchItem(0, chunk[:10], 24), BatchItem(0, chunk[10:], 34)])[-1], whole
    )
    assert engine.pieces_alike(9, 20) and not engine.pieces_alike(8, 20)


def test_eviction_and_shift_keep_the_policys_cells_and_receipts(gpu: Daemon, cpu: Daemon) -> None:
    """A sink session that evicts and shifts (`llama_memory_seq_rm`, `llama_memory_seq_add` on
    the device): its receipt, trace and logical positions are the policy's, as on the CPU, and
    llama.cpp's cells agree with them (the audit, every cell checked)."""
    policy = {"sinks": 4, "window": 48, "evict_chunk": 16}
    got = {}
    for name, d in (("gpu", gpu), ("cpu", cpu)):
        c = client(d)
        h = c.create(**policy).handle
        receipt = c.append(h, TEXT[:420]).receipt
        trace = c.s.Trace(pb.HandleRequest(handle=h), metadata=ALICE).events
        got[name] = (
            receipt,
            [(e.at_token, e.evicted_logical.start, e.evicted_logical.end, e.shift_delta,
              e.shifted_cache.start, e.shifted_cache.end) for e in trace],
        )  # fmt: skip
        if name == "gpu":
            assert_cells_agree(d, h.session_id, receipt.retained)
        c.s.Close(pb.HandleRequest(handle=h), metadata=ALICE)
    (g, gt), (p, pt) = got["gpu"], got["cpu"]
    assert gt == pt and gt
    for field in ("n_seen", "retained", "evictions", "evicted_tokens", "shifts"):
        assert getattr(g, field) == getattr(p, field), field
    for span in ("anchors_logical", "recent_logical", "anchors_cache", "recent_cache"):
        a, b = getattr(g, span), getattr(p, span)
        assert (a.start, a.end) == (b.start, b.end), span


def assert_cells_agree(d: Daemon, session_id: str, retained: int) -> None:
    """llama.cpp's cells of the session against its policy, every cell (the audit), and packed
    from position 0: the shift moved the window down behind the sinks."""
    scheduler, session = d.service.scheduler, d.service.registry.get(session_id)
    assert session is not None and session.seq.trace, "it evicted"
    assert scheduler.call(lambda e: scheduler.auditor.check(session)), "the cells disagree"
    assert scheduler.call(lambda e: e.cells.pos_range(session.seq_id)) == (0, retained - 1)


def test_decode_runs_and_a_resume_from_the_journal_are_bit_for_bit(
    tmp_path: Path, step: Daemon
) -> None:
    """Decode runs of 16 (the GPU default: each token alone in its pass, journalled as its own
    chunk) give a step at a time's tokens and logits; and a daemon stopped with nothing but its
    journal (no stop snapshot) replays it, one sequence a pass, to the same logits."""
    d = daemon(tmp_path / "runs", max_sessions=2, snapshot_every_tokens=100_000)
    try:
        c = client(d)
        h = c.create(window=200).handle
        c.append(h, PROMPT)
        ids, _ = c.generate(h, n=12)
        assert d.service.metrics.count("run_tokens") > 0
        logits = logits_of(c, h)
        stop_without_snapshots(d)
        d = daemon(tmp_path / "runs", max_sessions=2, snapshot_every_tokens=100_000)
        c = client(d)
        resumed = c.inspect(h).receipt
        assert "replayed" in resumed.resume
        assert np.array_equal(logits_of(c, h), logits)
        then, _ = c.generate(h, n=4)
    finally:
        d.stop()
    r = client(step)
    ref = r.create(window=200).handle
    r.append(ref, PROMPT)
    assert r.generate(ref, n=12)[0] == ids
    assert np.array_equal(logits_of(r, ref), logits)
    assert r.generate(ref, n=4)[0] == then
    r.s.Close(pb.HandleRequest(handle=ref), metadata=ALICE)


def test_a_kill_9_mid_generation_resumes_bit_for_bit(tmp_path: Path, step: Daemon) -> None:
    """`sinkd serve` with every layer offloaded, killed (SIGKILL) in the middle of a reply:
    restarted, the session holds what was acknowledged, with the logits a daemon that never
    stopped has at that token, and the two go on alike."""
    env = {
        **os.environ,
        "SINKD_STATE_DIR": str(tmp_path / "state"),
        "SINKD_N_GPU_LAYERS": "99",
        "SINKD_N_CTX_SEQ": "256",
        "SINKD_MAX_SESSIONS": "2",
        "SINKD_SNAPSHOT_EVERY_TOKENS": "100000",  # what resume finds is the journal
        "SINKD_HTTP": "off",
        "SINKD_TENANTS": json.dumps([{"name": "alice", "token_sha256": sha("alice-token")}]),
    }
    sock = tmp_path / "sinkd.sock"
    proc = serve_subprocess(sock, env)
    try:
        c = Client(f"unix:{sock}")
        h = c.create(window=200).handle
        prompt_seen = c.append(h, PROMPT).receipt.n_seen
        heard = 0
        for ev in c.s.Generate(pb.GenerateRequest(handle=h, max_tokens=24), metadata=ALICE):
            heard += ev.HasField("token")
            if heard == 6:
                proc.send_signal(signal.SIGKILL)
                break
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    proc = serve_subprocess(sock, env)
    try:
        c = Client(f"unix:{sock}")
        resumed = c.inspect(h).receipt
        generated = resumed.n_seen - prompt_seen
        assert generated >= 6  # every token heard was acknowledged, so journalled
        logits = logits_of(c, h)
        then, _ = c.generate(h, n=4)
    finally:
        proc.terminate()
        proc.wait(30)
    said = proc.stderr.read().decode() if proc.stderr else ""
    backend = step.service.scheduler.engine.backend  # type: ignore[union-attr]
    assert f"computes on {backend}" in said  # `sinkd serve` names the device it offloads to
    r = client(step)
    ref = r.create(window=200).handle
    r.append(ref, PROMPT)
    r.generate(ref, n=generated)
    assert np.array_equal(logits_of(r, ref), logits)
    assert r.generate(ref, n=4)[0] == then
    r.s.Close(pb.HandleRequest(handle=ref), metadata=ALICE)


def test_a_parked_session_comes_back_bit_for_bit(gpu: Daemon, step: Daemon) -> None:
    """Three sessions on two sequences: the least recent is parked (its cells read off the
    device into a snapshot) and restored to go on; its tokens and logits are those of a session
    that was never parked."""
    c = client(gpu)
    first = c.create(window=200).handle
    c.append(first, PROMPT)
    others = [c.create(window=200).handle for _ in range(2)]
    for k, h in enumerate(others):
        c.append(h, TEXT[200 + 40 * k : 240 + 40 * k])
    assert gpu.service.metrics.count("parks") >= 1
    ids, _ = c.generate(first, n=6)  # restored
    assert gpu.service.metrics.count("restores") >= 1
    logits = logits_of(c, first)
    for h in (first, *others):
        c.s.Close(pb.HandleRequest(handle=h), metadata=ALICE)
    r = client(step)
    ref = r.create(window=200).handle
    r.append(ref, PROMPT)
    assert r.generate(ref, n=6)[0] == ids
    assert np.array_equal(logits_of(r, ref), logits)
    r.s.Close(pb.HandleRequest(handle=ref), metadata=ALICE)


REPORT = "Disk report, node by node:\n" + "".join(
    f"node-{i}: sda {90 - i}% full.\n" for i in range(4)
)


def turn(tokenize: Any, n: int, first: str) -> str:
    """The report, then a line of `n` tokens in all beginning with `first` (no token merges
    across the report's last newline)."""
    tail = first
    while len(tokenize(REPORT + tail)) - len(tokenize(REPORT)) < n:
        tail += " node"
    assert tokenize(REPORT + tail)[: len(tokenize(REPORT))] == tokenize(REPORT)
    assert len(tokenize(REPORT + tail)) - len(tokenize(REPORT)) == n
    return REPORT + tail


def test_a_restored_prefix_computes_a_whole_reads_bits(gpu: Daemon, step: Daemon) -> None:
    """A second chat with the same system prompt starts from its stored prefix; one whose first
    prompt shares the report a first chat kept (the part of a longer prefix) restores it and reads
    on, where reading on ends in a piece that sums like the whole read's last (26 and 29 rows: 9
    or more); and where it would not (11 rows against a last piece of 8), it reads the turn whole.
    Each gives the bits of a daemon that keeps no prefix. (With the CPU's rule, a lone row alone,
    the third would restore and compute other bits here.)"""
    engine = gpu.service.scheduler.engine
    assert engine is not None
    tokenize, n_report = engine.vocab.tokenize, len(engine.vocab.tokenize(REPORT))
    assert 9 <= n_report < 64
    kept = turn(tokenize, n_report + 10, "First question:")  # 64 tokens or more: kept
    turns = {
        "restores the report": turn(tokenize, n_report + 29, "Third question:"),  # 64 + 26
        "reads the turn whole": turn(tokenize, n_report + 11, "Second question:"),  # 64 + 8
    }  # fmt: skip
    assert len(tokenize(kept)) >= 64
    opened: list[tuple[Daemon, pb.Handle]] = []

    def chat(d: Daemon, text: str) -> tuple[pb.Receipt, np.ndarray]:
        """A session, kept open: a tenant's prefix goes with the last session holding it."""
        c = client(d)
        h = c.s.Create(
            pb.CreateSessionRequest(policy=pb.Policy(name="sink", sinks=4, window=250),
                                    system_prompt=SYSTEM), metadata=ALICE,
        ).handle  # fmt: skip
        opened.append((d, h))
        return c.append(h, text).receipt, logits_of(c, h)

    try:
        first, _ = chat(gpu, kept)  # reads the system prompt and its first prompt, keeps both
        n_system = first.system_prompt_tokens
        assert n_system >= 64 and first.prefix_tokens == 0
        restored = {}
        for what, text in turns.items():
            receipt, logits = chat(gpu, text)
            restored[what] = receipt.prefix_tokens - n_system
            want_receipt, want = chat(step, text)
            assert want_receipt.prefix_tokens == 0 and want_receipt.n_seen == receipt.n_seen
            assert np.array_equal(logits, want), what
        assert restored == {"restores the report": n_report, "reads the turn whole": 0}
    finally:
        for d, h in opened:
            client(d).s.Close(pb.HandleRequest(handle=h), metadata=ALICE)


def test_a_session_moves_only_between_daemons_of_one_backend(
    tmp_path: Path, gpu: Daemon, cpu: Daemon
) -> None:
    """An archive made on the CPU backend is refused by a daemon that offloads its layers, and
    one made there by a CPU daemon, each naming both backends; a state directory journalled on
    the CPU makes its sessions stale, not replayed, on the GPU."""
    for made, into in ((cpu, gpu), (gpu, cpu)):
        h = client(made).create().handle
        client(made).append(h, PROMPT[:60])
        data = b"".join(made.service.moves.export(WHO, Handle(h.session_id, h.generation)))
        assert (
            archive.unpack(data).manifest["config"]["backend"]
            == made.service.scheduler.engine.backend
        )  # type: ignore[union-attr]
        theirs, ours = made.service.scheduler.engine.backend, into.service.scheduler.engine.backend  # type: ignore[union-attr]
        with pytest.raises(FailedPrecondition) as refused:
            into.service.moves.import_(WHO, data)
        assert f"backend was {theirs!r}, this daemon runs {ours!r}" in str(refused.value)
        client(made).s.Close(pb.HandleRequest(handle=h), metadata=ALICE)
    on_cpu = daemon(tmp_path / "moved", n_gpu_layers=0)
    try:
        h = client(on_cpu).create().handle
        client(on_cpu).append(h, PROMPT[:60])
    finally:
        on_cpu.stop()
    on_gpu = daemon(tmp_path / "moved")
    try:
        with pytest.raises(grpc.RpcError) as stale:
            client(on_gpu).append(h, " more")
        assert stale.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        backend = on_gpu.service.scheduler.engine.backend  # type: ignore[union-attr]
        assert f"backend was 'cpu', the daemon runs {backend!r}" in (stale.value.details() or "")
    finally:
        on_gpu.stop()
