"""Appends and generations: the requests that become jobs the scheduler batches with everyone
else's. Text is turned into tokens on the caller's thread (the engine guards its vocabulary
against a concurrent close), and each job stays bound to the generation its handle was checked
against."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from sinkd.cachepolicy.recall_plan import RecallMode
from sinkd.daemon import failpoints
from sinkd.daemon.engine import schemas
from sinkd.daemon.engine.sampler import Sampler, SamplingParams
from sinkd.daemon.engine.vocab import content_mark
from sinkd.daemon.models.registry import ModelEntry
from sinkd.daemon.runtime import requests
from sinkd.daemon.runtime.access import Access
from sinkd.daemon.runtime.api import (
    AppendResult,
    CancelToken,
    ChatRequest,
    Done,
    ErrorEvent,
    GenerationOptions,
    Handle,
    Stream,
    TokenEvent,
    Turn,
)
from sinkd.daemon.runtime.loop.jobs import GenSpec, Job
from sinkd.daemon.runtime.loop.scheduler import Scheduler
from sinkd.daemon.runtime.recall import across
from sinkd.daemon.runtime.recall.across import Said
from sinkd.daemon.runtime.recall.framing import Presentation, chat_layout
from sinkd.daemon.runtime.recall.layer import RecallAsk, chat_query
from sinkd.daemon.runtime.recall.past import may_need_the_past
from sinkd.daemon.runtime.sessions import Principal, Session
from sinkd.errors import Unsupported

AFTER = ("", "\n")  # a turn's framing at a session's start, and after a reply


def after_reply(session: Session) -> int:
    """Engine thread: 1 when the session's stream holds more than its system prompt (the next
    turn opens on a new line), else 0; an index into `AFTER`."""
    return int(session.seq.state.n_seen > len(session.system_tokens))


class Turns:
    def __init__(
        self,
        access: Access,
        scheduler: Scheduler,
        entry: ModelEntry,
        call_timeout_s: float,
        presentation: Presentation = Presentation.SYSTEM_AFTER,
        max_reply_tokens: int = requests.MAX_GENERATE_TOKENS,
    ) -> None:
        self.presentation = presentation  # where a chat turn's recalled text goes
        self.max_reply_tokens = max_reply_tokens  # an unset max tokens: to the turn's end, or this
        self.access = access
        self.scheduler = scheduler
        self.entry = entry
        self.call_timeout_s = call_timeout_s

    def wait(self, job: Job, timeout: float | None) -> Done:
        return job.wait(timeout or self.call_timeout_s, self.scheduler.alive)

    def append(
        self,
        principal: Principal,
        handle: Handle,
        text: str | None,
        tokens: list[int] | None,
        cancel: CancelToken | None = None,
        timeout: float | None = None,
    ) -> AppendResult:
        """Append text or token ids (the owner's deliberate tool); the receipt as it left it."""
        session = self.access.owned(principal, handle)
        engine = self.access.engine
        if tokens is None:
            tokens = engine.vocab.tokenize(text or "", add_bos=False)
        else:
            engine.vocab.check_tokens(tokens)
        failpoints.hit("append-tokenized")
        # an empty append decodes what the session has pending (a reset's system prompt), or
        # nothing: the engine thread knows which, and answers the receipt as it stands
        job = Job(session, tokens, generation=handle.generation)
        if cancel is not None:
            cancel.tie(job.cancel)
        done = self.wait(self.scheduler.submit(job), timeout)
        return AppendResult(len(tokens), done.receipt)

    def history(
        self,
        principal: Principal,
        handle: Handle,
        turns: list[Turn],
        cancel: CancelToken | None = None,
        timeout: float | None = None,
    ) -> AppendResult:
        """Append earlier chat turns as the template frames them, each content as
        text: what a stateless client's history brings to a new session, through its policy."""
        engine = self.access.engine
        if not engine.chat_template:
            raise Unsupported(f"model {self.entry.name} has no chat template")
        session = self.access.owned(principal, handle)
        if not turns:
            return self.append(principal, handle, None, [], cancel, timeout)
        marks = [(t.role, content_mark(i)) for i, t in enumerate(turns)]
        framed = engine.vocab.render_chat(marks, add_assistant=False)
        contents = [engine.vocab.tokenize(t.content) for t in turns]  # once, for both framings
        # after a reply the turns open on a new line, as `chat`'s: which one is decided as the
        # job starts, on the engine thread, where the session stands then
        framings = [engine.vocab.tokenize_framed(prefix + framed, contents) for prefix in AFTER]

        taken: list[int] = []

        def frame(job: Job) -> None:
            job.tokens = framings[after_reply(job.session)]
            taken.append(len(job.tokens))

        job = Job(session, framings[0], generation=handle.generation, on_start=frame)
        if cancel is not None:
            cancel.tie(job.cancel)
        done = self.wait(self.scheduler.submit(job), timeout)
        return AppendResult(taken[0], done.receipt)

    def generate(
        self,
        principal: Principal,
        handle: Handle,
        options: GenerationOptions,
        cancel: CancelToken | None = None,
        timeout: float | None = None,
    ) -> Stream:
        """Tokens as they come, then `Done`; errors raise."""
        session = self.access.owned(principal, handle)
        params = requests.sampling_params(options.sampling)
        return self._stream(session, handle, options, params, [], None, cancel, timeout)

    def chat(
        self,
        principal: Principal,
        handle: Handle,
        request: ChatRequest,
        cancel: CancelToken | None = None,
        timeout: float | None = None,
    ) -> Stream:
        """One chat turn: the user's message in the template's framing (the message itself is
        data), recall before the answer when the session recalls automatically, the model's
        recommended sampling when the session chose none."""
        session = self.access.owned(principal, handle)
        engine = self.access.engine
        if not engine.chat_template:
            raise Unsupported(
                f"model {self.entry.name} has no chat template; use append and generate"
            )
        # both framings of the turn (after a reply it opens on a new line), tokenized here; which
        # one goes in, and the seed of the model's chat sampling, is decided as the job starts, on
        # the engine thread, where the session stands then
        message = engine.vocab.tokenize(request.message)  # as text, once, for both framings
        framings = [
            self._chat_turn(session, request.message, message, p, request.private) for p in AFTER
        ]
        asked = across.asks_to_remember(request.message)
        bare = across.asks_for_the_reply(request.message)  # "remember that": the reply is meant
        reply = request.reply_before if bare else ""
        # what the user states is kept (a bare question or bidding is not: `states_something`)
        keeps = bool(message) and not bare and (asked or across.states_something(request.message))
        params = requests.sampling_params(request.options.sampling)
        seeded = params is None and not session.sampling.chosen
        entry = self.entry

        def frame(job: Job) -> None:
            s = job.session
            job.tokens, job.recall, offset = framings[after_reply(s)]
            job.private = request.private
            if s.recall.across and not request.private and (keeps or reply):
                job.keep = Said(offset, message if keeps else [], asked, reply)
            if seeded and job.gen is not None:
                n_seen = s.seq.state.n_seen
                chat = requests.chat_sampling(entry.sampling, s.generation, n_seen, s.rewinds)
                if chat is not None:
                    job.gen.sampler = Sampler(chat)

        prompt, ask, _ = framings[0]
        return self._stream(
            session, handle, request.options, params, prompt, ask, cancel, timeout, frame
        )

    def _chat_turn(
        self,
        session: Session,
        message: str,
        message_tokens: list[int],
        prefix: str,
        private: bool = False,
    ) -> tuple[list[int], RecallAsk | None, int]:
        """The user's turn in the template's framing (the message as text), when the session
        recalls on its own, where its recalled passages go, and where the message starts."""
        engine = self.access.engine
        mark = content_mark(0)  # the message goes in as text, the template's framing around it
        turn = engine.vocab.render_chat([("user", mark)], add_assistant=False)
        text = engine.vocab.render_chat([("user", mark)], add_assistant=True)
        if not text.startswith(turn):  # a template that does not end the turn before the header
            turn = text
        question = engine.vocab.tokenize_framed(prefix + turn, [message_tokens])
        head = (prefix + turn).partition(mark)[0]
        offset = len(engine.vocab.tokenize(head, special=True)) if head else 0
        rest = text[len(turn) :]
        prompt = question + (engine.vocab.tokenize_framed(rest, []) if rest else [])
        ask = None
        if session.recall.mode is RecallMode.AUTO and message.strip():
            # where the passages go: the model's measured choice (framing.py)
            layout = chat_layout(engine, self.presentation, prefix, turn, mark, len(question))
            ask = RecallAsk(
                chat_query(message),
                session.recall,
                layout.frame,
                strip_control=True,
                insert_at=layout.insert_at,
                by_meaning=may_need_the_past(message),
                across=not private and across.asks_for_the_past(message),
            )
        return prompt, ask, offset

    def _stream(
        self,
        session: Session,
        handle: Handle,
        options: GenerationOptions,
        params: SamplingParams | None,
        prompt: list[int],
        ask: RecallAsk | None,
        cancel: CancelToken | None,
        timeout: float | None,
        on_start: Callable[[Job], None] | None = None,
    ) -> Stream:
        """The one place a request's options become the engine's spec."""
        unset = options.max_tokens is None
        limit = self.max_reply_tokens if options.max_tokens is None else options.max_tokens
        requests.check_generation_args(limit, options.stops)
        sampler = session.sampler if params is None else Sampler(params)
        grammar = requests.output_grammar(options.output)
        mask = None if grammar is None else self.access.engine.vocab.constrain(grammar)
        spec = GenSpec(limit, list(options.stops), sampler, repetition_guard=unset, grammar=mask)
        job = Job(session, prompt, spec, generation=handle.generation, on_start=on_start)
        job.recall = ask
        if cancel is not None:
            cancel.tie(job.cancel)
        self.scheduler.submit(job)
        deadline = time.monotonic() + (timeout or self.call_timeout_s)
        output = options.output
        if output is None or output.schema_json is None:
            return self._events(job, deadline)
        return self._checked(self._events(job, deadline), json.loads(output.schema_json))

    def _events(self, job: Job, deadline: float) -> Stream:
        while True:
            event = job.next_event(deadline, self.scheduler.alive)
            if isinstance(event, ErrorEvent):
                raise event.error
            if isinstance(event, Done):
                failpoints.hit("generation-done")
                yield event
                return
            yield event

    @staticmethod
    def _checked(events: Stream, schema: dict[str, Any]) -> Stream:
        """A reply the model ended is checked against its schema before its end is told: what
        the grammar holds only in part (a float's bounds, `multipleOf`) raises SchemaUnmet."""
        pieces: list[str] = []
        for event in events:
            if isinstance(event, TokenEvent):
                pieces.append(event.text)
            elif isinstance(event, Done) and event.reason == "eog":
                schemas.check_reply(schema, "".join(pieces))
            yield event
