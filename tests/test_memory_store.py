"""The memory store alone (SQLite, no model): passages cut at text boundaries, replays stored once,
recalled copies never stored, trim at resume, pruning, deletion off the disk, and the running sizes
equal to a fresh count after any mix of writes and deletes."""

from __future__ import annotations

import itertools
import math
import random
import sqlite3
from pathlib import Path

import pytest

from sinkd.daemon.store.journal import Journal
from sinkd.daemon.store.memory import MemoryStore, Passage, Segmenting, query_terms
from sinkd.daemon.store.passages import SessionKey
from tests.support.sql import vm_steps

pytestmark = pytest.mark.unit

WORDS = "the pass key is 4711 . remember it \n sea ships whale zebraquartz light".split(" ")


def piece(token: int) -> bytes:
    return (" " + WORDS[token % len(WORDS)]).encode()


def stream(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(len(WORDS)) for _ in range(n)]


def store_in(tmp: Path, kind: str = "text") -> MemoryStore:
    return MemoryStore(Journal(tmp / "journal.db").db, Segmenting(kind))


def evict(store: MemoryStore, tokens: list[int], start: int = 0, chunk: int = 16) -> None:
    for i in range(0, len(tokens), chunk):
        part = tokens[i : i + chunk]
        store.add_evicted(SessionKey("s", 0), start + i, part, [False] * len(part), piece)


def test_passages_tile_the_evicted_range_and_cut_at_boundaries(tmp_path: Path) -> None:
    store = store_in(tmp_path)
    tokens = stream(600)
    evict(store, tokens)
    passages = store.passages(SessionKey("s", 0))
    assert passages[0].logical[0] == 0 and passages[-1].logical[1] == 600
    assert all(a.logical[1] == b.logical[0] for a, b in itertools.pairwise(passages))
    assert [t for p in passages for t in p.tokens] == tokens
    for p in passages[:-1]:
        assert 16 <= len(p.tokens) <= 48
        if len(p.tokens) < 48:  # cut at a boundary: the last piece ends a line or a sentence
            assert piece(p.tokens[-1]).decode().strip() in (".", "")
    (tmp_path / "fixed").mkdir()
    fixed = store_in(tmp_path / "fixed", "fixed")
    evict(fixed, tokens)
    assert {len(p.tokens) for p in fixed.passages(SessionKey("s", 0))[:-1]} == {48}


def test_a_replay_stores_nothing_twice_and_recalled_copies_are_never_stored(
    tmp_path: Path,
) -> None:
    store = store_in(tmp_path)
    tokens = stream(200)
    evict(store, tokens)
    before = [(p.logical, p.tokens) for p in store.passages(SessionKey("s", 0))]
    evict(store, tokens[64:])  # a resume replays chunks it already stored
    evict(store, tokens, chunk=7)
    assert [(p.logical, p.tokens) for p in store.passages(SessionKey("s", 0))] == before
    skip = [20 <= i < 30 for i in range(40)]  # a recalled copy inside the evicted range
    store.add_evicted(SessionKey("s", 0), 200, stream(40, 1), skip, piece)
    stored = [p.logical for p in store.passages(SessionKey("s", 0))]
    assert all(b <= 220 or a >= 230 for a, b in stored)  # no passage holds a copied token
    assert store.stats(SessionKey("s", 0))[1] == 200 + 30


def test_trim_drops_what_lies_beyond_and_keeps_a_straddlers_head(tmp_path: Path) -> None:
    store = store_in(tmp_path)
    evict(store, stream(300))
    cut = next(p for p in store.passages(SessionKey("s", 0)) if p.logical[0] < 150 < p.logical[1])
    store.trim(SessionKey("s", 0), 150, piece)
    passages = store.passages(SessionKey("s", 0))
    assert passages[-1].logical == (cut.logical[0], 150)
    assert store.mark(SessionKey("s", 0)) == 150
    assert store.stats(SessionKey("s", 0))[1] == 150


