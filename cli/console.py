"""The CLI's consoles: a terminal wraps at its width; a pipe or a file is never wrapped at 80
columns (rich's default when it cannot ask), so a table row stays one line for grep and logs."""

from __future__ import annotations

import sys

from rich.console import Console

UNWRAPPED = 1_000  # a table sizes itself to its content; this is only the ceiling


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else UNWRAPPED
    return Console(stderr=stderr, width=width)
