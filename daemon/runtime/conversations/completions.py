"""A legacy completion (`/v1/completions`): the prompt continued as raw text, no chat template. A
client that resends a growing prompt (an editor's autocomplete, a script in a loop, LangChain's
`OpenAI` class) continues the session whose text its prompt begins with: only the new text is
read, as a chat continues with its new turn alone.

Each completion session is indexed by a hash of the text it holds (the prompt and what it
generated, cut stop strings included: the cells hold them), never the text. A request claims the
session it continues, so two requests never append to one session at once; a reply the model
ended (end of generation) is not continued (the text after it would follow an end token).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sinkd.daemon.runtime import requests
from sinkd.daemon.runtime.access import Access
from sinkd.daemon.runtime.api import (
    AppendResult,
    CancelToken,
    Done,
    GenerationOptions,
    Handle,
    Receipt,
    Stream,
    TokenEvent,
)
from sinkd.daemon.runtime.conversations.chats import Admit, Continuation
from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import InvalidInput, NotFound, StaleGeneration

MAX_HELD = 16  # completion sessions a tenant keeps to continue; past it the least recent closes

NewSession = Callable[[Principal], tuple[Receipt, str]]
Append = Callable[[Principal, Handle, str, CancelToken], AppendResult]
Generate = Callable[[Principal, Handle, GenerationOptions, CancelToken], Stream]
Close = Callable[[Principal, Handle], None]


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str
    options: GenerationOptions
    suffix: str | None = None  # fill-in-the-middle: refused where the model has no FIM tokens


@dataclass(frozen=True)
class _Held:
    handle: Handle
    length: int  # characters of text the session holds
    digest: bytes  # sha256 of that text
    n_seen: int  # its tokens


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class Completions:
    def __init__(
        self,
        access: Access,
        new_session: NewSession,
        append: Append,
        generate: Generate,
        close: Close,
    ) -> None:
        self.access = access
        self._new, self._append, self._generate, self._close = new_session, append, generate, close
        self._held: dict[str, OrderedDict[str, _Held]] = {}  # tenant -> session id -> held
        self._lock = threading.Lock()

    def complete(
        self, principal: Principal, request: CompletionRequest, cancel: CancelToken, admit: Admit
    ) -> tuple[Continuation, Stream]:
        """The session that answers (continued, or new) and the reply's stream."""
        if request.suffix is not None:
            raise InvalidInput(self._no_fim(), field="suffix")
        if not request.prompt:
            raise InvalidInput("prompt: empty (sinkd continues text; give it some)", field="prompt")
        options = request.options  # refused before a session is claimed, never after
        requests.check_generation_args(options.max_tokens or 1, options.stops)
        claimed = self._claim(principal, request.prompt)
        if claimed is not None:
            held, rest = claimed
            try:
                admit(held.handle.session_id)
            except BaseException:  # refused (its per-session calls): it stays to continue
                self._put(principal, held)
                raise
            try:
                read = self._append(principal, held.handle, rest, cancel) if rest else None
                n_before = read.receipt.n_seen - read.appended if read else held.n_seen
                how = Continuation(
                    held.handle, "continued", f"the prompt began with the {held.length}"
                    " characters this session holds: the rest was read", 0,
                    n_seen_before=n_before,
                )  # fmt: skip
                return how, self._followed(principal, held.handle, request, cancel)
            except (NotFound, StaleGeneration):  # closed meanwhile (room for a chat): read anew
                pass
            except BaseException:
                self._drop(principal, held.handle)
                raise
        receipt, note = self._new(principal)
        handle = receipt.handle
        try:
            admit(handle.session_id)
            if request.prompt:
                self._append(principal, handle, request.prompt, cancel)
        except BaseException:
            self._drop(principal, handle)
            raise
        why = "no session of the caller's holds the prompt's beginning: it was read whole"
        how = Continuation(handle, "new", why + (f"; {note}" if note else ""), 0)
        return how, self._followed(principal, handle, request, cancel)

    def _followed(
        self, principal: Principal, handle: Handle, request: CompletionRequest, cancel: CancelToken
    ) -> Stream:
        """The reply's events; at its end the session is indexed by the text it now holds."""
        events = self._generate(principal, handle, request.options, cancel)
        vocab = self.access.engine.vocab

        def follow() -> Iterator[TokenEvent | Done]:
            ids: list[int] = []
            kept = False
            try:
                for event in events:
                    if isinstance(event, TokenEvent):
                        ids.append(event.id)
                    elif isinstance(event, Done) and event.reason != "eog":
                        text = request.prompt + vocab.detokenize(ids)
                        self._keep(principal, handle, text, event.receipt.n_seen)
                        kept = True
                    yield event
            finally:
                if not kept:
                    self._drop(principal, handle)

        return follow()

    def _claim(self, principal: Principal, prompt: str) -> tuple[_Held, str] | None:
        """The caller's session holding the longest beginning of `prompt`, taken out of the
        index while this request uses it; and the rest of the prompt."""
        with self._lock:
            held = self._held.get(principal.tenant or "", OrderedDict())
            best = None
            for h in held.values():
                fits = h.length <= len(prompt) and _digest(prompt[: h.length]) == h.digest
                if fits and (best is None or h.length > best.length):
                    best = h
            if best is None:
                return None
            del held[best.handle.session_id]
            return best, prompt[best.length :]

    def _keep(self, principal: Principal, handle: Handle, text: str, n_seen: int) -> None:
        self._put(principal, _Held(handle, len(text), _digest(text), n_seen))

    def _put(self, principal: Principal, entry: _Held) -> None:
        """Into the index, the most recent; past MAX_HELD the least recent is closed."""
        with self._lock:
            held = self._held.setdefault(principal.tenant or "", OrderedDict())
            held[entry.handle.session_id] = entry
            oldest = next(iter(held.values())) if len(held) > MAX_HELD else None
            if oldest is not None:
                del held[oldest.handle.session_id]
        if oldest is not None:
            self._close_quietly(principal, oldest.handle)

    def _drop(self, principal: Principal, handle: Handle) -> None:
        """A session no request will continue (failed, cut off, ended by the model): closed."""
        with self._lock:
            self._held.get(principal.tenant or "", OrderedDict()).pop(handle.session_id, None)
        self._close_quietly(principal, handle)

    def _close_quietly(self, principal: Principal, handle: Handle) -> None:
        with contextlib.suppress(NotFound, StaleGeneration):
            self._close(principal, handle)

    def _no_fim(self) -> str:
        engine = self.access.engine
        if engine.vocab.fim_tokens() is None:
            return (
                "suffix: fill-in-the-middle needs the model's FIM tokens; llama.cpp finds none in"
                " this model's vocabulary"
            )
        return "suffix: fill-in-the-middle is not served by sinkd yet"
