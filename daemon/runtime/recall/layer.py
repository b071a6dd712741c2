"""Recall at run time: keep what the stream evicts, and bring the best of it back on request.

Engine thread only (the store shares the journal's connection and transaction). The executor hands
every eviction to `evicted`; a job that asks for recall is given its passages by `prepare` before
its first token is planned; the lifecycle calls `forked`, `dropped` and `forget`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sinkd.cachepolicy.recall_plan import (
    Candidate,
    RecallConfig,
    RecalledSpan,
    check_recallable,
    in_any,
    plan_recall,
    select,
)
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.engine.vocab import content_mark
from sinkd.daemon.metrics import Metrics
from sinkd.daemon.runtime.api import RecallReport
from sinkd.daemon.runtime.recall import across as across_words
from sinkd.daemon.runtime.recall.across import Said, ranked_across, with_corrections
from sinkd.daemon.runtime.recall.indexing import Indexer
from sinkd.daemon.runtime.sessions import Session
from sinkd.daemon.store import tenant_memory
from sinkd.daemon.store.memory import MemoryStore, Origin, Passage, SessionKey, query_terms
from sinkd.daemon.store.passages import text_of
from sinkd.daemon.store.speakers import ASSISTANT, NO_TURNS, TurnMarks, Turns
from sinkd.daemon.store.tenant_memory import Selection
from sinkd.errors import InvalidInput

MAX_QUERY_BYTES = 4096
# before a recalled passage the model itself said: its words come back marked as its own
OWN_WORDS = "(your own earlier reply, not something the user said) "
# a chat turn that asks no question and speaks of no earlier turn (past.py)
WORDS_ALONE = "bm25 alone: the turn asks no question and speaks of nothing said before"
SEARCH_POOL = 16  # candidates read from the index before the budget picks
log = logging.getLogger("sinkd.recall")


@dataclass(frozen=True)
class RecallAsk:
    """What a job asks of recall: the query, the settings to use and the text around each
    passage (`frame`: before and after, as text; the chat frame is a turn of its own)."""

    query: str
    config: RecallConfig
    frame: tuple[str, str] = ("", "\n")
    # a passage goes back without the turn markers it held: a recalled copy is text, and only the
    # frame (the template's own) carries control tokens
    strip_control: bool = True
    insert_at: int = 0  # where in the job's tokens the passages go (after the question)
    # search by meaning too (the query embedded); a chat turn that needs no past: words alone
    by_meaning: bool = True
    # search the tenant's memory across conversations too, after the session's own
    across: bool = False


def said_by_model(c: Candidate) -> bool:
    return c.speaker == ASSISTANT


def theirs_first(strong: list[Candidate]) -> list[Candidate]:
    """The passages worth recalling, what anyone else said (the user, the system, a tool, appended
    text) before the model's own earlier words, each in score order: a reply the model made up
    must not come back with the standing of what the user told it. The model's words still come
    back after them, marked as its own (`OWN_WORDS`): on the locker chats that answered better
    than leaving them out (docs/recall.md, "Who said it")."""
    return sorted(strong, key=said_by_model)


def turns_of(engine: Engine) -> Turns:
    """How the model's template opens a turn, read off its rendering of a user turn (a model
    without a template: all its stream is text)."""
    if not engine.chat_template:
        return NO_TURNS
    vocab = engine.vocab
    mark = content_mark(0)
    head = vocab.render_chat([("user", mark)], add_assistant=False).partition(mark)[0]
    header = vocab.tokenize_framed(head, [])
    return Turns(TurnMarks.of(header, vocab.is_control, vocab.piece), vocab.is_control)


def leftover(config: RecallConfig, chosen: list[Candidate], framing: int) -> RecallConfig | None:
    """The budget and passages the session's own memory left (None: none)."""
    budget = config.budget - sum(c.n_tokens + framing for c in chosen)
    passages = config.passages - len(chosen)
    if budget < 1 or passages < 1:
        return None
    return dataclasses.replace(config, budget=budget, passages=passages)


