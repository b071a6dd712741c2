"""`sinkd narrate`: an endless log from stdin, told as facts (templates, counts, line numbers)
every N lines, at once for an incident, and phrased by the model only where the check finds each
of its words in the lines (the loop: `sinkd.cli.narrator`). Memory is bounded by the digest's
template cap, the queue and the session's S+W cells."""

from __future__ import annotations

import datetime
import enum
import json
import sys
import threading
from typing import Annotated, Any

import typer
from rich.text import Text

from sinkd.cli import narrated
from sinkd.cli.alerting import Alerting
from sinkd.cli.console import console, shown
from sinkd.cli.exit_codes import handle_errors
from sinkd.cli.narrator import (
    Counts,
    Intake,
    NarrateConfig,
    Narration,
    Narrator,
    StreamDigester,
    read_lines,
)
from sinkd.cli.options import (
    ConnectOpt,
    EvictOpt,
    JsonFlag,
    ModelOpt,
    SinksOpt,
    TokenOpt,
    WindowOpt,
    policy_request,
    session_backend,
)
from sinkd.daemon.metrics import rss_bytes
from sinkd.daemon.runtime.api import RecallRequest

out = console()
err = console(stderr=True)


class OnFull(str, enum.Enum):
    DROP_OLDEST = "drop-oldest"
    BLOCK = "block"


def narration_line(ts: str, text: str) -> Text:
    """A narration as the terminal shows it: the model's words as text, never markup."""
    return Text.assemble((ts, "dim"), " ", shown(text))


def narration_text(item: Narration) -> str:
    """What the terminal prints of one interval: the facts, then the checked sentence."""
    facts = item.facts
    if facts.quiet:
        return facts.steady()
    lines = facts.render().splitlines()
    if facts.incident:
        lines[0] = "INCIDENT " + lines[0]
    if item.text:
        cites = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in facts.cites())
        lines.append(f"> {item.text} [lines {cites}]")
    return "\n  ".join(lines)


def narration_event(item: Narration, ts: str, counts: dict[str, Any]) -> dict[str, Any]:
    facts = item.facts
    return {
        "event": "narration",
        "ts": ts,
        "lines": [facts.first_line, facts.last_line],
        "incident": facts.incident,
        "quiet": facts.quiet,
        "text": facts.steady() if facts.quiet else item.text,
        "phrased": item.phrased,
        "behind": item.behind,
        "cites": [list(c) for c in facts.cites()],
        "facts": facts.as_dict(),
        "facts_text": facts.render(),
        "unsupported": [
            {"sentence": d.sentence, "claims": list(d.unsupported)} for d in item.dropped
        ],
        "lines_read_at_print": item.lines_read,
        **counts,
        "rss_bytes": rss_bytes(),
    }


app = typer.Typer(
    help="Narrate a log from stdin; with --stream, kept by the daemon: see its history.",
)


