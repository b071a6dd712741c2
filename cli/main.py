"""`sinkd`: stream text through a policy, print receipts, manage models."""

from __future__ import annotations

import enum
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import ProgressColumn
from rich.table import Table
from rich.text import Text

from sinkd.cachepolicy import PolicyConfig, PolicyName
from sinkd.cli import models, sessions
from sinkd.cli.console import console
from sinkd.cli.errors import handle_errors
from sinkd.daemon.errors import InvalidInput

app = typer.Typer(
    help="sinkd: a small local LLM over an unbounded stream at constant memory (attention sinks on"
    " llama.cpp). Evicted tokens are gone: this is not memory.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(models.app, name="models")
app.add_typer(sessions.app, name="sessions")


out = console()
err = console(stderr=True)

ModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="Model from models.lock.")]
PolicyOpt = Annotated[PolicyName, typer.Option("--policy", "-p", help="The eviction policy.")]
SinksOpt = Annotated[
    int | None,
    typer.Option("--sinks", "-s", min=0, help="S: sink positions kept (default: the model's)."),
]
WindowOpt = Annotated[
    int | None,
    typer.Option("--window", "-w", help="W: recent positions kept (default: the model's)."),
]
EvictOpt = Annotated[
    int | None,
    typer.Option("--evict", "-e", min=1, help="E: window cells evicted at once (default: 16)."),
]
CompactOpt = Annotated[
    int | None,
    typer.Option(
        "--compact",
        "-k",
        min=0,
        help="K: defer the position shift until the gap reaches K (unset: the daemon's default,"
        " 32 x E at most W, for a daemon session; 0 for the offline tools).",
    ),
]
ThreadsOpt = Annotated[
    int | None, typer.Option("--threads", min=1, help="CPU threads for llama.cpp.")
]
KvTypeOpt = Annotated[str, typer.Option("--kv-type", help="KV cache dtype (checked: f16).")]
DEFAULT_EVICT = 16  # the daemon's default_evict_chunk, for the embedded commands too


class OnFull(str, enum.Enum):
    DROP_OLDEST = "drop-oldest"
    BLOCK = "block"


JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


ENGINE_DIED = 70  # EX_SOFTWARE: the daemon stopped itself rather than serve without an engine


def _policy(
    entry_sinks: int,
    entry_window: int,
    policy: str,
    sinks: int | None,
    window: int | None,
    evict: int | None,
    compact: int | None,
) -> PolicyConfig:
    return PolicyConfig.resolve(
        policy,
        sinks=sinks,
        window=window,
        evict_chunk=evict,
        compact_interval=compact or 0,  # the offline tools shift at every eviction unless told
        default_sinks=entry_sinks,
        default_window=entry_window,
        default_evict_chunk=DEFAULT_EVICT,
    )


@app.command()
@handle_errors
def receipt(
    model: ModelOpt = None,
    sinks: SinksOpt = None,
    window: WindowOpt = None,
    kv_type: KvTypeOpt = "f16",
    as_json: JsonFlag = False,
) -> None:
    """Tensor-shape receipt: what one session's cache costs, by formula and as llama.cpp allocated it."""
    from sinkd.daemon.engine.models import load_lock
    from sinkd.evaluation import offline

    entry = load_lock().get(model)
    policy = _policy(entry.default_sinks, entry.default_window, "sink", sinks, window, 1, 0)
    data = offline.tensor_receipt(entry, policy, kv_type)
    if as_json:
        print(json.dumps(data, indent=2))
        return
    table = Table(title=f"tensor-shape receipt: {entry.name}", show_header=False)
    for key, value in data.items():
        if key in ("allocations", "sha256"):
            continue
        table.add_row(key.replace("_", " "), _fmt(value))
    out.print(table)
    out.print(
        f"llama.cpp rounds each sequence's stream up to a multiple of 256 cells: it allocated"
        f" {data['allocated_cells_per_session']} cells for a budget of {policy.budget} (its log"
        " gives MiB to 0.01)."
    )


