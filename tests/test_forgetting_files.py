"""Forget, reset and close take a passage's tokens out of every file of the state directory, not
just its words: the journal's chunks, the snapshots (retained window, cells) and recalled copies.
Each test first checks that the files did hold them, as token ids and as text."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sinkd.daemon import failpoints
from sinkd.daemon.node import Daemon
from sinkd.daemon.store.passages import SessionKey
from sinkd.proto.v1 import sinkd_pb2 as pb
from tests.support import disk
from tests.support.clients import Client
from tests.support.disk import token_needles
from tests.support.settings import settings
from tests.support.texts import TEXT
from tests.support.tokens import ALICE

pytestmark = pytest.mark.model

SECRET = "\nThe vault code is marmalade ocelot quasar 7391, said Quentin.\n"
WORD = "ocelot"
POLICY = {"sinks": 4, "window": 120, "evict_chunk": 16}
FILLER = (TEXT + "\n") * 4
WAIT_S = 60  # every wait ends; none is reached unless something is broken


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(
        settings(
            tmp_path_factory.mktemp("forget"),
            snapshot_every_tokens=64,  # snapshots taken while the secret is still in the window
            purge_interval_s=0,
        )
    )
    d.start()
    d.wait_ready(120)
    yield d
    d.stop()


def holders(state_dir: Path, tokens: list[int]) -> dict[str, list[str]]:
    """Which files hold the secret, by form: {"ids": [...], "text": [...]}."""
    return {
        "ids": disk.holders(state_dir, token_needles(tokens)),
        "text": disk.holders(state_dir, [WORD]),
    }


def secret_tokens(daemon: Daemon) -> list[int]:
    return daemon.service.engine.vocab.tokenize(SECRET.strip())


def test_forget_removes_the_token_ids_from_journal_and_snapshots(
    daemon: Daemon, client: Client
) -> None:
    state = daemon.settings.state_dir
    h = client.create(**POLICY).handle
    client.append(h, FILLER[:200] + SECRET)
    client.append(h, FILLER[200:1600])  # evicts the secret, snapshots on the way
    tokens = secret_tokens(daemon)
    before = holders(state, tokens)
    assert before["ids"] and before["text"], "the test plants the secret where it can be found"
    found = client.memory(h, search=WORD).passages
    assert found
    for p in found:
        client.forget(h, passage_id=p.passage_id)
    after = holders(state, tokens)
    assert after == {"ids": [], "text": []}
    snaps = list((state / "snapshots" / h.session_id).iterdir())
    assert len(snaps) == 1  # the scrub's snapshot alone: the older ones held the secret
    client.append(h, " and the talk goes on.")  # the session lives on from the scrubbed history
    assert len(client.generate(h, n=4)[0]) == 4


def test_a_live_recalled_copy_leaves_the_files_once_the_stream_evicts_it(tmp_path: Path) -> None:
    """No snapshot falls due on the way (their pruning would hide what the scrub must do)."""
    daemon = Daemon(settings(tmp_path, snapshot_every_tokens=100_000, purge_interval_s=0))
    daemon.start()
    daemon.wait_ready(120)
    client = Client(daemon.addresses[0])
    try:
        _live_copy(daemon, client)
    finally:
        client.close()
        daemon.stop()


def _live_copy(daemon: Daemon, client: Client) -> None:
    state = daemon.settings.state_dir
    h = client.create(**POLICY, recall=pb.RecallSettings(mode="manual")).handle
    client.append(h, FILLER[:200] + SECRET)
    client.append(h, FILLER[200:1600])
    report = client.recall(h, f"What is the vault code? {WORD} marmalade").report
    assert report.recalled, "the secret must come back for this test"
    for p in client.memory(h, search=WORD).passages:
        client.forget(h, passage_id=p.passage_id)
    tokens = secret_tokens(daemon)
    # still in the window: the model's live context, like any token there (and its snapshot)
    assert client.inspect(h, text=True).retained_text.count(WORD) == 1
    client.append(h, FILLER[1600:3000])  # the copy is evicted: the history is scrubbed again
    assert WORD not in client.inspect(h, text=True).retained_text
    assert holders(state, tokens) == {"ids": [], "text": []}


@pytest.mark.parametrize("how", ["reset", "close"])
def test_reset_and_close_remove_the_token_ids(daemon: Daemon, client: Client, how: str) -> None:
    state = daemon.settings.state_dir
    h = client.create(**POLICY).handle
    client.append(h, FILLER[:100] + SECRET + FILLER[100:400])  # in the window, and snapshotted
    tokens = secret_tokens(daemon)
    assert holders(state, tokens)["ids"], "the test plants the secret where it can be found"
    if how == "reset":
        h = client.s.Reset(pb.HandleRequest(handle=h), metadata=ALICE).handle
        client.append(h, FILLER[400:600])
    else:
        client.s.Close(pb.HandleRequest(handle=h), metadata=ALICE)
    assert holders(state, tokens) == {"ids": [], "text": []}


def test_a_close_overtaking_a_snapshot_in_flight_leaves_no_file(
    daemon: Daemon, client: Client
) -> None:
    """The close is queued while the engine thread writes the session's snapshot (its temporary
    written, not yet renamed): the close runs after it on the same thread and deletes it too."""
    state = daemon.settings.state_dir
    h = client.create(**POLICY).handle
    folder = state / "snapshots" / h.session_id
    queued, closed = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def close() -> None:
        try:
            client.s.Close(pb.HandleRequest(handle=h), metadata=ALICE)
            closed.set()
        except BaseException as e:
            errors.append(e)

    closer = threading.Thread(target=close)

    def mid_snapshot() -> None:  # the engine thread, this session's temporary on disk
        if closer.ident is None and list(folder.glob(".*.tmp")):
            closer.start()
            queued.wait(WAIT_S)  # the close waits in the engine's inbox behind this snapshot

    def close_queued() -> None:  # the Close's server thread, nothing else calls the engine now
        if closer.is_alive() and threading.current_thread().name.startswith("sinkd-rpc"):
            queued.set()

    with (
        failpoints.armed("snapshot-before-rename", mid_snapshot),
        failpoints.armed("call-enqueued", close_queued),
    ):
        client.append(h, FILLER[:100] + SECRET + FILLER[100:400])  # a snapshot falls due
        deadline = time.monotonic() + WAIT_S
        while closer.ident is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the snapshot comes in the engine's next gap
        closer.join(WAIT_S)
    assert not errors and queued.is_set() and closed.is_set()
    assert not folder.exists()
    assert holders(state, secret_tokens(daemon)) == {"ids": [], "text": []}


def test_a_close_while_a_snapshot_file_is_written_beside_the_steps_waits_for_it_and_deletes_it(
    daemon: Daemon, client: Client
) -> None:
    """While another session decodes, a snapshot's file is written off the engine thread: the
    steps go on meanwhile. A close that comes before the file is recorded waits for it (its
    wait, at `snapshot-settle-wait`, is what lets the write finish), then deletes it with the
    rest: no file holds the closed session's tokens, none is left behind it."""
    state = daemon.settings.state_dir
    steps = daemon.service.metrics.steps
    other = client.create(**POLICY).handle
    client.append(other, TEXT[:300])
    h = client.create(**POLICY).handle
    folder = state / "snapshots" / h.session_id
    held, release, waited = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:  # the writer thread, this session's temporary written, not renamed
        if threading.current_thread().name == "sinkd-snapshot" and list(folder.glob(".*.tmp")):
            held.set()
            release.wait(WAIT_S)

    def settling() -> None:  # the engine thread waits for the file: let it be written now
        waited.set()
        release.set()

    # greedy, the other session's text runs on without an end of generation: the engine is busy
    decoding = client.s.Generate(pb.GenerateRequest(handle=other, max_tokens=1000), metadata=ALICE)
    try:
        with (
            failpoints.armed("snapshot-before-rename", hold),
            failpoints.armed("snapshot-settle-wait", settling),
        ):
            next(decoding)
            client.append(h, FILLER[:100] + SECRET + FILLER[100:250])  # falls due: its turn ended
            assert held.wait(WAIT_S), "the snapshot was not written off the engine thread"
            assert holders(state, secret_tokens(daemon))["ids"], "the secret is in the journal"
            at_hold = steps._value.get()
            deadline = time.monotonic() + WAIT_S
            while steps._value.get() < at_hold + 5 and time.monotonic() < deadline:
                next(decoding)  # the other session's tokens keep coming
            assert steps._value.get() >= at_hold + 5 and not release.is_set()
            client.s.Close(pb.HandleRequest(handle=h), metadata=ALICE)
    finally:
        decoding.cancel()
    assert waited.is_set()  # the close waited for the file, then deleted it
    assert not folder.exists()
    assert holders(state, secret_tokens(daemon)) == {"ids": [], "text": []}


