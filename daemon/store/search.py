"""Searching the memory: BM25 over one session generation's passages, with FTS5's stemming, and
sentence vectors beside it (hybrid: the two rankings fused), so a question in other words than the
stored text still finds it."""

from __future__ import annotations

import math
import re
import sqlite3
from collections.abc import Sequence

import numpy as np

from sinkd.cachepolicy.recall_plan import Candidate
from sinkd.daemon.store.embedder import DIM, Embedder
from sinkd.daemon.store.passages import SessionKey
from sinkd.daemon.store.speakers import UNKNOWN
from sinkd.daemon.store.word_index import WordIndexes

LEXICAL_WEIGHT = 0.15
EMBED_BATCH = 32
MAX_EMBED_PER_SEARCH = 1024  # passages a search embeds on demand (~13 ms each here); the rest wait

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
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n+")


def sentences_of(text: str) -> list[str]:
    """A passage's sentences and lines with a word in them (none: a passage of no words has no
    vector and is found by BM25 alone)."""
    return [t.strip() for t in _SENTENCE_END.split(text) if _WORD.search(t)]


def query_terms(query: str) -> list[str]:
    """The query's content words, lowercased, in order, without repeats (at most 32)."""
    seen: dict[str, None] = {}
    for w in _WORD.findall(query.lower()):
        if w not in _STOPWORDS and (len(w) > 1 or w.isdigit()):
            seen.setdefault(w, None)
    return list(seen)[:MAX_QUERY_TERMS]


def vectors_of(embedder: Embedder, rows: Sequence[tuple[int, str]]) -> list[tuple[int, str, bytes]]:
    """(id, text, vectors) for each (id, text): a passage's vectors are one blob, its sentences'
    in order. Touches no database: a worker thread may run it."""
    sentences = [sentences_of(text) for _, text in rows]
    flat = [t for group in sentences for t in group]
    order = sorted(range(len(flat)), key=lambda i: len(flat[i]))  # batches of like lengths
    vectors = np.zeros((len(flat), DIM), np.float32)
    for i in range(0, len(order), EMBED_BATCH):
        part = order[i : i + EMBED_BATCH]
        vectors[part] = embedder.embed([flat[j] for j in part])
    out, at = [], 0
    for (i, text), group in zip(rows, sentences, strict=True):
        out.append((i, text, vectors[at : at + len(group)].tobytes()))
        at += len(group)
    return out


