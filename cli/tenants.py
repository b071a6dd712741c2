"""`sinkd tenants`: a tenant's backup and restore, for the admin: everything it owns on a daemon
(its sessions, its memory across conversations, its prefix states) in one archive, loaded whole
into a daemon that holds nothing of it (another deployment, a node restored after a disk loss).
The same archive a node move carries (docs/deployment.md, "Tenant moves")."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from sinkd.cli.console import console, shown, terminal_safe
from sinkd.cli.exit_codes import handle_errors
from sinkd.cli.options import ConnectOpt, JsonFlag, TokenOpt, connect
from sinkd.daemon.rpc.client import Client
from sinkd.daemon.store.archive import write_private
from sinkd.errors import InvalidInput

app = typer.Typer(help="A tenant's backup and restore (the admin's).", no_args_is_help=True)
out = console(stderr=True)  # stdout may carry the archive


def _admin_client(address: str | None, token: str | None) -> Client:
    backend = connect(address, token)
    if not isinstance(backend, Client):
        raise InvalidInput("a tenant's archive comes from a running daemon (--connect)")
    return backend


@app.command()
@handle_errors
def export(
    tenant: Annotated[str, typer.Argument(help="The tenant, as the daemon's settings name it.")],
    out_path: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="The archive to write (mode 0600; default: stdout)."),
    ] = None,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Write everything the tenant owns on the daemon as one archive (its content: keep it as
    private as the state directory). Its sessions must be between turns."""
    client = _admin_client(address, token)
    pieces = client.export_tenant(tenant)
    if out_path is None:
        if sys.stdout.isatty():
            raise InvalidInput("the archive is binary: give --out FILE, or redirect stdout")
        data = b"".join(pieces)
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        size, digest = len(data), hashlib.sha256(data).hexdigest()
    else:
        size = write_private(out_path, pieces)
        digest = hashlib.sha256(out_path.read_bytes()).hexdigest()
    said = {"tenant": tenant, "bytes": size, "sha256": digest}
    out.print(
        shown(json.dumps(said) if as_json else f"{tenant}: {size} bytes, sha256 {digest[:16]}")
    )


@app.command("import")
@handle_errors
def import_(
    path: Annotated[Path, typer.Argument(help="An archive from `sinkd tenants export`.")],
    address: ConnectOpt = None,
    token: TokenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Load a tenant's archive whole, in one transaction, into a daemon that holds nothing of the
    tenant; refused with the reason (another model, kernel or backend, damage, a tenant already
    there), and then nothing of it kept. Its sessions keep their ids and handles."""
    if not path.is_file():
        raise InvalidInput(f"no such file: {path}")
    got = _admin_client(address, token).import_tenant(path.read_bytes())
    if as_json:
        print(json.dumps({"tenant": got.tenant, "sessions": got.sessions,
                          "passages": got.passages, "prefixes": got.prefixes}))  # fmt: skip
    else:
        print(terminal_safe(f"{got.tenant}: {got.sessions} sessions, {got.passages} passages,"
                            f" {got.prefixes} prefix states imported"))  # fmt: skip
