"""The prefix states held, in RAM and in the state directory, within their bounds: past a bound
the least recently used prefix of the owner holding the most bytes goes first (RAM to disk, disk to
nothing). Files are written off the engine thread (`prefix_files.Writer`). Engine thread only."""

from __future__ import annotations

import functools
import logging
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sinkd.daemon.metrics import Metrics
from sinkd.daemon.private import private_dir
from sinkd.daemon.store import prefix_files
from sinkd.errors import CorruptSnapshot, SnapshotError

log = logging.getLogger("sinkd.prefixes")

SHARED = "*"  # the owner of the prefixes of the system prompts an operator declared shared
TOKEN_BYTES = array("i").itemsize


@dataclass
class Prefix:
    key: str
    owner: str  # a tenant, or SHARED
    tokens: tuple[int, ...]
    starts: tuple[int, ...]  # where the reads that made it began (a restore reads on from them)
    kv_size: int  # the cells' image
    file_size: int = 0  # 0: not on disk
    kv: bytes | None = None  # in RAM (None: on disk only)
    logits: np.ndarray | None = None  # with kv
    last_used: float = 0.0
    hits: int = 0
    created: float = 0.0
    # the live sessions (id, reset count) whose stream holds it: it read or restored it. A
    # tenant's prefix goes when the last of them is closed or reset (close and reset remove
    # everything of a session, its prompts too); a shared one (the operator's text) stays
    holders: set[tuple[str, int]] = field(default_factory=set)

    @property
    def n(self) -> int:
        return len(self.tokens)

    @functools.cached_property
    def raw(self) -> bytes:
        """The token ids as int32 bytes, compared in C (`common_length`)."""
        return array("i", self.tokens).tobytes()

    @property
    def ram(self) -> int:
        if self.kv is None:
            return 0
        return self.kv_size + (0 if self.logits is None else self.logits.nbytes)


def common_length(a: bytes, b: bytes) -> int:
    """How many tokens two streams (int32 token ids as bytes) share from their start: a binary
    search of slice compares, each in C, not a Python loop over every token of every prefix."""
    lo, hi = 0, min(len(a), len(b)) // TOKEN_BYTES
    va, vb = memoryview(a), memoryview(b)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if va[: mid * TOKEN_BYTES] == vb[: mid * TOKEN_BYTES]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixShelf:
    def __init__(self, metrics: Metrics, ram_bytes: int, disk_bytes: int) -> None:
        self.metrics = metrics
        self.ram_bytes = ram_bytes
        self.disk_bytes = disk_bytes
        self.identity: dict[str, Any] | None = None  # what makes a prefix valid (the daemon's)
        self.directory: Path | None = None
        self.held: dict[str, Prefix] = {}
        self._writer: prefix_files.Writer | None = None
        self._pending: set[str] = set()  # handed to the writer, not yet settled

    def open(self, directory: Path) -> Path:
        """Keep files in `directory` (made private) from now on; returns it."""
        self.directory = private_dir(directory)
        self._writer = prefix_files.Writer(self.directory)
        return self.directory

    def write(self, key: str, meta: dict[str, Any], kv: bytes, logits: np.ndarray | None) -> None:
        """Hand a kept prefix's file to the writer (none without a state directory)."""
        if self._writer is not None:
            self._writer.submit(key, meta, kv, logits)
            self._pending.add(key)

    def flush(self) -> None:
        """Every file handed over is on disk before this returns."""
        if self._writer is not None:
            self._writer.flush()
            self.settle()

    def image(self, p: Prefix) -> tuple[bytes, np.ndarray | None]:
        """The prefix's cells and logits, read back from its file where RAM no longer holds them."""
        if p.kv is not None:
            return p.kv, p.logits
        if not p.file_size or self.directory is None:
            raise CorruptSnapshot("its cells are neither in memory nor on disk")
        snap = prefix_files.read(prefix_files.path_for(self.directory, p.key))
        meta = snap.meta
        if tuple(meta.get("tokens", ())) != p.tokens or meta.get("identity") != self.identity:
            raise CorruptSnapshot("its file holds another prefix")
        p.kv, p.logits = snap.kv, snap.logits
        kv, logits = p.kv, p.logits
        self.fit()
        return kv, logits

    def settle(self) -> None:
        """What the writer has written since: on disk now (or, dropped meanwhile, removed)."""
        if self._writer is None or self.directory is None:
            return
        for key, result in self._writer.done():
            self._pending.discard(key)
            p = self.held.get(key)
            if isinstance(result, SnapshotError):  # a full disk: kept in RAM alone
                log.warning("prefix %s not written: %s", key[:12], result)
                self.metrics.prefix_drops.labels("unwritten").inc()
            elif p is None:
                prefix_files.remove(prefix_files.path_for(self.directory, key))
            else:
                p.file_size = result

    def close(self) -> None:
        """At the daemon's stop: the files handed over are written."""
        if self._writer is not None:
            self._writer.close()
            self.settle()
            self._writer = None

    def fit(self) -> None:
        """Past a bound, the least recently used prefix of the owner holding the most goes."""
        self.settle()
        while sum(p.ram for p in self.held.values()) > self.ram_bytes:
            victim = self._victim([p for p in self.held.values() if p.kv is not None],
                                  lambda p: p.ram)  # fmt: skip
            if victim.file_size:
                victim.kv, victim.logits = None, None  # on disk still
                self.metrics.prefix_drops.labels("ram").inc()
            else:
                self.drop(victim, "ram", "")
        while sum(p.file_size for p in self.held.values()) > self.disk_bytes:
            victim = self._victim([p for p in self.held.values() if p.file_size],
                                  lambda p: p.file_size)  # fmt: skip
            self.drop(victim, "disk", "")
        self._gauges()

    @staticmethod
    def _victim(held: list[Prefix], size: Any) -> Prefix:
        by_owner: dict[str, int] = {}
        for p in held:
            by_owner[p.owner] = by_owner.get(p.owner, 0) + size(p)
        most = max(by_owner, key=lambda o: by_owner[o])
        return min((p for p in held if p.owner == most), key=lambda p: p.last_used)

    def drop(self, p: Prefix, reason: str, why: str) -> None:
        self.held.pop(p.key, None)
        if not p.file_size and self._writer is not None and p.key in self._pending:
            self._writer.flush()  # its file is being written: gone before this returns
            self.settle()
        if p.file_size and self.directory is not None:
            prefix_files.remove(prefix_files.path_for(self.directory, p.key))
        self.metrics.prefix_drops.labels(reason).inc()
        if why:
            log.warning("prefix %s dropped: %s", p.key[:12], why)
        self._gauges()

    def _gauges(self) -> None:
        held = self.held.values()
        self.metrics.prefix_bytes.labels("ram").set(sum(p.ram for p in held))
        self.metrics.prefix_bytes.labels("disk").set(sum(p.file_size for p in held))
        self.metrics.prefix_entries.set(len(self.held))
