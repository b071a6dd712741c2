"""`sinkd receipt` and `sinkd stream`: one policy over one text, in this process (no daemon)."""

from __future__ import annotations

import codecs
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from sinkd.cachepolicy import PolicyName
from sinkd.cli.console import console
from sinkd.cli.exit_codes import handle_errors
from sinkd.cli.options import (
    CompactOpt,
    EvictOpt,
    JsonFlag,
    KvTypeOpt,
    ModelOpt,
    PolicyOpt,
    SinksOpt,
    ThreadsOpt,
    WindowOpt,
    offline_policy,
)
from sinkd.errors import InvalidInput

out = console()
err = console(stderr=True)


@handle_errors
def receipt(
    model: ModelOpt = None,
    sinks: SinksOpt = None,
    window: WindowOpt = None,
    kv_type: KvTypeOpt = "f16",
    as_json: JsonFlag = False,
) -> None:
    """Tensor-shape receipt: what one session's cache costs, by formula and as llama.cpp allocated it."""
    from sinkd.cli import offline
    from sinkd.daemon.models.registry import load_lock

    entry = load_lock().get(model)
    policy = offline_policy(entry.default_sinks, entry.default_window, "sink", sinks, window, 1, 0)
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


MAX_PENDING_CHARS = 65_536  # a "line" longer than this is streamed on without its end


def _read_texts(
    source: str, block_bytes: int = 4096, max_pending: int = MAX_PENDING_CHARS
) -> Iterator[str]:
    """Blocks of text from a file or stdin, split at line ends, invalid UTF-8 replaced. Input
    without a newline is held up to `max_pending` characters, then passed on: memory stays flat
    whatever comes down the pipe."""
    stream = sys.stdin.buffer if source == "-" else Path(source).open("rb")  # noqa: SIM115
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character never split
    try:
        pending = ""
        while True:
            data = stream.read(block_bytes)
            if not data:
                break
            pending += decoder.decode(data)
            cut = pending.rfind("\n") + 1
            if not cut and len(pending) >= max_pending:
                cut = len(pending)
            if cut:
                yield pending[:cut]
                pending = pending[cut:]
        pending += decoder.decode(b"", final=True)
        if pending:
            yield pending
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


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
    from sinkd.cli import offline
    from sinkd.daemon.models.registry import load_lock

    if chunk < 1:
        raise InvalidInput(f"--chunk: must be >= 1, got {chunk}")
    if source != "-" and not Path(source).is_file():
        raise InvalidInput(f"no such file: {source}")
    if model_file is None:
        entry = load_lock().get(model)
        name, default_sinks, default_window = entry.name, entry.default_sinks, entry.default_window
    else:
        name, default_sinks, default_window = model_file.name, 0, 256
    cfg = offline_policy(default_sinks, default_window, policy.value, sinks, window, evict, compact)
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