@handle_errors
def narrate(
    ctx: typer.Context,
    stream_name: Annotated[
        str,
        typer.Option(
            "--stream",
            help="Keep this stream in the daemon: its templates, baselines, line numbers and every"
            " interval's facts outlive this pipe and the daemon (`sinkd narrate history NAME`).",
        ),
    ] = "",
    embedded: Annotated[
        bool,
        typer.Option("--embedded", help="Run the model in this process, even if a daemon runs."),
    ] = False,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    model: ModelOpt = None,
    sinks: SinksOpt = None,
    window: WindowOpt = None,
    evict: EvictOpt = None,
    every_lines: Annotated[
        int, typer.Option("--every-lines", min=1, help="An interval's lines, at most...")
    ] = 200,
    every_seconds: Annotated[
        float, typer.Option("--every-seconds", help="...or its seconds, once it has a line.")
    ] = 30.0,
    incident_lines: Annotated[
        int,
        typer.Option(
            "--incident-lines",
            min=1,
            help="An incident (a new error, an error back or at a multiple of its rate, a new"
            " template of warnings bursting) closes its interval this many lines after its first"
            " line...",
        ),
    ] = 20,
    incident_seconds: Annotated[
        float, typer.Option("--incident-seconds", help="...or this many seconds after.")
    ] = 1.0,
    gap_seconds: Annotated[
        float, typer.Option("--gap-seconds", help="A silence this long is a fact.")
    ] = 60.0,
    recur_intervals: Annotated[
        int,
        typer.Option(
            "--recur-intervals",
            min=1,
            help="A known error is an incident again once back after this many intervals without"
            " it (else it is listed, not raised).",
        ),
    ] = 3,
    info_bursts: Annotated[
        bool,
        typer.Option(
            "--info-bursts",
            help="A new template of INFO lines bursting is an incident too (else a NEW fact:"
            " an install, a deploy).",
        ),
    ] = False,
    inferred_errors: Annotated[
        int,
        typer.Option(
            "--inferred-errors",
            min=1,
            help='Lines of one error that only its words suggest ("denied", "unable to"; no'
            " ERROR stated) in an interval before it is an incident (else it is listed).",
        ),
    ] = 2,
    page_handled: Annotated[
        bool,
        typer.Option(
            "--page-handled",
            help='A failure its program says it carried past ("falling back to", "deferred",'
            ' "-- using"; no ERROR stated) is an incident as any (else it is listed).',
        ),
    ] = False,
    keep_lines: Annotated[
        bool,
        typer.Option(
            "--keep-lines",
            help="With --stream: the daemon keeps each interval's raw lines beside its facts (the"
            " first 1,000; `history --lines`), forgotten with them. Else no line is kept.",
        ),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", help="Print nothing for an interval with nothing to say.")
    ] = False,
    webhook: Annotated[
        str,
        typer.Option(
            "--webhook",
            help="POST each incident, raised and over, to this URL as Alertmanager's webhook JSON"
            " (any Alertmanager receiver takes it).",
        ),
    ] = "",
    on_incident: Annotated[
        str,
        typer.Option(
            "--on-incident",
            help="Run this command for each incident, raised and over, the incident as JSON on"
            " its stdin (no shell).",
        ),
    ] = "",
    feed_lines: Annotated[
        bool,
        typer.Option(
            "--feed-lines",
            help="Also append the raw lines to the session (its memory and recall keep them;"
            " the model reads ~140 tokens/s here, so most are dropped on a busy log).",
        ),
    ] = False,
    chunk_lines: Annotated[
        int,
        typer.Option("--chunk-lines", min=1, help="--feed-lines: append after this many lines..."),
    ] = 16,
    chunk_seconds: Annotated[
        float, typer.Option("--chunk-seconds", help="...or after this long.")
    ] = 1.0,
    max_line_bytes: Annotated[
        int, typer.Option("--max-line-bytes", min=1, help="Longer lines are cut here.")
    ] = 512,
    queue_lines: Annotated[
        int, typer.Option("--queue-lines", min=1, help="--feed-lines: lines waiting at most.")
    ] = 1024,
    on_full: Annotated[
        OnFull,
        typer.Option(
            "--on-full", help="--feed-lines: drop-oldest (stay current) or block (lose nothing)."
        ),
    ] = OnFull.DROP_OLDEST,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Longest narration.")] = 48,
    recall: Annotated[
        bool | None,
        typer.Option(
            "--recall/--no-recall",
            help="Before the model is asked, bring back evicted text like these facts [on with"
            " --feed-lines; off without: each fact already carries its total and first line].",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Narrate an endless log from stdin (`tail -f app.log | sinkd narrate`): facts computed from
    every line, a checked sentence from the model; through the daemon when one answers, else in
    this process."""
    if ctx.invoked_subcommand is not None:
        return
    cfg = NarrateConfig(
        chunk_lines=chunk_lines,
        chunk_seconds=chunk_seconds,
        every_lines=every_lines,
        every_seconds=every_seconds,
        max_line_bytes=max_line_bytes,
        queue_lines=queue_lines,
        on_full=on_full.value,
        max_tokens=max_tokens,
        recall=feed_lines if recall is None else recall,
        feed_lines=feed_lines,
        quiet=quiet,
        incident_lines=incident_lines,
        incident_seconds=incident_seconds,
        gap_seconds=gap_seconds,
        recur_intervals=recur_intervals,
        info_bursts=info_bursts,
        inferred_min=inferred_errors,
        page_handled=page_handled,
        stream=stream_name,
        keep_lines=keep_lines,
    )
    cfg.validate()
    counts = Counts()
    alerting = Alerting(cfg.stream or "stdin", webhook, on_incident)
    backend = session_backend(embedded, address, token, model, 512)

    def emit(item: Narration) -> None:
        alerting.interval(item.facts)  # handed to its sender: never waits
        if item.facts.quiet and cfg.quiet:
            return
        ts = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        if as_json:
            print(json.dumps(narration_event(item, ts, counts.as_dict())), flush=True)
        else:
            out.print(narration_line(ts, narration_text(item)), highlight=False)

    digester = StreamDigester(backend.narration, cfg.stream, cfg.options()) if cfg.stream else None
    intake = Intake(cfg, counts, digester=digester)
    reader = threading.Thread(
        target=read_lines, args=(sys.stdin.buffer, intake, counts, cfg.max_line_bytes), daemon=True
    )
    interrupted = False
    try:
        # recall "manual": the narrator asks with the facts' templates (Narrator._recall)
        receipt = backend.create(
            policy_request("sink", sinks, window, evict, 0),
            recall=RecallRequest(mode="manual" if cfg.recall else "off"),
        )
        reader.start()
        Narrator(backend, receipt.handle, cfg, counts, emit).run(intake)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        backend.shutdown()
        alerting.close()
    summary = {
        **counts.as_dict(),
        **(alerting.counts.as_dict() if alerting.wanted else {}),
        "interrupted": interrupted,
        "rss_bytes": rss_bytes(),
    }
    if as_json:
        print(json.dumps({"event": "summary", **summary}), flush=True)
    else:
        err.print(
            f"narrate: {summary['lines_read']} lines read, {summary['narrations']} intervals"
            f" ({summary['incidents']} incidents, {summary['quiet_intervals']} quiet,"
            f" {summary['phrased']} phrased, {summary['behind']} facts alone while behind),"
            f" {summary['unsupported_dropped']} unsupported sentences dropped"
            + (
                f"; {summary['lines_appended']} lines appended to the session,"
                f" {summary['lines_dropped']} dropped, {summary['lines_truncated']} cut"
                if cfg.feed_lines
                else f", {summary['lines_truncated']} cut"
            )
            + (
                f"; alerts {summary['alerts_sent']} sent, {summary['alerts_failed']} failed,"
                f" {summary['alerts_dropped']} dropped, {summary['alerts_left']} left"
                if alerting.wanted
                else ""
            ),
            highlight=False,
        )


app.callback(invoke_without_command=True)(narrate)
app.command("history")(narrated.history)
app.command("ask")(narrated.ask)
app.command("list")(narrated.streams)
app.command("forget")(narrated.forget)
app.command("mute")(narrated.mute)
