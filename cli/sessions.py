"""`sinkd sessions list | inspect | trace | memory | forget | reset | close`: a tenant's sessions on
a running daemon.

Sessions are named by id; the CLI looks up the owner's current generation for it (`--generation`
pins one instead, and a stale one is refused like any stale handle).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from sinkd.cli.console import OWED, console, shown
from sinkd.cli.exit_codes import handle_errors
from sinkd.cli.options import ConnectOpt, JsonFlag, TokenOpt, connect
from sinkd.daemon.rpc.client import Client
from sinkd.daemon.runtime.api import Erased, Handle, Receipt, TenantUsage, to_json
from sinkd.daemon.store.archive import write_private
from sinkd.errors import InvalidInput, PermissionDenied

app = typer.Typer(
    help="List, inspect, trace, search the memory of, reset and close your sessions on a running"
    " daemon.",
    no_args_is_help=True,
)
out = console()

IdArg = Annotated[str, typer.Argument(help="Session id (from `sinkd sessions list`).")]
GenOpt = Annotated[
    str | None, typer.Option("--generation", help="Pin this generation instead of the current one.")
]


def owed_note(erased: Erased) -> None:
    if erased.purge_owed:
        console(stderr=True).print(f"note: {OWED}", style="yellow")


def _handle(backend: Client, session_id: str, generation: str | None) -> Handle:
    return Handle(session_id, generation) if generation else backend.resolve(session_id)


def _span(r: tuple[int, int] | None) -> str:
    return f"[{r[0]}, {r[1]})" if r is not None and r[1] > r[0] else "none"


def receipt_table(r: Receipt, title: str = "receipt") -> Table:
    p = r.policy
    table = Table(title=title, show_header=False)
    rows = [
        ("session", r.session_id),
        ("generation", f"{r.generation[:16]} (resets: {r.reset_count})"),
        ("state", r.state),
        (
            "policy",
            f"{p.policy.value} S={p.sinks} W={p.window} E={p.evict_chunk}"
            f" K={p.compact_interval} ingest={p.ingest_chunk}",
        ),
        ("tokens seen", str(r.n_seen)),
        ("retained cells", f"{r.retained} ({r.kv_payload_bytes:,} bytes of KV)"),
        ("anchors", f"logical {_span(r.anchors_logical)}  cache {_span(r.anchors_cache)}"),
        ("recent", f"logical {_span(r.recent_logical)}  cache {_span(r.recent_cache)}"),
        (
            "evicted",
            f"{r.evicted_tokens} tokens in {r.evictions} evictions ({r.shifts} shifts, gap {r.pending_gap})",
        ),
        (
            "system prompt",
            f"{r.system_prompt_tokens} tokens, {r.system_prompt_tokens_pinned} pinned as sinks",
        ),
        ("model", f"{r.model} ({r.model_sha256[:12]})"),
        ("recall", _recall_cell(r)),
        (
            "memory",
            f"{r.memory_passages} passages, {r.memory_tokens} tokens, {r.memory_bytes:,} bytes",
        ),
    ]
    for span in r.recalled:
        rows.append(
            (
                "recalled (in cache)",
                f"#{span.passage_id}: first seen {_span(span.source)}, now at"
                f" {_span(span.stream)}, score {span.score:.2f}, at"
                f" {time.strftime('%H:%M:%S', time.localtime(span.at))}",
            )
        )
    for key, value in rows:
        table.add_row(key, value)
    return table


@app.command("list")
@handle_errors
def list_sessions(
    address: ConnectOpt = None, token: TokenOpt = None, as_json: JsonFlag = False
) -> None:
    """Your sessions: positions and counts, no text."""
    backend = connect(address, token)
    rows = backend.list()
    if as_json:
        print(json.dumps(to_json(rows), indent=2))
        return
    table = Table(title=f"sessions at {backend.address}")
    columns = ("id", "state", "cells", "policy", "seen", "kept", "snapshot", "journal", "resume")
    for col in columns:
        table.add_column(col, no_wrap=col == "id")
    notes = []
    for r in rows:
        p = r.policy
        table.add_row(
            r.session_id, r.state, _residency_cell(r), f"{p.policy.value} {p.sinks}+{p.window}",
            str(r.n_seen), str(r.retained), _snapshot_cell(r),
            f"{r.journal_tokens} tok", _resume_label(r),
        )  # fmt: skip
        if r.state == "stale":
            notes.append(f"{r.session_id} is stale: {r.stale_reason}")
        elif r.resume != "new":
            notes.append(f"{r.session_id} resumed: {r.resume}")
    out.print(table)
    for note in notes:
        out.print(note, markup=False, highlight=False)
    try:
        usage = backend.tenants()
    except PermissionDenied:  # a tenant's token: its own sessions above, nobody's shares
        return
    out.print(_tenants_table(usage, backend.address))


@app.command("tenants")
@handle_errors
def list_tenants(
    address: ConnectOpt = None, token: TokenOpt = None, as_json: JsonFlag = False
) -> None:
    """Each tenant's open sessions, stored bytes and responses beside its limits as they stand
    now (the admin's token): counts and bytes, no text."""
    backend = connect(address, token)
    usage = backend.tenants()
    if as_json:
        print(json.dumps(to_json(usage), indent=2))
        return
    out.print(_tenants_table(usage, backend.address))


def _tenants_table(usage: list[TenantUsage], address: str) -> Table:
    """Use against limit: a tenant's limit now is its cap, or the pool less the other tenants'
    unused reserves (docs/daemon.md, "Shares")."""
    table = Table(title=f"tenants at {address}")
    for col in ("tenant", "sessions", "parked", "stored", "memory", "prefixes", "responses"):
        table.add_column(col, no_wrap=col == "tenant")
    for t in usage:
        stored = _mib(t.stored_bytes) if t.stored_bytes else "0"
        if t.max_stored_bytes:
            stored += f" / {_mib(t.max_stored_bytes)}"
        table.add_row(
            shown(t.tenant), f"{t.sessions} / {t.max_sessions} (reserved {t.reserved_sessions})",
            str(t.parked), stored, _mib(t.memory_bytes), _mib(t.prefix_bytes),
            f"{t.responses} / {t.max_responses}",
        )  # fmt: skip
    return table


@app.command("prefixes")
@handle_errors
def list_prefixes(
    address: ConnectOpt = None, token: TokenOpt = None, as_json: JsonFlag = False
) -> None:
    """Stored prefix states (a system prompt's cells, kept so that new sessions beginning with it
    do not read it again): keyed hashes and sizes, never text. Yours and the shared ones; the
    admin's token lists every tenant's."""
    backend = connect(address, token)
    rows = backend.list_prefixes()
    if as_json:
        print(json.dumps(to_json(rows), indent=2))
        return
    table = Table(title=f"prefix states at {backend.address}")
    for col in ("key", "tenant", "tokens", "RAM", "disk", "hits", "idle"):
        table.add_column(col, no_wrap=col == "key")
    for p in rows:
        table.add_row(
            p.key[:16], p.tenant, str(p.tokens), _mib(p.ram_bytes), _mib(p.disk_bytes),
            str(p.hits), f"{p.idle_s:.0f} s",
        )  # fmt: skip
    out.print(table)
    held = sum(p.ram_bytes for p in rows), sum(p.disk_bytes for p in rows)
    out.print(f"{len(rows)} held: {_mib(held[0])} in RAM, {_mib(held[1])} on disk", highlight=False)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n else "-"


def _residency_cell(r: Receipt) -> str:
    """Resident (in the context's cells) or parked (on disk, restored by its next call)."""
    if r.residency == "none":
        return "-"
    return r.residency + (f", restored {r.restores}x" if r.restores else "")


def _resume_label(r: Receipt) -> str:
    if r.state == "stale":
        return "stale"
    return "new" if r.resume == "new" else "resumed"


def _snapshot_cell(r: Receipt) -> str:
    if r.snapshot_n_seen < 0:
        return "none"
    age = max(0.0, time.time() - r.snapshot_unix_time)
    return f"@{r.snapshot_n_seen}, {age:.0f}s ago"


@app.command("inspect")
@handle_errors
def inspect(
    session_id: IdArg,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    generation: GenOpt = None,
    text: Annotated[
        bool, typer.Option("--text", help="Also print the retained text (owner only).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """The receipt: anchors and recent range, logical and cache positions, bytes, evictions."""
    backend = connect(address, token)
    seen = backend.inspect(_handle(backend, session_id, generation), include_text=text)
    if as_json:
        body = {"receipt": to_json(seen.receipt)}
        print(
            json.dumps(
                {**body, **({"retained_text": seen.retained_text} if text else {})}, indent=2
            )
        )
        return
    out.print(receipt_table(seen.receipt))
    if text:
        out.rule("retained text (what the model still sees)")
        out.print(shown(seen.retained_text), highlight=False)


@app.command("trace")
@handle_errors
def trace(
    session_id: IdArg,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    generation: GenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """The eviction trace: what left the cache, when, and how the window moved."""
    backend = connect(address, token)
    events = backend.trace(_handle(backend, session_id, generation))
    if as_json:
        print(json.dumps(to_json(events), indent=2))
        return
    table = Table(title=f"eviction trace of {session_id} (newest {len(events)})")
    for col in ("at token", "evicted logical", "evicted cache", "shift"):
        table.add_column(col, justify="right")
    for e in events:
        if e.kind == "recall":
            table.add_row(
                str(e.at_token),
                f"recalled #{e.passage_id} from {_span(e.recalled_source)}",
                f"into logical {_span(e.recalled_logical)}",
                "",
            )
            continue
        if e.kind == "rewind":
            table.add_row(str(e.at_token), f"rewound {_span(e.evicted_logical)}",
                          _span(e.evicted_cache), "")  # fmt: skip
            continue
        shift = f"{e.shift_delta} on {_span(e.shifted_cache)}" if e.shifted_cache else "deferred"
        table.add_row(str(e.at_token), _span(e.evicted_logical), _span(e.evicted_cache), shift)
    out.print(table)


@app.command("reset")
@handle_errors
def reset(
    session_id: IdArg,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    generation: GenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Start a new generation: every cell freed, old handles refused from now on."""
    backend = connect(address, token)
    receipt, erased = backend.reset(_handle(backend, session_id, generation))
    if as_json:
        ids = {"session_id": receipt.session_id, "generation": receipt.generation}
        print(json.dumps({**ids, "receipt": to_json(receipt), "purge_owed": erased.purge_owed}))
    else:
        out.print(
            f"{session_id}: reset; new generation {receipt.generation[:16]}, {receipt.retained} cells held"
        )
        owed_note(erased)


@app.command("close")
@handle_errors
def close(
    session_id: IdArg,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    generation: GenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Close the session and free its sequence."""
    backend = connect(address, token)
    erased = backend.close(_handle(backend, session_id, generation))
    if as_json:
        print(json.dumps({"closed": session_id, "purge_owed": erased.purge_owed}))
    else:
        print(f"{session_id}: closed")
        owed_note(erased)


@app.command()
@handle_errors
def release(
    session_id: IdArg,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    generation: GenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """The session now lives on another node (imported there): close it on this one, which
    answers UNAVAILABLE for it from now on rather than NOT_FOUND (docs/deployment.md)."""
    backend = connect(address, token)
    backend.release(_handle(backend, session_id, generation))
    print(json.dumps({"released": session_id}) if as_json else f"{session_id}: released")


@app.command("export")
@handle_errors
def export(
    session_id: IdArg,
    out_path: Annotated[
        Path,
        typer.Option("--out", "-o", help="The archive to write (mode 0600; never over a file)."),
    ],
    address: ConnectOpt = None,
    token: TokenOpt = None,
    generation: GenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Write the session as an archive another node can import: its cells, journal, memory and
    record. It holds the session's content (text and token ids): keep it as private as the
    state directory."""
    backend = connect(address, token)
    size = write_private(out_path, backend.export_session(_handle(backend, session_id, generation)))
    digest = hashlib.sha256(out_path.read_bytes()).hexdigest()
    if as_json:
        print(json.dumps({"session_id": session_id, "archive": str(out_path), "bytes": size,
                          "sha256": digest}))  # fmt: skip
    else:
        out.print(f"{session_id}: exported to {out_path} ({size} bytes, sha256 {digest[:16]})")


@app.command("import")
@handle_errors
def import_(
    path: Annotated[Path, typer.Argument(help="An archive from `sinkd sessions export`.")],
    address: ConnectOpt = None,
    token: TokenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Load an archive as a session of this daemon, with the same id and generation (its handle
    stays valid), under the gates of a resume: refused with the reason, and nothing kept, on any
    mismatch of model, tokenizer, template, kernel or cells, or any damage."""
    if not path.is_file():
        raise InvalidInput(f"no such file: {path}")
    backend = connect(address, token)
    receipt = backend.import_session(path.read_bytes())
    if as_json:
        ids = {"session_id": receipt.session_id, "generation": receipt.generation}
        print(json.dumps({**ids, "receipt": to_json(receipt)}))
    else:
        out.print(
            f"{receipt.session_id}: imported at token {receipt.n_seen}, {receipt.retained} cells held"
        )


def _recall_cell(r: Receipt) -> str:
    c = r.recall
    if not c.mode.stores:
        return "off (evicted text is not kept)"
    return (
        f"{c.mode.value}: up to {c.budget} tokens, {c.passages} passage(s), score >="
        f" {c.threshold:g}"
    )


def parse_target(target: str) -> tuple[int | None, tuple[int, int] | None]:
    """`12` is passage 12; `100:200` (or `100-200`) is every passage overlapping logical
    positions [100, 200)."""
    text = target.strip()
    for sep in (":", "-"):
        if sep in text:
            a, _, b = text.partition(sep)
            try:
                start, end = int(a), int(b)
            except ValueError:
                break
            if not 0 <= start < end:
                raise typer.BadParameter(f"a range needs 0 <= start < end, got {target!r}")
            return None, (start, end)
    try:
        pid = int(text)
    except ValueError:
        raise typer.BadParameter(
            f"expected a passage id (12) or a logical range (100:200), got {target[:64]!r}"
        ) from None
    if pid < 1:
        raise typer.BadParameter(f"passage ids start at 1, got {pid}")
    return pid, None


SpeakerOpt = Annotated[
    str | None,
    typer.Option(
        "--speaker",
        help="Only what one speaker said: user, assistant, system, tool, text, unknown.",
    ),
]


@app.command("memory")
@handle_errors
def memory(
    session_id: IdArg,
    search: Annotated[
        str, typer.Option("--search", help="Show the passages that best match this text.")
    ] = "",
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 20,
    speaker: SpeakerOpt = None,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    generation: GenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """The session's memory: text the stream evicted, kept as passages, each with who said it
    (owner only)."""
    backend = connect(address, token)
    passages = backend.memory(_handle(backend, session_id, generation), search, limit, speaker)
    if as_json:
        print(json.dumps(to_json(passages), indent=2))
        return
    title = f"memory of {session_id}" + (" (best matches first)" if search else " (newest last)")
    table = Table(title=title)
    for col in ("passage", "logical", "speaker", "turn", "tokens", "score", "text"):
        table.add_column(col, no_wrap=col != "text")
    for p in passages:
        score = "" if p.score is None else f"{p.score:.2f}"
        table.add_row(
            str(p.passage_id), _span(p.logical), p.speaker, str(p.turn), str(p.n_tokens), score,
            shown(p.text.replace("\n", " ")[:200]),
        )  # fmt: skip
    out.print(table)
    if not passages:
        out.print("nothing stored" + (" matches" if search else " yet"))


@app.command("forget")
@handle_errors
def forget(
    session_id: IdArg,
    target: Annotated[
        str | None, typer.Argument(help="A passage id (12) or a logical range (100:200).")
    ] = None,
    speaker: SpeakerOpt = None,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    generation: GenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Delete passages from the session's memory, on disk (a range deletes every passage that
    overlaps it, whole; --speaker every passage that speaker said). What the cache holds now is
    not touched."""
    if (target is None) == (speaker is None):
        raise typer.BadParameter("name a passage id, a logical range or --speaker, one of them")
    passage_id, logical = parse_target(target) if target is not None else (None, None)
    backend = connect(address, token)
    erased = backend.forget(_handle(backend, session_id, generation), passage_id, logical, speaker)
    if as_json:
        print(json.dumps({"forgotten": erased.count, "purge_owed": erased.purge_owed}))
    else:
        print(f"{session_id}: {erased.count} passage(s) deleted")
        owed_note(erased)
