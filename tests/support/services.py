"""The service in process, driven past its edges: on the fake engine, and calls whose jobs share
one engine step."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sinkd.daemon.runtime.api import Done, GenerationOptions, Handle, PolicyRequest, TokenEvent
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from tests.support.fake_engine import FakeEngine, open_fake
from tests.support.settings import settings


def fake_service(tmp: Path, **kw: Any) -> SinkdService:
    """A started service on the fake engine: not durable, recall by words alone, four sessions."""
    config = {"durable": False, "recall_dense": False, "max_sessions": 4, **kw}
    service = SinkdService(settings(tmp, **config), open_engine=open_fake)
    service.start()
    service.wait_ready(30)
    return service


def fake_engine_of(service: SinkdService) -> FakeEngine:
    engine = service.scheduler.engine
    assert isinstance(engine, FakeEngine)
    return engine


def in_one_step(svc: SinkdService, calls: list[Any]) -> list[Any]:
    """Start `calls` (each a job submitted to the engine) so that their jobs enter the same step:
    the engine thread is held by a call until every job waits in its inbox. Returns futures."""
    held, go = threading.Event(), threading.Event()

    def hold(engine: Any) -> None:
        held.set()
        assert go.wait(60)

    pool = ThreadPoolExecutor(len(calls) + 1)
    blocker = pool.submit(svc.scheduler.call, hold)
    assert held.wait(60)  # the engine thread is busy: the jobs wait in its inbox
    futures = [pool.submit(call) for call in calls]
    deadline = time.monotonic() + 30
    while svc.scheduler._inbox.qsize() < len(calls) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.set()
    blocker.result(60)
    pool.shutdown(wait=False)
    return futures


def drafts_at_the_prior(service: SinkdService) -> None:
    """Weigh the service's drafts at the prior's costs, not at what this machine's clock says its
    passes took: how many tokens are drafted is then a function of the tokens alone, the same on
    any machine and under any load (the tokens never depend on it)."""
    service.scheduler.executor.verifier.costs.observe = lambda rows, seconds, after=1: None  # type: ignore[method-assign]


def draft_counts(service: SinkdService) -> tuple[int, int]:
    """The draft tokens the service's verifications accepted and rejected so far."""
    r = service.metrics.registry
    got = [
        r.get_sample_value("sinkd_draft_tokens_total", {"outcome": o})
        for o in ("accepted", "rejected")
    ]
    return int(got[0] or 0), int(got[1] or 0)


def replies_together(
    service: SinkdService,
    who: Principal,
    policy: PolicyRequest,
    openings: list[str],
    options: list[GenerationOptions],
) -> tuple[list[Handle], list[list[int]]]:
    """A session per opening, its opening appended; then every session's reply, their jobs in the
    same steps (`in_one_step`): the handles and each reply's ids."""
    handles = []
    for opening in openings:
        handle = service.create(who, policy).handle
        service.append(who, handle, opening, timeout=20)
        handles.append(handle)

    def generate(k: int) -> list[int]:
        events = service.generate(who, handles[k], options[k], timeout=30)
        return [e.id for e in events if isinstance(e, TokenEvent)]

    futures = in_one_step(service, [lambda k=k: generate(k) for k in range(len(handles))])
    return handles, [f.result(60) for f in futures]


def collected(events: Iterable[Any]) -> tuple[list[int], str, Done]:
    """A generation's stream read to its end: the token ids, the text, the Done."""
    ids, text, done = [], [], None
    for event in events:
        if isinstance(event, TokenEvent):
            ids.append(event.id)
            text.append(event.text)
        else:
            assert isinstance(event, Done)
            done = event
    assert done is not None
    return ids, "".join(text), done
