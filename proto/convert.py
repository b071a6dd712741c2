"""The runtime's typed objects (`sinkd.daemon.runtime.api`) to protobuf and back, written once.

The servicer converts its answers here; the CLI's client converts them back. Ranges are
`sinkd.v1.Range`; an unset optional message (a receipt's `last_recall`) is None on our side.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sinkd.cachepolicy import PolicyConfig
from sinkd.cachepolicy.recall_plan import RecallConfig, RecalledSpan
from sinkd.cachepolicy.sequence import TraceEvent
from sinkd.daemon.runtime.api import (
    DigestOptions,
    Done,
    Handle,
    KeptSelection,
    ModelInfo,
    NarratedInterval,
    NarratedStream,
    NarrationAnswer,
    PassageView,
    PrefixInfo,
    RecallReport,
    Receipt,
    Stats,
    TenantUsage,
    TokenEvent,
)
from sinkd.proto.v1 import sinkd_pb2 as pb

Span = tuple[int, int]


def _range(span: Span | None) -> pb.Range | None:
    return None if span is None else pb.Range(start=span[0], end=span[1])


def _span(message: pb.Range) -> Span:
    return (int(message.start), int(message.end))


def handle_to_pb(h: Handle) -> pb.Handle:
    return pb.Handle(session_id=h.session_id, generation=h.generation)


def handle_from_pb(message: pb.Handle) -> Handle:
    return Handle(message.session_id, message.generation)


def policy_to_pb(p: PolicyConfig) -> pb.Policy:
    return pb.Policy(
        name=p.policy.value,
        sinks=p.sinks,
        window=p.window,
        evict_chunk=p.evict_chunk,
        compact_interval=p.compact_interval,
        ingest_chunk=p.ingest_chunk or None,
    )


def policy_from_pb(message: pb.Policy) -> PolicyConfig:
    return PolicyConfig.named(
        message.name,
        sinks=message.sinks,
        window=message.window,
        evict_chunk=message.evict_chunk or 1,
        compact_interval=message.compact_interval,
        ingest_chunk=message.ingest_chunk,
    )


def recall_settings_to_pb(c: RecallConfig) -> pb.RecallSettings:
    return pb.RecallSettings(
        mode=c.mode.value,
        budget=c.budget,
        passages=c.passages,
        threshold=c.threshold,
        private=not c.across,
    )


def recall_settings_from_pb(message: pb.RecallSettings) -> RecallConfig:
    return RecallConfig.named(
        message.mode or "off",
        budget=message.budget,
        passages=message.passages,
        threshold=message.threshold,
        across=not message.private and (message.mode or "off") != "off",
    )


def recalled_to_pb(s: RecalledSpan) -> pb.RecalledPassage:
    return pb.RecalledPassage(
        passage_id=s.passage_id,
        source_logical=_range(s.source),
        stream_logical=_range(s.stream),
        score=s.score,
        recalled_unix_time=s.at,
        speaker=s.speaker,
        conversation=s.conversation,
        said_unix_time=s.said_at,
    )


def recalled_from_pb(message: pb.RecalledPassage) -> RecalledSpan:
    return RecalledSpan(
        passage_id=message.passage_id,
        source=_span(message.source_logical),
        stream=_span(message.stream_logical),
        offset=0,  # where the copy starts among the recall's tokens: the daemon's business
        score=message.score,
        at=message.recalled_unix_time,
        speaker=message.speaker or "unknown",
        conversation=message.conversation,
        said_at=message.said_unix_time,
    )


def report_to_pb(r: RecallReport) -> pb.RecallReport:
    return pb.RecallReport(
        query_sha256=r.query_sha256,
        query_terms=r.query_terms,
        candidates=r.candidates,
        best_score=r.best_score,
        threshold=r.threshold,
        note=r.note,
        recalled=[recalled_to_pb(s) for s in r.recalled],
        search=r.search,
    )


def report_from_pb(message: pb.RecallReport) -> RecallReport:
    return RecallReport(
        query_sha256=message.query_sha256,
        query_terms=message.query_terms,
        candidates=message.candidates,
        best_score=message.best_score,
        threshold=message.threshold,
        note=message.note,
        recalled=tuple(recalled_from_pb(s) for s in message.recalled),
        search=message.search,
    )


def receipt_to_pb(r: Receipt) -> pb.Receipt:
    return pb.Receipt(
        session_id=r.session_id,
        generation=r.generation,
        reset_count=r.reset_count,
        state=r.state,
        tenant=r.tenant,
        policy=policy_to_pb(r.policy),
        n_seen=r.n_seen,
        retained=r.retained,
        anchors_logical=_range(r.anchors_logical),
        recent_logical=_range(r.recent_logical),
        anchors_cache=_range(r.anchors_cache),
        recent_cache=_range(r.recent_cache),
        pending_gap=r.pending_gap,
        evictions=r.evictions,
        evicted_tokens=r.evicted_tokens,
        shifts=r.shifts,
        kv_payload_bytes=r.kv_payload_bytes,
        model=r.model,
        model_sha256=r.model_sha256,
        system_prompt_tokens=r.system_prompt_tokens,
        system_prompt_tokens_pinned=r.system_prompt_tokens_pinned,
        system_prompt_sha256=r.system_prompt_sha256,
        resume=r.resume,
        stale_reason=r.stale_reason,
        snapshot_n_seen=r.snapshot_n_seen,
        snapshot_unix_time=r.snapshot_unix_time,
        journal_chunks=r.journal_chunks,
        journal_tokens=r.journal_tokens,
        recall=recall_settings_to_pb(r.recall),
        recalled=[recalled_to_pb(s) for s in r.recalled],
        memory_passages=r.memory_passages,
        memory_tokens=r.memory_tokens,
        memory_bytes=r.memory_bytes,
        last_recall=None if r.last_recall is None else report_to_pb(r.last_recall),
        residency=r.residency,
        restores=r.restores,
        restored_ms=r.restored_ms,
        prefix_tokens=r.prefix_tokens,
    )


def receipt_from_pb(m: pb.Receipt) -> Receipt:
    return Receipt(
        session_id=m.session_id,
        generation=m.generation,
        reset_count=m.reset_count,
        state=m.state,
        tenant=m.tenant,
        policy=policy_from_pb(m.policy),
        n_seen=m.n_seen,
        retained=m.retained,
        anchors_logical=_span(m.anchors_logical),
        recent_logical=_span(m.recent_logical),
        anchors_cache=_span(m.anchors_cache),
        recent_cache=_span(m.recent_cache),
        pending_gap=m.pending_gap,
        evictions=m.evictions,
        evicted_tokens=m.evicted_tokens,
        shifts=m.shifts,
        kv_payload_bytes=m.kv_payload_bytes,
        model=m.model,
        model_sha256=m.model_sha256,
        system_prompt_tokens=m.system_prompt_tokens,
        system_prompt_tokens_pinned=m.system_prompt_tokens_pinned,
        system_prompt_sha256=m.system_prompt_sha256,
        resume=m.resume,
        stale_reason=m.stale_reason,
        snapshot_n_seen=m.snapshot_n_seen,
        snapshot_unix_time=m.snapshot_unix_time,
        journal_chunks=m.journal_chunks,
        journal_tokens=m.journal_tokens,
        recall=recall_settings_from_pb(m.recall),
        recalled=tuple(recalled_from_pb(s) for s in m.recalled),
        memory_passages=m.memory_passages,
        memory_tokens=m.memory_tokens,
        memory_bytes=m.memory_bytes,
        last_recall=report_from_pb(m.last_recall) if m.HasField("last_recall") else None,
        residency=m.residency,
        restores=m.restores,
        restored_ms=m.restored_ms,
        prefix_tokens=m.prefix_tokens,
    )


def prefix_to_pb(p: PrefixInfo) -> pb.PrefixState:
    return pb.PrefixState(
        key=p.key,
        tenant=p.tenant,
        shared=p.shared,
        tokens=p.tokens,
        ram_bytes=p.ram_bytes,
        disk_bytes=p.disk_bytes,
        hits=p.hits,
        idle_s=p.idle_s,
    )


def prefix_from_pb(m: pb.PrefixState) -> PrefixInfo:
    return PrefixInfo(
        key=m.key,
        tenant=m.tenant,
        shared=m.shared,
        tokens=m.tokens,
        ram_bytes=m.ram_bytes,
        disk_bytes=m.disk_bytes,
        hits=m.hits,
        idle_s=m.idle_s,
    )


def token_to_pb(t: TokenEvent) -> pb.Token:
    return pb.Token(id=t.id, text=t.text, index=t.index, latency_ms=t.latency_ms)


def token_from_pb(m: pb.Token) -> TokenEvent:
    return TokenEvent(m.id, m.text, m.index, m.latency_ms)


def done_to_pb(d: Done) -> pb.Done:
    return pb.Done(
        reason=d.reason,
        generated=d.generated,
        receipt=receipt_to_pb(d.receipt),
        recall=None if d.recall is None else report_to_pb(d.recall),
    )


def done_from_pb(m: pb.Done) -> Done:
    recall = report_from_pb(m.recall) if m.HasField("recall") else None
    return Done(m.reason, m.generated, receipt_from_pb(m.receipt), recall)


def event_to_pb(event: TokenEvent | Done) -> pb.GenerateEvent:
    if isinstance(event, TokenEvent):
        return pb.GenerateEvent(token=token_to_pb(event))
    return pb.GenerateEvent(done=done_to_pb(event))


def event_from_pb(m: pb.GenerateEvent) -> TokenEvent | Done:
    return token_from_pb(m.token) if m.HasField("token") else done_from_pb(m.done)


def trace_to_pb(e: TraceEvent) -> pb.TraceEvent:
    return pb.TraceEvent(
        at_token=e.at_token,
        evicted_logical=_range(e.evicted_logical),
        evicted_cache=_range(e.evicted_cache),
        shift_delta=e.shift_delta,
        shifted_cache=_range(e.shifted_cache),
        kind=e.kind,
        passage_id=e.passage_id,
        recalled_source=_range(e.recalled_source),
        recalled_logical=_range(e.recalled_logical),
    )


def trace_from_pb(m: pb.TraceEvent) -> TraceEvent:
    def optional(name: str) -> Span | None:
        return _span(getattr(m, name)) if m.HasField(name) else None

    return TraceEvent(
        at_token=m.at_token,
        evicted_logical=_span(m.evicted_logical),
        evicted_cache=_span(m.evicted_cache),
        shift_delta=m.shift_delta,
        shifted_cache=optional("shifted_cache"),
        kind=m.kind,
        passage_id=m.passage_id,
        recalled_source=optional("recalled_source"),
        recalled_logical=optional("recalled_logical"),
    )


def passage_to_pb(p: PassageView) -> pb.Passage:
    return pb.Passage(
        passage_id=p.passage_id,
        logical=_range(p.logical),
        n_tokens=p.n_tokens,
        text=p.text,
        created_unix_time=p.created_unix_time,
        sealed=p.sealed,
        score=p.score,
        speaker=p.speaker,
        turn=p.turn,
        conversation=p.conversation,
        asked=p.asked,
    )


def passage_from_pb(m: pb.Passage) -> PassageView:
    return PassageView(
        passage_id=m.passage_id,
        logical=_span(m.logical),
        n_tokens=m.n_tokens,
        text=m.text,
        created_unix_time=m.created_unix_time,
        sealed=m.sealed,
        score=m.score if m.HasField("score") else None,
        speaker=m.speaker or "unknown",
        turn=m.turn,
        conversation=m.conversation,
        asked=m.asked,
    )


def kept_selection_to_pb(k: KeptSelection) -> pb.KeptSelection:
    return pb.KeptSelection(
        passage_id=k.passage_id,
        conversation=k.conversation,
        speaker=k.speaker,
        since=k.since,
        until=k.until,
    )


def kept_selection_from_pb(m: pb.KeptSelection) -> KeptSelection:
    def given(name: str) -> Any:
        return getattr(m, name) if m.HasField(name) else None

    return KeptSelection(
        passage_id=given("passage_id"),
        conversation=given("conversation"),
        speaker=given("speaker"),
        since=given("since"),
        until=given("until"),
    )


def stats_to_pb(s: Stats) -> pb.StatsResponse:
    return pb.StatsResponse(
        sessions=s.sessions,
        max_sessions=s.max_sessions,
        cells_in_use=s.cells_in_use,
        cells_per_session=s.cells_per_session,
        kv_bytes_per_token=s.kv_bytes_per_token,
        prefill_tokens=s.prefill_tokens,
        decode_tokens=s.decode_tokens,
        evictions=s.evictions,
        steps=s.steps,
        invariant_violations=s.invariant_violations,
        model=s.model,
        model_sha256=s.model_sha256,
        stale_sessions=s.stale_sessions,
        snapshots=s.snapshots,
        snapshot_failures=s.snapshot_failures,
        parked_sessions=s.parked_sessions,
        max_parked_sessions=s.max_parked_sessions,
        parks=s.parks,
        restores=s.restores,
        tenants=[tenant_usage_to_pb(t) for t in s.tenants],
    )


def tenant_usage_to_pb(t: TenantUsage) -> pb.TenantUsage:
    return pb.TenantUsage(**dataclasses.asdict(t))


def tenant_usage_from_pb(m: pb.TenantUsage) -> TenantUsage:
    return TenantUsage(**{f.name: getattr(m, f.name) for f in dataclasses.fields(TenantUsage)})


def model_to_pb(m: ModelInfo) -> pb.ModelInfo:
    return pb.ModelInfo(
        name=m.name,
        sha256=m.sha256,
        loaded=m.loaded,
        is_default=m.is_default,
        default_sinks=m.default_sinks,
        default_window=m.default_window,
        backend=m.backend,
    )


def digest_options_from_pb(m: pb.DigestOptions) -> DigestOptions:
    return DigestOptions(
        every_lines=m.every_lines,
        incident_lines=m.incident_lines,
        incident_seconds=m.incident_seconds,
        gap_seconds=m.gap_seconds,
        recur_intervals=m.recur_intervals,
        info_bursts=m.info_bursts,
        keep_lines=m.keep_lines,
        inferred_min=m.inferred_min,
        page_handled=m.page_handled,
    )


def digest_options_to_pb(o: DigestOptions) -> pb.DigestOptions:
    return pb.DigestOptions(**dataclasses.asdict(o))


def interval_to_pb(i: NarratedInterval) -> pb.NarratedInterval:
    return pb.NarratedInterval(**{**dataclasses.asdict(i), "support": list(i.support)})


def interval_from_pb(m: pb.NarratedInterval) -> NarratedInterval:
    return NarratedInterval(
        stream=m.stream,
        number=m.number,
        last_number=m.last_number,
        first_line=m.first_line,
        last_line=m.last_line,
        started=m.started,
        ended=m.ended,
        incidents=m.incidents,
        errors=m.errors,
        record_json=m.record_json,
        support=tuple(m.support),
    )


def narrated_stream_to_pb(s: NarratedStream) -> pb.NarratedStream:
    return pb.NarratedStream(**dataclasses.asdict(s))


def narrated_stream_from_pb(m: pb.NarratedStream) -> NarratedStream:
    return NarratedStream(
        name=m.name,
        created=m.created,
        updated=m.updated,
        intervals=m.intervals,
        lines=m.lines,
        incidents=m.incidents,
    )


def answer_to_pb(a: NarrationAnswer) -> pb.NarrationAnswer:
    return pb.NarrationAnswer(
        stream=a.stream,
        held=a.held,
        text=a.text,
        dropped=list(a.dropped),
        facts_text=a.facts_text,
        cites=[interval_to_pb(i) for i in a.cites],
    )


def answer_from_pb(m: pb.NarrationAnswer) -> NarrationAnswer:
    return NarrationAnswer(
        stream=m.stream,
        held=m.held,
        text=m.text,
        dropped=tuple(m.dropped),
        facts_text=m.facts_text,
        cites=tuple(interval_from_pb(i) for i in m.cites),
    )
