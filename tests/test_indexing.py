"""Vectors for evicted passages are made on a worker thread, not the engine thread (issue 48: a
chat turn that recalls nothing waited behind the last turn's embedding): the engine thread only
reads texts out and writes vectors back; a vector made for text that changed or left meanwhile is
not kept; a search that needs the batch in flight waits for it rather than embedding it again; a
failing embedder stops indexing, not the daemon. Driven by events: the stub embedder blocks until
the test lets it go."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import wait
from pathlib import Path

import numpy as np
import pytest

from sinkd.daemon.runtime.recall import indexing
from sinkd.daemon.runtime.recall.indexing import Indexer
from sinkd.daemon.store.embedder import DIM
from sinkd.daemon.store.journal import Journal
from sinkd.daemon.store.memory import MemoryStore, Segmenting, SessionKey

pytestmark = pytest.mark.unit
KEY = SessionKey("s_1", 0)
SENTENCES = [f"Sentence {i} says the weather on day {i} was fine." for i in range(40)]
WAIT_S = 30  # a bound on every wait, never a pacing


class GatedEmbedder:
    """Unit vectors from a hash of the text; blocks while `gate` is clear, records each call's
    thread and the worker's nice value."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.calls: list[tuple[int, int]] = []  # (thread id, texts)
        self.nice: int | None = None
        self.idle = False
        self.fail = False

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append((threading.get_ident(), len(texts)))
        if threading.current_thread() is not threading.main_thread():
            if sys.platform.startswith("linux"):
                tid = threading.get_native_id()
                self.idle = os.sched_getscheduler(tid) == os.SCHED_IDLE
                self.nice = os.getpriority(os.PRIO_PROCESS, tid)
            self.entered.set()
            assert self.gate.wait(WAIT_S)
        if self.fail:
            raise RuntimeError("embedder broke")
        out = np.zeros((len(texts), DIM), np.float32)
        for i, t in enumerate(texts):
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "little")
            v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
            out[i] = v / np.linalg.norm(v)
        return out

    def on_worker(self) -> int:
        main = threading.main_thread().ident
        return sum(n for ident, n in self.calls if ident != main)

    def on_engine_thread(self) -> int:
        main = threading.main_thread().ident
        return sum(n for ident, n in self.calls if ident == main)


@pytest.fixture
def stub() -> GatedEmbedder:
    return GatedEmbedder()


@pytest.fixture
def store(tmp_path: Path, stub: GatedEmbedder) -> Iterator[MemoryStore]:
    journal = Journal(tmp_path / "j.db")
    yield MemoryStore(journal.db, Segmenting(), stub)  # type: ignore[arg-type]
    journal.db.close()


def fill(store: MemoryStore, sentences: list[str], start: int = 0) -> None:
    """Each word a token, its id its index in `words` (the store needs ids and their bytes)."""
    words = [w + " " for s in sentences for w in s.split()]
    store.add_evicted(
        KEY, start, range(len(words)), [False] * len(words), lambda t: words[t].encode()
    )
    store.db.commit()


def unembedded(store: MemoryStore) -> int:
    return int(store.db.execute("SELECT COUNT(*) FROM passages WHERE vector IS NULL").fetchone()[0])


def finished(indexer: Indexer) -> None:
    assert indexer.in_flight is not None
    assert not wait([indexer.in_flight], WAIT_S).not_done


def run_out(indexer: Indexer, store: MemoryStore) -> None:
    """Engine-thread passes until the indexer has nothing left: each writes a finished batch
    and starts the next."""
    while indexer.has_work:
        if indexer.in_flight is not None:
            finished(indexer)
        indexer.between_steps(store)


def test_vectors_are_made_off_the_engine_thread_and_written_between_steps(
    store: MemoryStore, stub: GatedEmbedder
) -> None:
    fill(store, SENTENCES)
    n = unembedded(store)
    assert n > 2 * indexing.BATCH_PASSAGES  # several batches
    stub.gate.clear()
    indexer = Indexer()
    indexer.between_steps(store)  # hands a batch to the worker and returns
    assert stub.entered.wait(WAIT_S)
    indexer.between_steps(store)  # the batch still on the worker: the engine goes on
    assert unembedded(store) == n
    stub.gate.set()
    run_out(indexer, store)
    assert unembedded(store) == 0
    assert stub.on_engine_thread() == 0 and stub.on_worker() > 0
    if sys.platform.startswith("linux"):  # only what nothing else wants of the cores
        assert stub.nice is not None
        assert stub.idle or stub.nice > os.nice(0) or os.nice(0) >= indexing.WORKER_NICE
    fill(store, ["A new line arrives later, after all were embedded."], 10_000)
    assert not indexer.has_work  # nothing said it: no query per step
    indexer.noted()
    run_out(indexer, store)
    assert unembedded(store) == 0
    indexer.close()