def _fmt(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10_000:
        return f"{value:,} ({value / 2**20:.2f} MiB)"
    return str(value)


def _read_texts(source: str, block_bytes: int = 4096) -> Iterator[str]:
    """Blocks of text from a file or stdin, split at line ends, invalid UTF-8 replaced."""
    stream = sys.stdin.buffer if source == "-" else Path(source).open("rb")  # noqa: SIM115
    try:
        buf = b""
        while True:
            data = stream.read(block_bytes)
            if not data:
                break
            buf += data
            cut = buf.rfind(b"\n") + 1
            if cut:
                yield buf[:cut].decode("utf-8", errors="replace")
                buf = buf[cut:]
        if buf:
            yield buf.decode("utf-8", errors="replace")
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


@app.command()
@handle_errors
def stream(
    source: Annotated[str, typer.Argument(help="A text file, or - for stdin.")],
    model: ModelOpt = None,
    policy: PolicyOpt = PolicyName.SINK,
    sinks: SinksOpt = None,
    window: WindowOpt = None,
    evict: EvictOpt = None,
    compact: CompactOpt = 0,
    chunk: Annotated[int, typer.Option("--chunk", min=1, help="Tokens per reported chunk.")] = 256,
    threads: ThreadsOpt = None,
    kv_type: KvTypeOpt = "f16",
    model_file: Annotated[
        Path | None,
        typer.Option(
            "--model-file", help="An unlisted GGUF (not in models.lock): full policy only."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Feed text through a policy on the embedded engine; per chunk: tokens, retained, evicted, perplexity."""
    from sinkd.daemon.engine.models import load_lock
    from sinkd.evaluation import offline

    if chunk < 1:
        raise InvalidInput(f"--chunk: must be >= 1, got {chunk}")
    if source != "-" and not Path(source).is_file():
        raise InvalidInput(f"no such file: {source}")
    if model_file is None:
        entry = load_lock().get(model)
        name, default_sinks, default_window = entry.name, entry.default_sinks, entry.default_window
    else:
        name, default_sinks, default_window = model_file.name, 0, 256
    cfg = _policy(default_sinks, default_window, policy.value, sinks, window, evict, compact)
    if not as_json:
        err.print(
            f"sinkd stream: {name}, {cfg.policy.value} S={cfg.sinks} W={cfg.window}"
            f" E={cfg.evict_chunk} K={cfg.compact_interval}",
            highlight=False,
        )
    seq = None
    reports = offline.stream(
        None if model_file else name, model_file, cfg, _read_texts(source), chunk, threads, kv_type
    )
    for report, current in reports:
        seq = current
        if as_json:
            print(json.dumps(report.as_dict()), flush=True)
        else:
            row = report.as_dict()
            out.print(
                f"{row['chunk']:>5}  seen {row['tokens_seen']:>7}  retained {row['retained']:>5}"
                f"  evicted {row['evicted_tokens']:>7}  ppl {row['perplexity']:>9.3f}"
                f"  rss {report.rss_bytes / 2**20:7.1f} MiB",
                highlight=False,
            )
    if seq is None:
        raise InvalidInput("the input held no text")
    final = seq.receipt().as_dict()
    final["model"] = name
    final["note"] = "evicted tokens are gone: the model sees only the sinks and the window"
    if as_json:
        print(json.dumps({"receipt": final}), flush=True)
    else:
        out.print_json(json.dumps(final))


@app.command()
@handle_errors
def serve(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML settings file.")
    ] = None,
    socket: Annotated[Path | None, typer.Option("--socket", help="Unix socket path.")] = None,
    tcp: Annotated[
        str | None, typer.Option("--tcp", help="Also listen on host:port (needs tenants).")
    ] = None,
    model: ModelOpt = None,
    max_sessions: Annotated[
        int | None, typer.Option("--max-sessions", help="Sequences in the context.")
    ] = None,
    n_ctx_seq: Annotated[int | None, typer.Option("--ctx", help="Cells per session.")] = None,
    threads: ThreadsOpt = None,
    gpu_layers: Annotated[
        int | None, typer.Option("--gpu-layers", help="Layers to offload (CUDA/Metal builds).")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="Prometheus endpoint on 127.0.0.1.")
    ] = None,
    allow_unchecked: Annotated[
        bool,
        typer.Option(
            "--allow-unchecked", help="Run a KV dtype or backend not checked in models.lock."
        ),
    ] = False,
    state_dir: Annotated[
        Path | None,
        typer.Option("--state-dir", help="Journal and snapshots (default ~/.local/state/sinkd)."),
    ] = None,
    durable: Annotated[
        bool | None,
        typer.Option("--durable/--no-durable", help="Keep sessions across restarts (default on)."),
    ] = None,
) -> None:
    """Run the gRPC daemon until SIGTERM or Ctrl-C; pulls and verifies the model first if missing."""
    import logging

    from pydantic import ValidationError

    from sinkd.daemon.config import load_settings
    from sinkd.daemon.engine.models import load_lock, model_path
    from sinkd.daemon.rpc.server import Daemon

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = load_settings(
            config, socket=socket, tcp=tcp, model=model, max_sessions=max_sessions,
            n_ctx_seq=n_ctx_seq, n_threads=threads, n_gpu_layers=gpu_layers, metrics_port=metrics_port,
            allow_unchecked=allow_unchecked or None, state_dir=state_dir, durable=durable,
        )  # fmt: skip
    except ValidationError as e:
        for problem in e.errors():
            where = ".".join(str(p) for p in problem["loc"]) or "settings"
            print(f"sinkd: {where}: {problem['msg']}", file=sys.stderr)
        raise typer.Exit(2) from None
    entry = load_lock().get(settings.model)
    if not model_path(entry).is_file():
        err.print(f"model {entry.name} is not pulled yet: pulling it now")
        models.pull_model(entry.name)
    daemon = Daemon(settings)
    daemon.trap_signals()
    daemon.start()
    try:
        daemon.wait_ready()
    except BaseException:
        daemon.stop()
        raise
    err.print(f"sinkd serving {entry.name} on {', '.join(daemon.addresses)}", highlight=False)
    if settings.durable:
        count = daemon.service.metrics.count
        err.print(
            f"state in {settings.state_dir}: {count('resumed_sessions')} sessions resumed,"
            f" {count('stale_sessions')} stale (`sinkd sessions list` says why)",
            highlight=False,
        )
    daemon.serve_until_signal()
    if daemon.died.is_set():
        print("sinkd: the engine thread died (see the log); stopped serving", file=sys.stderr)
        raise typer.Exit(ENGINE_DIED)
    err.print("sinkd stopped", highlight=False)


ConnectOpt = Annotated[
    str | None, typer.Option("--connect", help="Use the daemon at this address ($SINKD_ADDRESS).")
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", help="Bearer token (default: $SINKD_TOKEN).", envvar="SINKD_TOKEN"),
]


def _backend(
    embedded: bool, connect: str | None, token: str | None, model: str | None, budget: int
) -> Any:
    """--embedded: this process; --connect: that daemon; neither: the daemon at the default
    address if one answers (one model in memory, and the daemon keeps every core instead of
    splitting them with a second engine: bench/two_processes.py), else this process. The first line
    says which."""
    from sinkd.cli.backend import EmbeddedBackend, RemoteBackend, daemon_answers, default_address

    if embedded:
        return EmbeddedBackend(model=model, n_ctx_seq=budget, max_sessions=2)
    if connect is not None:
        return RemoteBackend(connect, token)
    address = default_address()
    if daemon_answers(address):
        err.print(f"using the daemon at {address}")
        return RemoteBackend(address, token)
    err.print(f"no daemon answers at {address}: running the model in this process")
    return EmbeddedBackend(model=model, n_ctx_seq=budget, max_sessions=2)


def _policy_dict(
    policy: str, sinks: int | None, window: int | None, evict: int | None, compact: int | None
) -> dict[str, Any]:
    d: dict[str, Any] = {"name": policy}
    if compact is not None:  # unset: the daemon's default
        d["compact_interval"] = compact
    if sinks is not None:
        d["sinks"] = sinks
    if window is not None:
        d["window"] = window
    if evict is not None:
        d["evict_chunk"] = evict
    return d


CHAT_WINDOW = 1020  # S=4 + W=1,020: 1,024 cells (bench/chat_defaults.py: ITL and memory by window)


PLAIN_SAMPLING = {  # SamplingParams' defaults, spelled out so a remote daemon gets the same
    "temperature": 0.0,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "repeat_penalty": 1.0,
    "seed": 0,
}


class RecallModeOpt(str, enum.Enum):
    OFF = "off"
    MANUAL = "manual"
    AUTO = "auto"


@app.command()
@handle_errors
def chat(
    embedded: Annotated[
        bool, typer.Option("--embedded", help="Run the model in this process, no daemon.")
    ] = False,
    connect: ConnectOpt = None,
    token: TokenOpt = None,
    model: ModelOpt = None,
    system: Annotated[str, typer.Option("--system", help="System prompt.")] = "",
    pin_system: Annotated[
        bool, typer.Option("--pin-system", help="Keep the whole system prompt as sinks.")
    ] = False,
    policy: PolicyOpt = PolicyName.SINK,
    sinks: SinksOpt = None,
    window: WindowOpt = None,
    evict: EvictOpt = None,
    compact: CompactOpt = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Longest reply.")] = 256,
    recall: Annotated[
        RecallModeOpt | None,
        typer.Option(
            "--recall",
            help="auto: before each turn, bring evicted text that matches your message back into"
            " the cache (a line says what); manual: keep it, recall on request; off: keep"
            " nothing. Default: auto for the sink policy.",
        ),
    ] = None,
    temperature: Annotated[
        float | None, typer.Option("--temperature", min=0.0, help="0: greedy.")
    ] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", min=0)] = None,
    top_p: Annotated[float | None, typer.Option("--top-p")] = None,
    min_p: Annotated[float | None, typer.Option("--min-p")] = None,
    repeat_penalty: Annotated[
        float | None,
        typer.Option("--repeat-penalty", help="Over the last 64 tokens; 1: off."),
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0)] = None,
) -> None:
    """Talk to a session; replies stream as they are generated. /reset /fork /receipt /trace /quit.

    Sampling: the model's recommended settings (models.lock), unless any option below is given;
    then the given ones, the others at their plain defaults (greedy, top-k 40, top-p 0.95, ...)."""
    from sinkd.cli.chat import ChatLoop

    if window is None and policy in (PolicyName.SINK, PolicyName.SINK_NOSHIFT, PolicyName.WINDOW):
        window = CHAT_WINDOW  # a conversation's worth: one long reply evicts no earlier turn
    pol = _policy_dict(policy.value, sinks, window, evict, compact)
    pol["pin_system_prompt"] = pin_system
    given = {
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "min_p": min_p,
        "repeat_penalty": repeat_penalty,
        "seed": seed,
    }
    chosen = {k: v for k, v in given.items() if v is not None}
    sampling = {**PLAIN_SAMPLING, **chosen} if chosen else None
    backend = _backend(embedded, connect, token, model, CHAT_WINDOW + 4)
    try:
        handle, receipt = backend.create(
            pol,
            system_prompt=system,
            recall={"mode": recall.value} if recall else None,
            sampling=sampling,
        )
        loop = ChatLoop(backend, handle, max_tokens, sys.stdout, err)
        loop.status(receipt)
        loop.run(sys.stdin)
    finally:
        backend.shutdown()


@app.command()
@handle_errors
def narrate(
    embedded: Annotated[
        bool,
        typer.Option("--embedded", help="Run the model in this process, even if a daemon runs."),
    ] = False,
    connect: ConnectOpt = None,
    token: TokenOpt = None,
    model: ModelOpt = None,
    sinks: SinksOpt = None,
    window: WindowOpt = None,
    evict: EvictOpt = None,
    chunk_lines: Annotated[
        int, typer.Option("--chunk-lines", min=1, help="Append after this many lines...")
    ] = 16,
    chunk_seconds: Annotated[
        float, typer.Option("--chunk-seconds", help="...or after this long.")
    ] = 1.0,
    every_lines: Annotated[
        int, typer.Option("--every-lines", min=1, help="Narrate after this many appended lines...")
    ] = 200,
    every_seconds: Annotated[
        float, typer.Option("--every-seconds", help="...or this many seconds.")
    ] = 30.0,
    max_line_bytes: Annotated[
        int, typer.Option("--max-line-bytes", min=1, help="Longer lines are cut here.")
    ] = 512,
    queue_lines: Annotated[
        int, typer.Option("--queue-lines", min=1, help="Lines waiting at most.")
    ] = 1024,
    on_full: Annotated[
        OnFull,
        typer.Option("--on-full", help="drop-oldest (stay current) or block (lose nothing)."),
    ] = OnFull.DROP_OLDEST,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Longest narration.")] = 48,
    recall: Annotated[
        bool,
        typer.Option(
            "--recall/--no-recall",
            help="Before each narration, bring back evicted lines like the latest ones.",
        ),
    ] = True,
    as_json: JsonFlag = False,
) -> None:
    """Narrate an endless log from stdin (`tail -f app.log | sinkd narrate`): through the daemon
    when one answers, else in this process."""
    import datetime
    import threading

    from sinkd.cli.narrate import Counts, LineQueue, NarrateConfig, Narrator, read_lines
    from sinkd.evaluation.textstream import rss_bytes

    cfg = NarrateConfig(
        chunk_lines,
        chunk_seconds,
        every_lines,
        every_seconds,
        max_line_bytes,
        queue_lines,
        on_full.value,
        max_tokens,
        recall,
    )
    cfg.validate()
    counts = Counts()
    backend = _backend(embedded, connect, token, model, 512)

    def emit(text: str, snapshot: dict[str, Any]) -> None:
        ts = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        if as_json:
            print(
                json.dumps(
                    {
                        "event": "narration",
                        "ts": ts,
                        "text": text,
                        **snapshot,
                        "rss_bytes": rss_bytes(),
                    }
                ),
                flush=True,
            )
        else:
            out.print(f"[dim]{ts}[/dim] {text}", highlight=False)

    queue = LineQueue(cfg.queue_lines, cfg.on_full, counts)
    reader = threading.Thread(
        target=read_lines, args=(sys.stdin.buffer, queue, counts, cfg.max_line_bytes), daemon=True
    )
    interrupted = False
    try:
        # recall "manual": the narrator asks with the latest lines (see Narrator._recall)
        handle, _ = backend.create(
            _policy_dict("sink", sinks, window, evict, 0),
            recall={"mode": "manual" if recall else "off"},
        )
        reader.start()
        Narrator(backend, handle, cfg, counts, emit).run(queue)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        backend.shutdown()
    summary = {**counts.as_dict(), "interrupted": interrupted, "rss_bytes": rss_bytes()}
    if as_json:
        print(json.dumps({"event": "summary", **summary}), flush=True)
    else:
        err.print(
            f"narrate: {summary['lines_read']} lines read, {summary['lines_appended']} appended,"
            f" {summary['lines_dropped']} dropped, {summary['lines_truncated']} cut,"
            f" {summary['narrations']} narrations ({summary['recalls']} with recalled lines),"
            f" {summary['evicted_tokens']} tokens evicted"
            f" in {summary['evictions']} evictions",
            highlight=False,
        )


class _TokensPerSecond(ProgressColumn):
    def render(self, task: Any) -> Text:
        return Text(f"{task.speed or 0:7.1f} tok/s")


eval_app = typer.Typer(help="Measure quality over stream position.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")


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

    from sinkd.daemon.engine.models import load_lock
    from sinkd.evaluation import offline
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
    cfg = _policy(entry.default_sinks, entry.default_window, "sink", sinks, window, evict, compact)
    raw = sys.stdin.read() if text == "-" else Path(text).read_text(errors="replace")

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  _TokensPerSecond(), TimeRemainingColumn(),
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
    plot(
        results,
        str(out_dir / f"{name}.png"),
        f"{entry.name}, S={cfg.sinks} W={cfg.window} E={cfg.evict_chunk}, {Path(text).name}",
    )
    if as_json:
        print(json.dumps(results))
        return
    table = Table(title=f"perplexity over {len(ids)} tokens ({out_dir / name}.json, .png)")
    for col in ("policy", "scored", "ppl", "last bucket", "tok/s", "note"):
        table.add_column(col)
    for r in results["runs"]:
        table.add_row(r["policy"], str(r["scored_tokens"]), f"{r['ppl']:.2f}", f"{r['ppl_last_bucket']:.2f}",
                      f"{r['tokens_per_s']:.0f}", r["note"])  # fmt: skip
    out.print(table)


if __name__ == "__main__":  # pragma: no cover
    app()


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
        Path, typer.Option("--text", help="Filler text (public domain, e.g. bench/texts/kjv.txt).")
    ],
    model: ModelOpt = None,
    distances: Annotated[
        str, typer.Option("--distances", help="Tokens between the key and the question.")
    ] = "126,1000,4000",
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
    out_dir: Annotated[Path, typer.Option("--out", help="Where the JSON and PNG go.")] = Path(
        "bench/results/recall"
    ),
    as_json: JsonFlag = False,
) -> None:
    """Passkey retrieval by distance with and without recall (and the controls), multi-key, and
    facts asked many chat turns later; in this process, through the daemon's service."""
    import tempfile

    from sinkd.daemon.config import Settings
    from sinkd.daemon.runtime.service import SinkdService
    from sinkd.evaluation.recall import Plan, evaluate, plot, report_tables

    if not text.is_file():
        raise InvalidInput(f"no such file: {text}")
    plan = Plan(
        distances=_ints(distances, "--distances"),
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
    plot(data, out_dir / "eval-recall.png")
    if as_json:
        print(json.dumps(data, indent=1))
        return
    from rich.table import Table

    for title, columns, rows in report_tables(data):
        table = Table(title=title, title_justify="left")
        for c in columns:
            table.add_column(c, justify="right")
        for row in rows:
            table.add_row(*(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row))
        out.print(table)
    err.print(f"wrote {out_dir / 'eval-recall.json'} and .png")
