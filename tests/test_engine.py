"""Engine claims, proven on the real models through llama.cpp (small budgets, a few seconds each)."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest

from sinkd.cachepolicy import CacheFull, CacheSequence, ConfigError, PolicyConfig
from sinkd.daemon import failpoints
from sinkd.daemon.engine.decoding import BatchItem
from sinkd.daemon.engine.llama import Engine, EngineConfig
from sinkd.daemon.engine.row_probe import sgemm_float_rows
from sinkd.daemon.validation import validated
from sinkd.errors import EngineError, InvalidInput, Unsupported
from tests.support.texts import TEXT

pytestmark = pytest.mark.model

MakeEngine = Callable[..., Engine]


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(p || q) of the next-token distributions, in nats."""
    lp = _log_softmax(p_logits)
    lq = _log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum())


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max()
    return x - np.log(np.exp(x).sum())


def seq(policy: str, **kw: int) -> CacheSequence:
    return CacheSequence(PolicyConfig.named(policy, **kw))


def test_a_sink_equals_full_before_the_first_eviction(make_engine: MakeEngine) -> None:
    engine = make_engine(n_ctx_seq=128, n_seq_max=3, n_batch=64)
    tokens = engine.vocab.tokenize(TEXT)[:60]
    full, sink = seq("full", sinks=0, window=128), seq("sink", sinks=4, window=60)
    engine.feed(2, seq("full", sinks=0, window=128), tokens[::-1])  # another sequence in the cache
    a = engine.feed(0, full, tokens[:40])
    b = engine.feed(1, sink, tokens[:40])
    assert a is not None and b is not None and np.array_equal(a, b)
    for t in tokens[40:]:
        a, b = engine.feed(0, full, [t]), engine.feed(1, sink, [t])
        assert a is not None and b is not None
        assert np.array_equal(a, b), "sink must be the full cache until the budget overflows"
    assert sink.receipt().evictions == 0 and sink.retained == 60


@pytest.mark.parametrize("model", [None, "gemma3-270m"])
def test_b_window_shift_matches_noshift_within_the_translation_floor(
    make_engine: MakeEngine, model: str | None
) -> None:
    """Relative positions are identical with and without the shift, so in exact arithmetic the
    next-token distributions are equal. llama.cpp re-rotates f16 keys, and its CPU kernels quantize
    activations to 8 bits, so even a pure translation of every position (no eviction, no shift) moves
    the logits: measured here, the median KL is about 0.005-0.01 nats for SmolLM2 and 0.01-0.02 for
    Gemma 3. The tolerance is that floor, measured in the same run: the shifted cache may deviate
    from the unshifted one at most twice as much as a pure translation does, by the median (in
    both arms a few tokens near a tie carry most of the mean: Gemma's mean moved 2x between two
    sets of CPU kernels, from a translation outlier of 0.62 to shift outliers of 0.3-0.58), and
    agree on the top token about as often. A change of what the cache holds (sinks kept) lies
    over an order of magnitude above it."""
    engine = make_engine(model, n_ctx_seq=256, n_seq_max=5, n_batch=64)
    tokens = engine.vocab.tokenize(TEXT, add_bos=True)[:230]
    runs = {
        "shift": (seq("window", window=64), 0),
        "shift_k16": (seq("window", window=64, compact_interval=16), 0),
        "noshift": (seq("sink-noshift", sinks=0, window=64), 0),
        "translated": (seq("sink-noshift", sinks=0, window=64), 37),
        "other_content": (seq("sink-noshift", sinks=4, window=60), 0),
    }
    for seq_id, (cseq, offset) in enumerate(runs.values()):
        engine.feed(seq_id, cseq, tokens[:64], pos_offset=offset)
    kls: dict[str, list[float]] = {name: [] for name in runs}
    top1: dict[str, int] = dict.fromkeys(runs, 0)
    for t in tokens[64:]:
        out = {
            name: engine.feed(i, cseq, [t], pos_offset=off)
            for i, (name, (cseq, off)) in enumerate(runs.items())
        }
        for name, logits in out.items():
            kls[name].append(kl(logits, out["noshift"]))  # type: ignore[arg-type]
            top1[name] += int(logits.argmax() == out["noshift"].argmax())  # type: ignore[union-attr]
    n = len(tokens) - 64
    floor = float(np.median(kls["translated"]))
    assert runs["shift"][0].receipt().evictions == n and runs["shift"][0].receipt().shifts == n
    assert runs["shift_k16"][0].receipt().shifts == n // 16
    assert 0 < floor < 0.1, f"translation floor {floor} out of the expected range"
    for name in ("shift", "shift_k16"):
        assert np.median(kls[name]) <= 2 * floor, (name, np.median(kls[name]), floor)
        assert top1[name] >= top1["translated"] - 0.05 * n, (name, top1)
    assert np.median(kls["other_content"]) > 10 * 2 * floor  # the metric sees real differences


