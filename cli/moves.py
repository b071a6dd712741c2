"""Tenants moved whole between a deployment's nodes, driven from the admin's side over gRPC: the
order of one move, and the resolver that finishes or makes again a move a kill -9 cut short.

One move (daemon/runtime/tenant_moves.py has what each step leaves if a node dies in it): the
source marks the tenant leaving, exports it, the destination imports it (one transaction, which
records the move as arrived and clears the tenant's mark there), the source releases it (deletes
everything of it, purged). The destination is marked arriving before the ring sends it the
tenant, by the caller (nodes.py), so that no node answers a tenant whose state is elsewhere.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sinkd.daemon.rpc.client import Client
from sinkd.daemon.runtime.api import TenantHeld
from sinkd.errors import FailedPrecondition, SinkdError, message_of

BETWEEN_TURNS_S = 60.0  # how long an export waits for a session in the middle of a turn


@dataclass(frozen=True)
class Moved:
    tenant: str
    source: str
    target: str
    sessions: int
    passages: int
    prefixes: int
    seconds: float
    archive_bytes: int
    what: str = "moved"  # moved | released (a cut-short move finished) | cleared (a mark)
    error: str = ""  # not moved: why (it stays where it was, whole)


Clients = Callable[[str], Client]


def holds(t: TenantHeld) -> bool:
    return bool(t.sessions or t.passages or t.prefixes)


def move_tenant(clients: Clients, tenant: str, source: str, target: str) -> Moved:
    """One tenant from `source` to `target`, whole; a refusal leaves it where it was (marked
    leaving there until the resolver makes the move again, or clears the mark)."""
    start = time.monotonic()
    move_id = uuid.uuid4().hex
    src, dst = clients(source), clients(target)
    try:
        src.mark_tenant(tenant, "leaving", move_id, target)
        data = _export(src, tenant, move_id)
        got = dst.import_tenant(data)
        src.release_tenant(tenant, move_id)
    except SinkdError as e:
        return Moved(tenant, source, target, 0, 0, 0, time.monotonic() - start, 0,
                     error=f"{type(e).__name__}: {message_of(e)}")  # fmt: skip
    return Moved(tenant, source, target, got.sessions, got.passages, got.prefixes,
                 time.monotonic() - start, len(data))  # fmt: skip


def _export(src: Client, tenant: str, move_id: str) -> bytes:
    """The archive, once every session of the tenant is between turns (its calls are refused
    from the mark on: the turns under way end)."""
    deadline = time.monotonic() + BETWEEN_TURNS_S
    while True:
        try:
            return b"".join(src.export_tenant(tenant, move_id))
        except FailedPrecondition as e:
            if "between turns" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def resolve(clients: Clients, nodes: list[str], target_of: Callable[[str], str]) -> list[Moved]:
    """Bring every tenant the `nodes` hold whole to the node `target_of` names.

    1. What a cut-short move left: a tenant marked leaving whose destination says the move
       arrived is released (the destination holds it whole); one whose move did not arrive is
       served where it is again. A destination that does not answer leaves the mark as it is
       (the tenant waits, never served twice).
    2. Each tenant held away from its node is moved there; held on several nodes (its node was
       down a while and another served it), each part is moved there and merged with the others.
    3. Marks left on nodes that hold nothing are cleared, but for the node a tenant still has to
       reach (arriving) while it is held elsewhere."""
    done: list[Moved] = []

    def said(tenant: str, source: str, target: str, what: str, error: str = "") -> None:
        done.append(Moved(tenant, source, target, 0, 0, 0, 0.0, 0, what, error))

    waiting: set[str] = set()
    for node in nodes:
        for t in clients(node).held_tenants()[0]:
            if t.state != "leaving":
                continue
            try:
                arrived = clients(t.peer).held_tenants(t.move_id)[1] == t.tenant
            except (SinkdError, KeyError) as e:  # not a node of ours, or down: wait for it
                said(t.tenant, node, t.peer, "waiting", f"its destination {t.peer!r}: {e}")
                waiting.add(t.tenant)
                continue
            if arrived:
                clients(node).release_tenant(t.tenant, t.move_id)
                said(t.tenant, node, t.peer, "released")
            else:
                clients(node).mark_tenant(t.tenant, "")
                said(t.tenant, node, node, "cleared")
    for tenant, at in sorted(_holders(clients, nodes).items()):
        target = target_of(tenant)
        if tenant in waiting or at == [target]:
            continue
        if target not in nodes:
            said(tenant, ",".join(at), target, "waiting", f"its node {target!r} is not up")
            continue
        if target not in at:  # none of its calls answered there until it is whole there
            clients(target).mark_tenant(tenant, "arriving", "", at[0])
        for source in at:
            if source != target:
                done.append(move_tenant(clients, tenant, source, target))
    held = _holders(clients, nodes)
    for node in nodes:
        for t in clients(node).held_tenants()[0]:
            if not t.state or t.state == "leaving" or holds(t):
                continue
            elsewhere = [n for n in held.get(t.tenant, []) if n != node]
            if not elsewhere or target_of(t.tenant) != node:
                clients(node).mark_tenant(t.tenant, "")
                said(t.tenant, node, node, "cleared")
    return done


def _holders(clients: Clients, nodes: list[str]) -> dict[str, list[str]]:
    """Each tenant's nodes that hold something of it and are not giving it away."""
    at: dict[str, list[str]] = {}
    for node in nodes:
        for t in clients(node).held_tenants()[0]:
            if holds(t) and t.state != "leaving":
                at.setdefault(t.tenant, []).append(node)
    return at
