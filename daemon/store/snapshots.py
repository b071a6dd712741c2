"""Snapshot files: one session's KV cells, policy state and next-token logits, checksummed.

Layout: magic, format version, metadata length, JSON metadata, the llama.cpp sequence image, the
logits (float32), then the SHA-256 of everything before it. Written to a temporary name, fsynced,
renamed, and the directory fsynced: a reader sees a whole snapshot or none, and a torn or damaged
one fails its checksum.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sinkd.daemon import failpoints
from sinkd.errors import CorruptSnapshot, SnapshotError

MAGIC = b"SINKDSNP"
VERSION = 1
_HEAD = struct.Struct("<8sII")
_DIGEST = 32


@dataclass(frozen=True)
class Snapshot:
    meta: dict[str, Any]
    kv: bytes
    logits: np.ndarray | None


def parts(snapshot: Snapshot) -> list[bytes]:
    """The file's content in pieces, digest last: written one after another, never joined (a
    snapshot is megabytes, and the engine thread waits while it is written)."""
    return sealed(body(snapshot))


def body(snapshot: Snapshot) -> list[bytes]:
    """The file's pieces before its digest, each an immutable copy: a thread of its own may seal and
    write them while the session goes on (`sealed`)."""
    logits = b"" if snapshot.logits is None else snapshot.logits.astype("<f4").tobytes()
    meta = dict(snapshot.meta, kv_bytes=len(snapshot.kv), logits_bytes=len(logits))
    meta_bytes = json.dumps(meta, sort_keys=True).encode()
    return [_HEAD.pack(MAGIC, VERSION, len(meta_bytes)) + meta_bytes, snapshot.kv, logits]


def sealed(pieces: list[bytes]) -> list[bytes]:
    """`body`'s pieces with the SHA-256 of them all after them."""
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    return [*pieces, digest.digest()]


def encode(snapshot: Snapshot) -> bytes:
    return b"".join(parts(snapshot))


def decode(data: bytes) -> Snapshot:
    if len(data) < _HEAD.size + _DIGEST:
        raise CorruptSnapshot(f"{len(data)} bytes: shorter than a snapshot header")
    body, digest = data[:-_DIGEST], data[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise CorruptSnapshot("checksum mismatch (truncated or damaged)")
    magic, version, meta_len = _HEAD.unpack_from(body)
    if magic != MAGIC or version != VERSION:
        raise CorruptSnapshot(f"not a version-{VERSION} sinkd snapshot")
    meta = json.loads(body[_HEAD.size : _HEAD.size + meta_len])
    start = _HEAD.size + meta_len
    kv = body[start : start + meta["kv_bytes"]]
    raw = body[start + meta["kv_bytes"] :]
    if len(kv) != meta["kv_bytes"] or len(raw) != meta["logits_bytes"]:
        raise CorruptSnapshot("section lengths disagree with the metadata")
    logits = np.frombuffer(raw, dtype="<f4").astype(np.float32) if raw else None
    return Snapshot(meta, kv, logits)


def write_atomic(
    path: Path,
    data: bytes | list[bytes],
    fsync: bool = True,
    failpoint: str = "snapshot-before-rename",
) -> None:
    """Write `data` to `path` so that `path` holds either its old content or all of `data`.

    `fsync=False` keeps that promise across a process crash but not a power loss."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for piece in [data] if isinstance(data, bytes) else data:
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        failpoints.hit(failpoint)
        os.replace(tmp, path)
        if fsync:
            fsync_dir(path.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SnapshotError(f"writing {path.name}: {e.strerror or e}") from e


def fsync_dir(path: Path) -> None:
    """Make the entries of a directory (a rename, a new file or folder) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_meta(path: Path) -> dict[str, Any]:
    """A snapshot file's metadata alone, from its header (its checksum is not verified: `read`
    does that). CorruptSnapshot if the header is not a snapshot's."""
    try:
        with path.open("rb") as f:
            head = f.read(_HEAD.size)
            if len(head) < _HEAD.size:
                raise CorruptSnapshot(f"{path.name}: shorter than a snapshot header")
            magic, version, meta_len = _HEAD.unpack(head)
            if magic != MAGIC or version != VERSION:
                raise CorruptSnapshot(f"{path.name}: not a version-{VERSION} sinkd snapshot")
            meta = json.loads(f.read(meta_len))
    except (OSError, ValueError) as e:  # JSON's errors are ValueErrors
        raise CorruptSnapshot(f"{path.name}: unreadable header ({type(e).__name__})") from e
    if not isinstance(meta, dict):
        raise CorruptSnapshot(f"{path.name}: its metadata is not an object")
    return meta


def read(path: Path) -> Snapshot:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CorruptSnapshot(f"{path.name}: {e.strerror or e}") from e
    return decode(data)