@pytest.mark.parametrize(
    ("policy", "kw"),
    [
        ("sink", {"sinks": 4, "window": 28, "evict_chunk": 1}),
        ("sink", {"sinks": 4, "window": 28, "evict_chunk": 8}),
        ("sink", {"sinks": 4, "window": 28, "evict_chunk": 4, "compact_interval": 12}),
        ("sink-noshift", {"sinks": 4, "window": 28, "evict_chunk": 4}),
    ],
)
def test_c_llama_positions_agree_with_the_policy(
    make_engine: MakeEngine, policy: str, kw: dict[str, int]
) -> None:
    engine = make_engine(n_ctx_seq=64, n_seq_max=1, n_batch=16)
    tokens = engine.vocab.tokenize(TEXT)[:150]
    cseq = seq(policy, **kw)
    compactions_seen = 0
    for i in range(0, len(tokens), 7):
        engine.feed(0, cseq, tokens[i : i + 7])
        cache = cseq.cache_positions()
        assert engine.cells.pos_range(0) == (min(cache), max(cache))
        if cseq.receipt().pending_gap == 0 and policy == "sink" and cseq.receipt().shifts:
            compactions_seen += 1
            assert engine.cells.pos_range(0) == (0, cseq.retained - 1)
    assert cseq.receipt().evictions > 0
    if policy == "sink":
        assert compactions_seen > 0


@pytest.mark.parametrize("evict_chunk", [1, 5])
def test_d_large_append_matches_token_at_a_time_within_budget(
    make_engine: MakeEngine, evict_chunk: int
) -> None:
    # the stream llama.cpp gives each sequence is exactly S+W cells (it pads to multiples of 256):
    # had the sequence ever needed one cell more, llama_decode would have failed
    budget = 256
    engine = make_engine(n_ctx_seq=budget, n_seq_max=2, n_batch=64)
    assert engine.n_ctx_seq == budget
    tokens = engine.vocab.tokenize(TEXT + " " + TEXT)[:400]
    chunked = seq("sink", sinks=4, window=budget - 4, evict_chunk=evict_chunk)
    single = seq("sink", sinks=4, window=budget - 4, evict_chunk=evict_chunk)
    a = engine.feed(0, chunked, tokens)  # 400 tokens, past the budget, in one append
    for t in tokens:
        b = engine.feed(1, single, [t])
    assert chunked.logical_positions() == single.logical_positions()
    assert chunked.logical_positions()[:4] == [0, 1, 2, 3]
    assert engine.cells.pos_range(0) == engine.cells.pos_range(1)
    assert chunked.retained <= budget
    assert a is not None and b is not None
    assert a.argmax() == b.argmax() and kl(a, b) < 0.05  # same evictions, different batching


def test_d_full_policy_refuses_overflow_before_touching_llama(make_engine: MakeEngine) -> None:
    engine = make_engine(n_ctx_seq=32, n_seq_max=1, n_batch=32)
    tokens = engine.vocab.tokenize(TEXT)[:40]
    full = seq("full", sinks=0, window=32)
    before = engine.feed(0, full, tokens[:30])
    with pytest.raises(CacheFull):
        engine.feed(0, full, tokens[30:40])
    assert engine.cells.pos_range(0) == (0, 29) and full.retained == 30
    again = engine.feed(0, full, tokens[30:31])
    assert before is not None and again is not None


def test_e_reset_empties_and_replays_bit_identically(make_engine: MakeEngine) -> None:
    engine = make_engine(n_ctx_seq=64, n_seq_max=2, n_batch=32)
    fresh = make_engine(n_ctx_seq=64, n_seq_max=2, n_batch=32)
    tokens = engine.vocab.tokenize(TEXT)[:100]
    cseq = seq("sink", sinks=4, window=60)
    engine.feed(1, seq("sink", sinks=4, window=60), tokens[50:])  # a neighbour stays in the cache
    engine.feed(0, cseq, tokens)
    engine.cells.clear(0)
    cseq.reset()
    assert engine.cells.pos_range(0) == (-1, -1) and cseq.retained == 0
    replay = engine.feed(0, cseq, tokens[:50])
    reference = fresh.feed(0, seq("sink", sinks=4, window=60), tokens[:50])
    assert replay is not None and reference is not None
    assert np.array_equal(replay, reference)


