"""The session's memory of evicted text, under its owner's control: recall into the cache now,
read the stored passages, forget them (from disk, at once)."""

from __future__ import annotations

from collections.abc import Callable

from sinkd.cachepolicy.recall_plan import RecallMode
from sinkd.daemon.config import Settings
from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.runtime import lifecycle, requests
from sinkd.daemon.runtime.access import Access
from sinkd.daemon.runtime.api import (
    Erased,
    Handle,
    KeptSelection,
    PassageView,
    RecallRequest,
    RecallResult,
)
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.erasure import Erasure
from sinkd.daemon.runtime.loop.jobs import Job
from sinkd.daemon.runtime.loop.scheduler import Scheduler
from sinkd.daemon.runtime.recall.layer import Recall, RecallAsk, check_query
from sinkd.daemon.runtime.sessions import Principal, Session
from sinkd.daemon.runtime.turns import Turns
from sinkd.daemon.store.memory import Origin, Passage
from sinkd.daemon.store.speakers import SPEAKERS, UNKNOWN
from sinkd.daemon.store.tenant_memory import GIVEN, Selection
from sinkd.errors import FailedPrecondition, InvalidInput, NotFound, PermissionDenied


class Remembering:
    def __init__(
        self,
        access: Access,
        scheduler: Scheduler,
        turns: Turns,
        recall: Recall,
        durability: Durability | None,
        settings: Settings,
        erasure: Erasure,
    ) -> None:
        self.access = access
        self.scheduler = scheduler
        self.turns = turns
        self.recall = recall
        self.durability = durability
        self.settings = settings
        self.erasure = erasure
        # told the tenant (engine thread) whose text was forgotten: what else holds its text's
        # state goes too (its stored prefix states)
        self.on_forgot: Callable[[str], object] = lambda tenant: None
        # SessionElsewhere for a tenant marked moving (tenant_moves.py), checked by each write
        # on the engine thread: one whose call passed the edge before the mark does nothing
        self.served_here: Callable[[str], None] = lambda tenant: None

    def recall_into(
        self,
        principal: Principal,
        handle: Handle,
        query: str,
        budget: int | None = None,
        passages: int | None = None,
        threshold: float | None = None,
        timeout: float | None = None,
    ) -> RecallResult:
        """Search the session's memory and decode the best passages into its cache now (after
        whatever the stream holds)."""
        session = self.access.owned(principal, handle)
        check_query(query)
        current = session.recall
        if not session.policy.evicts:
            raise FailedPrecondition(
                f"session {session.id} uses the full policy: it never evicts, so nothing left the"
                " cache to be recalled"
            )
        if current.mode is RecallMode.OFF:
            raise FailedPrecondition(
                f"session {session.id} keeps no memory (recall mode off): nothing to recall"
            )
        config = requests.resolve_recall(
            RecallRequest(
                current.mode.value,
                current.budget if budget is None else budget,
                current.passages if passages is None else passages,
                current.threshold if threshold is None else threshold,
            ),
            session.policy,
            self.settings,
            across=current.across,
        )
        job = Job(session, [], generation=handle.generation)
        job.recall = RecallAsk(query, config, across=config.across)
        done = self.turns.wait(self.scheduler.submit(job), timeout)
        assert done.recall is not None  # a recall job always reports
        return RecallResult(done.recall, done.receipt)

    def memory(
        self,
        principal: Principal,
        handle: Handle,
        search: str = "",
        limit: int = 100,
        speaker: str | None = None,
    ) -> list[PassageView]:
        """The session's stored passages (text included: the owner's), newest last, or the best
        matches of `search`; one speaker's alone when named."""
        session = self.access.owned(principal, handle)
        if not 1 <= limit <= 10_000:
            raise InvalidInput(f"limit: must be in 1..10000, got {limit}")
        check_speaker(speaker)
        found = self.scheduler.call(
            lambda e: self._read(session, handle.generation, search, limit, speaker)
        )
        return [_view(p, score) for p, score in found]

    def _read(
        self, session: Session, generation: str, search: str, limit: int, speaker: str | None
    ) -> list[tuple[Passage, float | None]]:
        lifecycle.check_generation(session, generation)
        return self.recall.passages(session, search, limit, speaker)

    def forget(
        self,
        principal: Principal,
        handle: Handle,
        passage_id: int | None = None,
        logical: tuple[int, int] | None = None,
        speaker: str | None = None,
        time_left: float | None = None,
    ) -> Erased:
        """Delete a passage, every passage overlapping a logical range, or every passage one
        speaker said, from disk (before the reply, or the reply says the purge is owed)."""
        session = self.access.owned(principal, handle)
        if [passage_id, logical, speaker].count(None) != 2:
            raise InvalidInput("forget: name one passage, one logical range or one speaker")
        check_speaker(speaker)
        if logical is not None and not 0 <= logical[0] < logical[1]:
            raise InvalidInput(f"forget: the range must be start < end, got {list(logical)}")
        if max([passage_id or 0, *(logical or ())]) >= 2**63:
            raise InvalidInput("forget: passage ids and positions are below 2**63")
        n, owed = self.erasure.run(
            lambda e: self._forget(session, handle.generation, passage_id, logical, speaker),
            time_left,
        )
        if n == 0:
            what = (
                f"passage {passage_id}"
                if passage_id is not None
                else f"passage said by {speaker}"
                if speaker is not None
                else f"range {list(logical or ())}"
            )
            raise NotFound(f"session {session.id} stores no {what}")
        return Erased(n, owed)

    def _forget(
        self,
        session: Session,
        generation: str,
        passage_id: int | None,
        logical: tuple[int, int] | None,
        speaker: str | None,
    ) -> int:
        self.served_here(session.tenant)
        lifecycle.check_generation(session, generation)
        n = self.recall.forget(session, passage_id, logical, speaker)
        if not n:
            return n
        self.on_forgot(session.tenant)
        if self.durability is None:
            self.recall.purge()
            return n
        # the rows, zeroed (secure_delete), with the purge they owe (the snapshot scrub owes one)
        self.durability.record(self.durability.owe_purge)
        snapshotter = self.scheduler.snapshotter
        if (
            snapshotter is not None
            and session.has_history
            and not session.unlogged  # an append in flight: at the next gap between steps
        ):
            snapshotter.take(session, scrub=True)
        return n


