"""Decode runs (several greedy decodes per scheduler pass, runtime/loop/runahead.py): the tokens,
reasons, journal rows and bits of a step at a time, whatever ends a reply (max tokens, the end of
the turn, the repetition guard, an eviction on the way, a stop string, a cancel); on the fake engine
for the logic, on SmolLM2 for the bits and a resume after kill -9."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sinkd.daemon.engine.sampler import Sampler, SamplingParams
from sinkd.daemon.node import Daemon
from sinkd.daemon.runtime.api import (
    GenerationOptions,
    PolicyRequest,
    SamplingRequest,
)
from sinkd.daemon.runtime.loop.jobs import GenSpec, Job
from sinkd.daemon.runtime.loop.runahead import tokens_allowed
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.proto.v1 import sinkd_pb2 as pb
from tests.support.clients import Client
from tests.support.daemons import stop_without_snapshots
from tests.support.services import collected, fake_service, replies_together
from tests.support.settings import settings
from tests.support.texts import TEXT
from tests.support.tokens import ALICE

WHO = Principal("alice")
GREEDY = SamplingRequest(temperature=0.0)


def passes(service: SinkdService) -> list[int]:
    """Counts the scheduler's passes (each `_step`), from now on."""
    seen = [0]
    step = service.scheduler._step

    def counted(heads: Any) -> None:
        seen[0] += 1
        step(heads)

    service.scheduler._step = counted  # type: ignore[method-assign]
    return seen


def reply(
    service: SinkdService, opening: str, options: GenerationOptions, window: int = 24
) -> tuple[list[int], str, str, int, int]:
    """A session that evicts every few tokens (S=4, W=`window`, E=4): its generated ids, text,
    reason, the journal rows it wrote and its evictions."""
    handle = service.create(
        WHO, PolicyRequest(name="sink", sinks=4, window=window, evict_chunk=4)
    ).handle
    service.append(WHO, handle, opening, timeout=20)
    ids, text, done = collected(service.generate(WHO, handle, options, timeout=30))
    session = service.registry.get(handle.session_id)
    assert session is not None
    rows, evictions = session.log_chunks, session.seq.state.evictions
    service.close(WHO, handle)
    return ids, text, done.reason, rows, evictions


CASES = [  # (opening, options): every way a reply ends, each well past a full window (28 cells)
    ("Sea 171.", GenerationOptions(90, sampling=GREEDY)),  # the end of the turn, at 64 tokens
    ("Sea 263.", GenerationOptions(40, sampling=GREEDY)),  # max tokens
    ("Sea 114.", GenerationOptions(None, sampling=GREEDY)),  # repetition guard on, then eog
    ("Sea 185.", GenerationOptions(50, stops=["e"], sampling=GREEDY)),  # a stop string
    ("Sea 90.", GenerationOptions(30, sampling=SamplingRequest(temperature=0.8, seed=3))),
]


@pytest.mark.unit
def test_runs_give_the_tokens_reasons_and_journal_rows_of_a_step_at_a_time(
    tmp_path: Path,
) -> None:
    got: dict[int, list[Any]] = {}
    for run in (1, 8):
        service = fake_service(tmp_path / str(run), durable=True, decode_run=run)
        try:
            counted = passes(service)
            got[run] = [reply(service, opening, options) for opening, options in CASES]
            got[run].append(counted[0])
            got[run].append(service.metrics.count("run_tokens"))
        finally:
            service.stop()
    *replies, passes_8, run_tokens_8 = got[8]
    *replies_1, passes_1, run_tokens_1 = got[1]
    assert replies == replies_1  # ids, text, reason, journal rows: each reply alike
    reasons = [r[2] for r in replies]
    assert reasons[:2] == ["eog", "max_tokens"] and "stop" in reasons
    assert all(r[4] > 3 for r in replies[:3])  # runs stopped before each eviction
    assert run_tokens_1 == 0 and run_tokens_8 > 0
    tokens = sum(len(r[0]) for r in replies)
    assert passes_1 >= tokens and passes_8 < passes_1 - run_tokens_8 // 2


def three_replies(service: SinkdService) -> list[list[int]]:
    """A long greedy reply, a short greedy one and a sampled one, their jobs in the same steps."""
    policy = PolicyRequest(name="sink", sinks=4, window=24, evict_chunk=4)
    options = [
        GenerationOptions(60, sampling=GREEDY),
        GenerationOptions(13, sampling=GREEDY),
        GenerationOptions(30, sampling=SamplingRequest(temperature=0.8, seed=5)),
    ]
    return replies_together(service, WHO, policy, ["Sea 171.", "Sea 263.", "Sea 90."], options)[1]


@pytest.mark.unit
def test_sessions_that_leave_a_run_early_or_never_join_keep_their_rows(tmp_path: Path) -> None:
    """Three replies in the same steps: a long greedy one, a short greedy one that leaves the run
    while the other goes on, a sampled one that never joins: each as a step at a time gives it
    (a row lent when a session leaves is copied before the next decode overwrites it)."""
    got = {}
    for run in (1, 8):
        service = fake_service(tmp_path / str(run), decode_run=run)
        try:
            got[run] = three_replies(service), service.metrics.count("run_tokens")
        finally:
            service.stop()
    assert got[8][0] == got[1][0] and [len(ids) for ids in got[1][0]] == [60, 13, 30]
    assert got[8][1] > 0