def test_running_sizes_equal_a_fresh_count(tmp_path: Path) -> None:
    store = store_in(tmp_path)
    rng = random.Random(3)
    evict(store, stream(900, 3))
    store.copy(SessionKey("s", 0), SessionKey("c", 0))
    for _ in range(20):
        op = rng.choice(["forget", "prune", "evict", "trim"])
        if op == "forget":
            ids = [p.id for p in store.passages(SessionKey("s", 0))]
            if ids:
                store.forget(SessionKey("s", 0), passage_id=rng.choice(ids))
        elif op == "prune":
            store.prune(SessionKey("s", 0), rng.randrange(100, 900))
        elif op == "evict":
            mark = store.mark(SessionKey("s", 0))
            evict(store, stream(50, rng.randrange(99)), start=mark)
        else:
            store.trim(
                SessionKey("s", 0),
                max(0, store.mark(SessionKey("s", 0)) - rng.randrange(40)),
                piece,
            )
        for key in (SessionKey("s", 0), SessionKey("c", 0)):
            assert store.stats(key) == store.sizes.count(key)
    store.invalidate()
    assert store.stats(SessionKey("s", 0)) == store.sizes.count(SessionKey("s", 0))


def test_prune_takes_the_oldest_first(tmp_path: Path) -> None:
    store = store_in(tmp_path)
    evict(store, stream(500))
    pruned = store.prune(SessionKey("s", 0), 200)
    _, tokens, _ = store.stats(SessionKey("s", 0))
    assert tokens <= 200 and pruned == 500 - tokens
    assert store.passages(SessionKey("s", 0))[-1].logical[1] == 500  # the newest stay


def test_deleted_text_leaves_the_files(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.db")
    store = MemoryStore(journal.db)
    zebra = WORDS.index("zebraquartz")
    evict(store, [zebra] * 32 + stream(100))
    journal.commit()
    files = list(tmp_path.glob("journal.db*"))

    def found() -> bool:
        return any(b"zebraquartz" in p.read_bytes() for p in files if p.exists())

    assert found()
    assert store.search(SessionKey("s", 0), "zebraquartz", 5)
    store.drop("s")
    journal.commit()
    store.purge()
    assert not store.search(SessionKey("s", 0), "zebraquartz", 5)
    assert not found()


def test_queries_keep_content_words_only() -> None:
    assert query_terms("What is the pass key of door 3?") == ["pass", "key", "door", "3"]
    assert query_terms("what is it?") == []
    assert len(query_terms(" ".join(f"w{i}" for i in range(100)))) == 32


def test_a_temporary_store_is_deleted_at_close() -> None:
    store = MemoryStore.temporary()
    folder = store._folder
    assert folder is not None and (folder / "memory.db").exists()
    store.close()
    assert not folder.exists()
    with pytest.raises(sqlite3.ProgrammingError):
        store.db.execute("SELECT 1")


def zipf_piece(token: int) -> bytes:
    return b" ." if token == 0 else f" w{token}".encode()


def zipf_stream(n: int, seed: int) -> list[int]:
    """Words w1..w199 drawn by Zipf's law (w1 the commonest), a full stop now and then."""
    rng = random.Random(seed)
    return rng.choices(range(200), weights=[3.0] + [1 / r for r in range(1, 200)], k=n)


def bm25_by_hand(passages: list[Passage], words: list[str]) -> dict[tuple[int, int], float]:
    """BM25 (k1 1.2, b 0.75, FTS5's idf) over these passages alone; a passage's length in tokens."""
    n, avgdl = len(passages), sum(len(p.tokens) for p in passages) / len(passages)
    texts = {p.logical: p.text.split() for p in passages}
    score = dict.fromkeys(texts, 0.0)
    for w in words:
        hits = {k: t.count(w) for k, t in texts.items() if w in t}
        idf = math.log((n - len(hits) + 0.5) / (len(hits) + 0.5))
        idf = idf if idf > 0 else 1e-6
        for k, tf in hits.items():
            score[k] += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * (k[1] - k[0]) / avgdl))
    return {k: s for k, s in score.items() if s}