def test_f_fork_leaves_the_parent_bit_identical(make_engine: MakeEngine) -> None:
    engine = make_engine(n_ctx_seq=64, n_seq_max=2, n_batch=32)
    control = make_engine(n_ctx_seq=64, n_seq_max=2, n_batch=32)
    tokens = engine.vocab.tokenize(TEXT)[:200]
    parent = seq("sink", sinks=4, window=60)
    engine.feed(0, parent, tokens[:58])
    before = engine.cells.pos_range(0)
    engine.cells.copy(0, 1)
    child = parent.fork()
    engine.feed(1, child, tokens[58:190])  # the child evicts and shifts many times
    assert child.receipt().evictions > 60 and parent.receipt().evictions == 0
    assert engine.cells.pos_range(0) == before
    after = engine.feed(0, parent, tokens[190:191])
    ref_seq = seq("sink", sinks=4, window=60)
    control.feed(0, ref_seq, tokens[:58])
    reference = control.feed(0, ref_seq, tokens[190:191])
    assert after is not None and reference is not None
    assert np.array_equal(after, reference)


def test_g_gemma_refuses_what_it_cannot_stream(make_engine: MakeEngine) -> None:
    gemma = make_engine("gemma3-270m", n_ctx_seq=512, n_seq_max=1, n_batch=64)
    assert gemma.n_swa == 512 and gemma.adds_bos and gemma.can_shift
    gemma.check_policy(PolicyConfig.named("sink", sinks=4, window=252))
    with pytest.raises(Unsupported, match="sliding window of 512"):
        gemma.check_policy(PolicyConfig.named("sink-noshift", sinks=4, window=252))
    with pytest.raises(Unsupported, match="sliding window of 512"):
        gemma.check_policy(PolicyConfig.named("sink", sinks=4, window=500, compact_interval=64))
    # a session's default K is cut to what the sliding window leaves: 8 here, not 3 x 16
    assert gemma.position_limit == 512
    deferred = PolicyConfig.named("sink", sinks=4, window=500, evict_chunk=16).with_deferred_shift(
        3, gemma.position_limit
    )
    assert deferred.compact_interval == 8
    gemma.check_policy(deferred)
    assert gemma.vocab.tokenize("hello", add_bos=True)[0] == gemma.bos  # the BOS is the first sink


def test_g_gemma_without_full_swa_cache_cannot_shift() -> None:
    from sinkd.daemon.engine.loading import open_engine

    with pytest.raises(Unsupported, match="swa_full"):
        open_engine("gemma3-270m", EngineConfig(n_ctx_seq=512, n_seq_max=1, swa_full=False))


def test_budget_and_tokens_are_validated_before_llama(make_engine: MakeEngine) -> None:
    engine = make_engine(n_ctx_seq=64, n_seq_max=1, n_batch=16)
    assert engine.n_ctx_seq == 256  # llama.cpp rounds each sequence's stream up to 256 cells
    engine.check_policy(PolicyConfig.named("sink", sinks=4, window=252))
    with pytest.raises(ConfigError, match="exceeds the 256 cells"):
        engine.check_policy(PolicyConfig.named("sink", sinks=4, window=253))
    cseq = seq("sink", sinks=4, window=60)
    with pytest.raises(InvalidInput, match="outside the vocabulary"):
        engine.feed(0, cseq, [1, 2, engine.n_vocab])
    with pytest.raises(InvalidInput, match="outside the vocabulary"):
        engine.feed(0, cseq, [-1])
    assert engine.cells.pos_range(0) == (-1, -1) and cseq.retained == 0
    engine.feed(0, cseq, engine.vocab.tokenize(TEXT)[:100])  # 100 > n_batch: split, never asserted
    assert cseq.retained == 64 and engine.cells.pos_range(0) == (0, 63)


def test_a_batch_is_validated_whole_before_llama(make_engine: MakeEngine) -> None:
    engine = make_engine(n_ctx_seq=64, n_seq_max=2, n_batch=16)
    bad = [
        ("invalid or repeated sequence ids", [BatchItem(0, [1], 0), BatchItem(0, [2], 0)]),
        ("invalid or repeated sequence ids", [BatchItem(2, [1], 0)]),
        ("empty batch item for sequence 1", [BatchItem(0, [1], 0), BatchItem(1, [], 0)]),
        ("outside the vocabulary", [BatchItem(0, [1], 0), BatchItem(1, [2, engine.n_vocab], 0)]),
        ("outside 1..n_batch", [BatchItem(0, [1] * 9, 0), BatchItem(1, [1] * 8, 0)]),
    ]
    for why, items in bad:
        with pytest.raises(InvalidInput, match=re.escape(why)):
            engine.decode_batch(items)
    assert (
        engine.cells.pos_range(0) == engine.cells.pos_range(1) == (-1, -1)
    )  # nothing reached llama.cpp


