"""`sinkd eval ppl | recall`: quality over stream position, in this process."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from sinkd.cli.console import console
from sinkd.cli.exit_codes import handle_errors
from sinkd.cli.options import (
    CompactOpt,
    EvictOpt,
    JsonFlag,
    ModelOpt,
    SinksOpt,
    TokensPerSecond,
    WindowOpt,
    offline_policy,
)
from sinkd.errors import InvalidInput, Unsupported, message_of

out = console()
err = console(stderr=True)


eval_app = typer.Typer(help="Measure quality over stream position.", no_args_is_help=True)


@eval_app.command("ppl")
@handle_errors
def eval_ppl(
    text: Annotated[str, typer.Option("--text", help="A text file, or - for stdin.")],
    model: ModelOpt = None,
    tokens: Annotated[int, typer.Option("--tokens", min=1, help="Tokens to stream.")] = 4096,
    policies: Annotated[
        str,
        typer.Option("--policies", help="Comma list of full,window,sink,sink-noshift,recompute."),
    ] = "full,window,sink,sink-noshift,recompute",
    sinks: SinksOpt = None,
    window: WindowOpt = None,
    evict: EvictOpt = 1,
    compact: CompactOpt = 0,
    stride: Annotated[
        int, typer.Option("--stride", min=1, help="recompute: tokens scored per re-encoding.")
    ] = 64,
    bucket: Annotated[
        int, typer.Option("--bucket", min=1, help="Tokens per perplexity bucket.")
    ] = 256,
    out_dir: Annotated[Path, typer.Option("--out", help="Where the JSON and PNG go.")] = Path(
        "bench/results"
    ),
    name: Annotated[str, typer.Option("--name", help="File name stem of the results.")] = "ppl",
    as_json: JsonFlag = False,
) -> None:
    """Per-token loss through the engine for each policy; perplexity by stream position as JSON and PNG."""
    import platform

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from sinkd.cli import offline
    from sinkd.daemon.models.registry import load_lock
    from sinkd.evaluation.ppl import plot, summary

    names = [p.strip() for p in policies.split(",") if p.strip()]
    known = {"full", "window", "sink", "sink-noshift", "recompute"}
    if not names or set(names) - known:
        raise InvalidInput(f"--policies: choose from {', '.join(sorted(known))}, got {policies!r}")
    if tokens < 2 or bucket < 1:
        raise InvalidInput("--tokens must be >= 2 and --bucket >= 1")
    if text != "-" and not Path(text).is_file():
        raise InvalidInput(f"no such file: {text}")
    entry = load_lock().get(model)
    cfg = offline_policy(
        entry.default_sinks, entry.default_window, "sink", sinks, window, evict, compact
    )
    raw = sys.stdin.read() if text == "-" else Path(text).read_text(errors="replace")

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TokensPerSecond(), TimeRemainingColumn(),
                  console=err, transient=True) as bar:  # fmt: skip

        def progress(policy: str, total: int) -> Any:
            task = bar.add_task(policy, total=total)
            return lambda n: bar.advance(task, n)

        ids, n_ctx_train, runs = offline.perplexity(
            entry, raw, tokens, names, cfg, stride, progress
        )
    results: dict[str, Any] = {
        "model": entry.name, "model_sha256": entry.sha256, "text": text, "tokens": len(ids),
        "sinks": cfg.sinks, "window": cfg.window, "evict_chunk": cfg.evict_chunk,
        "compact_interval": cfg.compact_interval, "stride": stride, "bucket": bucket,
        "n_ctx_train": n_ctx_train, "machine": platform.platform(), "cpus": os.cpu_count(),
        "command": "sinkd " + " ".join(sys.argv[1:]),
        "runs": [summary(r, bucket) for r in runs],
    }  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(results, indent=1))
    drawn = drawn_or_said(
        lambda: plot(
            results,
            str(out_dir / f"{name}.png"),
            f"{entry.name}, S={cfg.sinks} W={cfg.window} E={cfg.evict_chunk}, {Path(text).name}",
        )
    )
    if as_json:
        print(json.dumps(results))
        return
    files = f"{out_dir / name}.json" + (", .png" if drawn else "")
    table = Table(title=f"perplexity over {len(ids)} tokens ({files})")
    for col in ("policy", "scored", "ppl", "last bucket", "tok/s", "note"):
        table.add_column(col)
    for r in results["runs"]:
        table.add_row(r["policy"], str(r["scored_tokens"]), f"{r['ppl']:.2f}", f"{r['ppl_last_bucket']:.2f}",
                      f"{r['tokens_per_s']:.0f}", r["note"])  # fmt: skip
    out.print(table)


def drawn_or_said(draw: Callable[[], None]) -> bool:
    """Draw the plot; without matplotlib (an extra) say so, the JSON being written already."""
    try:
        draw()
    except Unsupported as e:
        err.print(f"no plot: {message_of(e)}", highlight=False)
        return False
    return True


def _ints(value: str, option: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise InvalidInput(f"{option}: a comma list of token counts, got {value[:64]!r}") from None
    if any(v < 1 for v in out):
        raise InvalidInput(f"{option}: token counts must be >= 1")
    return out


@eval_app.command("recall")
@handle_errors
def eval_recall(
    text: Annotated[
        Path | None,
        typer.Option(
            "--text",
            help="Filler text (public domain, e.g. bench/texts/kjv.txt); passkey and chat arms.",
        ),
    ] = None,
    model: ModelOpt = None,
    arm: Annotated[
        str,
        typer.Option(
            "--arm",
            help="passkey: keys asked by a fixed question, prefilled answer; chat: facts said in "
            "passing, asked in other words, free answers, beside the in-window ceiling; "
            "conversation: multi-turn chats through the HTTP front, a fact said in turn 1 (and "
            "contradicted by an assistant reply in half), asked --distances turns later; "
            "memory: one user's many conversations through the HTTP front, facts asked in a new "
            "conversation --distances conversations later, with memory across conversations on "
            "and off.",
        ),
    ] = "passkey",
    distances: Annotated[
        str | None,
        typer.Option(
            "--distances",
            help="Tokens between the key (or fact) and the question "
            "[passkey: 126,1000,4000; chat: 1000,4000,16000]; conversation: turns [10,30];"
            " memory: conversations [5,20].",
        ),
    ] = None,
    sources: Annotated[
        str, typer.Option("--sources", help="chat: conversation,document (where facts are said).")
    ] = "conversation,document",
    samplings: Annotated[
        str, typer.Option("--samplings", help="chat: greedy,chat (the model's chat sampling).")
    ] = "greedy,chat",
    presentation: Annotated[
        str | None,
        typer.Option(
            "--presentation",
            help="chat: system-after, system-before, quoted or user-turn [the model's, models.lock].",
        ),
    ] = None,
    streams: Annotated[
        int, typer.Option("--streams", min=1, help="chat: streams per source, 20 facts each.")
    ] = 1,
    facts: Annotated[
        int,
        typer.Option(
            "--facts", min=1, max=20, help="chat: facts per stream; memory: facts (a quick run)."
        ),
    ] = 20,
    trials: Annotated[int, typer.Option("--trials", min=1, help="Streams per distance.")] = 5,
    long_distances: Annotated[
        str, typer.Option("--long-distances", help="Longer distances, fewer trials.")
    ] = "",
    long_trials: Annotated[int, typer.Option("--long-trials", min=0)] = 0,
    multi_trials: Annotated[
        int, typer.Option("--multi-trials", min=0, help="Multi-key streams (8 keys, at 1k).")
    ] = 3,
    control_trials: Annotated[
        int,
        typer.Option("--control-trials", min=0, help="Streams of the window and full controls."),
    ] = 2,
    conversations: Annotated[int, typer.Option("--conversations", min=0)] = 1,
    chats: Annotated[
        int, typer.Option("--chats", min=1, help="conversation: chats per distance and arm.")
    ] = 8,
    cells: Annotated[
        int | None,
        typer.Option(
            "--cells", min=64, help="conversation: the recall and off arms' session cells [1024]."
        ),
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Where the JSON and PNG go.")] = Path(
        "bench/results/recall"
    ),
    as_json: JsonFlag = False,
) -> None:
    """Passkey retrieval by distance with and without recall (and the controls), multi-key, and
    facts asked many chat turns later; or (--arm chat) facts said in passing and asked in the
    user's own words. In this process, through the daemon's service."""
    import tempfile

    from sinkd.daemon.config import Settings
    from sinkd.daemon.runtime.service import SinkdService
    from sinkd.evaluation.recall_trials import Plan, evaluate, plot, report_tables

    if arm not in ("passkey", "chat", "conversation", "memory"):
        raise InvalidInput(f"--arm: passkey, chat, conversation or memory, got {arm!r}")
    if arm == "memory":
        _eval_memory(model, distances or "5,20", facts, out_dir, as_json)
        return
    if arm == "conversation":
        _eval_conversation(model, distances or "10,30", chats, cells, out_dir, as_json)
        return
    if text is None or not text.is_file():
        raise InvalidInput(f"--text: no such file: {text}" if text else "--text is required")
    if arm == "chat":
        _eval_chat(text, model, distances or "1000,4000,16000", sources, samplings, presentation,
                   streams, facts, out_dir, as_json)  # fmt: skip
        return
    plan = Plan(
        distances=_ints(distances or "126,1000,4000", "--distances"),
        trials=trials,
        long_distances=_ints(long_distances, "--long-distances"),
        long_trials=long_trials,
        multi_distances=[1000],
        multi_trials=multi_trials,
        control_trials=control_trials,
        conversation_turns=6,
        conversations=conversations,
        placement_trials=trials,
    )
    with tempfile.TemporaryDirectory() as tmp:

        def make(**kw: Any) -> SinkdService:
            settings = Settings(
                model=model,
                socket=Path(tmp) / "unused.sock",
                durable=False,
                **{"step_tokens": 256, "prefill_chunk": 256, "n_batch": 256, **kw},
            )
            service = SinkdService(settings)
            service.start()
            service.wait_ready()
            return service

        data = evaluate(make, text.read_text(errors="replace"), plan, progress=err.print)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "eval-recall.json").write_text(json.dumps(data, indent=1))
    drawn = drawn_or_said(lambda: plot(data, out_dir / "eval-recall.png"))
    if as_json:
        print(json.dumps(data, indent=1))
        return
    for title, columns, rows in report_tables(data):
        _print_table(title, columns, rows)
    err.print(f"wrote {out_dir / 'eval-recall.json'}" + (" and .png" if drawn else ""))


def _print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title, title_justify="left")
    for c in columns:
        table.add_column(c, justify="right")
    for row in rows:
        table.add_row(*(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row))
    out.print(table)


def _names(value: str, option: str, known: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    if not names or set(names) - set(known):
        raise InvalidInput(f"{option}: a comma list of {', '.join(known)}, got {value[:64]!r}")
    return names


def _eval_chat(
    text: Path,
    model: str | None,
    distances: str,
    sources: str,
    samplings: str,
    presentation: str | None,
    streams: int,
    facts: int,
    out_dir: Path,
    as_json: bool,
) -> None:
    """The chat arm: `streams` streams per source, 20 facts each (evaluation/recall_chat.py)."""
    import tempfile

    from sinkd.daemon.config import Settings
    from sinkd.daemon.models.registry import load_lock
    from sinkd.daemon.runtime.recall.framing import Presentation
    from sinkd.daemon.runtime.service import SinkdService
    from sinkd.evaluation.recall_chat import SAMPLINGS, SOURCES, ChatPlan, chat_table, evaluate_chat

    entry = load_lock().get(model)
    chosen = presentation or entry.recall_presentation
    if chosen not in {p.value for p in Presentation}:
        known = ", ".join(p.value for p in Presentation)
        raise InvalidInput(f"--presentation: one of {known}, got {chosen!r}")
    plan = ChatPlan(
        distances=tuple(_ints(distances, "--distances")),
        sources=_names(sources, "--sources", SOURCES),
        samplings=_names(samplings, "--samplings", tuple(SAMPLINGS)),
        streams=streams,
        facts=facts,
    )
    with tempfile.TemporaryDirectory() as tmp:
        kw: dict[str, Any] = {
            "model": entry.name, "socket": Path(tmp) / "unused.sock", "durable": False,
            "http": None, "step_tokens": 256, "prefill_chunk": 256, "n_batch": 256,
            "n_ctx_seq": 1024, "max_sessions": 6, "call_timeout_s": 7200,
            "recall_presentation": chosen,
        }  # fmt: skip
        settings = Settings(**kw)
        service = SinkdService(settings)
        service.start()
        try:
            service.wait_ready()
            data = evaluate_chat(
                service, text.read_text(errors="replace"), plan, progress=err.print
            )
        finally:
            service.stop(snapshot=False)
    _report(data, out_dir / f"eval-recall-chat_{entry.name}_{chosen}.json", as_json,
            lambda: chat_table([data]))  # fmt: skip


def _eval_conversation(
    model: str | None,
    distances: str,
    chats: int,
    cells: int | None,
    out_dir: Path,
    as_json: bool,
) -> None:
    """The conversation arm: a daemon per arm in this process, its HTTP front on a free local
    port, talked to as a chat client does (evaluation/recall_conversation.py)."""
    from sinkd.daemon.models.registry import load_lock
    from sinkd.evaluation.recall_conversation import (
        ConversationPlan,
        conversation_table,
        evaluate_conversations,
    )

    entry = load_lock().get(model)
    plan = ConversationPlan(
        distances=tuple(_ints(distances, "--distances")),
        chats=chats,
        cells=cells or ConversationPlan.cells,
    )

    @contextlib.contextmanager
    def daemon(arm: str, n_cells: int) -> Iterator[tuple[str, str, str]]:
        recall = "auto" if arm == "recall" else "off"
        with _http_daemon(entry.name, ["eval"], n_ctx_seq=n_cells, recall_mode=recall) as (
            address,
            tokens,
        ):
            yield address, tokens[0], entry.name

    data = evaluate_conversations(daemon, plan, progress=err.print)
    _report(data, out_dir / f"eval-recall-conversation_{entry.name}.json", as_json,
            lambda: conversation_table(data))  # fmt: skip


def _eval_memory(
    model: str | None, distances: str, facts: int, out_dir: Path, as_json: bool
) -> None:
    """The memory arm: two daemons in this process (memory across conversations on, and off),
    their HTTP fronts on free local ports, two tenants each (evaluation/recall_memory.py)."""
    from sinkd.daemon.models.registry import load_lock
    from sinkd.evaluation.recall_memory import MemoryPlan, evaluate_memory, memory_tables

    entry = load_lock().get(model)
    plan = MemoryPlan(facts=facts, distances=tuple(_ints(distances, "--distances")))

    @contextlib.contextmanager
    def daemon(arm: str, n_cells: int) -> Iterator[tuple[str, list[str], str]]:
        with _http_daemon(
            entry.name, ["alice", "bob"], n_ctx_seq=n_cells, max_sessions=8,
            memory_across_conversations=arm == "memory", call_timeout_s=3600,
            n_threads=1,  # two engines in one process: one thread each, alike
        ) as (address, tokens):  # fmt: skip
            yield address, tokens, entry.name

    data = evaluate_memory(daemon, plan, progress=err.print)
    tables = memory_tables(data)
    _report(data, out_dir / f"eval-recall-memory_{entry.name}.json", as_json, lambda: tables[0])
    if not as_json:
        _print_table(*tables[1])


@contextlib.contextmanager
def _http_daemon(
    model: str, tenants: list[str], **settings: Any
) -> Iterator[tuple[str, list[str]]]:
    """A daemon in this process for an evaluation: its HTTP front on a free local port, a state
    directory of its own, a random token per tenant; yields (address, tokens)."""
    import hashlib
    import secrets
    import tempfile

    from sinkd.daemon.config import Settings, Tenant
    from sinkd.daemon.node import Daemon

    tokens = [secrets.token_urlsafe(16) for _ in tenants]
    configured = [
        Tenant(name=name, token_sha256=hashlib.sha256(t.encode()).hexdigest())
        for name, t in zip(tenants, tokens, strict=True)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(
            Settings(
                model=model,
                socket=Path(tmp) / "sinkd.sock",
                state_dir=Path(tmp) / "state",
                http="127.0.0.1:0",
                tenants=configured,
                **settings,
            )  # fmt: skip
        )
        d.start()
        try:
            d.wait_ready(600)
            assert d.http is not None
            yield d.http.address, tokens
        finally:
            d.stop()


def _report(
    data: dict[str, Any],
    path: Path,
    as_json: bool,
    table: Callable[[], tuple[str, list[str], list[list[Any]]]],
) -> None:
    """An arm's results: the JSON file (with the command that made it), then the JSON or the
    table on stdout."""
    data["command"] = "sinkd " + " ".join(sys.argv[1:])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    if as_json:
        print(json.dumps(data, indent=1))
        return
    _print_table(*table())
    err.print(f"wrote {path}")


@eval_app.command("narrate")
@handle_errors
def eval_narrate(
    loghub: Annotated[
        Path,
        typer.Option(
            "--loghub",
            help="A folder with loghub's BGL_2k.log, Apache_2k.log, OpenSSH_2k.log, Linux_2k.log"
            " (github.com/logpai/loghub; not shipped).",
        ),
    ],
    models: Annotated[
        str, typer.Option("--models", help="Comma list of pinned models.")
    ] = "smollm2-135m-instruct,gemma3-270m",
    rate: Annotated[float, typer.Option("--rate", help="Lines a second, replayed.")] = 50.0,
    max_lines: Annotated[int, typer.Option("--max-lines", min=100, help="Lines a case.")] = 1000,
    every_lines: Annotated[int, typer.Option("--every-lines", min=1)] = 100,
    within: Annotated[
        int,
        typer.Option("--within", min=1, help="An incident counts if narrated this many lines on."),
    ] = 200,
    before: Annotated[
        str | None,
        typer.Option(
            "--before", help="A git ref whose cli/narrate.py is today's narrator, beside."
        ),
    ] = None,
    throughput_repeat: Annotated[
        int,
        typer.Option(
            "--throughput-repeat", min=0, help="Then the first case this many times, unpaced."
        ),
    ] = 50,
    out_dir: Annotated[Path, typer.Option("--out", help="Where eval-narrate.json goes.")] = Path(
        "."
    ),
    questions: Annotated[
        bool,
        typer.Option(
            "--questions",
            help="Instead: questions about BGL's labelled incidents, asked of a narrated stream"
            " (evaluation/narrate_questions.py); eval-narrate-questions.json.",
        ),
    ] = False,
    incidents: Annotated[
        bool,
        typer.Option(
            "--incidents",
            help="Instead, without a model: incidents missed and false at today's rules and the"
            " earlier ones, false ones per 10,000 lines of logs with no labelled trouble (this"
            " machine's package logs among them; evaluation/narrate_incidents.py);"
            " eval-narrate-incidents.json.",
        ),
    ] = False,
) -> None:
    """Incident recall, unsupported sentences, lag and lines a second of `sinkd narrate` on real
    logs with labelled incidents (evaluation/narrate.py says which and how they are scored)."""
    import tempfile

    from sinkd.evaluation import narrate as ev

    names = _names(models, "--models", ("smollm2-135m-instruct", "gemma3-270m"))
    if not (loghub / "BGL_2k.log").exists():
        raise InvalidInput(f"--loghub: no BGL_2k.log in {loghub}")
    if questions:
        _eval_narrate_questions(ev.bgl_case(loghub, max_lines), names, every_lines, out_dir)
        return
    if incidents:
        _eval_narrate_incidents(loghub, out_dir)
        return
    all_cases = ev.cases(loghub, max_lines)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sinkd-eval-narrate-") as tmp:
        narrators: list[tuple[str, Path | None]] = [("facts", None)]
        if before:
            narrators.append((f"before ({before})", ev.narrator_at(before, Path(tmp))))
        for model in names:
            for label, path in narrators:
                for case in all_cases:
                    command = ev.narrate_command(model, every_lines, path)
                    run = ev.replay(command, case.lines, rate, 1800)
                    row = {
                        "model": model,
                        "narrator": label,
                        **ev.score(case, run, within, path is None),
                    }
                    rows.append(row)
                    err.print(json.dumps(row), highlight=False)
    columns = list(rows[0]) if rows else []
    _print_table(
        "narrate: real logs, labelled incidents", columns, [[r[c] for c in columns] for r in rows]
    )
    speed = (
        ev.throughput(all_cases[0].lines, names[0], every_lines, throughput_repeat)
        if throughput_repeat
        else {}
    )
    if speed:
        _print_table("unpaced", list(speed), [list(speed.values())])
    data = {
        "cases": [
            {"name": c.name, "source": c.source, "lines": len(c.lines),
             "incidents": [{"first_line": i.first_line, "lines": len(i.lines), "label": i.label} for i in c.incidents]}
            for c in all_cases
        ],
        "rate": rate,
        "within": within,
        "every_lines": every_lines,
        "rows": rows,
        "throughput": speed,
    }  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "eval-narrate.json").write_text(json.dumps(data, indent=1))
    err.print(f"wrote {out_dir / 'eval-narrate.json'}")


def _eval_narrate_incidents(loghub: Path, out_dir: Path) -> None:
    from sinkd.evaluation import narrate_incidents as ni

    results = ni.evaluate(loghub)
    for title, columns, rows in ni.tables(results):
        _print_table(title, columns, rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "eval-narrate-incidents.json"
    path.write_text(json.dumps(results, indent=1))
    err.print(f"wrote {path}")


def _eval_narrate_questions(
    case: Any, names: tuple[str, ...], every_lines: int, out_dir: Path
) -> None:
    import tempfile

    from sinkd.daemon.config import Settings
    from sinkd.daemon.runtime.service import SinkdService
    from sinkd.evaluation import narrate_questions as nq

    results: dict[str, Any] = {}
    rows: list[list[Any]] = []
    for model in names:
        with tempfile.TemporaryDirectory(prefix="sinkd-eval-ask-") as tmp:
            settings = Settings(
                model=model, socket=Path(tmp) / "unused.sock", durable=False, http=None,
                step_tokens=256, prefill_chunk=256, n_batch=256, call_timeout_s=600,
            )  # fmt: skip
            service = SinkdService(settings)
            service.start()
            try:
                service.wait_ready()
                answers = nq.evaluate(service, case, every_lines)
            finally:
                service.stop(snapshot=False)
        results[model] = {"summary": nq.summary(answers), "answers": answers}
        for a in answers:
            cites = ", ".join(f"{x}-{y}" for x, y in a["cites"]) or "-"
            rows.append([model, a["kind"], a["question"], cites, a["first_line_about"] or "-",
                         a["right"], a["dropped"], a["printed_unsupported"]])  # fmt: skip
        err.print(json.dumps({"model": model, **nq.summary(answers)}), highlight=False)
    _print_table(
        f"narrate ask: {case.source}, questions from its labels",
        ["model", "kind", "question", "cites", "first line about", "right", "dropped",
         "printed unsupported"],
        rows,
    )  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "eval-narrate-questions.json"
    path.write_text(json.dumps({"source": case.source, "every_lines": every_lines,
                                "models": results}, indent=1))  # fmt: skip
    err.print(f"wrote {path}")
