"""HTML that is escaped by construction: `html("<td>{}</td>", value)` escapes every value that is
not itself `Html`, so text from conversations, memory and logs is always shown as text (a
`<script>` in a log line reads as one), and only this package's own templates make markup."""

from __future__ import annotations

import datetime
import html as _html
from collections.abc import Iterable
from typing import Any


class Html(str):
    """Markup this package made (never text from a caller)."""


def escape(value: Any) -> Html:
    if isinstance(value, Html):
        return value
    return Html(_html.escape(str(value), quote=True))


def html(template: str, *values: Any, **named: Any) -> Html:
    return Html(
        template.format(*(escape(v) for v in values), **{k: escape(v) for k, v in named.items()})
    )


def join(parts: Iterable[Html], sep: str = "") -> Html:
    return Html(sep.join(escape(p) for p in parts))


def table(head: list[str], rows: Iterable[list[Any]], empty: str = "none") -> Html:
    body = [html("<tr>{}</tr>", join(html("<td>{}</td>", c) for c in row)) for row in rows]
    if not body:
        return html('<p class="empty">{}</p>', empty)
    return html(
        "<table><thead><tr>{}</tr></thead><tbody>{}</tbody></table>",
        join(html("<th>{}</th>", h) for h in head),
        join(body),
    )


def link(href: str, text: Any) -> Html:
    return html('<a href="{}">{}</a>', href, text)


def when(unix: float) -> str:
    if not unix:
        return "-"
    return datetime.datetime.fromtimestamp(unix).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def size(n: int) -> str:
    """Bytes, as a person reads them."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def form(action: str, csrf: str, fields: dict[str, Any], button: str, danger: bool = False) -> Html:
    """A POST form with the login's CSRF token and hidden fields."""
    hidden = join(
        html('<input type="hidden" name="{}" value="{}">', k, v) for k, v in fields.items()
    )
    css = "danger" if danger else ""
    return html(
        '<form method="post" action="{}">'
        '<input type="hidden" name="csrf" value="{}">{}<button class="{}">{}</button></form>',
        action, csrf, hidden, css, button,
    )  # fmt: skip


def page(title: str, body: Html, who: str = "", csrf: str = "", admin: bool = False) -> Html:
    nav = Html("")
    if who:
        items = [link("/ui/sessions", "Sessions")]
        if admin:  # the admin owns no memory and no streams: it reads counts
            items.append(link("/ui/admin", "Admin"))
        else:
            items += [link("/ui/memory", "Memory"), link("/ui/narrations", "Narrator")]
        logout = form("/ui/logout", csrf, {}, "Log out")
        nav = html('<nav>{}<span class="who">{}</span>{}</nav>', join(items, " "), who, logout)
    return html(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<title>{} - sinkd</title><link rel="stylesheet" href="/ui/static/ui.css"></head>'
        "<body><header><strong>sinkd</strong>{}</header><main><h1>{}</h1>{}</main></body></html>",
        title, nav, title, body,
    )  # fmt: skip


def forgotten_note(count: int, owed: bool, what: str) -> Html:
    """What a forget removed, and whether its purge is still owed."""
    later = " Its text leaves the files once a reader lets go." if owed else ""
    return html("<p>Removed: {} {}{}.{}</p>", count, what, "" if count == 1 else "s", later)