def test_a_passage_that_changed_or_left_meanwhile_keeps_no_stale_vector(
    store: MemoryStore, stub: GatedEmbedder
) -> None:
    fill(store, SENTENCES[:6])
    ids = [p.id for p in store.passages(KEY)]
    assert len(ids) >= 2
    stub.gate.clear()
    indexer = Indexer()
    indexer.between_steps(store)
    assert stub.entered.wait(WAIT_S)
    grown, gone = ids[-1], ids[0]
    store.db.execute("UPDATE passages SET text = text || ' more' WHERE number=?", (grown,))
    store.forget(KEY, gone)
    store.db.commit()
    stub.gate.set()
    made = indexer.in_flight
    assert made is not None and not wait([made], WAIT_S).not_done
    assert len(made.result()) == len(ids)  # the worker embedded the old texts
    stale = store.write_vectors(made.result())
    rows = dict(store.db.execute("SELECT number, vector IS NULL FROM passages").fetchall())
    assert gone not in rows and stale == len(ids) - 2
    assert rows[grown] == 1  # its vector was for the old text: not kept
    assert all(missing == 0 for number, missing in rows.items() if number != grown)
    run_out(indexer, store)  # the next batch embeds the grown passage's new text
    assert unembedded(store) == 0
    indexer.close()


def test_a_search_waits_for_the_batch_in_flight_and_embeds_only_the_query(
    store: MemoryStore, stub: GatedEmbedder
) -> None:
    fill(store, SENTENCES[:10])
    stub.gate.clear()
    indexer = Indexer(batch=1000)
    indexer.between_steps(store)
    assert stub.entered.wait(WAIT_S)
    stub.gate.set()
    indexer.settle(store)  # what `Recall.prepare` does before a search that needs every vector
    assert unembedded(store) == 0
    before = stub.on_engine_thread()
    found = store.search(KEY, SENTENCES[3], 4)
    assert found and stub.on_engine_thread() - before == 1  # the query, nothing else
    indexer.close()


def test_a_failing_embedder_stops_indexing_and_search_still_answers(
    store: MemoryStore, stub: GatedEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    fill(store, SENTENCES[:6])
    stub.fail = True
    indexer = Indexer()
    indexer.between_steps(store)
    finished(indexer)
    indexer.between_steps(store)
    assert indexer.failed and not indexer.has_work
    assert "indexing passages for dense recall failed" in caplog.text
    assert unembedded(store) > 0
    stub.fail = False
    assert store.search(KEY, "weather on day 3", 2, embed_missing=False)  # BM25 still finds
    indexer.close()


def test_close_drops_the_batch_in_flight(store: MemoryStore, stub: GatedEmbedder) -> None:
    fill(store, SENTENCES[:6])
    stub.gate.clear()
    indexer = Indexer()
    indexer.between_steps(store)
    assert stub.entered.wait(WAIT_S)
    flight = indexer.in_flight
    indexer.close()
    stub.gate.set()
    assert flight is not None and not wait([flight], WAIT_S).not_done
    run_out(indexer, store)  # after close: a new worker takes the rest
    assert unembedded(store) == 0
    indexer.close()


def test_the_tenants_take_turns_so_a_flood_keeps_no_one_waiting(
    store: MemoryStore, stub: GatedEmbedder
) -> None:
    """Bob stores 40 passages after alice's one: newest first across tenants, alice's would wait
    behind five of bob's batches (and her search would embed it itself, paying for bob's flood).
    The tenants take turns: hers is in the first batch after bob's first, whoever went first."""
    words = {"alice": "My name is Ada and I like tulips.", "bob": SENTENCES}
    for tenant, who in (("alice", "a"), ("bob", "b")):
        texts = [words[tenant]] if tenant == "alice" else words[tenant]
        split = [w + " " for s in texts for w in str(s).split()]
        store.add_evicted(
            SessionKey(who, 0, tenant), 0, range(len(split)), [False] * len(split),
            lambda t, split=split: split[t].encode(),
        )  # fmt: skip
    store.db.commit()
    assert store.tenants_waiting() == ["alice", "bob"]
    indexer = Indexer()
    indexer._last_tenant = "alice"  # bob's turn first: alice must still come next
    alice = SessionKey("a", 0, "alice")
    indexer.between_steps(store)  # the first batch: bob's
    for _ in range(2):
        finished(indexer)
        indexer.between_steps(store)  # written back; the next batch started
        if not store.unindexed(1, key=alice):
            break
    else:
        raise AssertionError("alice's passage waited behind more than one batch of bob's")
    run_out(indexer, store)
    assert unembedded(store) == 0
    indexer.close()
