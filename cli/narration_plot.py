"""`sinkd narrate history NAME --plot FILE`: a narrated stream's timeline as a picture (lines and
error lines per interval, incidents marked), what an operator would rather look at than read.
matplotlib, from sinkd's plots extra (named when missing, `evaluation/plotting.py`)."""

from __future__ import annotations

import datetime
from pathlib import Path

from sinkd.daemon.runtime.api import NarratedInterval
from sinkd.errors import InvalidInput
from sinkd.evaluation.plotting import pyplot

FORMATS = (".svg", ".png", ".pdf")
MIN_WIDTH_DAYS = 1 / 86_400  # an interval read in under a second is still drawn


def plot(intervals: list[NarratedInterval], path: Path, title: str) -> None:
    """Two panes over wall-clock time: each interval's lines, and its lines at error or worse;
    a red line at each interval that raised an incident (`gid` "incident-N": its number)."""
    if path.suffix.lower() not in FORMATS:
        raise InvalidInput(f"--plot: a file ending in {', '.join(FORMATS)}, got {path.name!r}")
    if not intervals:
        raise InvalidInput("--plot: no interval in the period asked")
    plt = pyplot()
    starts = [datetime.datetime.fromtimestamp(i.started).astimezone() for i in intervals]
    widths = [max((i.ended - i.started) / 86_400, MIN_WIDTH_DAYS) for i in intervals]
    fig, (upper, lower) = plt.subplots(2, 1, sharex=True, figsize=(10, 5))
    upper.bar(
        starts,
        [i.last_line - i.first_line + 1 for i in intervals],
        width=widths,
        align="edge",
        color="#4878a8",
    )
    upper.set_ylabel("lines")
    lower.bar(starts, [i.errors for i in intervals], width=widths, align="edge", color="#c44e52")
    lower.set_ylabel("error lines")
    for i, start in zip(intervals, starts, strict=True):
        if i.incidents:
            for ax in (upper, lower):
                ax.axvline(start, color="red", linewidth=1, gid=f"incident-{i.number}")
    upper.set_title(
        f"{title}: {len(intervals)} intervals, {sum(i.incidents for i in intervals)} incidents"
    )
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
