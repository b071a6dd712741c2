"""The bad-input table of docs/daemon.md ("Bad input"), each row sent to a live daemon.

For every row: the documented status and message, the daemon still serves, and a bystander
session is untouched (same receipt, bit-identical next-token logits).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from sinkd.daemon.node import Daemon
from sinkd.proto.v1 import sinkd_pb2 as pb
from tests.support.clients import Client
from tests.support.settings import settings
from tests.support.tokens import ALICE, BOB

pytestmark = pytest.mark.model
OK = grpc.StatusCode.OK
BUDGET = 64  # S=4 + W=60


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(settings(tmp_path_factory.mktemp("bad"), max_message_bytes=64 * 1024))
    d.start()
    d.wait_ready(60)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> Client:
    return Client(daemon.addresses[0])


@pytest.fixture(scope="module")
def bystander(client: Client, daemon: Daemon) -> tuple[pb.Handle, Any]:
    h = client.create(md=BOB).handle
    client.append(h, "A bystander's own words, which nobody else may disturb.", md=BOB)
    return h, daemon.service.registry.lookup("bob", h.session_id, h.generation)


@pytest.fixture(autouse=True)
def close_all_but_the_bystander(client: Client, bystander: tuple[pb.Handle, Any]) -> Iterator[None]:
    yield
    for md in (ALICE, BOB):
        for r in client.s.List(pb.ListSessionsRequest(), metadata=md).sessions:
            if r.session_id != bystander[0].session_id:
                h = pb.Handle(session_id=r.session_id, generation=r.generation)
                client.s.Close(pb.HandleRequest(handle=h), metadata=md)


def status(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str, Any]:
    try:
        result = call()
        if isinstance(result, Iterator):
            result = list(result)
        return OK, "", result
    except grpc.RpcError as e:
        return e.code(), e.details() or "", None


def fresh(client: Client, **policy: Any) -> pb.Handle:
    return client.create(**policy).handle


def tokens_request(h: pb.Handle, ids: list[int]) -> pb.AppendRequest:
    return pb.AppendRequest(handle=h, tokens=pb.TokenList(ids=ids))


def gen(client: Client, h: pb.Handle, **kw: Any) -> Callable[[], Any]:
    return lambda: client.s.Generate(pb.GenerateRequest(handle=h, **kw), metadata=ALICE)


def row_empty_append(c: Client) -> Any:
    h = fresh(c)
    code, _, r = status(lambda: c.append(h, ""))
    assert code == OK and r.appended == 0 and r.receipt.n_seen == 0
    return code


def row_one_token(c: Client) -> Any:
    h = fresh(c)
    code, _, r = status(lambda: c.s.Append(tokens_request(h, [42]), metadata=ALICE))
    assert code == OK and r.receipt.n_seen == 1 and r.receipt.retained == 1
    return code


def row_exactly_full(c: Client) -> Any:
    h = fresh(c)
    code, _, r = status(
        lambda: c.s.Append(tokens_request(h, list(range(100, 100 + BUDGET))), metadata=ALICE)
    )
    assert code == OK and r.receipt.retained == BUDGET and r.receipt.evictions == 0
    code, _, r = status(
        lambda: c.s.Append(tokens_request(h, [7]), metadata=ALICE)
    )  # the first overflow
    assert (
        code == OK and r.receipt.evictions == 1 and r.receipt.evicted_tokens == 16
    )  # E=16 by default
    assert r.receipt.retained == BUDGET - 16 + 1 and r.receipt.anchors_logical.end == 4
    return code


def row_larger_than_budget(c: Client) -> Any:
    h = fresh(c)
    code, _, r = status(
        lambda: c.s.Append(tokens_request(h, list(range(200, 200 + 5 * BUDGET))), metadata=ALICE)
    )
    assert code == OK and r.receipt.retained <= BUDGET
    assert r.receipt.retained + r.receipt.evicted_tokens == 5 * BUDGET
    return code


EXPECTED: list[tuple[str, Callable[[Client], Any], grpc.StatusCode, str]] = [
    ("empty append", row_empty_append, OK, ""),
    ("one token", row_one_token, OK, ""),
    ("append that exactly fills the budget, then the first overflow", row_exactly_full, OK, ""),
    ("append larger than the whole budget", row_larger_than_budget, OK, ""),
    (
        "message above the size limit",
        lambda c: c.append(fresh(c), "x" * 70_000),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "larger than max",
    ),
    (
        "token id above the vocabulary",
        lambda c: c.s.Append(tokens_request(fresh(c), [1, 49152]), metadata=ALICE),
        grpc.StatusCode.INVALID_ARGUMENT,
        "outside the vocabulary",
    ),
    (
        "negative token id",
        lambda c: c.s.Append(tokens_request(fresh(c), [-1]), metadata=ALICE),
        grpc.StatusCode.INVALID_ARGUMENT,
        "outside the vocabulary",
    ),
    (
        "zero window",
        lambda c: c.create(window=0),
        grpc.StatusCode.INVALID_ARGUMENT,
        "window: must be >= 1",
    ),
    (
        "S+W above the context",
        lambda c: c.create(sinks=4, window=253),
        grpc.StatusCode.INVALID_ARGUMENT,
        "exceeds the 256 cells",
    ),
    (
        "E above W",
        lambda c: c.create(window=8, evict_chunk=9),
        grpc.StatusCode.INVALID_ARGUMENT,
        "evict_chunk: must be in 1..window",
    ),
    (
        "unknown policy",
        lambda c: c.create(name="lru"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unknown policy 'lru'",
    ),
    (
        "unknown session",
        lambda c: c.inspect(pb.Handle(session_id="s_0000", generation="g")),
        grpc.StatusCode.NOT_FOUND,
        "no session",
    ),
    (
        "another tenant's session",
        lambda c: c.inspect(c.create(md=BOB).handle),
        grpc.StatusCode.NOT_FOUND,
        "no session",
    ),
    (
        "missing token",
        lambda c: c.create(md=[]),
        grpc.StatusCode.UNAUTHENTICATED,
        "missing bearer token",
    ),
    (
        "wrong token",
        lambda c: c.create(md=[("authorization", "Bearer guess")]),
        grpc.StatusCode.UNAUTHENTICATED,
        "unknown bearer token",
    ),
    (
        "temperature out of range",
        lambda c: c.s.Create(
            pb.CreateSessionRequest(
                policy=pb.Policy(name="sink", sinks=4, window=60),
                sampling=pb.Sampling(temperature=7),
            ),
            metadata=ALICE,
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "temperature",
    ),
    (
        "top_p out of range",
        lambda c: c.s.Create(
            pb.CreateSessionRequest(
                policy=pb.Policy(name="sink", sinks=4, window=60),
                sampling=pb.Sampling(temperature=1, top_p=1.5),
            ),
            metadata=ALICE,
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "top_p",
    ),
    (
        "max_tokens above the limit",
        lambda c: gen(c, fresh(c), max_tokens=5000)(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "max_tokens",
    ),
    (
        "generate on an empty session",
        lambda c: gen(c, fresh(c), max_tokens=3)(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "append text before generating",
    ),
    (
        "too many stop strings",
        lambda c: gen(c, fresh(c), max_tokens=3, stop=["x"] * 17)(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "stop",
    ),
    (
        "forget a passage id past SQLite's integers",
        lambda c: c.forget(fresh(c), passage_id=2**63),
        grpc.StatusCode.INVALID_ARGUMENT,
        "below 2**63",
    ),
    (
        "forget a range past SQLite's integers",
        lambda c: c.forget(fresh(c), logical=pb.Range(start=0, end=2**64 - 1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "below 2**63",
    ),
]


@pytest.mark.parametrize(
    ("name", "call", "code", "message"), EXPECTED, ids=[e[0] for e in EXPECTED]
)
def test_bad_input_row(
    client: Client,
    daemon: Daemon,
    bystander: tuple[pb.Handle, Any],
    name: str,
    call: Callable[[Client], Any],
    code: grpc.StatusCode,
    message: str,
) -> None:
    handle, session = bystander
    before = client.inspect(handle, md=BOB).receipt
    logits = session.last_logits.copy()
    got, details, _ = status(lambda: call(client))
    assert got == code, (name, got, details)
    assert message in details, (name, details)
    assert client.inspect(handle, md=BOB).receipt == before
    assert np.array_equal(session.last_logits, logits)


def test_stale_generation_closed_session_resets_forks(client: Client) -> None:
    h = fresh(client)
    client.append(h, "Some words to start.")
    r1 = client.s.Reset(pb.HandleRequest(handle=h), metadata=ALICE)
    r2 = client.s.Reset(pb.HandleRequest(handle=r1.handle), metadata=ALICE)  # repeated resets
    assert (
        r2.receipt.reset_count == 2
        and len({h.generation, r1.handle.generation, r2.handle.generation}) == 3
    )
    code, details, _ = status(lambda: client.append(r1.handle, "x"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "stale" in details
    client.append(r2.handle, "Fresh words after two resets.")
    child = client.s.Fork(pb.HandleRequest(handle=r2.handle), metadata=ALICE).handle
    grandchild = client.s.Fork(
        pb.HandleRequest(handle=child), metadata=ALICE
    ).handle  # a fork of a fork
    client.append(grandchild, " and the grandchild goes on alone")
    assert client.inspect(child).receipt.n_seen < client.inspect(grandchild).receipt.n_seen
    code, _, events = status(gen(client, child, max_tokens=4, stop=["<never matches>"]))
    assert code == OK and events[-1].done.reason == "max_tokens"  # a stop that never matches
    client.s.Close(pb.HandleRequest(handle=child), metadata=ALICE)
    code, details, _ = status(gen(client, child, max_tokens=2))  # generate on a closed session
    assert code == grpc.StatusCode.NOT_FOUND
    assert client.inspect(grandchild).receipt.n_seen > 0  # its own sequence, unharmed


def test_full_policy_at_capacity_is_refused_whole(client: Client) -> None:
    h = client.create(name="full", sinks=0, window=64).handle
    client.s.Append(tokens_request(h, list(range(300, 350))), metadata=ALICE)
    code, details, _ = status(
        lambda: client.s.Append(tokens_request(h, list(range(20))), metadata=ALICE)
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "cache full" in details
    assert client.inspect(h).receipt.n_seen == 50  # nothing of the refused append went in
    code, _, events = status(gen(client, h, max_tokens=40))
    assert (
        code == OK
        and events[-1].done.reason == "cache_full"
        and events[-1].done.receipt.retained == 64
    )


def test_invalid_utf8_on_the_wire(client: Client, daemon: Daemon) -> None:
    """A text field that is not UTF-8 cannot be parsed as the message: refused, nothing changes."""
    h = fresh(client)
    raw = (
        pb.AppendRequest(handle=h, text="AAAA")
        .SerializeToString()
        .replace(b"AAAA", b"\xff\xfe\xc3(")
    )
    append = client.channel.unary_unary(
        "/sinkd.v1.Sessions/Append",
        request_serializer=None,
        response_deserializer=pb.AppendResponse.FromString,
    )
    code, details, _ = status(lambda: append(raw, metadata=ALICE))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert client.inspect(h).receipt.n_seen == 0


def test_a_session_that_leaves_k_unset_defers_its_shift_until_the_gap_reaches_w(
    client: Client,
) -> None:
    """The daemon's default K (32 x E, at most W, since each shift re-rotates the whole context):
    here W=60, so three overflows of E=16 leave a gap behind the sinks and the fourth (gap 64)
    closes all of it in one shift; a session that asks for K=0 shifts at every eviction."""
    deferred, eager = fresh(client), fresh(client, compact_interval=0)
    seen = {}
    for name, h in (("deferred", deferred), ("eager", eager)):
        client.s.Append(tokens_request(h, list(range(100, 100 + BUDGET))), metadata=ALICE)
        rows = []
        for _ in range(4):  # 16 more tokens each: one eviction of E=16
            r = client.s.Append(tokens_request(h, list(range(300, 316))), metadata=ALICE).receipt
            rows.append((r.evictions, r.shifts, r.pending_gap, r.retained))
        seen[name] = rows
    assert seen["deferred"] == [(1, 0, 16, BUDGET), (2, 0, 32, BUDGET), (3, 0, 48, BUDGET),
                                (4, 1, 0, BUDGET)]  # fmt: skip
    assert seen["eager"] == [(i, i, 0, BUDGET) for i in (1, 2, 3, 4)]