def test_batch_logits_are_each_items_own_row_and_outlive_the_next_decode(
    make_engine: MakeEngine,
) -> None:
    """decode_batch reads llama.cpp's output buffer through a cached view: each item gets its own
    row (batch order is by sequence id), as a copy, also after the buffer grew for a longer read."""
    engine = make_engine(n_ctx_seq=128, n_seq_max=4, n_batch=64)
    toks = engine.vocab.tokenize(TEXT)
    first = engine.decode_batch([BatchItem(3, toks[:2], 0)])  # a one-row view, cached
    assert first[0] is not None and np.array_equal(first[0], engine.logits(1))
    items = [BatchItem(2, toks[:5], 0), BatchItem(0, toks[5:10], 0, logits=False),
             BatchItem(1, toks[12:17], 0)]  # fmt: skip
    rows = engine.decode_batch(items)  # one length: one llama_decode
    # in the batch: sequence 0 (5 tokens), 1 (5), 2 (5); outputs at the last of 1 and of 2
    assert rows[1] is None
    assert rows[2] is not None and np.array_equal(rows[2], engine.logits(9))
    assert rows[0] is not None and np.array_equal(rows[0], engine.logits(14))
    kept = [rows[0].copy(), rows[2].copy()]
    engine.cells.clear(3)
    many = engine.feed(3, seq("sink", sinks=4, window=100), toks[:60], outputs="all")
    assert many is not None and many.shape == (60, engine.n_vocab)
    again = engine.decode_batch([BatchItem(2, toks[5:6], 5)])
    assert again[0] is not None and np.array_equal(again[0], engine.logits(0))
    assert np.array_equal(rows[0], kept[0]) and np.array_equal(rows[2], kept[1])  # copies


def _rows_by_company(
    make_engine: MakeEngine, cells: int, flash: str
) -> tuple[dict[tuple[str, int], np.ndarray], bool]:
    """One token and one 64-token chunk after a history filling 600 of 1,024 cells (or 180 of
    256), decoded alone, beside another sequence's token and (the chunk) beside another 64-token
    chunk, on two threads and on one: each case's logits row, and whether flash attention ran.
    Beside a lone token llama.cpp would cut the chunk 1 + 1, then 63, and on the plain path a
    lone row's attention takes ggml's vec_dot where 2 rows or more take llamafile's sgemm (found
    on an AMD EPYC, AVX2: 2.795 against 2.831 in the first logit)."""
    toks = make_engine(n_ctx_seq=64, n_seq_max=1).vocab.tokenize(TEXT * 6)
    filled = 600 if cells > 256 else 180
    one, chunk = [toks[1000]], toks[1001:1065]
    rows: dict[tuple[str, int], np.ndarray] = {}
    for threads in (2, 1):
        engine = make_engine(
            n_ctx_seq=cells, n_seq_max=2, n_batch=256, n_threads=threads, flash_attn=flash
        )
        for at in range(0, filled, 200):
            engine.decode_batch([BatchItem(0, toks[at : min(at + 200, filled)], at)])
        engine.decode_batch([BatchItem(1, toks[:40], 0)])
        history = engine.cells.save_seq(0), engine.cells.save_seq(1)
        cases = {
            "alone": [BatchItem(0, one, filled)],
            "beside a token": [BatchItem(0, one, filled), BatchItem(1, [toks[40]], 40)],
            "chunk alone": [BatchItem(0, chunk, filled)],
            "chunk beside a token": [BatchItem(0, chunk, filled), BatchItem(1, [toks[40]], 40)],
            "chunk beside a chunk": [BatchItem(0, chunk, filled), BatchItem(1, toks[40:104], 40)],
            "chunk beside 8": [BatchItem(0, chunk, filled), BatchItem(1, toks[40:48], 40)],
        }
        for name, items in cases.items():
            engine.cells.restore_seq(0, history[0])
            engine.cells.restore_seq(1, history[1])
            rows[name, threads] = engine.decode_batch(items)[0]
    return rows, engine.flash_attn