def test_a_sessions_scores_are_its_own_whatever_else_the_store_holds(tmp_path: Path) -> None:
    """BM25 over the session's own passages: another session's text (another tenant's, or the
    same session's older generation) moves neither its scores nor its ranking, so a recall is the
    same alone and in company, and scores leak nothing of what others stored."""
    words = ["w2", "w9", "w40", "w150"]

    def fill(store: MemoryStore, session: str, reset: int, tokens: list[int]) -> None:
        for i in range(0, len(tokens), 16):
            part = tokens[i : i + 16]
            store.add_evicted(SessionKey(session, reset), i, part, [False] * len(part), zipf_piece)

    alone = store_in(tmp_path)
    fill(alone, "s", 0, zipf_stream(1500, seed=1))
    got = [(c.source, c.score) for c in alone.search(SessionKey("s", 0), " ".join(words), 1000)]
    expected = bm25_by_hand(alone.passages(SessionKey("s", 0)), words)
    assert len(expected) > 20 and len({round(v, 3) for v in expected.values()}) > 10
    assert dict(got) == pytest.approx(expected, rel=1e-9)
    assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
    (tmp_path / "crowd").mkdir()
    crowd = store_in(tmp_path / "crowd")
    for who, seed in (("t", 2), ("u", 3)):  # others first: the ids and the index differ too
        fill(crowd, who, 0, zipf_stream(3000, seed))
    fill(crowd, "s", 1, zipf_stream(600, seed=4))  # the session's next generation
    fill(crowd, "s", 0, zipf_stream(1500, seed=1))
    assert [
        (c.source, c.score) for c in crowd.search(SessionKey("s", 0), " ".join(words), 1000)
    ] == got


def test_a_search_leaves_no_transaction_open_and_joins_one_unchanged(tmp_path: Path) -> None:
    """Stemming a query writes a temp table: outside a transaction it must not open one (the
    journal would then sync for nothing), inside one it must leave it as it was."""
    store = store_in(tmp_path)
    fill_text = stream(200, seed=5)
    evict(store, fill_text)
    store.db.commit()
    assert store.search(SessionKey("s", 0), "whale ships", 10)
    assert not store.db.in_transaction
    evict(store, stream(40, seed=6), start=200)
    assert store.db.in_transaction
    found = store.search(SessionKey("s", 0), "whale ships", 10)
    assert store.db.in_transaction and found
    store.db.rollback()
    assert store.passages(SessionKey("s", 0))[-1].logical[1] == 200


def evict_into(store: MemoryStore, session: str, reset_count: int, tokens: list[int]) -> None:
    start = store.mark(SessionKey(session, reset_count))
    store.add_evicted(SessionKey(session, reset_count), start, tokens, [False] * len(tokens), piece)


