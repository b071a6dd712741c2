"""Speculative decoding (drafts from a session's own text, runtime/loop/drafting.py; verified by the
executor): the tokens, reasons, journal rows and receipts of a token at a time, and drafts that own
nothing once rejected, whatever happens during a verification (a failure, a reset, a close, a
fork, a park, a cancel). On the fake engine for the logic (its toy model made repetitive, so that
drafts are taken and refused); the bits, on both pinned models, are tests/test_speculative_model.py."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sinkd.daemon import failpoints
from sinkd.daemon.runtime.api import (
    GenerationOptions,
    Handle,
    PolicyRequest,
    SamplingRequest,
    TokenEvent,
)
from sinkd.daemon.runtime.loop.drafting import (
    OCCURRENCES,
    PROBE_EVERY,
    PROBE_MAX,
    SUPPORT,
    DecodeCosts,
    DraftControl,
    Guess,
    guesses,
)
from sinkd.daemon.runtime.loop.stepplan import Candidate, plan_step
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal, Session
from sinkd.errors import Cancelled, SinkdError
from tests.support.services import (
    collected,
    draft_counts,
    drafts_at_the_prior,
    fake_engine_of,
    fake_service,
    replies_together,
)

pytestmark = pytest.mark.unit
WHO = Principal("alice")
GREEDY = SamplingRequest(temperature=0.0)
CASES = [  # (opening, options): every way a reply ends, past a full window (4 + 40 cells) or not
    ("Sea 171.", GenerationOptions(90, sampling=GREEDY)),
    ("Sea 263.", GenerationOptions(40, sampling=GREEDY)),  # max tokens
    ("Sea 114.", GenerationOptions(None, sampling=GREEDY)),  # the repetition guard
    ("Sea 185.", GenerationOptions(50, stops=["cdw"], sampling=GREEDY)),
    ("Sea 90.", GenerationOptions(60, sampling=SamplingRequest(temperature=0.8, seed=3))),
    (
        "Sea 91.",
        GenerationOptions(60, sampling=SamplingRequest(temperature=0.0, repeat_penalty=1.3)),
    ),
]


def repetitive(tmp: Path, speculative: str = "auto", **kw: Any) -> SinkdService:
    """A fake service whose toy model looks at the last two tokens alone: its text repeats. Its
    drafts are weighed at the prior's costs, not at what this machine's clock says a fake pass
    took, so that how much it drafts is the same on any machine."""
    service = fake_service(tmp, speculative=speculative, **kw)
    fake_engine_of(service).markov = 2
    drafts_at_the_prior(service)
    return service


def session_of(service: SinkdService, handle: Handle) -> Session:
    session = service.registry.get(handle.session_id)
    assert session is not None
    return session


def cells_hold_the_ledger(service: SinkdService, session: Session) -> None:
    """The session's cells hold its ledger's tokens, in order, and nothing else."""
    cells = fake_engine_of(service).cells.seqs[session.seq_id]
    assert [cells[p] for p in sorted(cells)] == session.retained.all()


def reply(service: SinkdService, opening: str, options: GenerationOptions) -> tuple[Any, ...]:
    """A session that evicts and shifts on the way (S=4, W=40, E=4, K=8): its generated ids, text,
    reason, journal rows and receipt."""
    policy = PolicyRequest(name="sink", sinks=4, window=40, evict_chunk=4, compact_interval=8)
    handle = service.create(WHO, policy).handle
    service.append(WHO, handle, opening, timeout=20)
    ids, text, done = collected(service.generate(WHO, handle, options, timeout=30))
    session = session_of(service, handle)
    cells_hold_the_ledger(service, session)
    r = done.receipt
    receipt = (r.n_seen, r.retained, r.evictions, r.evicted_tokens, r.shifts, r.recent_cache)
    rows = session.log_chunks
    service.close(WHO, handle)
    return ids, text, done.reason, rows, receipt


def lookup(context: list[int], k: int) -> list[int]:
    """The drafts of the longest suffix that occurred earlier ([] where none did)."""
    found = guesses(context, k)
    return found[0].drafts if found else []


def test_lookup_proposes_what_followed_the_longest_latest_match() -> None:
    assert lookup([1, 2, 3, 4, 9, 2, 3, 5, 7, 1, 2, 3], 3) == [4, 9, 2]  # 1 2 3: the longest
    assert lookup([2, 3, 5, 2, 3, 6, 0, 2, 3], 2) == [6, 0]  # the latest occurrence of 2 3
    assert lookup([5, 6, 7, 8, 6, 7], 5) == [8, 6, 7]  # no more than what follows it
    assert lookup([1, 2, 3, 4], 4) == [] and lookup([1, 2, 1, 2], 0) == []
    # ids whose bytes line up across two ids are no match (the search is over raw bytes)
    assert lookup([0x01000000, 0x00000002, 0x02000000, 0x00000000, 1, 2], 2) == []
    assert lookup([7, 7, 7], 2) == [7]  # 7 7 at 0..1, then only one token follows it


def test_a_guess_counts_how_many_earlier_occurrences_went_on_as_its_drafts_do() -> None:
    # three "lines" of one shape, parted by a number: 1 2 <n> 3 4 5 0
    lines = [t for n in (10, 11, 12) for t in (1, 2, n, 3, 4, 5, 0)]
    # after a line's fixed words, the next line runs on alike up to its number
    after_words = guesses([*lines, 1, 2, 13, 3, 4], 6)
    assert after_words == [Guess([5, 0, 1, 2, 13, 3], 2, 3, [3, 3, 3, 3, 1, 1])]
    assert [round(after_words[0].likely(j), 2) for j in range(6)] == [0.75] * 4 + [0.25] * 2
    # at a line's start: the longer suffixes were seen twice, the shortest three times
    at_start = guesses([*lines, 1, 2], 2)
    assert [(g.matched, g.occurrences, g.agreeing) for g in at_start] == [
        (6, 2, [1, 1]),
        (2, 3, [1, 1]),
    ]
    assert at_start[0].drafts == [12, 3]  # what followed the latest occurrence
    # (the suffixes of 5 to 3 tokens occurred where the one of 6 did: the same guess, given once)
    # only the latest OCCURRENCES are weighed
    many = guesses([7, 8, 9] * (OCCURRENCES + 4) + [7, 8], 1)
    assert all(g.occurrences == OCCURRENCES for g in many)
    assert guesses([1, 2, 3], 4) == [] and guesses([1, 2, 1, 2], 0) == []


def test_a_session_drafts_what_its_text_agrees_on_and_probes_when_nothing_pays() -> None:
    costs = DecodeCosts()  # the prior: each row past the first costs 0.45 of one
    sure = Guess(list(range(100, 108)), 4, 8, [8] * 8)
    line_start = Guess(list(range(100, 108)), 4, 8, [8, 8, 8, 2, 2, 2, 2, 2])
    seen_once = Guess(list(range(100, 108)), 8, 1, [1] * 8)
    control = DraftControl(max_drafts=8)
    assert control.choose(costs, [sure]) == sure.drafts[:2]  # a new session's: two at most
    control.observe(drafted=2, accepted=2)
    assert control.choose(costs, [sure]) == sure.drafts[:4]  # ... one more for each taken
    control.observe(drafted=4, accepted=4)
    assert control.choose(costs, [sure]) == sure.drafts  # agreed all along: the longest pays most
    assert control.choose(costs, [line_start]) == line_start.drafts[:3]  # up to where they part
    # of two guesses, the one that pays more: eight agreeing occurrences over one
    assert control.choose(costs, [seen_once, line_start]) == line_start.drafts[:3]
    assert DraftControl(max_drafts=2).choose(costs, [sure]) == sure.drafts[:2]
    # measured costs replace the prior: rows that cost as much as their tokens never pay, ...
    linear = DecodeCosts()
    for rows in range(1, 10):
        for _ in range(3):
            linear.observe(rows, 0.01 * rows)
    assert linear.ratio(4) == pytest.approx(4.0) and control.choose(linear, [sure]) == []
    for _ in range(PROBE_EVERY):
        control.skipped()
    # ... but a one-token probe after PROBE_EVERY tokens, where the occurrences all agree
    assert control.choose(linear, [seen_once]) == []
    assert control.choose(linear, [seen_once, sure]) == sure.drafts[:1] and control.probing
    # a length not measured yet costs what the measured ones say, not the prior: on a
    # compute-bound CPU a second row costs ~0.8 of the first, and a guess seen once pays not
    heavy = DecodeCosts()
    for rows, seconds in ((1, 0.010), (2, 0.018)):
        for _ in range(3):
            heavy.observe(rows, seconds)
    assert heavy.ratio(9) == pytest.approx(1 + 0.8 * 8) and costs.ratio(9) == pytest.approx(4.6)
    fresh = DraftControl(max_drafts=8)
    fresh.observe(drafted=6, accepted=6)  # (its drafts were taken: it may draft eight)
    assert fresh.choose(costs, [seen_once]) != [] and fresh.choose(heavy, [seen_once]) == []
    # beside other decoding sessions a draft's row weighs more against the step: a guess that
    # pays alone pays beside one other only where the text agrees on it, beside seven not at all
    assert costs.ratio(2, sequences=8) > costs.ratio(2) * 1.2
    assert fresh.choose(costs, [sure], sequences=2) == sure.drafts
    assert fresh.choose(costs, [seen_once], sequences=2) == []
    assert fresh.choose(costs, [sure], sequences=8) == []
    # where nothing could pay, the session does not even look
    assert DraftControl(max_drafts=8).worth_looking(costs, sequences=2)
    assert not DraftControl(max_drafts=8).worth_looking(costs, sequences=8)
    assert not DraftControl(max_drafts=8).worth_looking(linear)


def test_a_stream_whose_drafts_are_rejected_pays_for_a_few_then_for_rarer_probes() -> None:
    costs = DecodeCosts()  # a row past the first costs 0.45 of one
    control = DraftControl(max_drafts=8)
    sure = Guess(list(range(100, 108)), 4, 8, [8] * 8)  # the text agrees; the stream never does
    drafted_at, drafted = [], 0
    for token in range(4000):
        drafts = control.choose(costs, [sure]) if control.worth_looking(costs) else []
        if drafts:
            drafted_at.append(token)
            drafted += len(drafts)
            control.observe(drafted=len(drafts), accepted=0)
        else:
            control.skipped()
    early = [t for t in drafted_at if t < PROBE_EVERY]
    assert len(early) <= 2  # the trust gives way after one rejection
    probes = [t for t in drafted_at if t >= PROBE_EVERY]
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps and all(b > 1.8 * min(a, PROBE_MAX // 2) for a, b in itertools.pairwise(gaps))
    assert drafted <= 12  # 4,000 tokens: two drafts, then probes ever rarer


def test_a_taken_probe_trusts_the_text_again_and_a_sampled_stream_drafts_less() -> None:
    costs = DecodeCosts()
    sure = Guess(list(range(100, 108)), 4, 8, [8] * 8)
    control = DraftControl(max_drafts=8)
    for _ in range(5):
        if drafts := control.choose(costs, [sure]):
            control.observe(drafted=len(drafts), accepted=0)
    assert control.trust_of(SUPPORT.index(4)) < 0.6 and control.choose(costs, [sure]) == []
    for _ in range(PROBE_EVERY):
        control.skipped()
    assert control.choose(costs, [sure]) == [100] and control.probing
    control.observe(drafted=1, accepted=1)  # the text is followed again: the drafts come back
    assert control.trust == 1.0 and control.choose(costs, [sure]) == sure.drafts[:3]
    # a stream that takes half of what its text predicts drafts shorter than one that takes all
    line_start = Guess(list(range(100, 108)), 4, 8, [8, 8, 8, 7, 7, 7, 7, 7])
    halved = DraftControl(max_drafts=8)
    control.observe(drafted=8, accepted=8)
    for _ in range(30):
        if drafts := halved.choose(costs, [line_start]):
            halved.observe(drafted=len(drafts), accepted=len(drafts) // 2)
    assert 0.3 < halved.trust_of(SUPPORT.index(4)) < 0.7
    assert len(halved.choose(costs, [line_start])) < len(control.choose(costs, [line_start]))
    assert lookup([1, 2, 3, 9, 1, 2, 3], 1) == [9] and lookup([1, 2, 3], 1) == []


def test_a_stream_that_rejects_what_its_text_said_once_still_drafts_what_it_repeats() -> None:
    """A narration takes its facts' recurring words and rejects a sentence seen once: the two are
    trusted apart, so the rejections cost the once-seen guesses their drafts and not the others."""
    costs = DecodeCosts()
    repeated = Guess(list(range(100, 108)), 3, 8, [8, 8, 8, 8, 8, 8, 8, 8])
    said_once = Guess(list(range(200, 208)), 8, 1, [1] * 8)
    control = DraftControl(max_drafts=8)
    control.observe(*[len(control.choose(costs, [repeated]))] * 2)  # taken: it may draft more
    for _ in range(6):  # the once-seen guesses, drafted and rejected
        if drafts := control.choose(costs, [said_once]):
            control.observe(drafted=len(drafts), accepted=0)
    assert control.trust_of(SUPPORT.index(1)) < 0.5
    assert control.choose(costs, [said_once]) == []
    assert control.trust_of(SUPPORT.index(4)) == 1.0
    assert control.choose(costs, [said_once, repeated]) == repeated.drafts[:4]


def test_a_lone_sessions_passes_are_counted_by_rows_for_the_metrics_endpoint(
    tmp_path: Path,
) -> None:
    """A draft's cost against a plain token, in one run (bench/speculative.py reads it): every
    pass of one sequence alone, by the rows it carried, with its seconds."""
    service = fake_service(tmp_path, speculative="auto")
    fake_engine_of(service).markov = 2
    policy = PolicyRequest(name="sink", sinks=4, window=40, evict_chunk=4)
    handle = service.create(WHO, policy).handle
    service.append(WHO, handle, "Sea 171.", timeout=20)
    collected(service.generate(WHO, handle, GenerationOptions(60, sampling=GREEDY), timeout=30))
    sample = service.metrics.registry.get_sample_value
    verified = service.metrics.count("verifications")
    by_rows = {
        rows: sample("sinkd_solo_passes_total", {"rows": str(rows)}) or 0 for rows in range(1, 10)
    }
    assert verified > 0 and sum(n for rows, n in by_rows.items() if rows > 1) == verified
    assert by_rows[1] > 0 and (sample("sinkd_solo_pass_seconds_total", {"rows": "1"}) or 0) > 0
    # the one-row passes right after another shape (a verification's, the prompt's) apart
    rebuilt = sample("sinkd_solo_rebuilt_passes_total") or 0
    assert 0 < rebuilt <= by_rows[1] and (sample("sinkd_solo_rebuilt_pass_seconds_total") or 0) > 0
    service.close(WHO, handle)


def test_a_pass_after_a_shift_is_not_what_a_plain_token_costs(tmp_path: Path) -> None:
    """llama.cpp turns the keys again (RoPE) in the pass after a shift: a cost of the eviction's,
    so that pass is left out of the one-row passes drafts are weighed against."""
    service = fake_service(tmp_path, speculative="off")
    policy = PolicyRequest(name="sink", sinks=4, window=24, evict_chunk=4, compact_interval=8)
    handle = service.create(WHO, policy).handle
    service.append(WHO, handle, "Sea 171.", timeout=20)
    ids, _, done = collected(
        service.generate(WHO, handle, GenerationOptions(60, sampling=GREEDY), timeout=30)
    )
    shifts = done.receipt.shifts
    plain = service.metrics.registry.get_sample_value("sinkd_solo_passes_total", {"rows": "1"})
    assert shifts >= 4  # 60 tokens through 28 cells, compacted every 8 evicted
    assert len(ids) - shifts - 2 <= (plain or 0) <= len(ids) - shifts
    service.close(WHO, handle)


def test_a_verification_is_charged_the_graph_the_next_pass_builds_again() -> None:
    costs = DecodeCosts()
    for _ in range(5):
        costs.observe(1, 0.010, after=1)  # a token after a token: llama.cpp's graph reused
        costs.observe(3, 0.022, after=1)
    assert costs.switch() == 0.0 and costs.ratio(3) == pytest.approx(2.2)
    for _ in range(5):
        costs.observe(1, 0.0115, after=3)  # a token after a verification: the graph built again
    assert costs.rebuilt() == (5, pytest.approx(0.0575)) and costs.totals()[1][0] == 10
    assert costs.switch() == pytest.approx(0.15)
    assert costs.ratio(3) == pytest.approx(2.2 + 0.15)  # what a verification costs in all
    assert costs.ratio(2) == pytest.approx(1.0 + 0.6 + 0.15)  # measured slope, then the switch
    # a plain one-row pass is measured by the ones after a one-row pass alone
    assert costs.ratio(1) == 1.0 and costs.per_row() == pytest.approx(0.6)


def test_drafts_take_only_the_room_prefill_leaves_and_share_one_length() -> None:
    decoding = [Candidate(0, True, 0, drafts=6), Candidate(1, True, 0, drafts=3)]
    prefill = Candidate(3, False, 50)
    slots = plan_step([*decoding, prefill], 64, 50, 0).slots
    assert {s.key: s.n_tokens for s in slots} == {0: 1 + 3, 1: 1 + 3, 3: 50}  # one length: 3
    slots = plan_step([*decoding, prefill], 56, 50, 0).slots
    assert {s.key: s.n_tokens for s in slots} == {0: 3, 1: 3, 3: 50}  # 4 left: 2 each
    slots = plan_step([*decoding, prefill], 52, 50, 0).slots
    assert {s.key: s.n_tokens for s in slots} == {0: 1, 1: 1, 3: 50}  # none left: none
    # beside a decoder with none, drafts would take a second pass: none
    slots = plan_step([*decoding, Candidate(2, True, 0), prefill], 64, 50, 0).slots
    assert {s.key: s.n_tokens for s in slots} == {0: 1, 1: 1, 2: 1, 3: 50}


@pytest.fixture
def spoken_and_plain(tmp_path: Path) -> Iterator[Callable[[str], SinkdService]]:
    made: list[SinkdService] = []

    def make(speculative: str) -> SinkdService:
        service = repetitive(tmp_path / speculative, speculative, durable=True)
        made.append(service)
        return service

    yield make
    for service in made:
        service.stop()


def test_speculation_gives_the_tokens_reasons_journal_rows_and_receipts_of_one_at_a_time(
    spoken_and_plain: Callable[[str], SinkdService],
) -> None:
    got = {}
    steps = {}
    for mode in ("off", "auto"):
        service = spoken_and_plain(mode)
        got[mode] = [reply(service, opening, options) for opening, options in CASES]
        steps[mode] = service.metrics.count("steps")
        if mode == "auto":
            accepted, rejected = draft_counts(service)
            assert accepted > 10 and rejected > 0  # both ways out of a verification were taken
        else:
            assert draft_counts(service) == (0, 0)
    assert got["auto"] == got["off"]
    reasons = [r[2] for r in got["off"]]
    assert {"max_tokens", "repetition", "stop"} <= set(reasons)
    assert all(r[4][2] > 0 and r[4][4] > 0 for r in got["off"][:2])  # evicted and shifted
    assert steps["auto"] < steps["off"]


def three_together(service: SinkdService) -> list[list[int]]:
    """Two greedy replies and a sampled one, their jobs in the same steps."""
    policy = PolicyRequest(name="sink", sinks=4, window=40, evict_chunk=4)
    options = [
        GenerationOptions(90, sampling=GREEDY),
        GenerationOptions(25, sampling=GREEDY),
        GenerationOptions(30, sampling=SamplingRequest(temperature=0.8, seed=5)),
    ]
    openings = ["Sea 114.", "Sea 185.", "Sea 90."]
    handles, got = replies_together(service, WHO, policy, openings, options)
    for handle in handles:
        cells_hold_the_ledger(service, session_of(service, handle))
    return got


def test_sessions_in_one_step_verify_together_each_as_alone(tmp_path: Path) -> None:
    """Three replies whose jobs share steps, two greedy and one sampled: each as one at a time
    gives it, with fewer steps."""
    got = {}
    for mode in ("off", "auto"):
        service = repetitive(tmp_path / mode, mode)
        try:
            got[mode] = three_together(service), service.metrics.count("steps")
            if mode == "auto":
                assert draft_counts(service)[0] > 0, draft_counts(service)
        finally:
            service.stop()
    assert got["auto"][0] == got["off"][0] and [len(i) for i in got["off"][0]] == [90, 25, 30]
    assert got["auto"][1] < got["off"][1]


def during_first_verification(action: Callable[[], None]) -> Any:
    """Arm `verify-draft` to run `action` once, in the engine thread, mid-verification (the
    pending token decoded, its drafts' cells in)."""
    fired = threading.Event()

    def once() -> None:
        if not fired.is_set():
            fired.set()
            action()

    return failpoints.armed("verify-draft", once), fired


def enqueue_and_wait(service: SinkdService, call: Callable[[], Any]) -> Callable[[], None]:
    """An action that starts `call` on another thread and returns once its work waits in the
    engine's inbox (so that it runs right after the step); errors are collected and re-raised."""
    errors: list[BaseException] = []
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(call())
        except BaseException as e:  # collected, re-raised by the test
            errors.append(e)

    def action() -> None:
        before = service.scheduler._inbox.qsize()
        thread = threading.Thread(target=run)
        thread.start()
        while service.scheduler._inbox.qsize() <= before and thread.is_alive():
            thread.join(0.005)
        action.thread = thread  # type: ignore[attr-defined]

    action.errors = errors  # type: ignore[attr-defined]
    action.results = results  # type: ignore[attr-defined]
    return action


def started_session(service: SinkdService, opening: str = "Sea 171.") -> Handle:
    policy = PolicyRequest(name="sink", sinks=4, window=60, evict_chunk=4)
    handle = service.create(WHO, policy).handle
    service.append(WHO, handle, opening, timeout=20)
    return handle


def generated(service: SinkdService, handle: Handle, n: int = 40) -> list[int]:
    events = service.generate(WHO, handle, GenerationOptions(n, sampling=GREEDY), timeout=30)
    return [e.id for e in events if isinstance(e, TokenEvent)]


def generated_until(service: SinkdService, handle: Handle, n: int = 40) -> tuple[list[int], Any]:
    """The tokens streamed, and the error that ended the stream (None: it finished)."""
    ids: list[int] = []
    try:
        for e in service.generate(WHO, handle, GenerationOptions(n, sampling=GREEDY), timeout=30):
            if isinstance(e, TokenEvent):
                ids.append(e.id)
    except SinkdError as error:
        return ids, error
    return ids, None


@pytest.mark.parametrize("call", ["reset", "close", "fork", "park"])
def test_a_call_made_during_a_verification_finds_no_draft(tmp_path: Path, call: str) -> None:
    """A reset, close, fork or park asked for while a verification is under way runs right after
    its step: the sessions it leaves hold their ledgers' tokens alone, and each goes on as a
    session that never drafted (a reset one as a new session)."""
    service = repetitive(tmp_path, max_sessions=1 if call == "park" else 2, max_parked_sessions=4)
    try:
        handle = started_session(service)
        calls = {
            "reset": lambda: service.reset(WHO, handle),
            "close": lambda: service.close(WHO, handle),
            "fork": lambda: service.fork(WHO, handle),
            "park": lambda: started_session(service, "Sea 5."),  # room made by parking it
        }
        action = enqueue_and_wait(service, calls[call])
        armed, fired = during_first_verification(action)
        with armed:
            first, error = generated_until(service, handle)
        assert fired.is_set() and first
        assert isinstance(error, Cancelled) if call in ("reset", "close") else error is None
        action.thread.join(30)  # type: ignore[attr-defined]
        if action.errors:  # type: ignore[attr-defined]
            raise action.errors[0]  # type: ignore[attr-defined]
        session = session_of(service, handle) if call != "close" else None
        if call == "close":
            assert service.registry.get(handle.session_id) is None
            engine = fake_engine_of(service)
            assert all(not cells for cells in engine.cells.seqs.values())
            return
        assert session is not None
        if call == "park":
            assert session.parked  # it made room for the new one once its reply ended
        else:
            cells_hold_the_ledger(service, session)
        if call == "fork":
            child = session_of(service, action.results[0].handle)  # type: ignore[attr-defined]
            cells_hold_the_ledger(service, child)
            forked_at = len(child.retained)  # after the step: the parent went on generating
            assert child.retained.all() == session.retained.all()[:forked_at]
        current = Handle(handle.session_id, session.generation)
        then = generated(service, current)
        cells_hold_the_ledger(service, session)
    finally:
        service.stop()
    # the same script where nothing drafts
    plain = repetitive(tmp_path / "plain", "off", max_sessions=2)
    try:
        handle = started_session(plain)
        if call == "reset":
            assert first == generated(plain, handle)[: len(first)]  # as far as it went
            handle = Handle(handle.session_id, plain.reset(WHO, handle)[0].generation)
            assert then == generated(plain, handle)  # a new session's reply, nothing carried
        else:
            assert first + then == generated(plain, handle, 80)
    finally:
        plain.stop()


def test_a_cancel_or_a_failure_during_a_verification_leaves_no_draft(tmp_path: Path) -> None:
    """A client that cancels mid-verification gets what was sampled so far and no more; a bug
    inside a verification fails the request, not the session; either way the cells hold the
    ledger alone and the session goes on."""
    service = repetitive(tmp_path, durable=True)
    try:
        handle = started_session(service)
        session = session_of(service, handle)
        stream = service.generate(WHO, handle, GenerationOptions(60, sampling=GREEDY), timeout=30)

        # a cancel: the job's flag is set mid-verification; the next step drops it
        def cancel() -> None:
            for job in service.scheduler.queues._queues.get(handle.session_id, []):
                job.cancel()

        armed, fired = during_first_verification(cancel)
        got: list[int] = []
        with armed, pytest.raises(Cancelled):
            for event in stream:
                if isinstance(event, TokenEvent):
                    got.append(event.id)
        assert fired.is_set() and 0 < len(got) < 60
        cells_hold_the_ledger(service, session)

        generated(service, handle)  # the session still serves
        cells_hold_the_ledger(service, session)

        def bug() -> None:
            raise RuntimeError("a bug inside a verification")

        # a session of its own (the first one's drafts were rejected: it drafts little now)
        other = started_session(service)
        armed, fired = during_first_verification(bug)
        with armed, pytest.raises(SinkdError, match="internal error"):
            generated(service, other)
        session = session_of(service, other)
        assert fired.is_set() and session.state.value != "failed"
        cells_hold_the_ledger(service, session)
        generated(service, other)  # the session still serves
        cells_hold_the_ledger(service, session)
    finally:
        service.stop()