def nothing_recalled(
    best_held: RecalledSpan | None,
    found: list[Candidate],
    strong_others: list[Candidate],
    held: dict[tuple[str, int], RecalledSpan],
) -> tuple[str, str]:
    """The report's note and the metric's outcome of a recall that brought nothing back."""
    if best_held is None and strong_others:
        best_held = held.get(strong_others[0].ref)
    if best_held is not None:
        a, b = best_held.stream
        whose = f" of conversation {best_held.conversation}" if best_held.conversation else ""
        return (
            f"nothing recalled: the best match, passage {best_held.passage_id}{whose}, is still"
            f" in the window (its copy at logical {a}-{b})"
        ), "in_window"
    if not found:
        return "nothing recalled: no stored passage matched the query", "empty"
    return "nothing recalled: no stored passage scored above the thresholds", "empty"


def in_window(session: Session) -> dict[tuple[str, int], RecalledSpan]:
    """Passages whose recalled copy the window still holds whole, by `ref` (the conversation
    they came from, "" for the session's own, and their number)."""
    start = session.seq.state.window_start
    return {s.ref: s for s in session.recalled if s.stream[0] >= start}


def chat_query(message: str) -> str:
    """What a chat turn's recall searches for: the end of the message, at most MAX_QUERY_BYTES
    (a question ends a message; the whole of a pasted document would cost a search per word)."""
    tail = message.encode("utf-8", errors="replace")[-MAX_QUERY_BYTES:]
    return tail.decode("utf-8", errors="ignore")


def check_query(query: str) -> None:
    if not query.strip():
        raise InvalidInput("recall: the query is empty")
    if len(query.encode("utf-8", errors="replace")) > MAX_QUERY_BYTES:
        raise InvalidInput(f"recall: the query is longer than {MAX_QUERY_BYTES} bytes")


