"""Pure pieces of the runtime, without llama.cpp: the step plan, the session state machine, the
error hierarchy's edges, and the call limits."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sinkd import errors
from sinkd.cachepolicy import CacheFull, ConfigError, PolicyConfig
from sinkd.daemon.callers.limits import CallLimits
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.loop.placement import runs, swaps_for_one_run
from sinkd.daemon.runtime.loop.stepplan import Candidate, plan_step
from sinkd.daemon.runtime.loop.syncer import Syncer
from sinkd.daemon.runtime.sessions import (
    TRANSITIONS,
    ModelIdentity,
    Session,
    SessionState,
)
from sinkd.errors import (
    IllegalTransition,
    ModelMismatch,
    ResourceExhausted,
    SinkdError,
    StaleGeneration,
    Unsupported,
)

pytestmark = pytest.mark.unit
S = SessionState


# --- the step plan ---


def test_decoders_first_then_prefill_chunks_round_robin() -> None:
    cands = [Candidate(0, True, 0), Candidate(1, False, 200), Candidate(2, False, 10)]
    plan = plan_step(cands, step_tokens=80, prefill_chunk=64, rr=0)
    assert [(s.key, s.n_tokens, s.decoding) for s in plan.slots] == [
        (0, 1, True),
        (1, 64, False),
        (2, 10, False),
    ]
    nxt = plan_step(cands, step_tokens=80, prefill_chunk=64, rr=plan.next_rr)
    assert [s.key for s in nxt.slots] == [0, 2, 1]  # the other prefill goes first now


def test_a_chunk_that_does_not_fit_waits_whole() -> None:
    plan = plan_step([Candidate(0, False, 100)], step_tokens=50, prefill_chunk=64, rr=0)
    assert [(s.key, s.n_tokens) for s in plan.slots] == [(0, 50)]  # chunk capped at the step
    plan = plan_step(
        [Candidate(0, True, 0), Candidate(1, False, 64)], step_tokens=64, prefill_chunk=64, rr=0
    )
    assert [s.key for s in plan.slots] == [0]  # 63 left: the 64-token chunk waits, never split


def test_many_decoders_never_starve_a_prefill() -> None:
    """step_tokens decoders would fill every step: every other step they give up a chunk's worth,
    rotating; over any two steps the prefill and every decoder make progress."""
    for step, chunk in ((8, 2), (8, 8)):
        cands = [Candidate(i, True, 0) for i in range(8)] + [Candidate(8, False, 100)]
        for rr in range(4):
            got: dict[int, int] = {}
            for plan in (
                plan_step(cands, step, chunk, rr),
                plan_step(cands, step, chunk, rr + 1),
            ):
                assert sum(s.n_tokens for s in plan.slots) <= step
                for s in plan.slots:
                    got[s.key] = got.get(s.key, 0) + 1
            assert got.get(8, 0) >= 1  # the prefill
            assert all(got.get(i, 0) >= 1 for i in range(8))  # every decoder


@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 300)), max_size=12),
    st.integers(1, 256),
    st.integers(1, 128),
    st.integers(0, 1000),
)
def test_a_plan_never_exceeds_the_step_or_repeats_a_session(
    heads: list[tuple[bool, int]], step: int, chunk: int, rr: int
) -> None:
    cands = [Candidate(i, d, 0 if d else r) for i, (d, r) in enumerate(heads)]
    plan = plan_step(cands, step, chunk, rr)
    keys = [s.key for s in plan.slots]
    assert len(keys) == len(set(keys))
    assert sum(s.n_tokens for s in plan.slots) <= step
    for s in plan.slots:
        c = cands[s.key]
        assert s.decoding == c.decoding and s.n_tokens == (
            1 if c.decoding else min(c.remaining, chunk, step)
        )
    if any(c.decoding for c in cands) or any(c.remaining for c in cands):
        assert plan.slots  # work waiting: the step is never empty


# --- the session state machine ---


def session() -> Session:
    identity = ModelIdentity("m", "0" * 64, "1" * 64, "2" * 64)
    policy = PolicyConfig.named("sink", sinks=4, window=60)
    from sinkd.cachepolicy import CacheSequence

    return Session(
        id="s_1", tenant="t", seq_id=0, policy=policy, seq=CacheSequence(policy),
        sampling=None, sampler=None, model=identity, system_tokens=[],
        system_prompt_sha256="", pinned=0,
    )  # fmt: skip


def test_the_documented_lifecycle_is_allowed() -> None:
    s = session()
    for to in (
        S.PREFILLING,
        S.IDLE,
        S.GENERATING,
        S.IDLE,
        S.PREFILLING,
        S.GENERATING,
        S.FAILED,
        S.IDLE,
        S.CLOSED,
    ):
        s.transition(to)
    assert s.state is S.CLOSED


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        ((S.IDLE, S.CLOSED), S.IDLE),  # nothing after close
        ((S.STALE,), S.IDLE),  # a stale session is closed, never revived
        ((S.IDLE, S.FAILED), S.GENERATING),  # a failed session must be reset first
        ((S.IDLE, S.FAILED), S.STALE),  # resumed or restored from parking, not a failed one
    ],
)
def test_edges_outside_the_table_are_refused(path: tuple[S, ...], bad: S) -> None:
    s = session()
    for to in path:
        s.transition(to)
    with pytest.raises(IllegalTransition, match=f"{s.state.value} -> {bad.value}"):
        s.transition(bad)


def test_every_state_but_closed_can_close() -> None:
    assert all(S.CLOSED in TRANSITIONS[st_] for st_ in S if st_ is not S.CLOSED)
    assert TRANSITIONS[S.CLOSED] == frozenset()


# --- errors at the edges ---


def every_error_class() -> list[type[SinkdError]]:
    return [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, SinkdError)]


def test_every_error_names_a_grpc_status_and_an_exit_code() -> None:
    import grpc

    for cls in every_error_class():
        assert grpc.StatusCode[cls.status]  # a real status name
        assert isinstance(cls.exit_code, int) and 1 < cls.exit_code < 128


@pytest.mark.parametrize(
    "error",
    [
        Unsupported("model x has no chat template"),
        StaleGeneration("this handle is stale"),
        ResourceExhausted("session limit reached"),
        ModelMismatch("m", "sha256", "a", "b"),
        ConfigError("window", "must be >= 1"),
        CacheFull(10, 5, 12),
    ],
)
def test_a_remote_error_comes_back_as_its_class(error: SinkdError) -> None:
    """What the servicer sends (status, message, class name) rebuilds the same class, hence the
    same exit code as an embedded run."""
    back = errors.by_name(type(error).__name__, error.status, str(error))
    assert type(back) is type(error) and back.exit_code == error.exit_code
    assert str(back) == str(error)


def test_an_unnamed_refusal_keeps_its_status() -> None:
    back = errors.by_name("NoSuchClass", "RESOURCE_EXHAUSTED", "received metadata too large")
    assert isinstance(back, errors.Refused) and back.exit_code == 8


def test_messages_quote_a_bounded_prefix() -> None:
    assert len(errors.echo("x" * 1_000_000)) < 100
    assert len(errors.message_of(SinkdError("y" * 100_000))) <= 1030


# --- call limits ---


def test_call_limits_refuse_past_each_bound_and_release() -> None:
    limits = CallLimits(total=3, per_tenant=2, per_session=1)
    with limits.admit("a", "s1"), limits.admit("a", "s2"):
        with (
            pytest.raises(ResourceExhausted, match="max_calls_per_tenant"),
            limits.admit("a", "s3"),
        ):
            pass
        with (
            limits.admit("b", "s3"),
            pytest.raises(ResourceExhausted, match="busy"),
            limits.admit("c"),
        ):
            pass
    with limits.admit("a", "s1"):
        with (
            pytest.raises(ResourceExhausted, match="max_calls_per_session"),
            limits.admit("a", "s1"),
        ):
            pass
        with limits.admit("b", "s1"):  # another tenant naming a's busy session: no "busy" oracle
            pass
    assert limits.in_flight() == 0
    with limits.admit("a", "s1"):
        assert limits.in_flight() == 1


def test_call_limits_hold_under_contention() -> None:
    limits = CallLimits(total=4, per_tenant=4, per_session=4)
    peak, admitted, lock = [0], [0], threading.Lock()
    barrier = threading.Barrier(16)

    def call() -> None:
        barrier.wait()
        try:
            with limits.admit("t", "s"), lock:
                admitted[0] += 1
                peak[0] = max(peak[0], limits.in_flight())
        except ResourceExhausted:
            pass

    threads = [threading.Thread(target=call) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert admitted[0] >= 1 and peak[0] <= 4 and limits.in_flight() == 0


def test_runs_counts_llama_cpps_ubatches_of_a_decode_step() -> None:
    assert runs([]) == 0
    assert runs([3]) == 1
    assert runs([7, 6, 5, 4]) == 1  # the engine orders a batch by id
    assert runs([0, 2, 4]) == 3
    assert runs([0, 1, 5, 6, 9]) == 3


@given(
    st.integers(1, 16).flatmap(
        lambda n: st.tuples(
            st.just(n), st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)
        )
    )
)
def test_placement_makes_one_run_with_the_fewest_exchanges(case: tuple[int, list[int]]) -> None:
    n_seq, ids = case
    swaps = swaps_for_one_run(ids, n_seq)
    placed = list(ids)
    for a, b in swaps:
        assert a in placed and b not in placed  # an active id goes where no active one is
        placed[placed.index(a)] = b
    assert runs(placed) == 1
    # no window of len(ids) ids holds more of them than the one chosen
    k, held = len(ids), set(ids)
    most = max(sum(q in held for q in range(s, s + k)) for s in range(n_seq - k + 1))
    assert len(swaps) == k - most


def test_placement_refuses_ids_it_cannot_place() -> None:
    with pytest.raises(ValueError):
        swaps_for_one_run([1, 1], 4)
    with pytest.raises(ValueError):
        swaps_for_one_run([4], 4)


# --- the journal's syncer ---


def test_an_fsync_interval_lets_the_commits_meanwhile_share_one_fsync() -> None:
    """A commit soon after an fsync waits out the interval, what is committed meanwhile rides on
    the same fsync, and no reply goes out before the fsync that covers it; a commit after the
    interval does not wait. Driven by a fake clock and a sleep that blocks on an event."""
    now = [100.0]
    sent: list[str] = []
    sent_at_sync: list[list[str]] = []
    asked: list[float] = []
    sleeping, wake = threading.Event(), threading.Event()
    delivered = {name: threading.Event() for name in "abcd"}

    def sleep(seconds: float) -> None:
        asked.append(seconds)
        sleeping.set()
        assert wake.wait(30), "the test never woke the syncer"

    def reply(name: str) -> list[tuple[Any, Callable[[], None]]]:
        def send() -> None:
            sent.append(name)
            delivered[name].set()

        return [(None, send)]

    syncer = Syncer(lambda: sent_at_sync.append(list(sent)), Metrics(), 0.02, lambda: now[0], sleep)
    try:
        syncer.submit(reply("a"))
        assert delivered["a"].wait(30)
        now[0] = 100.005  # 5 ms after the first fsync began: 15 ms to wait
        syncer.submit(reply("b"))
        assert sleeping.wait(30)
        assert asked == [pytest.approx(0.015)]
        syncer.submit(reply("c"))
        assert sent == ["a"]  # b waits for its fsync
        wake.set()
        assert delivered["c"].wait(30)
        assert sent_at_sync == [[], ["a"]]  # one fsync for b and c
        assert sent == ["a", "b", "c"]
        now[0] = 200.0  # long after: no wait
        syncer.submit(reply("d"))
        assert delivered["d"].wait(30)
        assert len(asked) == 1 and len(sent_at_sync) == 3
        assert syncer.error is None
    finally:
        wake.set()
        syncer.close()


def test_a_chat_turns_recall_searches_the_end_of_the_message_within_the_query_bound() -> None:
    """Chat's whole message was the query, unbounded: a pasted document costs a search per word."""
    from sinkd.daemon.runtime.recall.layer import MAX_QUERY_BYTES, chat_query, check_query

    pasted = "é" + "lorem ipsum dolor " * 100_000 + "What was the vault code?"
    query = chat_query(pasted)
    assert len(query.encode()) <= MAX_QUERY_BYTES and query.endswith("What was the vault code?")
    check_query(query)  # what an explicit Recall may ask, no more
    assert chat_query("short question") == "short question"
    assert chat_query("é" * 3000).startswith("é")  # never half a character


