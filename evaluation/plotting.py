"""matplotlib, for the plots `sinkd eval` and bench/ draw: an extra (`sinkd[plots]`), since the
daemon and the CLI's main commands never draw. Without it an evaluation still writes its JSON."""

from __future__ import annotations

from typing import Any

from sinkd.errors import Unsupported

EXTRA = "pip install 'sinkd[plots]'"


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only backend, or Unsupported naming the extra."""
    try:
        import matplotlib
    except ImportError:
        raise Unsupported(f"plots need matplotlib, in sinkd's plots extra: {EXTRA}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