@pytest.mark.unit
def test_a_waiting_request_or_the_time_bound_ends_a_run_at_once(tmp_path: Path) -> None:
    """While something waits in the engine's inbox, or once a run has decoded for decode_run_ms,
    a run decodes nothing more: each pass then decodes one token, as without runs; the same reply
    otherwise runs."""
    got = {}
    for case in ("free", "waiting", "bounded"):
        bound = 1e-6 if case == "bounded" else 0.0
        service = fake_service(tmp_path / case, decode_run=8, decode_run_ms=bound)
        try:
            if case == "waiting":
                service.scheduler._interrupted = lambda: True  # type: ignore[method-assign]
            options = GenerationOptions(40, sampling=GREEDY)
            ids, *_ = reply(service, "Sea 263.", options)
            got[case] = ids, service.metrics.count("run_tokens")
        finally:
            service.stop()
    assert got["waiting"][0] == got["free"][0] == got["bounded"][0] and len(got["free"][0]) > 8
    assert got["free"][1] > 0 and got["waiting"][1] == got["bounded"][1] == 0


@pytest.mark.unit
def test_a_run_stops_before_each_token_a_step_at_a_time_decides_on(tmp_path: Path) -> None:
    """The last token allowed, the one the repetition guard looks at, the last free cell: each is
    left to an ordinary step; a sampler that draws, a stop string or a lost argmax runs nothing."""
    service = fake_service(tmp_path)
    try:
        handle = service.create(WHO, PolicyRequest(name="sink", sinks=4, window=100)).handle
        service.append(WHO, handle, "Sea.", timeout=20)
        session = service.registry.get(handle.session_id)
        assert session is not None and session.greedy_hint is not None
        free = session.policy.budget - session.seq.retained

        def job(done: int, most: int = 200, guard: bool = False, **kw: Any) -> Job:
            stops = kw.pop("stops", [])
            sampler = Sampler(SamplingParams(**kw))
            j = Job(session, [], GenSpec(most, stops, sampler, repetition_guard=guard))
            j.generated = done
            return j

        assert tokens_allowed(job(0)) == free < 199
        assert tokens_allowed(job(95, most=100)) == 4  # 96..99: the 100th ends the reply
        assert tokens_allowed(job(10, guard=True)) == 5  # 11..15: the guard looks at the 16th
        assert tokens_allowed(job(15, guard=True)) == 0
        assert tokens_allowed(job(16, guard=True)) == 15
        assert tokens_allowed(job(0, stops=["x"])) == 0
        assert tokens_allowed(job(0, temperature=0.7)) == 0
        assert tokens_allowed(job(0, repeat_penalty=1.1)) == 0
        assert session.last_logits is not None
        session.set_logits(session.last_logits.copy(), None)  # e.g. read back from a snapshot
        assert tokens_allowed(job(0)) == 0
    finally:
        service.stop()


def generate_all(c: Client, handles: list[pb.Handle], n: int) -> list[list[int]]:
    """Every session generates `n` greedy tokens at once (their steps and runs shared)."""
    with ThreadPoolExecutor(len(handles)) as pool:
        return list(pool.map(lambda h: c.generate(h, n=n)[0], handles))


def logits_of(c: Client, h: pb.Handle) -> np.ndarray:
    r = c.s.Inspect(pb.InspectRequest(handle=h, include_logits=True), metadata=ALICE)
    return np.frombuffer(r.logits, dtype="<f4")


@pytest.mark.model
def test_runs_are_bit_for_bit_a_step_at_a_time_and_resume_after_kill_9(tmp_path: Path) -> None:
    """Three sessions generate together on SmolLM2, evicting on the way (W=60, E=16), with runs of
    8 and a step at a time: the same tokens; then the runs' daemon dies without its stop
    snapshots and resumes from the journal: the same logits, bit for bit, and the same tokens."""
    results: dict[int, Any] = {}
    for run in (1, 8):
        kw = {"snapshot_every_tokens": 10_000, "max_sessions": 4, "decode_run": run}
        d = Daemon(settings(tmp_path / str(run), **kw))
        d.start()
        d.wait_ready(120)
        c = Client(d.addresses[0])
        handles = [c.create(window=60).handle for _ in range(3)]
        for k, h in enumerate(handles):
            c.append(h, TEXT[k * 200 : k * 200 + 200])
        first = generate_all(c, handles, 40)
        if run == 8:
            assert d.service.metrics.count("run_tokens") > 0
            stop_without_snapshots(d)  # what the journal holds is all there is
            d = Daemon(settings(tmp_path / str(run), **kw))
            d.start()
            d.wait_ready(120)
            c = Client(d.addresses[0])
        rows = [logits_of(c, h) for h in handles]
        results[run] = (first, rows, generate_all(c, handles, 24))
        d.stop()
    (first_8, rows_8, then_8), (first_1, rows_1, then_1) = results[8], results[1]
    assert first_8 == first_1 and then_8 == then_1
    assert all(np.array_equal(a, b) for a, b in zip(rows_8, rows_1, strict=True))