class Recall:
    def __init__(
        self,
        store: Callable[[], MemoryStore],
        metrics: Metrics,
        max_tokens_per_session: int,
        across_max_tokens: int = 200_000,
    ) -> None:
        self._store = store
        self.metrics = metrics
        self.max_tokens = max_tokens_per_session
        self.across_max_tokens = across_max_tokens  # each tenant's memory across conversations
        self.indexer = Indexer()
        # how a search finds passages: "bm25+dense", or "bm25 alone: why" (set at load)
        self.search = "bm25 alone: the model is not loaded yet"
        self._engine_reads: tuple[Engine, Turns, list[int]] | None = None

    @property
    def store(self) -> MemoryStore:
        return self._store()

    def between_steps(self) -> None:
        """Engine thread, once per loop: vectors the worker made go into the store, and the next
        passages without one go to the worker (`Indexer`). Nearly free when there are none."""
        if not self.indexer.has_work:
            return
        try:
            self.indexer.between_steps(self.store)
        except Exception:  # search still works: it embeds what it needs, or falls back to BM25
            log.exception("indexing passages for dense recall failed; it stops until a restart")
            self.indexer.failed = True

    def close(self) -> None:
        self.indexer.close()

    def _of_engine(self, engine: Engine) -> tuple[Turns, list[int]]:
        """How this engine's template opens a turn, and `OWN_WORDS` as its tokens (made once per
        engine, not per eviction or per recall)."""
        known = self._engine_reads
        if known is None or known[0] is not engine:
            known = self._engine_reads = (
                engine,
                turns_of(engine),
                engine.vocab.tokenize(OWN_WORDS),
            )
        return known[1], known[2]

    def refresh(self, session: Session) -> None:
        session.memory_stats = self.store.stats(session.key)

    # --- as the stream evicts ---

    def evicted(
        self, engine: Engine, session: Session, logical_start: int, tokens: list[int]
    ) -> None:
        if not session.recall.mode.stores or not tokens:
            return
        spans = session.recalled
        skip = [in_any(logical_start + i, spans) for i in range(len(tokens))]
        stored = self.store.add_evicted(
            session.key,
            logical_start,
            tokens,
            skip,
            engine.vocab.piece,
            self._of_engine(engine)[0],
            session.retained.sinks,
        )
        self.metrics.memory_stored_tokens.inc(stored)
        if stored:
            self.indexer.noted()
        end = logical_start + len(tokens)
        if session.scrub_after is not None and end >= session.scrub_after:
            session.scrub_due, session.scrub_after = True, None  # a forgotten copy is gone now
        if spans and spans[0].stream[1] <= end:  # copies the stream has evicted entirely
            session.recalled = [s for s in spans if s.stream[1] > end]
            self.store.drop_recalls_before(session.key, end)
        pruned = self.store.prune(session.key, self.max_tokens)
        if pruned:
            self.metrics.memory_pruned_tokens.inc(pruned)
        self.refresh(session)

    # --- a job's recall, before its tokens are planned ---

    def prepare(self, engine: Engine, session: Session, ask: RecallAsk) -> list[int]:
        """Search, pick within the budget, lay out; returns the tokens to insert into the job at
        `ask.insert_at` (after the session's pending prefix) and records the spans on the
        session. The session's own memory first; then, where the conversation takes part, the
        tenant's memory across conversations (its other conversations' words), in what budget
        and passages the session's own left."""
        check_recallable(session.policy)
        t0 = time.monotonic()
        config = ask.config
        store = self.store
        held = in_window(session)
        own = self._found(store, session.key, ask, held)
        memory = tenant_memory.key_of(session.tenant)
        others = (
            with_corrections(
                store, session.tenant, self._found(store, memory, ask, held, session.id), session.id
            )
            if ask.across and session.recall.across
            else []
        )
        own_words = self._of_engine(engine)[1]
        bodies: dict[tuple[str, int], list[int]] = {}
        for p in store.passages(session.key, [c.passage_id for c in own]):
            head = own_words if p.speaker == ASSISTANT else []
            bodies["", p.id] = head + self._text(engine, p, ask)
        said: dict[tuple[str, int], str] = {}
        for p in store.passages(memory, [c.passage_id for c in others]) if others else []:
            head = engine.vocab.tokenize(across_words.heading(p.speaker, p.created))
            bodies[p.conversation, p.id] = head + self._text(engine, p, ask)
            said[p.conversation, p.id] = p.text
        found = [dataclasses.replace(c, n_tokens=len(bodies[c.ref])) for c in own + others]
        frame = engine.vocab.tokenize_framed  # the template's framing, around no content
        before = frame(ask.frame[0], []) if ask.frame[0] else []
        after = frame(ask.frame[1], []) if ask.frame[1] else []
        framing = len(before) + len(after)
        strong = theirs_first([c for c in found if c.strong(config) and not c.conversation])
        strong_others = ranked_across(
            [c for c in found if c.strong(config) and c.conversation],
            lambda c: across_words.says_it_corrects(said[c.ref]),
        )
        # the best match's copy is still in the window: the model has it, decode nothing again
        # (a turn that recalled it before costs the search alone)
        best_held = held.get(strong[0].ref) if strong else None
        chosen: list[Candidate] = []
        if best_held is None:
            chosen = select(
                [c for c in strong if c.ref not in held], config, framing, second=said_by_model
            )
        rest = leftover(config, chosen, framing)
        if rest is not None and strong_others and strong_others[0].ref not in held:
            fresh = [c for c in strong_others if c.ref not in held]
            chosen += select(fresh, rest, framing, ranked=True)
        if any(c.conversation for c in chosen):
            session.took_across = True
        self.metrics.recall_latency.observe(time.monotonic() - t0)
        report = RecallReport(
            query_sha256=hashlib.sha256(ask.query.encode()).hexdigest(),
            query_terms=len(query_terms(ask.query)),
            candidates=len(found),
            best_score=max((c.score for c in found), default=0.0),
            threshold=config.threshold,
            note="",
            search=self.search if ask.by_meaning or not store.dense else WORDS_ALONE,
        )
        if not chosen:
            note, outcome = nothing_recalled(best_held, found, strong_others, held)
            session.last_recall = dataclasses.replace(report, note=note)
            self.metrics.recalls.labels(outcome=outcome).inc()
            return []
        plan = plan_recall(
            session.policy,
            session.seq.state,
            chosen,
            len(before),
            len(after),
            time.time(),
            n_before=len(session.pending_prefix) + ask.insert_at,
        )
        tokens: list[int] = []
        for c in chosen:
            tokens += before + bodies[c.ref] + after
        assert len(tokens) == plan.n_tokens
        session.recalled = [*session.recalled, *plan.spans]
        store.add_recall(session.key, plan.spans)
        for span in plan.spans:
            session.seq.note_recall(span)
        n_across = sum(1 for c in chosen if c.conversation)
        session.last_recall = dataclasses.replace(
            report,
            note=f"recalled {len(plan.spans)} passage(s), {plan.n_tokens} tokens"
            + (f"; {n_across} from other conversations" if n_across else ""),
            recalled=tuple(plan.spans),
        )
        self.metrics.recalls.labels(outcome="recalled").inc()
        self.metrics.recalled_tokens.inc(plan.n_tokens)
        return tokens

    def _found(
        self,
        store: MemoryStore,
        key: SessionKey,
        ask: RecallAsk,
        held: dict[tuple[str, int], RecalledSpan],
        leave_out: str | None = None,
    ) -> list[Candidate]:
        """A lookup first: the passages that have their vectors already (nothing embedded now);
        unless its best is still in the window, search again with every passage's vector (the
        worker's batch in flight waited for, what is still missing embedded now)."""
        meaning = ask.by_meaning
        search = store.search
        found = search(key, ask.query, SEARCH_POOL, False, meaning, leave_out)
        lookup = theirs_first([c for c in found if c.strong(ask.config)])
        if meaning and not (lookup and lookup[0].ref in held) and store.unindexed(1, key=key):
            self.indexer.settle(store)
            found = search(key, ask.query, SEARCH_POOL, True, meaning, leave_out)
        return found

    @staticmethod
    def _text(engine: Engine, p: Passage, ask: RecallAsk) -> list[int]:
        return [t for t in p.tokens if not (ask.strip_control and engine.vocab.is_control(t))]

    # --- the tenant's memory across conversations ---

    def keep(self, engine: Engine, session: Session, said: Said, n_before: int) -> int:
        """A chat turn's words into the tenant's memory, as the turn starts (`n_before`: the
        tokens queued before the job's, a pending prefix). Returns passages kept."""
        if not session.recall.across:
            return 0
        session.user_turns += 1
        start = session.seq.state.n_seen + n_before + said.offset
        at = (start, start + len(said.tokens))
        across = self.store.across
        piece = engine.vocab.piece
        n = across.keep(
            session.tenant, Origin(session.id, session.reset_count, at, said.asked),
            said.tokens, piece, "user", session.user_turns,
        )  # fmt: skip
        if said.reply:
            n += across.keep(
                session.tenant, Origin(session.id, session.reset_count, at, True),
                engine.vocab.tokenize(said.reply), piece, ASSISTANT, session.user_turns - 1,
            )  # fmt: skip
        if n and said.tokens and across_words.says_it_corrects(text_of(said.tokens, piece)):
            embedder = self.store.embedder  # a correction: linked to what it corrects
            if embedder is not None:
                across.link_correction(session.tenant, embedder, session.id)
        if n:
            self.metrics.memory_stored_tokens.inc(len(said.tokens))
            self.indexer.noted()
            pruned = self.store.prune(tenant_memory.key_of(session.tenant), self.across_max_tokens)
            self.metrics.memory_pruned_tokens.inc(pruned)
        return n

    def made_private(self, session: Session) -> int:
        """The conversation leaves its tenant's memory: nothing more of it is kept or recalled
        across, and what it gave goes. Returns passages deleted."""
        session.recall = dataclasses.replace(session.recall, across=False)
        return self.store.across.drop_from(session.id, None)

    def across_passages(
        self, tenant: str, which: Selection, search: str, limit: int, dense_floor: float
    ) -> list[tuple[Passage, float | None]]:
        """The tenant's kept passages `which` names: the newest `limit`, or the best matches of
        `search`, ranked as a conversation's recall ranks them (`ranked_across`)."""
        store = self.store
        if not search:
            return [(p, None) for p in store.across.passages(tenant, which, limit)]
        check_query(search)
        key = tenant_memory.key_of(tenant)
        allowed = set(store.across.numbers(tenant, which))
        found = [
            c
            for c in store.search(key, search, 10_000)
            if (c.lexical > 0 or c.dense >= dense_floor) and c.passage_id in allowed
        ]
        found = [c for c in with_corrections(store, tenant, found) if c.passage_id in allowed]
        by_id = {p.id: p for p in store.passages(key, [c.passage_id for c in found])}
        # as a conversation's recall ranks them (a correction first among the close ones)
        found = ranked_across(
            found, lambda c: across_words.says_it_corrects(by_id[c.passage_id].text)
        )
        found = found[:limit]
        return [(by_id[c.passage_id], c.score) for c in found if c.passage_id in by_id]

    def forget_across(self, tenant: str, which: Selection, sessions: list[Session]) -> int:
        """Delete passages from the tenant's memory. A session that holds a live copy of one
        rewrites its files once the stream has evicted it; one that took copies before has
        its files rewritten now (its journal may hold an evicted copy)."""
        numbers = set(self.store.across.forget(tenant, which))
        self.metrics.memory_forgotten_passages.inc(len(numbers))
        for session in sessions if numbers else []:
            live = [
                s.stream[1] for s in session.recalled if s.conversation and s.passage_id in numbers
            ]
            if live:
                session.scrub_after = max([*live, session.scrub_after or 0])
            if session.took_across:
                session.scrub_due = True
        return len(numbers)

    def abandoned(self, session: Session) -> None:
        """A recall's job ended before all its tokens went in: its copies end where the stream
        does (positions past it will hold other tokens)."""
        self._end_copies_at_the_stream(session)

    def rewound(self, session: Session) -> None:
        """The stream went back (a regenerated turn): copies past its end are gone."""
        self._end_copies_at_the_stream(session)

    def _end_copies_at_the_stream(self, session: Session) -> None:
        n_seen = session.seq.state.n_seen
        session.recalled = [
            dataclasses.replace(r, stream=(r.stream[0], min(r.stream[1], n_seen)))
            for r in session.recalled
            if r.stream[0] < n_seen
        ]
        self.store.cut_recalls(session.key, n_seen)

    # --- reads and user control ---

    def passages(
        self, session: Session, search: str, limit: int, speaker: str | None = None
    ) -> list[tuple[Passage, float | None]]:
        store = self.store
        if search:
            check_query(search)
            dense_floor = session.recall.dense_threshold
            found = [  # what either search matched: a word, or a vector close enough
                c
                for c in store.search(session.key, search, limit if speaker is None else 10_000)
                if (c.lexical > 0 or c.dense >= dense_floor) and speaker in (None, c.speaker)
            ][:limit]
            by_id = {p.id: p for p in store.passages(session.key, [c.passage_id for c in found])}
            return [(by_id[c.passage_id], c.score) for c in found if c.passage_id in by_id]
        kept = [p for p in store.passages(session.key) if speaker in (None, p.speaker)]
        return [(p, None) for p in kept[-limit:]]

    def forget(
        self,
        session: Session,
        passage_id: int | None,
        logical: tuple[int, int] | None,
        speaker: str | None = None,
    ) -> int:
        """Delete passages; their tokens are to leave the journal and the snapshots too (the
        session's scrub), and a live recalled copy of one leaves them again when it is evicted."""
        ranges = self.store.forget(session.key, passage_id, logical, speaker)
        self.metrics.memory_forgotten_passages.inc(len(ranges))
        if ranges:
            session.scrub_due = True
            live = [
                s.stream[1]
                for s in session.recalled
                if not s.conversation
                and any(s.source[0] < b and a < s.source[1] for a, b in ranges)
            ]
            if live:
                session.scrub_after = max([*live, session.scrub_after or 0])
        self.refresh(session)
        return len(ranges)

    def forked(self, parent: Session, child: Session) -> None:
        child.recall = parent.recall
        child.recalled = list(parent.recalled)
        if parent.recall.mode.stores:
            self.store.copy(parent.key, child.key)
            self.refresh(child)

    def dropped(self, session_id: str, keep_reset_count: int | None) -> int:
        return self.store.drop(session_id, keep_reset_count)

    def purge(self) -> None:
        """A daemon without a state directory: its memory's private file, which no other
        connection opens, merged and its log truncated now."""
        if self.store.purge().busy:  # not expected: said rather than assumed gone
            log.warning("the memory's write-ahead log could not be truncated")

    # --- resume ---

    def resumed_spans(self, session: Session) -> None:
        """Before replay: the recalled copies the journal knows of, so a replayed eviction of a
        copy is not stored again."""
        session.recalled = self.store.recalls(session.key)
        session.took_across = any(s.conversation for s in session.recalled)

    def resumed(self, engine: Engine, session: Session) -> None:
        """After replay: drop what was committed ahead of the history the journal kept."""
        s = session.seq.state
        self.store.trim(session.key, max(s.window_start, session.policy.sinks), engine.vocab.piece)
        # copies still in the window stay recorded (a later eviction must skip them, after the next
        # restart too); only those past the journal's history go
        self._end_copies_at_the_stream(session)
        self.refresh(session)
