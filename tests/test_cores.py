"""Engines on one machine share its cores: each decodes with its cores divided by the engines busy
decoding, follows that share between decodes, and computes the same bits whatever its share."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from sinkd.cachepolicy import CacheSequence, PolicyConfig
from sinkd.daemon.config import THREADS_ENV, machine_threads
from sinkd.daemon.engine import cores, teams
from sinkd.daemon.engine.cores import CoreShare
from sinkd.daemon.engine.decoding import BatchItem
from sinkd.daemon.engine.llama import Engine
from tests.support.texts import TEXT

MakeEngine = Callable[..., Engine]


@pytest.mark.unit
def test_the_cores_are_split_between_the_engines_decoding(tmp_path: Path) -> None:
    a = CoreShare(8, tmp_path, refresh_s=3600)  # re-reads only when told, or when it registers
    b = CoreShare(8, tmp_path, refresh_s=3600)
    assert a.threads() == 8  # alone
    assert b.threads() == 4  # registers and sees two
    assert a.threads() == 8 and a.refresh() == 4  # a sees b at its next reading
    b.refresh_s = 0.0
    b.idle()  # nothing to decode: b stops counting
    assert not b.registered and a.refresh() == 8
    assert b.threads() == 4 and a.refresh() == 4  # busy again
    a.close()
    b.close()
    assert not list(tmp_path.iterdir())


@pytest.mark.unit
def test_a_dead_engine_stops_counting(tmp_path: Path) -> None:
    """A process killed while it decodes drops its lock with it; the next reading removes its file."""
    code = (
        "import sys, time; from pathlib import Path; from sinkd.daemon.engine.cores import CoreShare;"
        " s = CoreShare(8, Path(sys.argv[1])); s.threads(); print('ready', flush=True); time.sleep(600)"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        a = CoreShare(8, tmp_path, refresh_s=3600)
        assert a.threads() == 4
        p.kill()
        p.wait(30)
        assert a.refresh() == 8
        assert len(list(tmp_path.iterdir())) == 1  # its file is gone, this one's stays
        a.close()
    finally:
        p.kill()


@pytest.mark.unit
def test_a_folder_that_cannot_be_made_leaves_every_core(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    share = CoreShare(8, tmp_path / "a-file" / "engines")
    assert share.threads() == 8 and not share.registered


@pytest.mark.model
def test_an_engine_follows_its_share_and_computes_the_same_bits(
    make_engine: MakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread count llama.cpp's context reports follows the engines busy beside it, between
    two decodes; every logit equals an engine's that kept every core (llama.cpp's CPU results do
    not depend on the thread count)."""
    cores_now = machine_threads()
    if cores_now < 2:
        pytest.skip("one core: nothing to share")
    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.setattr(cores, "REFRESH_S", 0.0)  # re-read before every decode
    shared = make_engine(n_ctx_seq=128, n_seq_max=1, cores_dir=tmp_path)
    fixed = make_engine(n_ctx_seq=128, n_seq_max=1, n_threads=cores_now)
    tokens = shared.vocab.tokenize(TEXT)[:90]
    seqs = {
        e: CacheSequence(PolicyConfig.named("sink", sinks=4, window=124)) for e in (shared, fixed)
    }
    rows: dict[Engine, list[np.ndarray]] = {shared: [], fixed: []}
    seen: list[int] = []
    seen_fixed: set[int] = set()

    def step(chunk: list[int]) -> None:
        for e in (shared, fixed):
            rows[e].append(e.feed(0, seqs[e], chunk, outputs="all"))  # type: ignore[arg-type]
        seen.append(shared.threads)
        seen_fixed.add(fixed.threads)

    step(tokens[:60])
    other = CoreShare(cores_now, tmp_path, refresh_s=0.0)
    other.threads()  # another engine starts decoding
    for t in tokens[60:75]:
        step([t])
    other.close()  # and stops
    for t in tokens[75:90]:
        step([t])
    assert seen == [cores_now] + [cores_now // 2] * 15 + [cores_now] * 15
    assert seen_fixed == {cores_now}  # a count given is kept, whatever else decodes
    assert all(np.array_equal(a, b) for a, b in zip(rows[shared], rows[fixed], strict=True))


@pytest.mark.model
def test_a_daemon_counts_while_it_decodes_and_leaves_the_cores_when_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sinkd.daemon.node import Daemon
    from sinkd.daemon.rpc.client import Client
    from sinkd.proto.v1 import sinkd_pb2 as pb
    from tests.support.settings import settings
    from tests.support.tokens import ALICE

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.setattr(cores, "REFRESH_S", 0.0)  # idle at the first idle turn of the loop
    folder = cores.default_folder()

    def registered() -> int:
        return len([p for p in folder.iterdir() if not p.name.startswith(".")])

    def until_idle() -> None:
        deadline = time.monotonic() + 30  # the idle loop turns every 0.5 s
        while registered() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert registered() == 0

    d = Daemon(settings(tmp_path))
    d.start()
    try:
        d.wait_ready(120)
        until_idle()  # loaded and calibrated, then idle: it does not count
        s = Client(d.addresses[0]).s
        h = s.Create(pb.CreateSessionRequest(policy=pb.Policy(name="sink", sinks=4, window=60)),
                     metadata=ALICE).handle  # fmt: skip
        s.Append(pb.AppendRequest(handle=h, text=TEXT[:200]), metadata=ALICE)
        during: list[int] = []
        for ev in s.Generate(pb.GenerateRequest(handle=h, max_tokens=200), metadata=ALICE):
            if ev.HasField("token") and not during:
                # between two steps of this generation: the engine is busy, so it counts
                during.append(d.service.scheduler.call(lambda e: registered()))
        assert during == [1]
        until_idle()
    finally:
        d.stop()


# --- OpenMP teams of one process (teams.py) ---


def _decode_on_a_thread(decode: Callable[[], None], hold: threading.Event) -> threading.Thread:
    """Run `decode` on a new thread that then stays alive until `hold` is set."""
    errors: list[BaseException] = []
    done = threading.Event()

    def body() -> None:
        try:
            decode()
        except BaseException as e:  # re-raised on the test's thread
            errors.append(e)
        done.set()
        hold.wait(60)

    t = threading.Thread(target=body)
    t.start()
    assert done.wait(60), "the decode on the other thread did not finish"
    if errors:
        raise errors[0]
    return t


@pytest.fixture
def fresh_teams(monkeypatch: pytest.MonkeyPatch) -> None:
    """The detector as in a new process (the suite decodes on many threads before this)."""
    monkeypatch.setattr(teams, "_teams", {})
    monkeypatch.setattr(teams, "_warned", False)
    monkeypatch.setattr(teams, "uses_openmp", lambda: True)


@pytest.mark.unit
@pytest.mark.usefixtures("fresh_teams")
def test_two_live_threads_with_more_team_threads_than_cores_warn_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cpus = teams.available_cpus()
    hold = threading.Event()
    with caplog.at_level(logging.WARNING, logger="sinkd.teams"):
        t = _decode_on_a_thread(lambda: teams.decoding(cpus), hold)
        assert not caplog.records  # one team: nothing to say
        teams.decoding(cpus)  # a second thread's team, the first still alive
        teams.decoding(cpus)
        _decode_on_a_thread(lambda: teams.decoding(cpus), hold)
        hold.set()
        t.join(60)
    assert len(caplog.records) == 1  # once per process
    assert f"{2 * cpus} OpenMP threads" in caplog.records[0].getMessage()


@pytest.mark.unit
@pytest.mark.usefixtures("fresh_teams")
def test_a_thread_that_has_ended_or_decodes_alone_counts_no_team(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cpus = teams.available_cpus()
    with caplog.at_level(logging.WARNING, logger="sinkd.teams"):
        hold = threading.Event()
        hold.set()  # the thread ends right after its decode, and its team with it
        _decode_on_a_thread(lambda: teams.decoding(cpus), hold).join(60)
        teams.decoding(cpus)
        _decode_on_a_thread(lambda: teams.decoding(1), hold).join(60)
        assert not caplog.records  # one live team; a one-thread decode makes none
    assert list(teams._teams) == [threading.get_ident()]


@pytest.mark.unit
@pytest.mark.usefixtures("fresh_teams")
def test_a_dead_threads_team_is_not_revived_by_a_new_thread_with_its_ident(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Thread idents are reused: a dead decoder's entry under the ident a live thread now holds
    is still a dead team (the case is made by hand: which ident the OS hands out is its choice)."""
    cpus = teams.available_cpus()
    hold = threading.Event()
    hold.set()
    dead = _decode_on_a_thread(lambda: teams.decoding(cpus), hold)
    dead.join(60)
    live_hold = threading.Event()
    live = _decode_on_a_thread(lambda: None, live_hold)  # alive, decodes nothing
    assert live.ident is not None
    teams._teams = {live.ident: (dead, cpus)}  # as if `live` had reused the dead thread's ident
    try:
        with caplog.at_level(logging.WARNING, logger="sinkd.teams"):
            teams.decoding(cpus)
        assert not caplog.records  # one live team: this thread's
        assert list(teams._teams) == [threading.get_ident()]
    finally:
        live_hold.set()
        live.join(60)


@pytest.mark.model
@pytest.mark.usefixtures("fresh_teams")
def test_an_engine_decoding_beside_another_threads_engine_is_reported(
    make_engine: MakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """Real engines on two live threads, each with every core: the second one's decode warns."""
    cpus = teams.available_cpus()
    if cpus < 2:
        pytest.skip("one core: no team")
    a = make_engine(n_ctx_seq=128, n_seq_max=1, n_threads=cpus)
    b = make_engine(n_ctx_seq=128, n_seq_max=1, n_threads=cpus)
    tokens = a.vocab.tokenize(TEXT)[:8]
    hold = threading.Event()
    with caplog.at_level(logging.WARNING, logger="sinkd.teams"):
        a.decode_batch([BatchItem(0, tokens, 0)])  # this thread's team
        assert not caplog.records
        t = _decode_on_a_thread(lambda: b.decode_batch([BatchItem(0, tokens, 0)]), hold)
        hold.set()
        t.join(60)
    assert len(caplog.records) == 1 and "2 threads of this process" in caplog.messages[0]
