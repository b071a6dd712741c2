"""Where the CLI's sessions live: a running daemon (`sinkd.daemon.rpc.client.Client`), or the
same service embedded in this process (`EmbeddedBackend`, for one local user).

Both take and give the runtime's typed objects, so commands do not care which one they hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from sinkd.cachepolicy.sequence import TraceEvent
from sinkd.daemon.runtime.api import (
    AppendResult,
    ChatRequest,
    DigestOptions,
    Erased,
    GenerationOptions,
    Handle,
    Inspection,
    Narrated,
    NarratedInterval,
    NarratedStream,
    NarrationAnswer,
    NarrationForgotten,
    NarrationMuted,
    PassageView,
    PolicyRequest,
    RecallRequest,
    RecallResult,
    Receipt,
    SamplingRequest,
    Stream,
)

if TYPE_CHECKING:
    from sinkd.daemon.runtime.narrated import NarratedStreams
    from sinkd.daemon.runtime.narrated_ask import NarrationQuestions
    from sinkd.daemon.runtime.sessions import Principal

__all__ = ["Backend", "EmbeddedBackend", "Handle", "NarrationBackend"]


class NarrationBackend(Protocol):
    """A tenant's narrated streams: `Client.narration` (rpc/narration_client.py) or the
    embedded service's (`EmbeddedNarration`)."""

    def narrate(
        self,
        stream: str,
        lines: list[str],
        close: bool = False,
        options: DigestOptions | None = None,
        new_pipe: bool = False,
    ) -> Narrated: ...
    def note(self, stream: str, number: int, sentence: str) -> bool: ...
    def history(
        self,
        stream: str,
        since: float = 0.0,
        until: float = 0.0,
        severity: str = "",
        template: str = "",
        limit: int = 0,
    ) -> list[NarratedInterval]: ...
    def streams(self) -> list[NarratedStream]: ...
    def forget(
        self, stream: str, since: float | None = None, until: float | None = None
    ) -> NarrationForgotten: ...
    def ask(self, stream: str, question: str, max_tokens: int = 48) -> NarrationAnswer: ...
    def mute(self, stream: str, template_id: int, muted: bool = True) -> NarrationMuted: ...
    def muted(self, stream: str) -> list[tuple[int, str]]: ...


class Backend(Protocol):
    def create(
        self,
        policy: PolicyRequest,
        system_prompt: str = "",
        sampling: SamplingRequest | None = None,
        recall: RecallRequest | None = None,
    ) -> Receipt: ...
    def append(
        self, handle: Handle, text: str | None = None, tokens: list[int] | None = None
    ) -> AppendResult: ...
    def generate(self, handle: Handle, options: GenerationOptions) -> Stream: ...
    def chat(self, handle: Handle, request: ChatRequest) -> Stream: ...
    def reset(self, handle: Handle) -> tuple[Receipt, Erased]: ...
    def fork(self, handle: Handle) -> Receipt: ...
    def close(self, handle: Handle) -> Erased: ...
    def export_session(self, handle: Handle) -> Iterable[bytes]: ...
    def import_session(self, data: bytes) -> Receipt: ...
    def release(self, handle: Handle) -> None: ...
    def inspect(
        self, handle: Handle, include_text: bool = False, include_logits: bool = False
    ) -> Inspection: ...
    def trace(self, handle: Handle) -> list[TraceEvent]: ...
    def recall(self, handle: Handle, query: str) -> RecallResult: ...
    def memory(
        self, handle: Handle, search: str = "", limit: int = 100, speaker: str | None = None
    ) -> list[PassageView]: ...
    def forget(
        self,
        handle: Handle,
        passage_id: int | None = None,
        logical: tuple[int, int] | None = None,
        speaker: str | None = None,
    ) -> Erased: ...
    def list(self) -> list[Receipt]: ...
    def shutdown(self) -> None: ...

    @property
    def narration(self) -> NarrationBackend: ...


