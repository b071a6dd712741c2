"""What the page draws, as pure functions of what the service returns: a session's cache map from
its receipt, and a narrated stream's timeline from its kept intervals. SVG, made here (no script,
no style attribute: the stylesheet colours it by class)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sinkd.daemon.http.ui.markup import Html, html, join
from sinkd.daemon.runtime.api import NarratedInterval, Receipt

WIDTH = 800
BAR = 28


@dataclass(frozen=True)
class CacheCounts:
    """A session's positions by what holds them: the map's legend, and what a test compares with
    the receipt."""

    sinks: int  # the first positions kept for good, the pinned prompt not counted
    pinned: int  # the system prompt's tokens kept with them
    recalled: int  # positions in the window that hold a recalled passage's copy
    recalled_passages: int
    window: int  # the window's other positions
    evicted: int  # logical positions that left the cache for good
    cells: int  # the cells the session may hold (S + W + K)


def counts(r: Receipt) -> CacheCounts:
    anchors = r.anchors_logical[1] - r.anchors_logical[0]
    pinned = min(r.system_prompt_tokens_pinned, anchors)
    recalled = list(_recalled_in_window(r))
    in_window = sum(b - a for a, b in recalled)
    window = r.recent_logical[1] - r.recent_logical[0]
    p = r.policy
    return CacheCounts(
        sinks=anchors - pinned,
        pinned=pinned,
        recalled=in_window,
        recalled_passages=len(recalled),
        window=window - in_window,
        evicted=r.evicted_tokens,
        cells=p.sinks + p.window + p.compact_interval,
    )


def _recalled_in_window(r: Receipt) -> Iterable[tuple[int, int]]:
    lo, hi = r.recent_logical
    for span in r.recalled:
        a, b = max(span.stream[0], lo), min(span.stream[1], hi)
        if a < b:
            yield a, b


def cache_map(r: Receipt) -> Html:
    """Two bars: the logical stream (what the session has seen, evicted ranges included) and the
    session's cells (what the model still sees, at the size of its cells), with a legend."""
    c = counts(r)
    seen = max(r.n_seen, 1)
    a0, a1 = r.anchors_logical
    r0, r1 = r.recent_logical
    logical: list[tuple[int, int, str]] = []
    if c.pinned:
        logical.append((a0, a0 + c.pinned, "pinned"))
    if a1 > a0 + c.pinned:
        logical.append((a0 + c.pinned, a1, "sink"))
    if r0 > a1:
        logical.append((a1, r0, "evicted"))
    logical.append((r0, r1, "window"))
    logical += [(a, b, "recalled") for a, b in _recalled_in_window(r)]
    cells = max(c.cells, r.retained, 1)
    held: list[tuple[int, int, str]] = []
    ca0, ca1 = r.anchors_cache
    if c.pinned:
        held.append((ca0, ca0 + c.pinned, "pinned"))
    if ca1 > ca0 + c.pinned:
        held.append((ca0 + c.pinned, ca1, "sink"))
    cr0, cr1 = r.recent_cache
    held.append((cr0, cr1, "window"))
    held += [(cr0 + a - r0, cr0 + b - r0, "recalled") for a, b in _recalled_in_window(r)]
    top = _bar(logical, seen, 20, f"logical stream: {r.n_seen} tokens seen")
    bottom = _bar(held, cells, 20 + BAR + 34, f"cells: {r.retained} of {cells} in use")
    legend = html(
        '<p class="legend">'
        '<span class="key pinned"></span>pinned prompt <b data-count="pinned">{}</b> '
        '<span class="key sink"></span>sinks <b data-count="sinks">{}</b> '
        '<span class="key recalled"></span>recalled <b data-count="recalled">{}</b>'
        ' (<b data-count="recalled-passages">{}</b> passages) '
        '<span class="key window"></span>window <b data-count="window">{}</b> '
        '<span class="key evicted"></span>evicted <b data-count="evicted">{}</b>'
        ' in {} evictions <span class="key free"></span>free cells</p>',
        c.pinned, c.sinks, c.recalled, c.recalled_passages, c.window, c.evicted, r.evictions,
    )  # fmt: skip
    height = 20 + 2 * BAR + 34 + 10
    svg = html(
        '<svg class="cachemap" role="img" viewBox="0 0 {} {}" width="{}" height="{}">'
        "<title>cache map of session {}</title>{}{}</svg>",
        WIDTH + 20, height, WIDTH + 20, height, r.session_id, top, bottom,
    )  # fmt: skip
    return join([svg, legend])


def _bar(parts: list[tuple[int, int, str]], total: int, y: int, label: str) -> Html:
    scale = WIDTH / total
    rects = [html('<rect class="frame" x="10" y="{}" width="{}" height="{}"/>', y, WIDTH, BAR)]
    for a, b, kind in parts:
        if b <= a:
            continue
        x, w = 10 + a * scale, max((b - a) * scale, 1.0)
        rects.append(
            html(
                '<rect class="{}" x="{}" y="{}" width="{}" height="{}">'
                "<title>{} {}-{}</title></rect>",
                kind,
                f"{x:.1f}",
                y,
                f"{w:.1f}",
                BAR,
                kind,
                a,
                b,
            )  # fmt: skip
        )
    rects.append(html('<text x="10" y="{}">{}</text>', y - 5, label))
    return join(rects)


def timeline(intervals: list[NarratedInterval]) -> Html:
    """Lines and error lines per interval, incidents marked: a column an interval."""
    if not intervals:
        return Html("")
    most = max(max(i.last_line - i.first_line + 1 for i in intervals), 1)
    step = WIDTH / len(intervals)
    height = 160
    cols = []
    for k, i in enumerate(intervals):
        lines = i.last_line - i.first_line + 1
        x = 10 + k * step
        h_lines = 120 * lines / most
        h_err = 120 * min(i.errors, lines) / most
        w = max(step - 1, 1.0)
        cols.append(
            html(
                '<rect class="lines" x="{}" y="{}" width="{}" height="{}">'
                "<title>interval {}: lines {}-{}, {} errors</title></rect>",
                f"{x:.1f}",
                f"{140 - h_lines:.1f}",
                f"{w:.1f}",
                f"{h_lines:.1f}",
                i.number,
                i.first_line,
                i.last_line,
                i.errors,
            )  # fmt: skip
        )
        if h_err:
            cols.append(
                html(
                    '<rect class="errors" x="{}" y="{}" width="{}" height="{}"/>',
                    f"{x:.1f}",
                    f"{140 - h_err:.1f}",
                    f"{w:.1f}",
                    f"{h_err:.1f}",
                )  # fmt: skip
            )
        if i.incidents:
            cols.append(
                html(
                    '<circle class="incident" cx="{}" cy="12" r="5"><title>incident in'
                    " interval {}</title></circle>",
                    f"{x + w / 2:.1f}",
                    i.number,
                )  # fmt: skip
            )
    return html(
        '<svg class="timeline" role="img" viewBox="0 0 {} {}" width="{}" height="{}">'
        "<title>lines and error lines per interval</title>{}"
        '<text x="10" y="156">lines {}-{}: a column an interval, its height its lines; red:'
        " error lines; a dot: an incident</text></svg>",
        WIDTH + 20, height, WIDTH + 20, height, join(cols),
        intervals[0].first_line, intervals[-1].last_line,
    )  # fmt: skip
