"""`sinkd narrate history | ask | list | forget | mute`: the narrated streams a daemon keeps for the
caller's tenant (`sinkd narrate --stream NAME`): the timeline of intervals and incidents, by time,
severity and template words, without the model; a question answered from those facts alone."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from sinkd.cli.console import console, shown
from sinkd.cli.exit_codes import handle_errors
from sinkd.cli.memory import when
from sinkd.cli.options import ConnectOpt, JsonFlag, TokenOpt, connect
from sinkd.daemon.runtime.api import NarratedInterval, to_json

out = console()
StreamArg = Annotated[str, typer.Argument(help="The stream's name (`sinkd narrate --stream`).")]


def clock(t: float) -> str:
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def summary(interval: NarratedInterval) -> str:
    """An interval in a line: an incident's or an error's facts first; a fold's counts."""
    record = json.loads(interval.record_json)
    if interval.last_number > interval.number:
        errors = record.get("error_templates", {})
        top = sorted(errors.items(), key=lambda kv: -kv[1])[:3]
        named = "; ".join(f'{n} x "{t}"' for t, n in top)
        return f"{record.get('folded', 0)} intervals folded" + (f": {named}" if named else "")
    lines = record.get("text", "").splitlines()
    said = record.get("sentence", "")
    first = next(
        (line for line in lines[1:] if not line.startswith("(")), lines[0] if lines else ""
    )
    pipes = "".join(f"(a new pipe at line {n}) " for n in record.get("new_pipe_at", []))
    return pipes + first + (f" > {said}" if said else "")


def incident_cell(interval: NarratedInterval) -> str:
    """INCIDENT, with the templates it raised (`sinkd narrate mute NAME ID` takes one)."""
    if not interval.incidents:
        return ""
    opened = json.loads(interval.record_json).get("facts", {}).get("opened", [])
    ids = ", ".join(str(i["template_id"]) for i in opened)
    return f"INCIDENT (template {ids})" if ids else "INCIDENT"


@handle_errors
def history(
    stream: StreamArg,
    since: Annotated[
        str | None, typer.Option("--since", help="From: unix seconds or an ISO date/time.")
    ] = None,
    until: Annotated[str | None, typer.Option("--until", help="To: the same.")] = None,
    severity: Annotated[
        str,
        typer.Option(
            "--severity",
            help="Only intervals with a template at warning, error or critical (or worse).",
        ),
    ] = "",
    template: Annotated[
        str, typer.Option("--template", help="Only intervals whose facts hold these words.")
    ] = "",
    limit: Annotated[
        int, typer.Option("--limit", min=0, help="The newest this many (0: all).")
    ] = 0,
    lines: Annotated[
        bool, typer.Option("--lines", help="Also the raw lines each interval kept (--keep-lines).")
    ] = False,
    plot_file: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Also draw it (.svg, .png, .pdf): lines and error lines per interval, incidents"
            " marked (sinkd[plots]).",
        ),
    ] = None,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """The stream's timeline: every interval kept (oldest first), its lines, errors and incident,
    and what was said of it."""
    client = connect(address, token)
    found = client.narration.history(
        stream, when(since, "--since") or 0.0, when(until, "--until") or 0.0, severity,
        template, limit,
    )  # fmt: skip
    if plot_file is not None:
        from sinkd.cli.narration_plot import plot  # matplotlib: only when asked

        plot(found, plot_file, stream)
    if as_json:
        for interval in found:
            print(json.dumps({**to_json(interval), "record": json.loads(interval.record_json)}))  # type: ignore[dict-item]
        return
    table = Table(title=f"{stream}: {len(found)} intervals")
    for column in ("#", "lines", "from", "to", "errors", "incident", "facts"):
        table.add_column(column)
    for i in found:
        number = f"{i.number}-{i.last_number}" if i.last_number > i.number else str(i.number)
        table.add_row(
            number, f"{i.first_line}-{i.last_line}", clock(i.started), clock(i.ended),
            str(i.errors), incident_cell(i), shown(summary(i)),
        )  # fmt: skip
    out.print(table)
    if lines:
        for i in found:
            record = json.loads(i.record_json)
            kept = record.get("lines")
            if kept is None:
                continue
            out.print(f"[bold]interval {i.number}[/bold], lines {i.first_line}-{i.last_line}:")
            for n, text in enumerate(kept, i.first_line):
                out.print(
                    f"{n:>8} ", shown(text), highlight=False
                )  # the line as text, never markup
            if record.get("lines_left_out"):
                out.print(f"          ({record['lines_left_out']} more lines not kept)")


