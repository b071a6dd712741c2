"""`sinkd memory list | search | forget | add`: the caller's tenant's memory across its
conversations on a running daemon (docs/recall.md, "Across conversations"): what the user said in
one conversation, kept for the others, with where and when it was said."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Annotated

import typer
from rich.table import Table

from sinkd.cli.console import console, shown
from sinkd.cli.exit_codes import handle_errors
from sinkd.cli.options import ConnectOpt, JsonFlag, TokenOpt, connect
from sinkd.cli.sessions import owed_note
from sinkd.daemon.runtime.api import KeptSelection, PassageView, to_json

app = typer.Typer(
    help="List, search and forget what your tenant's memory across conversations keeps.",
    no_args_is_help=True,
)
out = console()

ConversationOpt = Annotated[
    str | None,
    typer.Option("--conversation", help="Only what this conversation (session id) said."),
]
SpeakerOpt = Annotated[
    str | None,
    typer.Option(
        "--speaker", help="user (the user's words), or assistant (replies kept on request)."
    ),
]
SinceOpt = Annotated[
    str | None,
    typer.Option("--since", help="Kept at or after: unix seconds, or an ISO date/time (local)."),
]
UntilOpt = Annotated[
    str | None, typer.Option("--until", help="Kept before: unix seconds, or an ISO date/time.")
]


def when(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise typer.BadParameter(
            f"{value!r}: unix seconds or an ISO date", param_hint=name
        ) from None


def selection(
    conversation: str | None, speaker: str | None, since: str | None, until: str | None
) -> KeptSelection:
    return KeptSelection(
        None, conversation, speaker, when(since, "--since"), when(until, "--until")
    )


def show(passages: list[PassageView], title: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps(to_json(passages), indent=2))
        return
    table = Table(title=title)
    for col in ("passage", "kept", "conversation", "turn", "speaker", "asked", "score", "text"):
        table.add_column(col, no_wrap=col != "text")
    for p in passages:
        table.add_row(
            str(p.passage_id),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(p.created_unix_time)),
            p.conversation, str(p.turn), p.speaker, "yes" if p.asked else "",
            "" if p.score is None else f"{p.score:.2f}", shown(p.text.replace("\n", " ")[:200]),
        )  # fmt: skip
    out.print(table)
    if not passages:
        out.print("nothing kept")


@app.command("list")
@handle_errors
def listing(
    conversation: ConversationOpt = None,
    speaker: SpeakerOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 50,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """What the memory keeps, newest last (the owner's text)."""
    backend = connect(address, token)
    found = backend.kept(selection(conversation, speaker, since, until), "", limit)
    show(found, "memory across conversations (newest last)", as_json)


@app.command("search")
@handle_errors
def search(
    query: Annotated[str, typer.Argument(help="What to look for (words or a question).")],
    conversation: ConversationOpt = None,
    speaker: SpeakerOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 10,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """The passages that best match QUERY, as a conversation's recall would find them."""
    backend = connect(address, token)
    found = backend.kept(selection(conversation, speaker, since, until), query, limit)
    show(found, "memory across conversations (best matches first)", as_json)


@app.command("forget")
@handle_errors
def forget(
    passage: Annotated[int | None, typer.Argument(help="A passage id (from `list`).")] = None,
    conversation: ConversationOpt = None,
    speaker: SpeakerOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Delete from the memory, on disk: one passage, or every one the options select (together:
    all of them must hold). A copy a conversation recalled leaves its files too."""
    which = selection(conversation, speaker, since, until)
    if passage is not None:
        which = KeptSelection(
            passage, *(which.conversation, which.speaker, which.since, which.until)
        )
    if which == KeptSelection():
        raise typer.BadParameter(
            "name a passage id, or --conversation, --speaker, --since, --until"
        )
    erased = connect(address, token).forget_kept(which)
    if as_json:
        print(json.dumps({"forgotten": erased.count, "purge_owed": erased.purge_owed}))
    else:
        print(f"{erased.count} passage(s) deleted")
        owed_note(erased)


@app.command("add")
@handle_errors
def add(
    text: Annotated[str, typer.Argument(help="What to remember, in the user's words.")],
    address: ConnectOpt = None,
    token: TokenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Keep TEXT in the memory as the user's words, asked to be remembered."""
    show(connect(address, token).remember(text), "kept", as_json)
