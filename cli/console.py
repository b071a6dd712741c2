"""The CLI's consoles: a terminal wraps at its width; a pipe or a file is never wrapped at 80
columns (rich's default when it cannot ask), so a table row stays one line for grep and logs."""

from __future__ import annotations

import re
import sys

from rich.console import Console
from rich.text import Text

UNWRAPPED = 1_000  # a table sizes itself to its content; this is only the ceiling


OWED = (
    "the deleted text may still be in journal.db-wal: another program reads the journal; it"
    " leaves once that program lets go (docs/security.md)"
)


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else UNWRAPPED
    return Console(stderr=stderr, width=width)


# C0 controls but tab and newline, DEL and C1: an escape sequence in model text or a passage would
# reach the terminal (move the cursor, retitle the window, hide what follows)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """Text from a model, a passage or a log, with its control characters shown, not obeyed."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def shown(text: str, style: str = "") -> Text:
    """Such text for rich: never read as markup (`[/x]` would raise, `[ERROR]` vanish)."""
    return Text(terminal_safe(text), style=style)
