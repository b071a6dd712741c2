"""gRPC's Narration service: a tenant's narrated streams (runtime/narrated.py), protobuf in and
out, errors translated by `rpc` as for every call."""

from __future__ import annotations

from typing import Any

from sinkd.daemon.rpc.servicer import BaseServicer, rpc
from sinkd.daemon.runtime.sessions import Principal
from sinkd.proto.convert import (
    answer_to_pb,
    digest_options_from_pb,
    interval_to_pb,
    narrated_stream_to_pb,
)
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc


class NarrationServicer(BaseServicer, pb_grpc.NarrationServicer):
    @rpc
    def Narrate(
        self, request: pb.NarrateRequest, context: Any, principal: Principal
    ) -> pb.NarrateResponse:
        options = digest_options_from_pb(request.options) if request.HasField("options") else None
        fed = self.service.narrated.feed(
            principal,
            request.stream,
            list(request.lines),
            request.close,
            options,
            new_pipe=request.new_pipe,
        )
        return pb.NarrateResponse(
            closed=[interval_to_pb(i) for i in fed.closed], lines=fed.lines, pending=fed.pending
        )

    @rpc
    def Note(
        self, request: pb.NoteNarrationRequest, context: Any, principal: Principal
    ) -> pb.NoteNarrationResponse:
        kept = self.service.narrated.note(
            principal, request.stream, request.number, request.sentence
        )
        return pb.NoteNarrationResponse(kept=kept)

    @rpc
    def History(
        self, request: pb.NarrationHistoryRequest, context: Any, principal: Principal
    ) -> pb.NarrationHistoryResponse:
        found = self.service.narrated.history(
            principal,
            request.stream,
            request.since,
            request.until,
            request.severity,
            request.template,
            request.limit,
        )
        return pb.NarrationHistoryResponse(intervals=[interval_to_pb(i) for i in found])

    @rpc
    def List(
        self, request: pb.ListNarrationsRequest, context: Any, principal: Principal
    ) -> pb.ListNarrationsResponse:
        streams = self.service.narrated.streams(principal)
        return pb.ListNarrationsResponse(streams=[narrated_stream_to_pb(s) for s in streams])

    @rpc
    def Forget(
        self, request: pb.ForgetNarrationRequest, context: Any, principal: Principal
    ) -> pb.ForgetNarrationResponse:
        since = request.since if request.HasField("since") else None
        until = request.until if request.HasField("until") else None
        gone = self.service.narrated.forget(principal, request.stream, since, until)
        return pb.ForgetNarrationResponse(intervals=gone.intervals, purge_owed=gone.purge_owed)

    @rpc
    def Mute(
        self, request: pb.MuteNarrationRequest, context: Any, principal: Principal
    ) -> pb.MuteNarrationResponse:
        done = self.service.narrated.mute(
            principal, request.stream, request.template_id, not request.unmute
        )
        return pb.MuteNarrationResponse(
            template_id=done.template_id, template=done.template, muted=done.muted
        )

    @rpc
    def Muted(
        self, request: pb.MutedNarrationRequest, context: Any, principal: Principal
    ) -> pb.MutedNarrationResponse:
        held = self.service.narrated.muted(principal, request.stream)
        return pb.MutedNarrationResponse(
            muted=[pb.MutedTemplate(template_id=t, template=text) for t, text in held]
        )

    @rpc
    def Ask(
        self, request: pb.NarrationAskRequest, context: Any, principal: Principal
    ) -> pb.NarrationAnswer:
        answer = self.service.questions.ask(
            principal, request.stream, request.question, request.max_tokens or 48
        )
        return answer_to_pb(answer)
