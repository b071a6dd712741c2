"""A session archive: one session, moved from one node to another (`sinkd sessions export` and
`import`).

Layout: magic, format version, manifest length, the manifest (JSON: what the session is, the
configuration it was made under, and each member's name, length and SHA-256), the members one after
another, then the SHA-256 of everything before it. An archive that is truncated, damaged, of another
version or not an archive fails one of these checks, which names it, before anything is loaded.
The members hold the session's content (its snapshot's cells, its token ids, its memory's text):
an archive file is written mode 0600, as the state directory's files are.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sinkd.errors import CorruptArchive, InvalidInput

MAGIC = b"SINKDARC"
VERSION = 1
_HEAD = struct.Struct("<8sII")
_DIGEST = 32
MAX_MANIFEST = 1 << 20


@dataclass(frozen=True)
class Archive:
    manifest: dict[str, Any]  # without "members": that list is the archive's own
    members: dict[str, bytes]


def pack(archive: Archive) -> list[bytes]:
    """The archive's bytes in pieces, digest last (a snapshot member is megabytes: never joined
    here)."""
    listed = [
        {"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, data in archive.members.items()
    ]
    manifest = json.dumps({**archive.manifest, "members": listed}, sort_keys=True).encode()
    pieces = [_HEAD.pack(MAGIC, VERSION, len(manifest)) + manifest, *archive.members.values()]
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    return [*pieces, digest.digest()]


def unpack(data: bytes) -> Archive:
    """Raises CorruptArchive naming the first check that fails."""
    if len(data) < _HEAD.size + _DIGEST:
        raise CorruptArchive(f"{len(data)} bytes: shorter than an archive's header")
    magic, version, manifest_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise CorruptArchive("not a sinkd session archive")
    if version != VERSION:
        raise CorruptArchive(f"archive format {version}; this sinkd reads format {VERSION}")
    body, digest = memoryview(data)[:-_DIGEST], data[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise CorruptArchive("checksum mismatch (truncated or damaged)")
    if manifest_len > min(MAX_MANIFEST, len(body) - _HEAD.size):
        raise CorruptArchive("manifest length out of range")
    try:
        manifest = json.loads(bytes(body[_HEAD.size : _HEAD.size + manifest_len]))
        listed = manifest.pop("members")
        at = _HEAD.size + manifest_len
        members = {}
        for m in listed:
            piece = bytes(body[at : at + int(m["bytes"])])
            at += int(m["bytes"])
            if len(piece) != int(m["bytes"]) or hashlib.sha256(piece).hexdigest() != m["sha256"]:
                raise CorruptArchive(f"member {str(m['name'])[:32]!r} damaged")
            members[str(m["name"])] = piece
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptArchive(f"manifest unreadable: {type(e).__name__}") from None
    if at != len(body):
        raise CorruptArchive("section lengths disagree with the manifest")
    return Archive(manifest, members)


def write_private(path: Path, pieces: Iterable[bytes]) -> int:
    """Write the archive to a new file, mode 0600 (it holds the session's content); an existing
    file is not replaced, and a write that fails part way (the daemon refused, the disk filled)
    leaves no file. Returns the bytes written."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise InvalidInput(f"{path}: exists; an archive never overwrites a file") from None
    except OSError as e:
        raise InvalidInput(f"{path}: {e.strerror or e}") from None
    written = 0
    try:
        for piece in pieces:
            view = memoryview(piece)
            while view:
                n = os.write(fd, view)
                view, written = view[n:], written + n
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    return written
