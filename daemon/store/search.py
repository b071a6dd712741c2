"""Searching the memory: BM25 over one session generation's passages, with FTS5's stemming."""

from __future__ import annotations

import math
import re
import sqlite3

from sinkd.cachepolicy.recall import Candidate
from sinkd.daemon.store.passages import SessionKey

_K1, _B = 1.2, 0.75  # FTS5's BM25 weights

# words too common to say what a query is about
_STOPWORDS = frozenset(
    """a about above after again all am an and any are as at be been before being below between
    both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me more
    most my myself no nor not now of off on once only or other our ours out over own same she
    should so some such than that the their theirs them then there these they this those through
    to too under until up very was we were what when where which while who whom why will with
    would you your yours yourself tell said say says remember recall earlier""".split()
)
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
MAX_QUERY_TERMS = 32


def query_terms(query: str) -> list[str]:
    """The query's content words, lowercased, in order, without repeats (at most 32)."""
    seen: dict[str, None] = {}
    for w in _WORD.findall(query.lower()):
        if w not in _STOPWORDS and (len(w) > 1 or w.isdigit()):
            seen.setdefault(w, None)
    return list(seen)[:MAX_QUERY_TERMS]


class PassageSearch:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def search(self, key: SessionKey, query: str, limit: int) -> list[Candidate]:
        """BM25 over this session generation's passages alone, best first (higher is better).

        Not FTS5's `bm25()`: it takes its statistics (passage count, lengths, how many passages
        hold a word) from the whole index, every session and tenant, so another's text would move
        a session's scores, and which passages it recalls, and the scores would tell of it. Here
        they come from the session's own passages: FTS5 finds a word's occurrences (its porter
        stems, as a MATCH would), the length of a passage is its tokens, and the weights are
        FTS5's (k1 1.2, b 0.75, idf log((N - n + 0.5) / (n + 0.5)), at least 1e-6).
        """
        stems = self._stems(query_terms(query))
        spans, numbers = {}, {}
        for i, a, b, number in self.db.execute(
            "SELECT id, logical_start, logical_end, number FROM passages"
            " WHERE session=? AND reset_count=?",
            (key.session_id, key.reset_count),
        ):
            spans[int(i)], numbers[int(i)] = (int(a), int(b)), int(number)
        if not stems or not spans:
            return []
        length = {i: b - a for i, (a, b) in spans.items()}
        n, avgdl = len(spans), max(sum(length.values()) / len(spans), 1.0)
        score: dict[int, float] = {}
        for stem in stems:
            hits = self.db.execute(
                "SELECT v.doc, COUNT(*) FROM temp.passage_terms v JOIN passages p ON p.id = v.doc"
                " WHERE v.term=? AND p.session=? AND p.reset_count=? GROUP BY v.doc",
                (stem, key.session_id, key.reset_count),
            ).fetchall()
            idf = math.log((n - len(hits) + 0.5) / (len(hits) + 0.5))
            idf = idf if idf > 0 else 1e-6
            for doc, tf in hits:
                norm = _K1 * (1 - _B + _B * length[doc] / avgdl)
                score[doc] = score.get(doc, 0.0) + idf * tf * (_K1 + 1) / (tf + norm)
        ranked = sorted(score, key=lambda d: (-score[d], spans[d]))[:limit]
        return [Candidate(numbers[d], spans[d], length[d], score[d]) for d in ranked]

    def _stems(self, terms: list[str]) -> list[str]:
        """The index's forms of the query's words (porter, unicode61), in order, without repeats:
        FTS5's own tokenizer, over a one-row table of this connection's."""
        if not terms:
            return []
        opened = not self.db.in_transaction  # then the temp write must not leave one open
        self.db.execute(
            "INSERT INTO temp.query_text (rowid, text) VALUES (1, ?)", (" ".join(terms),)
        )
        try:
            rows = self.db.execute("SELECT term FROM temp.query_terms ORDER BY offset").fetchall()
        finally:
            self.db.execute("DELETE FROM temp.query_text")
            if opened:
                self.db.commit()  # the temp database only: nothing of the journal's
        return list(dict.fromkeys(str(r[0]) for r in rows))
