"""The Narration service's calls, for `Client.narration`: a tenant's narrated streams."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from sinkd.daemon.runtime.api import (
    DigestOptions,
    Narrated,
    NarratedInterval,
    NarratedStream,
    NarrationAnswer,
    NarrationForgotten,
    NarrationMuted,
)
from sinkd.errors import SinkdError
from sinkd.proto import convert
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc


class NarrationCalls:
    """On the client's channel, with its metadata; a refusal rebuilt as the client rebuilds
    its own (`refused`)."""

    def __init__(
        self,
        channel: grpc.Channel,
        md: Sequence[tuple[str, str]],
        refused: Callable[[Any], SinkdError],
    ) -> None:
        self.stub = pb_grpc.NarrationStub(channel)  # type: ignore[no-untyped-call]
        self.md = md
        self.refused = refused

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self.stub, method)(request, metadata=self.md)
        except grpc.RpcError as e:
            raise self.refused(e) from None

    def narrate(
        self,
        stream: str,
        lines: list[str],
        close: bool = False,
        options: DigestOptions | None = None,
        new_pipe: bool = False,
    ) -> Narrated:
        """Digest `lines` into the stream; what they closed (and, `close`, the rest).
        `new_pipe`: they begin a new pipe (said in the history)."""
        request = pb.NarrateRequest(stream=stream, lines=lines, close=close, new_pipe=new_pipe)
        if options is not None:
            request.options.CopyFrom(convert.digest_options_to_pb(options))
        r = self._call("Narrate", request)
        return Narrated(tuple(convert.interval_from_pb(i) for i in r.closed), r.lines, r.pending)

    def note(self, stream: str, number: int, sentence: str) -> bool:
        request = pb.NoteNarrationRequest(stream=stream, number=number, sentence=sentence)
        return bool(self._call("Note", request).kept)

    def history(
        self,
        stream: str,
        since: float = 0.0,
        until: float = 0.0,
        severity: str = "",
        template: str = "",
        limit: int = 0,
    ) -> list[NarratedInterval]:
        request = pb.NarrationHistoryRequest(
            stream=stream, since=since, until=until, severity=severity, template=template,
            limit=limit,
        )  # fmt: skip
        return [convert.interval_from_pb(i) for i in self._call("History", request).intervals]

    def streams(self) -> list[NarratedStream]:
        reply = self._call("List", pb.ListNarrationsRequest())
        return [convert.narrated_stream_from_pb(s) for s in reply.streams]

    def forget(
        self, stream: str, since: float | None = None, until: float | None = None
    ) -> NarrationForgotten:
        request = pb.ForgetNarrationRequest(stream=stream, since=since, until=until)
        reply = self._call("Forget", request)
        return NarrationForgotten(int(reply.intervals), reply.purge_owed)

    def mute(self, stream: str, template_id: int, muted: bool = True) -> NarrationMuted:
        request = pb.MuteNarrationRequest(stream=stream, template_id=template_id, unmute=not muted)
        reply = self._call("Mute", request)
        return NarrationMuted(int(reply.template_id), reply.template, tuple(reply.muted))

    def muted(self, stream: str) -> list[tuple[int, str]]:
        reply = self._call("Muted", pb.MutedNarrationRequest(stream=stream))
        return [(int(m.template_id), m.template) for m in reply.muted]

    def ask(self, stream: str, question: str, max_tokens: int = 48) -> NarrationAnswer:
        request = pb.NarrationAskRequest(stream=stream, question=question, max_tokens=max_tokens)
        return convert.answer_from_pb(self._call("Ask", request))
