"""Dense search beside BM25, on the real MiniLM weights (no LLM): a question in other words than
the stored sentence finds it, BM25 alone does not; exact words stay first; the vectors are the
session's own and leave with their passage."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from sinkd.cachepolicy.recall_plan import RecallConfig
from sinkd.daemon.runtime.boot import DENSE, open_embedder
from sinkd.daemon.store.embedder import Embedder
from sinkd.daemon.store.journal import Journal
from sinkd.daemon.store.memory import MemoryStore, Segmenting
from sinkd.daemon.store.passages import SessionKey
from tests.support.sql import vm_steps

pytestmark = pytest.mark.unit

FILLER = (
    "And the earth was without form, and void; and darkness was upon the face of the deep. "
    "And the evening and the morning were the third day. "
    "And he built there an altar unto the LORD, and called upon the name of the LORD. "
    "And the waters prevailed upon the earth an hundred and fifty days. "
)
FACTS = {
    "Ada": "Before we go on, one thing about me. My name is Ada. Let us continue.\n",
    "carpenter": "A small personal note. I work as a carpenter. Now, back to the text.\n",
    "tulip42": "By the way. The wifi password is tulip42. Please carry on.\n",
}
PARAPHRASES = {
    "Ada": "What am I called?",
    "carpenter": "What is my profession?",
    "tulip42": "What is the network passphrase?",
}


def words(text: str) -> list[str]:
    return re.findall(r"\s*\S+", text)


class Tokens:
    """Words as tokens: each distinct word one id (the store needs ids and their bytes)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def of(self, text: str) -> list[int]:
        return [self.ids.setdefault(w, len(self.ids)) for w in words(text)]

    def piece(self, token: int) -> bytes:
        return next(w for w, i in self.ids.items() if i == token).encode()


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    e, search = open_embedder(True)
    assert e is not None and search == DENSE, f"`sinkd models pull minilm-l6-v2` first: {search}"
    return e


def fill(store: MemoryStore, key: SessionKey, vocab: Tokens, facts: dict[str, str]) -> None:
    text = FILLER * 3 + "".join(f + FILLER * 2 for f in facts.values())
    tokens = vocab.of(text)
    store.add_evicted(key, 0, tokens, [False] * len(tokens), vocab.piece)


def best_texts(store: MemoryStore, key: SessionKey, query: str, n: int = 2) -> list[str]:
    found = store.search(key, query, n)
    by_id = {p.id: p.text for p in store.passages(key, [c.passage_id for c in found])}
    return [by_id[c.passage_id] for c in found]


def test_a_paraphrase_is_nearer_its_sentence_than_other_text(embedder: Embedder) -> None:
    v = embedder.embed(["What am I called?", "My name is Ada.", FILLER.split(". ")[0]])
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.1


def test_dense_search_finds_what_bm25_cannot_and_keeps_exact_words(
    tmp_path: Path, embedder: Embedder
) -> None:
    key, vocab = SessionKey("s", 0), Tokens()
    dense = MemoryStore(Journal(tmp_path / "a.db").db, Segmenting(), embedder)
    lexical = MemoryStore(Journal(tmp_path / "b.db").db, Segmenting(), None)
    fill(dense, key, vocab, FACTS)
    fill(lexical, key, vocab, FACTS)
    for value, question in PARAPHRASES.items():
        assert not any(value in t for t in best_texts(lexical, key, question))
        assert any(value in t for t in best_texts(dense, key, question)), question
        c = dense.search(key, question, 1)[0]
        assert c.dense >= RecallConfig().dense_threshold and c.strong(RecallConfig())
    # a question with the stored word still finds it first
    assert "tulip42" in best_texts(dense, key, "the wifi password tulip42", 1)[0]


def test_vectors_are_the_sessions_own_and_leave_with_their_passage(
    tmp_path: Path, embedder: Embedder
) -> None:
    db = Journal(tmp_path / "j.db").db
    store = MemoryStore(db, Segmenting(), embedder)
    alice, bob, vocab = SessionKey("alice", 0), SessionKey("bob", 0), Tokens()
    fill(store, alice, vocab, {"Ada": FACTS["Ada"]})
    fill(store, bob, vocab, {"carpenter": FACTS["carpenter"]})
    assert store.finder.index(None, 10_000) > 0
    assert not any("carpenter" in t for t in best_texts(store, alice, "What is my profession?", 16))
    ada = next(p for p in store.passages(alice) if "Ada" in p.text)
    store.forget(alice, ada.id)
    db.commit()
    rows = db.execute(
        "SELECT COUNT(*) FROM passages WHERE session='alice' AND text LIKE '%Ada%'"
    ).fetchone()
    assert rows[0] == 0
    assert not any("Ada" in t for t in best_texts(store, alice, "What am I called?", 16))
    # a passage that grows is embedded again: its vector never lags its text
    n = db.execute("SELECT COUNT(*) FROM passages WHERE vector IS NULL").fetchone()[0]
    assert n == 0
    store.drop("bob")
    assert db.execute("SELECT COUNT(*) FROM passages WHERE session='bob'").fetchone()[0] == 0


def test_a_store_from_before_dense_search_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE passages (id INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL,"
        " reset_count INTEGER NOT NULL, logical_start INTEGER NOT NULL, logical_end INTEGER NOT"
        " NULL, tokens BLOB NOT NULL, text TEXT NOT NULL, sealed INTEGER NOT NULL, created REAL"
        " NOT NULL)"
    )
    db.commit()
    MemoryStore(db, Segmenting(), None)
    assert "vector" in {r[1] for r in db.execute("PRAGMA table_info(passages)")}


def test_a_tenant_dense_search_reads_no_other_tenant_rows(
    tmp_path: Path, embedder: Embedder
) -> None:
    """The dense half of a search (its passages' vectors, those still to embed) reads the
    session's own rows: its SQL work is the same, to a B-tree seek's depth (the log of every
    row's count: docs/security.md), before and after another tenant stores 400 passages of the
    same facts, none of them embedded yet; reading those would cost hundreds of steps more
    (tests/test_memory_store.py counts the word index's side the same way)."""
    store = MemoryStore(Journal(tmp_path / "journal.db").db, Segmenting("text"), embedder)
    vocab = Tokens()
    alice, bob = SessionKey("a", 0, "alice"), SessionKey("b", 0, "bob")
    fill(store, alice, vocab, FACTS)
    store.db.commit()
    question = PARAPHRASES["carpenter"]
    assert "carpenter" in best_texts(store, alice, question)[0]  # alice's vectors made

    def search() -> None:
        store.db.commit()  # each search starts outside a transaction, as between steps
        store.search(alice, question, 2)

    search()
    before = vm_steps(store, search)
    tokens = vocab.of("".join(FACTS.values()) * 4)
    for i in range(100):
        store.add_evicted(bob, i * len(tokens), tokens, [False] * len(tokens), vocab.piece)
    store.db.commit()
    assert len(store.unindexed(1000)) >= 400  # bob's, waiting for their vectors
    assert 0 <= vm_steps(store, search) - before <= 3
