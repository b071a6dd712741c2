"""Sentence vectors for evicted passages, made off the engine thread.

Embedding the passages a turn evicted takes 40-120 ms of CPU here (bench/README.md, "long_chat.py").
Done on the engine thread while it was idle, it sat in front of the next request, which a client
sends the moment a reply ends. Here a worker thread of lower priority makes them while the engine
decodes or waits, and the engine thread only reads the texts out and writes the vectors back, between
steps (the store is the engine thread's: the worker never touches it). numpy's BLAS is kept to
the calling thread (runtime/boot.py), so the worker's priority is the embedding's. A search that needs a
passage still on the worker waits for that batch (the engine is then idle, so the worker has the
cores) and embeds what is left itself. The tenants take turns, a batch each (newest first within
one): a tenant that stores a flood never keeps another's passages waiting.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from sinkd.daemon.store.memory import MemoryStore
from sinkd.daemon.store.search import vectors_of

BATCH_PASSAGES = 8  # one batch: ~0.1 s of embedding; results go in between two steps
WORKER_NICE = 10  # where SCHED_IDLE is refused: the worker yields to llama.cpp's threads
# a search waits this long at most for the worker's batch (~0.1 s of work), then embeds the
# passages itself: an idle-priority worker can starve on a machine other processes keep busy
SETTLE_TIMEOUT_S = 2.0
log = logging.getLogger("sinkd.recall")

Made = list[tuple[int, str, bytes]]


def _lower_priority() -> None:
    """The worker runs only on a core nothing else wants (Linux's SCHED_IDLE), or else at a
    lower nice value: a decode whose thread it delays waits at llama.cpp's barrier with all its
    threads. Linux schedules each thread on its own; elsewhere this would touch the process, so
    it is left alone there."""
    if not sys.platform.startswith("linux"):
        return
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread
        return
    except (OSError, AttributeError) as e:
        log.debug("the indexing thread is not SCHED_IDLE: %s", e)
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)
    except OSError as e:  # a container may refuse it: the worker then runs at normal priority
        log.debug("the indexing thread keeps its priority: %s", e)


class Indexer:
    """Engine thread: `noted` after passages are stored, `between_steps` once per loop,
    `settle` before a search that needs every vector, `close` at shutdown. One batch in flight
    at a time, so the vectors written never race the next batch's read."""

    def __init__(self, batch: int = BATCH_PASSAGES) -> None:
        self.batch = batch
        self._pool: ThreadPoolExecutor | None = None
        self._flight: tuple[MemoryStore, Future[Made]] | None = None
        self._maybe_missing = True  # a store opened with passages not yet embedded
        self._last_tenant = ""  # whose passages the last batch embedded (they take turns)
        self.failed = False

    @property
    def has_work(self) -> bool:
        return not self.failed and (self._flight is not None or self._maybe_missing)

    @property
    def in_flight(self) -> Future[Made] | None:
        """The batch on the worker now (tests wait on it)."""
        return None if self._flight is None else self._flight[1]

    def noted(self) -> None:
        """Passages were stored or grew: some may lack vectors."""
        self._maybe_missing = True

    def between_steps(self, store: MemoryStore) -> None:
        """Write a finished batch back; start the next if passages lack vectors. Cheap when there
        is nothing to do (a flag and a check of the batch in flight)."""
        if self.failed or store.embedder is None:
            self._maybe_missing = False  # BM25 alone: nothing to embed
            return
        if self._flight is not None:
            if not self._flight[1].done():
                return
            self._write(store)
        if self._maybe_missing:
            self._start(store)

    def settle(self, store: MemoryStore) -> None:
        """Before a search that must see every passage's vector: wait for the batch in flight
        (at most BATCH_PASSAGES passages; the search embeds the rest itself)."""
        if self._flight is None:
            return
        try:
            self._flight[1].result(timeout=SETTLE_TIMEOUT_S)
        except FutureTimeout:
            return  # the search embeds them itself; the worker's copies are then not written
        except Exception:
            pass  # reported by `_write`
        self._write(store)

    def close(self) -> None:
        """Shutdown: the batch in flight finishes on its own and is dropped (derived data)."""
        self._flight = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _start(self, store: MemoryStore) -> None:
        embedder = store.embedder
        assert embedder is not None
        waiting = store.tenants_waiting()
        if not waiting:
            self._maybe_missing = False
            return
        # the tenants in turn, each batch one tenant's newest: a tenant that stores a flood never
        # keeps another's passages waiting for their vectors (which its searches would then make)
        tenant = next((t for t in waiting if t > self._last_tenant), waiting[0])
        self._last_tenant = tenant
        rows = store.unindexed(self.batch, tenant=tenant)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                1, thread_name_prefix="sinkd-index", initializer=_lower_priority
            )
        future = self._pool.submit(vectors_of, embedder, rows)
        self._flight = (store, future)

    def _write(self, store: MemoryStore) -> None:
        """The finished batch into the store it was read from (another store, opened since,
        takes nothing: its passages are found again by `_start`)."""
        assert self._flight is not None
        (source, future), self._flight = self._flight, None
        try:
            made = future.result(timeout=0)
        except Exception:
            log.exception("indexing passages for dense recall failed; it stops until a restart")
            self.failed = True
            return
        if source is store:
            store.write_vectors(made)
        else:
            self._maybe_missing = True