def test_a_flooding_tenant_leaves_another_served_within_one_call() -> None:
    """Tenant a holds every slot of the pool and floods for more; tenant b, below its fair share,
    waits (bounded) instead of being refused; while it waits, a is refused even the slot that
    frees, which b takes as soon as one of a's calls ends."""
    import threading

    limits = CallLimits(total=4, per_tenant=8, per_session=4, fair_wait_s=30)
    held = [limits.admit("a") for _ in range(4)]
    for h in held:
        h.__enter__()
    outcome: list[str] = []
    admitted = threading.Event()

    def b_calls() -> None:
        try:
            with limits.admit("b"):
                outcome.append("answered")
                admitted.set()
        except ResourceExhausted as e:
            outcome.append(f"refused: {e}")
            admitted.set()

    b = threading.Thread(target=b_calls)
    b.start()
    assert limits.await_waiting(1, 30)  # b waits for a slot
    # a flood's next call: past its share (4 of 4, a share of 2) while b waits
    with pytest.raises(ResourceExhausted, match="fair share 2"), limits.admit("a"):
        pass
    held.pop().__exit__(None, None, None)  # one of a's calls ends
    assert admitted.wait(30) and outcome == ["answered"]
    b.join(30)
    for h in held:
        h.__exit__(None, None, None)
    assert limits.in_flight() == 0 and limits.waiting() == 0


def test_without_a_fair_wait_a_full_pool_refuses_at_once() -> None:
    limits = CallLimits(total=1, per_tenant=1, per_session=1)
    with limits.admit("a"), pytest.raises(ResourceExhausted, match="busy"), limits.admit("b"):
        pass


def test_a_fair_wait_ends_by_the_calls_deadline() -> None:
    """A tenant below its share waits for a slot at most `fair_wait_s` (30 here), and never past
    what its call's deadline leaves: it is told the deadline passed, and its worker is free."""
    from sinkd.errors import DeadlineExceeded

    limits = CallLimits(total=1, per_tenant=1, per_session=1, fair_wait_s=30)
    with limits.admit("a"):
        with (
            pytest.raises(DeadlineExceeded, match="deadline passed while it waited"),
            limits.admit("b", time_left=0.2),
        ):
            pass
        assert limits.waiting() == 0 and limits.in_flight() == 1
