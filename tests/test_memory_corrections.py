"""A correction in the tenant's memory across conversations (issue 62), with recall's real
sentence vectors (MiniLM): linked to the statement it corrects when it is kept, and brought first
by any search that finds that statement, though its own words are farther from the question."""

from __future__ import annotations

import sqlite3

import pytest

from sinkd.daemon.runtime.boot import DENSE, open_embedder
from sinkd.daemon.runtime.recall.across import with_corrections
from sinkd.daemon.store.embedder import Embedder
from sinkd.daemon.store.memory import MemoryStore, Origin
from sinkd.daemon.store.tenant_memory import Selection, key_of

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    e, search = open_embedder(True)
    assert e is not None and search == DENSE, f"`sinkd models pull minilm-l6-v2` first: {search}"
    return e


def keep(store: MemoryStore, conversation: str, text: str) -> None:
    data = list(text.encode())
    store.across.keep("alice", Origin(conversation, 0, (0, len(data))), data,
                      lambda t: bytes([t]), "user", 1)  # fmt: skip
    store.finder.index(key_of("alice"), 100)  # its vectors, as the indexer makes them


def texts(store: MemoryStore, query: str) -> list[str]:
    found = with_corrections(store, "alice", store.search(key_of("alice"), query, 3))
    by_id = {p.id: p.text for p in store.passages(key_of("alice"), [c.passage_id for c in found])}
    return [by_id[c.passage_id] for c in found]


def test_a_correction_is_linked_to_what_it_corrects_and_found_first(embedder: Embedder) -> None:
    store = MemoryStore(sqlite3.connect(":memory:"), embedder=embedder)
    keep(store, "s_a", "One thing about me: I collect old clocks.")
    keep(store, "s_b", "My grandfather collects old radios and lamps.")
    keep(store, "s_c", "I read about how rain forms last week.")
    keep(store, "s_x", "One thing about me: I am learning Finnish at night school.")
    keep(store, "s_y", "Correction, that changed: I am learning Korean at night school.")
    assert store.across.link_correction("alice", embedder, "s_y") == 4
    keep(store, "s_d", "Correction, that changed: I collect old stamps.")
    (original,) = store.across.passages("alice", Selection(conversation="s_a"), 1)
    # the clocks, not the other correction (both open with "Correction, that changed:")
    assert store.across.link_correction("alice", embedder, "s_d") == original.id
    plain = store.search(key_of("alice"), "What kind of thing do I hoard?", 3)
    assert plain[0].passage_id != 6  # the search alone ranks the correction lower
    assert texts(store, "What kind of thing do I hoard?")[0].endswith("I collect old stamps.")
    keep(store, "s_e", "Actually the trains to Peru leave at noon now.")  # like nothing kept
    assert store.across.link_correction("alice", embedder, "s_e") is None