@pytest.mark.parametrize(("cells", "flash"), [(1024, "auto"), (256, "exact"), (256, "auto")])
def test_a_tokens_logits_do_not_depend_on_its_batch_or_the_thread_count(
    make_engine: MakeEngine, cells: int, flash: str
) -> None:
    """Past 512 cache positions llama.cpp's CPU flash attention splits a lone token's sums by
    thread: the bits would depend on the threads and on the batch. The engine runs flash attention
    only below 512 cells per stream, in pieces under 64 rows ("exact"; "auto" on a build whose
    sgemm takes no lone float row), and the plain path otherwise, and it decodes each item length
    apart: either way a sequence's rows are the same alone, beside others of any length, and on
    one thread or two (what resume and batched == solo rest on)."""
    rows, flash_attn = _rows_by_company(make_engine, cells, flash)
    on_cpu = EngineConfig().n_gpu_layers == 0  # flash attention is unverified on a GPU: off there
    wanted = flash == "exact" or not sgemm_float_rows()
    assert flash_attn is (on_cpu and cells < 512 and wanted)
    for name in (
        "beside a token",
        "chunk beside a token",
        "chunk beside a chunk",
        "chunk beside 8",
    ):
        reference = "chunk alone" if name.startswith("chunk") else "alone"
        for threads in (2, 1):
            assert np.array_equal(rows[name, threads], rows[reference, 2]), (name, threads)
    assert np.array_equal(rows["alone", 1], rows["alone", 2])
    assert np.array_equal(rows["chunk alone", 1], rows["chunk alone", 2])


@pytest.mark.parametrize("model", [None, "gemma3-270m"])
def test_a_tokens_logits_do_not_depend_on_how_many_share_its_step(
    make_engine: MakeEngine, model: str | None
) -> None:
    """Eight sequences; sequence 0's next-token logits after 1, 2, 3 or 16 tokens at three places
    of a text, decoded alone and beside 1, 3 and 7 others of the same length, and beside a longer
    one (more cells to attend). With llama.cpp's defaults Gemma's repacked Q4_K/Q6_K weights take a
    gemm from 4 rows of the whole batch and a gemv below, and its tiled K-quant kernel 8 rows or
    more: its logits moved with the number of decoding sessions (here at 26 of these 36 pairs of 1
    to 3 tokens). The engine loads weights unrepacked, tiled off."""
    engine = make_engine(model, n_ctx_seq=512, n_seq_max=8, n_batch=256, n_threads=2)
    toks = engine.vocab.tokenize(TEXT * 6)
    for q in range(8):
        for at in range(0, 400 if q == 7 else 300, 100):
            engine.decode_batch([BatchItem(q, toks[q * 40 + at :][:100], at, logits=False)])
    history = [engine.cells.save_seq(q) for q in range(8)]
    for at in (600, 900, 1100):
        for n in (1, 2, 3, 16):
            rows = []
            for company in ([], [1], [1, 2, 3], [1, 2, 3, 4, 5, 6, 7], [7]):
                for q in range(8):
                    engine.cells.restore_seq(q, history[q])
                items = [BatchItem(0, toks[at : at + n], 300)]
                items += [
                    BatchItem(q, toks[at + 100 + q * 20 :][:n], 400 if q == 7 else 300)
                    for q in company
                ]
                rows.append(engine.decode_batch(items)[0])
            for k, row in enumerate(rows[1:], 1):
                assert np.array_equal(row, rows[0]), (model, at, n, k)


def test_flash_attention_would_make_a_tokens_bits_depend_on_its_company(
    make_engine: MakeEngine,
) -> None:
    """Why "auto" stops at 512 cells: forced on at 1,024, a lone token's logits differ from the
    same token's beside another sequence (llama.cpp's CPU kernel splits the lone row's sums over
    the threads)."""
    if EngineConfig().n_gpu_layers:
        pytest.skip("a claim about llama.cpp's CPU kernel")
    rows, flash_attn = _rows_by_company(make_engine, 1024, "on")
    assert flash_attn
    assert not np.array_equal(rows["beside a token", 2], rows["alone", 2])


def test_the_engine_computes_llamas_cells_per_stream_and_the_flash_rule() -> None:
    from sinkd.daemon.engine.llama import cells_per_stream, flash_attention_exact

    assert cells_per_stream(256, 8) == 256 and cells_per_stream(1024, 4) == 1024
    assert cells_per_stream(100, 3) == 256  # 300 -> 512 in all, 170 each -> 256
    assert cells_per_stream(300, 1) == 512 and cells_per_stream(256, 4, kv_unified=True) == 1024
    assert flash_attention_exact(256, 0) and flash_attention_exact(511, 0)
    assert not flash_attention_exact(512, 0) and not flash_attention_exact(256, 1)


