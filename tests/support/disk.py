"""What the state directory's files hold: the scan every deletion test makes, first to see that the
files did hold the content, then that none does any more."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from pathlib import Path


def token_needles(tokens: list[int]) -> list[bytes]:
    """How token ids sit in the files: an int32 run (journal chunks, passages) and a JSON list (a
    snapshot's retained window), four ids from the middle of `tokens`."""
    middle = len(tokens) // 2
    run = tokens[max(0, middle - 2) : middle + 2]
    assert len(run) == 4, "four tokens at least"
    return [struct.pack("<4i", *run), json.dumps(run)[1:-1].encode()]


def holders(state_dir: Path, needles: Iterable[bytes | str]) -> list[str]:
    """The files under `state_dir` whose bytes hold any of `needles` (a str as UTF-8), sorted.
    Reads what exists: a file renamed or deleted between the listing and the read (a snapshot's
    temporary) is skipped."""
    wanted = [n.encode() if isinstance(n, str) else n for n in needles]
    found = []
    for p in sorted(state_dir.rglob("*")):
        try:
            data = p.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            continue
        if any(n in data for n in wanted):
            found.append(str(p.relative_to(state_dir)))
    return found