def test_forgetting_in_a_loop_merges_at_most_once_per_interval(tmp_path: Path) -> None:
    """Each purge merges the tenant's full-text index on the engine thread: a tenant that forgets
    in a loop must not buy one per call. Its replies wait for the merge instead, at most
    `purge_wait_s` (none here), and say that the purge is owed."""
    d = Daemon(settings(tmp_path, purge_interval_s=60, purge_wait_s=0))
    d.start()
    d.wait_ready(120)
    client = Client(d.addresses[0])
    durability = d.service.durability
    assert durability is not None and durability.memory is not None
    merges = []
    original = durability.memory.merge
    durability.memory.merge = lambda every=False: (merges.append(1), original(every))[1]  # type: ignore[method-assign]
    try:
        h = client.create(**POLICY).handle
        client.append(h, FILLER[:2400])
        passages = client.memory(h, limit=100).passages
        assert len(passages) >= 6
        owed = [client.forget(h, passage_id=p.passage_id).purge_owed for p in passages[:6]]
        assert len(merges) == 1  # the first at once, the rest wait for the interval
        assert owed == [False] + [True] * 5
        assert durability.purge.pending
        key = SessionKey(h.session_id, 0)
        assert len(durability.memory.passages(key)) == len(passages) - 6  # deleted all the same
    finally:
        client.close()
        d.stop()
    assert len(merges) == 2  # what was pending is purged at stop