def test_passages_are_numbered_within_their_session_generation(tmp_path: Path) -> None:
    """A passage's number counts its own session generation's passages only: with other sessions
    evicting in between, a session still sees 1, 2, 3, ..., so its numbers tell nothing of what
    others stored (the row ids under them count every session's). A forgotten number is not
    given again, a fork keeps its parent's, a trimmed passage keeps its own."""
    store = store_in(tmp_path)
    rng = random.Random(5)
    for i in range(30):  # three sessions and a later generation, interleaved
        session, rc = rng.choice([("a", 0), ("b", 0), ("c", 0), ("a", 1)])
        evict_into(store, session, rc, stream(rng.randrange(20, 90), i))
    for key in (("a", 0), ("b", 0), ("c", 0), ("a", 1)):
        numbers = sorted(p.id for p in store.passages(SessionKey(*key)))
        assert numbers == list(range(1, len(numbers) + 1)), key
        rowids = [int(r[0]) for r in store.db.execute(
            "SELECT id FROM passages WHERE session=? AND reset_count=? ORDER BY id", key
        )]  # fmt: skip
        assert rowids != list(range(rowids[0], rowids[0] + len(rowids))), key  # others' between
    before = {p.id for p in store.passages(SessionKey("b", 0))}
    newest = max(before)
    assert len(store.forget(SessionKey("b", 0), passage_id=newest)) == 1
    assert store.forget(SessionKey("b", 0), passage_id=newest) == []
    evict_into(store, "b", 0, stream(60, 99))
    added = {p.id for p in store.passages(SessionKey("b", 0))} - before
    assert added and min(added) == newest + 1  # a forgotten number is never given again
    store.copy(SessionKey("a", 0), SessionKey("f", 0))
    assert [(p.id, p.logical) for p in store.passages(SessionKey("f", 0))] == [
        (p.id, p.logical) for p in store.passages(SessionKey("a", 0))
    ]
    evict_into(store, "f", 0, stream(60, 7))  # the fork numbers on from its parent's
    assert sorted(p.id for p in store.passages(SessionKey("f", 0))) == list(
        range(1, len(store.passages(SessionKey("f", 0))) + 1)
    )
    passages = store.passages(SessionKey("c", 0))
    cut = next(p for p in passages if len(p.tokens) > 1)
    store.trim(SessionKey("c", 0), cut.logical[0] + 1, piece)
    assert store.passages(SessionKey("c", 0))[-1].id == cut.id
    assert store.passages(SessionKey("c", 0))[-1].created == cut.created
    found = store.search(SessionKey("a", 0), "whale zebraquartz", 50)
    assert found and {c.passage_id for c in found} <= {
        p.id for p in store.passages(SessionKey("a", 0))
    }
    assert store.passages(SessionKey("a", 0), [found[0].passage_id])[0].id == found[0].passage_id


def old_store(db: sqlite3.Connection, text: str) -> list[tuple[str, int]]:
    """The tables of a store from before numbers and per-tenant indexes (one shared index), with
    four passages of `text`, sessions a, b, a, b: their (session, row id)."""
    db.executescript(
        """CREATE TABLE passages (id INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL,
        reset_count INTEGER NOT NULL, logical_start INTEGER NOT NULL, logical_end INTEGER NOT
        NULL, tokens BLOB NOT NULL, text TEXT NOT NULL, sealed INTEGER NOT NULL, created REAL NOT
        NULL);
        CREATE VIRTUAL TABLE passages_fts USING fts5(text, tokenize='porter unicode61');"""
    )
    rows = []
    for i, session in enumerate("abab"):
        cur = db.execute(
            "INSERT INTO passages (session, reset_count, logical_start, logical_end, tokens, text,"
            " sealed, created) VALUES (?, 0, ?, ?, ?, ?, 1, 0)",
            (session, 10 * i, 10 * i + 1, (7).to_bytes(4, "little"), text),
        )
        db.execute("INSERT INTO passages_fts (rowid, text) VALUES (?, ?)", (cur.lastrowid, text))
        rows.append((session, int(cur.lastrowid or 0)))
    db.commit()
    return rows


def test_a_store_from_before_numbers_keeps_its_passages_ids(tmp_path: Path) -> None:
    """Opened on a file whose passages had only the shared row id: each keeps that id as its
    number (receipts and listings made before stay right), and its session generation numbers on
    from there."""
    path = tmp_path / "journal.db"
    db = sqlite3.connect(path)
    old = old_store(db, "whale")  # row ids 1 and 3 for session a, 2 and 4 for b
    db.close()
    store = store_in(tmp_path)
    assert sorted(p.id for p in store.passages(SessionKey("a", 0))) == [
        i for s, i in old if s == "a"
    ]
    assert {c.passage_id for c in store.search(SessionKey("b", 0), "whale", 10)} == {
        i for s, i in old if s == "b"
    }
    store.add_evicted(SessionKey("a", 0), 100, stream(30), [False] * 30, piece)
    numbers = sorted(p.id for p in store.passages(SessionKey("a", 0)))
    assert numbers[:2] == [1, 3] and numbers[2] == 4  # after its highest old id, 3
    store.db.commit()
    store = store_in(tmp_path)  # opened again: nothing renumbered
    assert sorted(p.id for p in store.passages(SessionKey("a", 0))) == numbers