@handle_errors
def streams(address: ConnectOpt = None, token: TokenOpt = None, as_json: JsonFlag = False) -> None:
    """The narrated streams the daemon keeps for your tenant."""
    found = connect(address, token).narration.streams()
    if as_json:
        for s in found:
            print(json.dumps(to_json(s)))
        return
    table = Table(title=f"{len(found)} narrated streams")
    for column in ("stream", "intervals", "lines", "incidents", "since", "last"):
        table.add_column(column)
    for s in found:
        table.add_row(
            shown(s.name), str(s.intervals), str(s.lines), str(s.incidents), clock(s.created),
            clock(s.updated),
        )  # fmt: skip
    out.print(table)


@handle_errors
def forget(
    stream: StreamArg,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Only the intervals from: unix seconds or an ISO date/time."),
    ] = None,
    until: Annotated[str | None, typer.Option("--until", help="...to: the same.")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
    address: ConnectOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete the stream: its templates, baselines and every interval's facts; with --since or
    --until, only the intervals that overlap that period (the stream goes on)."""
    start, end = when(since, "--since"), when(until, "--until")
    period = start is not None or end is not None
    if not yes:
        what = (
            f"the intervals of {stream!r} from {since or 'its start'} to {until or 'now'}"
            if period
            else f"the narrated stream {stream!r} and all it kept"
        )
        typer.confirm(f"Forget {what}?", abort=True)
    gone = connect(address, token).narration.forget(stream, start, end)
    owed = " (the files hold them until a reader lets go)" if gone.purge_owed else ""
    out.print(f"forgot {stream}: {gone.intervals} intervals{owed}", highlight=False)


@handle_errors
def mute(
    stream: StreamArg,
    template_id: Annotated[
        int | None,
        typer.Argument(
            min=1,
            help="The template's id: an incident's alert label template_id, or history's."
            " Left out: the stream's muted templates are listed.",
        ),
    ] = None,
    unmute: Annotated[bool, typer.Option("--unmute", help="Page on it again.")] = False,
    address: ConnectOpt = None,
    token: TokenOpt = None,
) -> None:
    """Mute one of the stream's templates: its lines are still read, counted and listed in the
    facts, but it raises no incident (a page that is noise on this log). Kept with the stream."""
    if template_id is None and unmute:
        raise typer.BadParameter("--unmute needs the template's id", param_hint="template_id")
    narration = connect(address, token).narration
    if template_id is None:
        held = narration.muted(stream)
        for t, text in held:
            out.print(Text.assemble(f"{t:>6}  ", shown(text)), highlight=False)
        if not held:
            out.print(Text.assemble("nothing muted in ", shown(stream)), highlight=False)
        return
    done = narration.mute(stream, template_id, not unmute)
    what = "unmuted" if unmute else "muted"
    out.print(
        Text.assemble(f"{what} template {done.template_id} of {stream}: ", shown(done.template)),
        highlight=False,
    )


@handle_errors
def ask(
    stream: StreamArg,
    question: Annotated[str, typer.Argument(help='"When did the sshd failures start?"')],
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, max=256)] = 48,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Answer a question about the stream's past from its kept facts: the intervals that match
    (by the times, severities and template words it names) are given to the model, its sentence
    is checked against them, and the facts are printed whatever it said."""
    answer = connect(address, token).narration.ask(stream, question, max_tokens)
    if as_json:
        print(json.dumps(to_json(answer)))
        return
    if not answer.held:
        out.print(
            Text.assemble("The facts kept of ", shown(stream), " do not hold an answer to this."),
            highlight=False,
        )
        return
    cites = ", ".join(
        f"interval {i.number} (lines {i.first_line}-{i.last_line})" for i in answer.cites
    )
    said = shown(answer.text) if answer.text else "(no sentence of the model's passed the check)"
    out.print(Text.assemble("> ", said, f" [{cites}]"), highlight=False)
    for line in answer.facts_text.splitlines():
        out.print(Text.assemble("  ", shown(line)), highlight=False)
