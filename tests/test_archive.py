"""The session archive's format (daemon/store/archive.py): a round trip keeps every member byte
for byte; any truncation or flipped byte, another format version or another file is refused with
the check that failed; the file is the owner's alone and never overwrites one."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sinkd.daemon.store import archive
from sinkd.daemon.store.archive import Archive
from sinkd.errors import CorruptArchive, InvalidInput

pytestmark = pytest.mark.unit

SAMPLE = Archive(
    {"session": "s1", "tenant": "alice", "generation": "ab12", "config": {"model": "x"}},
    {"snapshot": os.urandom(5000), "journal": b"[]", "memory": b'{"passages": []}'},
)


def packed() -> bytes:
    return b"".join(archive.pack(SAMPLE))


def test_a_round_trip_keeps_the_manifest_and_every_member() -> None:
    got = archive.unpack(packed())
    assert got.manifest == SAMPLE.manifest
    assert got.members == SAMPLE.members


@pytest.mark.parametrize("cut", [0, 10, 20, 200, 3000, -33, -1])
def test_a_truncated_archive_is_refused(cut: int) -> None:
    data = packed()
    with pytest.raises(CorruptArchive, match="shorter|checksum"):
        archive.unpack(data[:cut])


def test_any_flipped_byte_is_refused() -> None:
    data = packed()
    for at in range(8, len(data), 97):  # past the magic, through manifest, members and digest
        damaged = bytearray(data)
        damaged[at] ^= 0x40
        with pytest.raises(CorruptArchive):
            archive.unpack(bytes(damaged))


def test_another_version_or_another_file_is_named() -> None:
    data = bytearray(packed())
    data[8] = archive.VERSION + 1
    with pytest.raises(CorruptArchive, match=f"format {archive.VERSION + 1}"):
        archive.unpack(bytes(data))
    with pytest.raises(CorruptArchive, match="not a sinkd session archive"):
        archive.unpack(b"SINKDSNP" + packed()[8:])
    assert issubclass(CorruptArchive, InvalidInput)  # the caller's input: INVALID_ARGUMENT, exit 2


def test_the_file_is_the_owners_alone_and_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "s1.sinkd"
    archive.write_private(path, archive.pack(SAMPLE))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert archive.unpack(path.read_bytes()).members == SAMPLE.members
    with pytest.raises(InvalidInput, match="exists"):
        archive.write_private(path, archive.pack(SAMPLE))