def test_pruning_at_the_cap_reads_the_oldest_passages_not_every_row(tmp_path: Path) -> None:
    """Each eviction past `memory_max_tokens` prunes about one passage: its work must not be a read
    of every passage stored (counted in SQLite VM steps, which are deterministic, not time)."""
    store = store_in(tmp_path, "fixed")
    key = SessionKey("s", 0)

    def steps_of_one_prune(n_passages: int) -> int:
        evict(store, stream(48 * n_passages, seed=n_passages), start=store.stats(key)[1], chunk=480)
        total = store.stats(key)[1]
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        store.db.set_progress_handler(count, 10)
        try:
            assert store.prune(key, total - 48) == 48  # the oldest passage goes
        finally:
            store.db.set_progress_handler(None, 10)
        return steps[0] * 10

    small = steps_of_one_prune(1000)
    large = steps_of_one_prune(7000)  # eight times the passages stored
    # reading every row grows with them (here 8,600 -> 65,800 steps); what remains is FTS5's own
    # delete, which grows with the index's segments (600 -> 1,800)
    assert large < 4 * small, (small, large)


def test_a_tenant_search_costs_the_same_whatever_another_tenant_stored(tmp_path: Path) -> None:
    """Each tenant's passages are in its own full-text index: alice's search of "whale" does the
    same work before and after bob stores 1,000 passages full of whales (with one index shared,
    the lookup read every whale of bob's: a tenant timing its recalls learnt how common a word is
    in the others' memories). The same search from bob's side does grow: the count can tell."""
    store = store_in(tmp_path)
    alice, bob = SessionKey("a", 0, "alice"), SessionKey("b", 0, "bob")
    for i in range(0, 400, 16):
        part = stream(16, seed=i)
        store.add_evicted(alice, i, part, [False] * 16, piece)
    whale = WORDS.index("whale")
    search = lambda key: lambda: store.search(key, "whale ships", 10)  # noqa: E731
    store.add_evicted(bob, 0, [whale] * 16, [False] * 16, piece)
    store.db.commit()
    search(alice)(), search(bob)()  # each tenant's terms view made on this connection
    before = vm_steps(store, search(alice)), vm_steps(store, search(bob))
    for i in range(16, 48_000, 16):
        store.add_evicted(bob, i, [whale] * 16, [False] * 16, piece)
    store.db.commit()
    assert len(store.passages(bob)) == 1000 and store.search(alice, "whale ships", 10)
    assert vm_steps(store, search(alice)) == before[0]
    assert vm_steps(store, search(bob)) > 10 * before[1]


def test_a_store_with_one_shared_index_is_split_by_tenant(tmp_path: Path) -> None:
    """A journal from before per-tenant indexes: each passage moves to its session's tenant's
    index (the journal's sessions say whose), the shared index goes, and searches find the same."""
    journal = Journal(tmp_path / "journal.db")
    for session, tenant in (("a", "alice"), ("b", "bob")):
        journal.put_session(session, tenant, {}, "live", "")
    db = journal.db
    old_store(db, "a whale")
    store = MemoryStore(db, Segmenting("text"))
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "passages_fts" not in tables and len(store.words.all()) == 2
    for session, tenant in (("a", "alice"), ("b", "bob")):
        key = SessionKey(session, 0, tenant)
        assert len(store.search(key, "whale", 10)) == 2
        index = store.words.table(tenant)
        assert db.execute(f"SELECT COUNT(*) FROM {index}").fetchone()[0] == 2
