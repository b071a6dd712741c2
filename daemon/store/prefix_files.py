"""Prefix state files: one stored prefix's cells and next-token logits, in the snapshot format
(checksummed, written whole or not at all), one file per prefix, named by its key.

A prefix state is a cache: the file is written without an fsync (a crash keeps it whole or
absent; a power loss may lose it, and a torn file fails its checksum and is not used).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sinkd.daemon.store import snapshots
from sinkd.errors import CorruptSnapshot, SnapshotError

SUFFIX = ".prefix"
KIND = "prefix"


@dataclass(frozen=True)
class PrefixFile:
    """What a listing reads of a file without its cells: its metadata, and its size."""

    path: Path
    meta: dict[str, Any]
    size: int


def path_for(directory: Path, key: str) -> Path:
    return directory / f"{key}{SUFFIX}"


def write(
    directory: Path, key: str, meta: dict[str, Any], kv: bytes, logits: np.ndarray | None
) -> int:
    """Write the prefix's file (SnapshotError on a full or failing disk); returns its size."""
    pieces = snapshots.parts(snapshots.Snapshot(dict(meta, kind=KIND), kv, logits))
    snapshots.write_atomic(
        path_for(directory, key), pieces, fsync=False, failpoint="prefix-before-rename"
    )
    return sum(len(p) for p in pieces)


Written = tuple[str, int | SnapshotError]  # a key, and its file's size or why it failed


class Writer:
    """Writes prefix files on a thread of its own: the engine thread hands an image over and goes
    on (a file is megabytes); `done()` says what was written since, or why not."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._todo: queue.Queue[tuple[str, dict[str, Any], bytes, np.ndarray | None] | None]
        self._todo = queue.Queue()
        self._done: queue.SimpleQueue[Written] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="sinkd-prefix-files", daemon=True)
        self._thread.start()

    def submit(self, key: str, meta: dict[str, Any], kv: bytes, logits: np.ndarray | None) -> None:
        self._todo.put((key, meta, kv, logits))

    def done(self) -> list[Written]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def flush(self) -> None:
        """Until every file handed over is written (or failed)."""
        self._todo.join()

    def close(self, timeout: float = 30.0) -> None:
        """Write what was handed over, then stop."""
        self._todo.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (item := self._todo.get()) is not None:
            key, meta, kv, logits = item
            try:
                self._done.put((key, write(self.directory, key, meta, kv, logits)))
            except SnapshotError as e:
                self._done.put((key, e))
            except Exception as e:  # never a dead writer that flush() would wait on forever
                self._done.put((key, SnapshotError(f"writing {key[:12]}: {e!r}")))
            finally:
                self._todo.task_done()
        self._todo.task_done()


def read(path: Path) -> snapshots.Snapshot:
    """The whole file, its checksum verified (CorruptSnapshot otherwise)."""
    snap = snapshots.read(path)
    if snap.meta.get("kind") != KIND:
        raise CorruptSnapshot(f"{path.name}: not a prefix state")
    return snap


def scan(directory: Path) -> tuple[list[PrefixFile], list[tuple[Path, str]]]:
    """The prefix files of a directory by their headers alone (the checksum is verified when one
    is used), and the files that are not prefix files with the reason."""
    found: list[PrefixFile] = []
    bad: list[tuple[Path, str]] = []
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        try:
            meta = snapshots.read_meta(path)
            if meta.get("kind") != KIND:
                raise CorruptSnapshot("not a prefix state")
            found.append(PrefixFile(path, meta, path.stat().st_size))
        except (CorruptSnapshot, OSError) as e:
            bad.append((path, str(e)))
    for tmp in directory.glob(f".*{SUFFIX}.*.tmp"):  # a write a crash cut short
        bad.append((tmp, "an unfinished write"))
    return found, bad


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)