@pytest.mark.parametrize("flash", ["off", "exact", "on"])
def test_a_chunks_logits_do_not_depend_on_how_it_was_cut(
    make_engine: MakeEngine, flash: str
) -> None:
    """A chunk computes the same bits in pieces of 2 rows or more: whole, 50 + 50, 64 + 36,
    10 + 30 + 60 or 2 + 98, and the token after it too (the plain path's sgemm sums each row alike
    in any tile); under flash attention as "exact" runs it, in pieces of at most 63 rows, a lone
    row too (1 + 99). Forced on as llama.cpp has it, flash attention tiles 64 rows or more of a
    stream and sums them otherwise: a whole chunk of 100 differs. (A lone row on the plain path:
    the next test.)"""
    if flash != "off" and EngineConfig().n_gpu_layers:
        pytest.skip("a claim about llama.cpp's CPU kernel")
    engine = make_engine(n_ctx_seq=256, n_seq_max=1, n_batch=256, n_threads=2, flash_attn=flash)
    assert engine.flash_attn is (flash != "off")
    toks = engine.vocab.tokenize(TEXT * 3)

    def cut(sizes: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        engine.cells.clear(0)
        engine.decode_batch([BatchItem(0, toks[:50], 0, logits=False)])
        pos, row = 50, None
        for n in sizes:
            row = engine.decode_batch([BatchItem(0, toks[pos : pos + n], pos)])[0]
            pos += n
        after = engine.decode_batch([BatchItem(0, [toks[pos]], pos)])[0]
        engine.cells.clear(0)  # and through feed's path, every row
        seq = CacheSequence(PolicyConfig.named("full", sinks=0, window=200))
        engine.feed(0, seq, toks[:50], outputs="none")
        rows = [
            engine.feed(0, seq, toks[50 + sum(sizes[:i]) :][:n], "all") for i, n in enumerate(sizes)
        ]
        assert row is not None and after is not None
        return row, after, np.concatenate([r for r in rows if r is not None])

    whole = cut([100])
    assert whole[2].shape == (100, engine.n_vocab)
    cuts = [[50, 50], [64, 36], [10, 30, 60], [2, 98]] + ([[1, 99]] if flash != "off" else [])
    for sizes in cuts:
        got = cut(sizes)
        same = all(np.array_equal(g, w) for g, w in zip(got, whole, strict=True))
        assert same is (flash != "on"), sizes


def test_a_lone_row_of_a_longer_text_sums_otherwise_only_with_stock_llamafile(
    make_engine: MakeEngine,
) -> None:
    """On the plain path (1,024 cells) a stream's lone row in a ubatch takes ggml's vec_dot for
    its attention products, and with llamafile 2 rows or more take its sgemm, which sums in another
    order: a chunk decoded as one token, then the rest, is then not always the chunk decoded whole
    (on an AMD EPYC, AVX2: at 13 of 16 cut points), while cuts into pieces of 2 or more are. So the
    step plan cuts a session's prefill by its own length alone and resume replays each chunk with
    the cut it had. The build sinkd installs patches sgemm to take a lone row of floats too
    (deploy/llama.cpp/sgemm-float-rows.patch; a build without llamafile sums alike as well): there
    every cut, a lone row's included, sums as the whole, which is what speculative decoding rests
    on (a pass of a token and its drafts gives each the bits it gets alone), and the engine's
    probe of the model as it opened says so (row_probe.py)."""
    import llama_cpp

    if EngineConfig().n_gpu_layers:
        pytest.skip("a claim about llama.cpp's CPU kernels")
    llamafile = b"LLAMAFILE = 1" in llama_cpp.llama_print_system_info()
    engine = make_engine(n_ctx_seq=1024, n_seq_max=1, n_batch=256, n_threads=2, flash_attn="off")
    stock = llamafile and not engine.float_rows  # a lone row sums otherwise
    assert (engine.rows_not_exact() is None) is not stock
    toks = engine.vocab.tokenize(TEXT * 6)
    for at in range(0, 600, 200):
        engine.decode_batch([BatchItem(0, toks[at : at + 200], at, logits=False)])
    history, chunk = engine.cells.save_seq(0), toks[1001:1065]

    def decoded(cut: list[int]) -> np.ndarray:
        engine.cells.restore_seq(0, history)
        pos, row = 600, None
        for n in cut:
            row = engine.decode_batch([BatchItem(0, chunk[pos - 600 :][:n], pos)])[0]
            pos += n
        assert row is not None
        return row

    whole = decoded([64])
    points = [0, 1, 2, 3, 4, 5, 8, 16, 31, 32, 33, 40, 48, 56, 60, 62]
    lone = [not np.array_equal(decoded([k, 1, 63 - k] if k else [1, 63]), whole) for k in points]
    if stock:
        assert any(lone), "a lone row summed as in a longer piece at every cut point"
    else:
        assert not any(lone), f"a lone row differed at cuts {lone}"
    assert all(
        np.array_equal(decoded([k, 2, 62 - k] if k else [2, 62]), whole) for k in (0, 2, 8, 32)
    )
    # a token and its drafts in one pass (every row asked): each row as the token decoded alone
    engine.cells.restore_seq(0, history)
    alone = [engine.decode_batch([BatchItem(0, [t], 600 + j)])[0] for j, t in enumerate(chunk[:5])]
    engine.cells.restore_seq(0, history)
    rows = engine.decode_rows([BatchItem(0, chunk[:5], 600)])[0]
    same = [np.array_equal(a, r.logits) for a, r in zip(alone, rows, strict=True)]
    assert stock or all(same), same  # with stock llamafile sinkd does not draft (rows_not_exact)


def test_the_rows_probe_waits_for_a_sequence_without_cells_and_leaves_it_empty(
    make_engine: MakeEngine,
) -> None:
    """A llamafile build is asked on the model (row_probe.py) when drafts are first weighed, on a
    sequence that holds no cells: where every one holds some it is asked again later."""
    import llama_cpp

    if EngineConfig().n_gpu_layers or b"LLAMAFILE = 1" not in llama_cpp.llama_print_system_info():
        pytest.skip("a build whose rows are settled without a probe")
    engine = make_engine(n_ctx_seq=256, n_seq_max=1, n_batch=64)
    assert not engine.rows_settled
    engine.decode_batch([BatchItem(0, engine.vocab.tokenize(TEXT)[:5], 0, logits=False)])
    why = engine.rows_not_exact()
    assert not engine.rows_settled and why is not None and "not probed yet" in why
    assert engine.cells.pos_range(0) == (0, 4)  # the session's cells untouched
    engine.cells.clear(0)
    assert engine.rows_not_exact() is None and engine.rows_settled
    assert engine.cells.pos_range(0) == (-1, -1)


def test_sampler_greedy_is_argmax_and_seeded_sampling_repeats(make_engine: MakeEngine) -> None:
    from sinkd.daemon.engine.sampler import Sampler, SamplingParams

    engine = make_engine(n_ctx_seq=64, n_seq_max=1, n_batch=32)
    tokens = engine.vocab.tokenize(TEXT)[:20]
    cseq = seq("sink", sinks=4, window=60)
    logits = engine.feed(0, cseq, tokens)
    greedy = Sampler(SamplingParams())
    assert logits is not None and engine.sample(greedy) == int(logits.argmax())
    # the greedy fast path selects what llama.cpp's greedy chain selects; on a tie, what its
    # backend argmax (ggml_argmax, computed in the decode) selects: the last of equal maxima
    tied = logits.copy()
    top = int(logits.argmax())
    tied[[5, top, 9000]] = logits[top]
    for row in (logits, -logits):
        assert greedy.sample_logits(row) == greedy.chain_select(row)
    assert greedy.sample_logits(tied) == max(9000, top)
    assert greedy.sample_logits(tied, greedy=5) == 5  # the decode's own argmax is taken as given
    draws = []
    for _ in range(2):
        s = Sampler(SamplingParams(temperature=1.0, seed=7))
        draws.append([engine.sample(s) for _ in range(5)])
    assert draws[0] == draws[1]
    with pytest.raises(InvalidInput, match="top_p"):
        validated(SamplingParams, temperature=1.0, top_p=0.0)


def test_the_decodes_argmax_is_the_rows_greedy_token_and_leaves_the_logits_as_they_were(
    make_engine: MakeEngine,
) -> None:
    """llama.cpp's backend argmax (a greedy chain per sequence, in the decode's graph) gives each
    asked row's greedy token, for a lone token, a chunk's last row and several sequences at once,
    and the logits are bit for bit those of an engine without it."""
    from sinkd.daemon.engine.sampler import greedy_token

    toks = make_engine(n_ctx_seq=128, n_seq_max=3, n_batch=64).vocab.tokenize(TEXT)
    rows: dict[bool, list[np.ndarray]] = {}
    for backend in (True, False):
        engine = make_engine(n_ctx_seq=128, n_seq_max=3, n_batch=64, backend_argmax=backend)
        assert engine.backend_argmax is backend
        got = engine.decode_next([BatchItem(0, toks[:7], 0), BatchItem(2, toks[9:16], 0)])
        nxt = [n for n in got if n is not None]
        for step in range(12):  # greedy continuation of both, a token each per decode
            pairs = zip((0, 2), nxt, strict=True)
            got = engine.decode_next(
                [BatchItem(q, [greedy_token(n.logits)], 7 + step) for q, n in pairs]
            )
            nxt = [n for n in got if n is not None]
            for n in nxt:
                assert n.greedy == (greedy_token(n.logits) if backend else None)
            rows.setdefault(backend, []).extend(n.logits.copy() for n in nxt)
    assert len(rows[True]) == 24
    assert all(np.array_equal(a, b) for a, b in zip(rows[True], rows[False], strict=True))


def test_the_repetition_penalty_is_llama_cpps_rule_over_the_given_history() -> None:
    from sinkd.daemon.engine.sampler import Sampler, SamplingParams

    logits = np.array([3.0, 2.9, -1.0, 0.5], dtype=np.float32)
    plain = Sampler(SamplingParams())
    penalised = Sampler(SamplingParams(repeat_penalty=1.5, repeat_last_n=2))
    assert plain.sample_logits(logits, [0]) == 0  # no penalty: the history changes nothing
    assert penalised.sample_logits(logits, [0]) == 1  # 3.0 / 1.5 = 2.0 < 2.9
    assert penalised.sample_logits(logits, [0, 3, 1]) == 0  # only the last 2 count: 0 is free
    out = penalised._penalised(logits, [2, 3])
    assert out[2] == pytest.approx(-1.5) and out[3] == pytest.approx(0.5 / 1.5)  # < 0: times
    assert logits[2] == -1.0  # the stored row is never changed
    with pytest.raises(InvalidInput, match="repeat_penalty"):
        validated(SamplingParams, repeat_penalty=0.5)


def test_unlisted_model_runs_full_only(make_engine: MakeEngine) -> None:
    from sinkd.daemon.engine.loading import open_unlisted
    from sinkd.daemon.models.registry import load_lock, model_path

    engine = open_unlisted(
        model_path(load_lock().get(None)), EngineConfig(n_ctx_seq=64, n_seq_max=1)
    )
    try:
        engine.check_policy(PolicyConfig.named("full", sinks=0, window=64))
        with pytest.raises(Unsupported, match="full policy only"):
            engine.check_policy(PolicyConfig.named("sink", sinks=4, window=60))
    finally:
        engine.close()


def test_a_failed_piece_leaves_the_cache_as_the_policy_says(make_engine: MakeEngine) -> None:
    """Under flash attention a long item is decoded in pieces of 63 rows. When a later piece fails,
    the earlier pieces' cells are removed again: the sequence holds what it held before, both
    through `decode_batch` and through `feed` (whose policy state then has not moved), and the
    next decode computes what it would have."""
    if EngineConfig().n_gpu_layers:
        pytest.skip("the pieces are the CPU rule's")
    engine = make_engine(n_ctx_seq=256, n_seq_max=2, n_batch=256, n_threads=2, flash_attn="exact")
    assert engine.flash_attn and engine.max_rows == 63
    toks = engine.vocab.tokenize(TEXT * 3)

    def refuse() -> None:
        raise EngineError("refused for the test")

    engine.decode_batch([BatchItem(0, toks[:40], 0, logits=False)])
    with failpoints.armed("decode-piece", refuse), pytest.raises(EngineError):
        engine.decode_batch([BatchItem(0, toks[40:140], 40)])
    assert engine.cells.pos_range(0) == (0, 39) and engine.cells.cell_count(0) == 40
    with failpoints.armed("decode-piece", refuse), pytest.raises(EngineError):  # one ended first
        engine.decode_batch([BatchItem(0, toks[40:140], 40), BatchItem(1, toks[:30], 0)])
    assert engine.cells.pos_range(0) == (0, 39) and engine.cells.pos_range(1) == (-1, -1)
    row = engine.decode_batch([BatchItem(0, toks[40:140], 40)])[0]
    engine.cells.clear(0)
    engine.decode_batch([BatchItem(0, toks[:40], 0, logits=False)])
    assert np.array_equal(engine.decode_batch([BatchItem(0, toks[40:140], 40)])[0], row)

    engine.cells.clear(0)
    seq = CacheSequence(PolicyConfig.named("full", sinks=0, window=200))
    engine.feed(0, seq, toks[:40], outputs="none")
    before = seq.state
    with failpoints.armed("decode-piece", refuse), pytest.raises(EngineError):
        engine.feed(0, seq, toks[40:140])
    assert seq.state == before and engine.cells.pos_range(0) == (0, 39)
    last = engine.feed(0, seq, toks[40:140])
    assert last is not None and np.array_equal(last, row)