class EmbeddedBackend:
    """The same service the daemon runs, in this process, for one local user."""

    def __init__(
        self,
        model: str | None = None,
        n_ctx_seq: int = 512,
        max_sessions: int = 2,
        threads: int | None = None,
    ) -> None:
        from sinkd.daemon.config import Settings
        from sinkd.daemon.runtime.service import SinkdService
        from sinkd.daemon.runtime.sessions import LOCAL_TENANT, Principal

        settings = Settings(  # in-process and gone with the process: nothing to make durable
            model=model,
            n_ctx_seq=n_ctx_seq,
            max_sessions=max_sessions,
            n_threads=threads,
            durable=False,
        )
        self.service = SinkdService(settings)
        self.principal = Principal(LOCAL_TENANT, admin=True)
        self.service.start()
        self.service.wait_ready()
        self._narration = EmbeddedNarration(
            self.service.narrated, self.service.questions, self.principal
        )

    @property
    def narration(self) -> NarrationBackend:
        """Narrated streams in this process: not kept past it (a daemon keeps them)."""
        return self._narration

    def create(
        self,
        policy: PolicyRequest,
        system_prompt: str = "",
        sampling: SamplingRequest | None = None,
        recall: RecallRequest | None = None,
    ) -> Receipt:
        return self.service.create(self.principal, policy, sampling, system_prompt, recall)

    def append(
        self, handle: Handle, text: str | None = None, tokens: list[int] | None = None
    ) -> AppendResult:
        return self.service.append(self.principal, handle, text, tokens)

    def generate(self, handle: Handle, options: GenerationOptions) -> Stream:
        return self.service.generate(self.principal, handle, options)

    def chat(self, handle: Handle, request: ChatRequest) -> Stream:
        return self.service.chat(self.principal, handle, request)

    def reset(self, handle: Handle) -> tuple[Receipt, Erased]:
        return self.service.reset(self.principal, handle)

    def fork(self, handle: Handle) -> Receipt:
        return self.service.fork(self.principal, handle)

    def close(self, handle: Handle) -> Erased:
        return self.service.close(self.principal, handle)

    def export_session(self, handle: Handle) -> Iterable[bytes]:
        return self.service.moves.export(self.principal, handle)  # refused: not durable

    def import_session(self, data: bytes) -> Receipt:
        return self.service.moves.import_(self.principal, data)

    def release(self, handle: Handle) -> None:
        self.service.moves.release(self.principal, handle)  # refused: not durable

    def inspect(
        self, handle: Handle, include_text: bool = False, include_logits: bool = False
    ) -> Inspection:
        return self.service.reads.inspect(self.principal, handle, include_text, include_logits)

    def trace(self, handle: Handle) -> list[TraceEvent]:
        return self.service.reads.trace(self.principal, handle)

    def recall(self, handle: Handle, query: str) -> RecallResult:
        return self.service.memory.recall_into(self.principal, handle, query)

    def memory(
        self, handle: Handle, search: str = "", limit: int = 100, speaker: str | None = None
    ) -> list[PassageView]:
        return self.service.memory.memory(self.principal, handle, search, limit, speaker)

    def forget(
        self,
        handle: Handle,
        passage_id: int | None = None,
        logical: tuple[int, int] | None = None,
        speaker: str | None = None,
    ) -> Erased:
        return self.service.memory.forget(self.principal, handle, passage_id, logical, speaker)

    def list(self) -> list[Receipt]:
        return self.service.reads.list_sessions(self.principal)

    def shutdown(self) -> None:
        self.service.stop()


class EmbeddedNarration:
    """The embedded service's narrated streams, as `Client.narration` offers a daemon's."""

    def __init__(
        self, streams: NarratedStreams, questions: NarrationQuestions, principal: Principal
    ) -> None:
        self.streams_ = streams
        self.questions = questions
        self.principal = principal

    def narrate(
        self,
        stream: str,
        lines: list[str],
        close: bool = False,
        options: DigestOptions | None = None,
        new_pipe: bool = False,
    ) -> Narrated:
        return self.streams_.feed(self.principal, stream, lines, close, options, new_pipe=new_pipe)

    def note(self, stream: str, number: int, sentence: str) -> bool:
        return self.streams_.note(self.principal, stream, number, sentence)

    def history(
        self,
        stream: str,
        since: float = 0.0,
        until: float = 0.0,
        severity: str = "",
        template: str = "",
        limit: int = 0,
    ) -> list[NarratedInterval]:
        return self.streams_.history(
            self.principal, stream, since, until, severity, template, limit
        )

    def streams(self) -> list[NarratedStream]:
        return self.streams_.streams(self.principal)

    def forget(
        self, stream: str, since: float | None = None, until: float | None = None
    ) -> NarrationForgotten:
        return self.streams_.forget(self.principal, stream, since, until)

    def ask(self, stream: str, question: str, max_tokens: int = 48) -> NarrationAnswer:
        return self.questions.ask(self.principal, stream, question, max_tokens)

    def mute(self, stream: str, template_id: int, muted: bool = True) -> NarrationMuted:
        return self.streams_.mute(self.principal, stream, template_id, muted)

    def muted(self, stream: str) -> list[tuple[int, str]]:
        return self.streams_.muted(self.principal, stream)