class AcrossConversations:
    """The tenant's memory across its conversations, under the owner's control: list and search
    it, forget from it (by passage, conversation, speaker or time), give it a text to remember."""

    def __init__(self, access: Access, scheduler: Scheduler, remembering: Remembering) -> None:
        self.access = access
        self.scheduler = scheduler
        self.remembering = remembering
        self.recall = remembering.recall
        self.durability = remembering.durability
        self.settings = remembering.settings
        self.erasure = remembering.erasure

    def _tenant(self, principal: Principal) -> str:
        if principal.tenant is None:
            raise PermissionDenied("the admin token keeps no memory; use a tenant's token")
        return principal.tenant

    def listing(
        self, principal: Principal, which: KeptSelection, search: str = "", limit: int = 100
    ) -> list[PassageView]:
        """What the tenant's memory keeps (text included: the owner's), newest last, or the best
        matches of `search`."""
        tenant = self._tenant(principal)
        if not 1 <= limit <= 10_000:
            raise InvalidInput(f"limit: must be in 1..10000, got {limit}")
        selection = check_selection(which)
        floor = self.settings.recall_dense_threshold
        found = self.scheduler.call(
            lambda e: self.recall.across_passages(tenant, selection, search, limit, floor)
        )
        return [_view(p, score) for p, score in found]

    def forget(
        self, principal: Principal, which: KeptSelection, time_left: float | None = None
    ) -> Erased:
        """Delete from the tenant's memory, from disk (before the reply, or the reply says the
        purge is owed); a copy recalled into a conversation leaves that conversation's files too
        (at once, or once its stream has evicted a live copy)."""
        tenant = self._tenant(principal)
        selection = check_selection(which)
        if selection == Selection():
            raise InvalidInput(
                "forget: name a passage, a conversation, a speaker or a time range (all of it:"
                " --since 0)"
            )
        n, owed = self.erasure.run(lambda e: self._forget(tenant, selection), time_left)
        if n == 0:
            raise NotFound("the memory across conversations keeps no such passage")
        return Erased(n, owed)

    def _forget(self, tenant: str, which: Selection) -> int:
        self.remembering.served_here(tenant)
        sessions = self.access.registry.of_tenant(tenant)
        n = self.recall.forget_across(tenant, which, sessions)
        if not n:
            return n
        if self.durability is None:
            self.recall.purge()
            return n
        self.durability.record(self.durability.owe_purge)  # the rows, zeroed (secure_delete)
        return n

    def remember(self, principal: Principal, text: str) -> list[PassageView]:
        """Keep a text the user gives the memory itself (no conversation said it), as the user's
        words asked to be remembered."""
        tenant = self._tenant(principal)
        if not self.settings.memory_across(tenant):
            raise FailedPrecondition(
                f"tenant {tenant} keeps no memory across conversations"
                " (memory_across_conversations is off)"
            )
        if not text.strip():
            raise InvalidInput("remember: the text is empty")
        if len(text.encode("utf-8", errors="replace")) > MAX_REMEMBER_BYTES:
            raise InvalidInput(f"remember: the text is longer than {MAX_REMEMBER_BYTES} bytes")
        engine = self.access.engine
        tokens = engine.vocab.tokenize(text)
        kept = self.scheduler.call(lambda e: self._keep(e, tenant, tokens))
        return [_view(p, None) for p in kept]

    def _keep(self, engine: Engine, tenant: str, tokens: list[int]) -> list[Passage]:
        self.remembering.served_here(tenant)
        across = self.recall.store.across
        n = across.keep(
            tenant, Origin(GIVEN, 0, (0, len(tokens)), True), tokens, engine.vocab.piece, "user", 0
        )
        if n:
            self.recall.indexer.noted()  # its vectors made off the engine thread, as any passage's
        if self.durability is not None:
            self.durability.record(lambda: None)
            self.durability.commit()
        return across.passages(tenant, Selection(), n) if n else []  # the newest: these


MAX_REMEMBER_BYTES = 4096


def check_selection(which: KeptSelection) -> Selection:
    """The store's selection, once the caller's is valid."""
    check_speaker(which.speaker)
    if which.passage_id is not None and not 0 < which.passage_id < 2**63:
        raise InvalidInput("passage ids are 1 .. 2**63-1")
    if which.since is not None and which.until is not None and which.since >= which.until:
        raise InvalidInput(
            f"the time range must be since < until, got {which.since}..{which.until}"
        )
    return Selection(which.passage_id, which.conversation, which.speaker, which.since, which.until)


def _view(p: Passage, score: float | None) -> PassageView:
    return PassageView(
        passage_id=p.id,
        logical=p.logical,
        n_tokens=len(p.tokens),
        text=p.text,
        created_unix_time=p.created,
        sealed=p.sealed,
        score=score,
        speaker=p.speaker,
        turn=p.turn,
        conversation=p.conversation,
        asked=p.asked,
    )


def check_speaker(speaker: str | None) -> None:
    if speaker is not None and speaker not in (*SPEAKERS, UNKNOWN):
        known = ", ".join((*SPEAKERS, UNKNOWN))
        raise InvalidInput(f"speaker {speaker[:32]!r} is unknown (known: {known})")