class PassageSearch:
    def __init__(
        self, db: sqlite3.Connection, words: WordIndexes, embedder: Embedder | None = None
    ) -> None:
        self.db = db
        self.words = words
        self.embedder = embedder
        self._last_query: tuple[str, np.ndarray] | None = None

    def search(
        self,
        key: SessionKey,
        query: str,
        limit: int,
        embed_missing: bool = True,
        by_meaning: bool = True,
        leave_out: str | None = None,
    ) -> list[Candidate]:
        """The session generation's passages that either search finds, best first (in the
        tenant's memory, those said in conversation `leave_out` left out: the asking one's).

        `by_meaning` False: BM25 alone, the query not embedded (a turn that needs no past).

        `embed_missing` False: only the passages that have their vectors already take part in
        the dense search (a lookup: no passage is embedded now; the newest evicted ones may not
        have theirs yet, and BM25 still sees them).

        BM25 alone where no embedder is loaded. Otherwise a passage's score is its closest
        sentence's cosine to the query plus 0.15 times its BM25 over the query's best BM25: the
        vectors carry paraphrase, the words break ties and keep exact names first. Chosen on the
        chat arm's facts (bench/README.md, "recall retrieval"): reciprocal rank fusion let BM25's
        chance matches in unrelated text outvote the vectors on paraphrased questions."""
        spans, numbers, speakers, origins = self._passages(key, leave_out)
        if not spans:
            return []
        lexical = self._bm25(key, query, spans)
        dense = (
            self._dense(key, query, embed_missing, spans)
            if self.embedder is not None and by_meaning
            else {}
        )
        if not dense:
            ranked = sorted(lexical, key=lambda d: (-lexical[d], spans[d]))[:limit]
            return [
                self._candidate(d, lexical[d], spans, numbers, speakers, origins, lexical, {})
                for d in ranked
            ]
        top = max(lexical.values(), default=0.0)
        fused = {
            d: dense.get(d, -1.0) + LEXICAL_WEIGHT * (lexical.get(d, 0.0) / top if top > 0 else 0.0)
            for d in dense.keys() | lexical.keys()
        }
        ranked = sorted(fused, key=lambda d: (-fused[d], spans[d]))[:limit]
        return [
            self._candidate(d, fused[d], spans, numbers, speakers, origins, lexical, dense)
            for d in ranked
        ]

    @staticmethod
    def _candidate(
        d: int,
        score: float,
        spans: dict[int, tuple[int, int]],
        numbers: dict[int, int],
        speakers: dict[int, str],
        origins: dict[int, tuple[str, float]],
        lexical: dict[int, float],
        dense: dict[int, float],
    ) -> Candidate:
        a, b = spans[d]
        conversation, said_at = origins.get(d, ("", 0.0))
        return Candidate(
            numbers[d], (a, b), b - a, score, lexical.get(d, 0.0), dense.get(d, 0.0), speakers[d],
            conversation, said_at,
        )  # fmt: skip

    def _passages(
        self, key: SessionKey, leave_out: str | None = None
    ) -> tuple[
        dict[int, tuple[int, int]], dict[int, int], dict[int, str], dict[int, tuple[str, float]]
    ]:
        """Each passage's range, number and speaker by row id, and, in the tenant's memory, the
        conversation that said it and when."""
        spans, numbers, speakers, origins = {}, {}, {}, {}
        for i, a, b, number, speaker, origin, created in self.db.execute(
            "SELECT id, logical_start, logical_end, number, speaker, origin_session, created"
            " FROM passages WHERE session=? AND reset_count=?",
            (key.session_id, key.reset_count),
        ):
            if origin is not None and origin == leave_out:
                continue
            spans[int(i)], numbers[int(i)] = (int(a), int(b)), int(number)
            speakers[int(i)] = speaker or UNKNOWN
            if origin is not None:
                origins[int(i)] = (str(origin), float(created))
        return spans, numbers, speakers, origins

    def _bm25(
        self, key: SessionKey, query: str, spans: dict[int, tuple[int, int]]
    ) -> dict[int, float]:
        """BM25 over this session generation's passages alone (higher is better).

        Not FTS5's `bm25()`: it takes its statistics (passage count, lengths, how many passages
        hold a word) from the whole index, every session of the tenant, so another session's text
        would move a session's scores. Here they come from the session's own passages: FTS5 finds
        a word's occurrences (its porter stems, as a MATCH would) in the tenant's own index (so no
        other tenant's text costs the lookup anything: word_index.py), the length of a passage is
        its tokens, and the weights are FTS5's (k1 1.2, b 0.75, idf log((N - n + 0.5) /
        (n + 0.5)), at least 1e-6).
        """
        stems = self._stems(query_terms(query))
        if not stems:
            return {}
        length = {i: b - a for i, (a, b) in spans.items()}
        n, avgdl = len(spans), max(sum(length.values()) / len(spans), 1.0)
        score: dict[int, float] = {}
        self.words.table(key.tenant)  # its terms view exists on this connection
        terms = self.words.terms(key.tenant)
        for stem in stems:
            hits = self.db.execute(
                f"SELECT v.doc, COUNT(*) FROM temp.{terms} v JOIN passages p ON p.id = v.doc"
                " WHERE v.term=? AND p.session=? AND p.reset_count=? GROUP BY v.doc",
                (stem, key.session_id, key.reset_count),
            ).fetchall()
            hits = [h for h in hits if h[0] in length]  # none left out (the asker's own words)
            idf = math.log((n - len(hits) + 0.5) / (len(hits) + 0.5))
            idf = idf if idf > 0 else 1e-6
            for doc, tf in hits:
                norm = _K1 * (1 - _B + _B * length[doc] / avgdl)
                score[doc] = score.get(doc, 0.0) + idf * tf * (_K1 + 1) / (tf + norm)
        return score

    def _dense(
        self, key: SessionKey, query: str, embed_missing: bool, spans: dict[int, tuple[int, int]]
    ) -> dict[int, float]:
        """Each passage's closest sentence to the query, by cosine (the session's passages only).
        Per sentence, not per passage: a passage cut from a turn holds other text too, and its
        mean vector drifts from the one sentence a question is about."""
        assert self.embedder is not None
        if embed_missing:
            self.index(key, MAX_EMBED_PER_SEARCH)
        rows = self.db.execute(
            "SELECT id, vector FROM passages WHERE session=? AND reset_count=?"
            " AND vector IS NOT NULL AND LENGTH(vector) > 0",
            (key.session_id, key.reset_count),
        ).fetchall()
        rows = [r for r in rows if int(r[0]) in spans]
        if not rows:
            return {}
        q = self._query_vector(query)
        matrix = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(-1, DIM)
        counts = np.array([len(r[1]) // (4 * DIM) for r in rows])
        best = np.maximum.reduceat(matrix @ q, np.concatenate([[0], np.cumsum(counts)[:-1]]))
        return {int(r[0]): float(c) for r, c in zip(rows, best, strict=True)}

    def _query_vector(self, query: str) -> np.ndarray:
        """The query's vector; the last one is kept (a turn's lookup, then its full search)."""
        assert self.embedder is not None
        if self._last_query is None or self._last_query[0] != query:
            self._last_query = (query, self.embedder.embed([query])[0])
        return self._last_query[1]

    def index(self, key: SessionKey | None, most: int) -> int:
        """Embed the sentences of up to `most` passages that have no vectors yet (of one session,
        or any), newest first, here and now; returns how many passages. Derived data: vectors
        lost in a crash are made again."""
        if self.embedder is None:
            return 0
        rows = self.unindexed(key, most)
        return self.write_vectors(vectors_of(self.embedder, rows)) if rows else 0

    def unindexed(
        self, key: SessionKey | None, most: int, tenant: str | None = None
    ) -> list[tuple[int, str]]:
        """(id, text) of up to `most` passages without vectors (of one session, one tenant's, or
        any), newest first."""
        if most < 1:
            return []
        if key is not None:  # the session's own rows, never a scan of every tenant's to embed
            sql = (
                "FROM passages INDEXED BY passages_by_number WHERE session=? AND reset_count=?"
                " AND vector IS NULL"
            )
            args: list[object] = [key.session_id, key.reset_count]
        elif tenant is not None:
            sql = (
                "FROM passages INDEXED BY passages_unindexed_by_tenant WHERE tenant=?"
                " AND vector IS NULL"
            )
            args = [tenant]
        else:
            sql, args = "FROM passages WHERE vector IS NULL", []
        rows = self.db.execute(
            f"SELECT id, text {sql} ORDER BY id DESC LIMIT ?", (*args, most)
        ).fetchall()
        return [(int(i), str(t)) for i, t in rows]

    def tenants_waiting(self) -> list[str]:
        """The tenants with passages still to embed, in order of name."""
        return [
            str(r[0])
            for r in self.db.execute(
                "SELECT DISTINCT tenant FROM passages INDEXED BY passages_unindexed_by_tenant"
                " WHERE vector IS NULL ORDER BY tenant"
            )
        ]

    def write_vectors(self, made: Sequence[tuple[int, str, bytes]]) -> int:
        """Store vectors made for (id, text): only where the passage still holds that text and
        has none (a passage that grew, or was forgotten, meanwhile takes nothing)."""
        n = 0
        for i, text, blob in made:
            n += self.db.execute(
                "UPDATE passages SET vector=? WHERE id=? AND text=? AND vector IS NULL",
                (blob, i, text),
            ).rowcount
        return n

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
            # merged back to empty: otherwise each query leaves a segment, and the next reads it
            self.db.execute("INSERT INTO temp.query_text (query_text) VALUES ('optimize')")
            if opened:
                self.db.commit()  # the temp database only: nothing of the journal's
        return list(dict.fromkeys(str(r[0]) for r in rows))
