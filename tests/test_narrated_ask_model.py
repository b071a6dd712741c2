"""`ask` on the real model (SmolLM2): three kinds of question about a narrated stream's past, the
intervals they cite, a question the kept facts do not answer, and no printed sentence that the
grounding check would drop."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from sinkd.daemon.runtime.api import DigestOptions
from sinkd.daemon.runtime.service import SinkdService
from sinkd.daemon.runtime.sessions import Principal
from sinkd.narration.grounding import sentences_of, unsupported_claims, words_of
from tests.support.settings import settings

pytestmark = pytest.mark.model
ALICE = Principal("alice")


def sshd_log(hour: int, n: int = 100) -> list[str]:
    """An hour's lines of a bastion host: accepted keys, then (at 02:00) password failures from
    one address, then (at 03:00) a disk filling."""
    out = []
    for i in range(n):
        t = f"Dec  7 {hour:02d}:{i % 60:02d}:{i % 60:02d} bastion"
        if hour == 2 and i % 3 == 0:
            out.append(
                f"{t} sshd[{4000 + i}]: Failed password for root from 203.0.113.7 port {50000 + i} ssh2"
            )
        elif hour == 3 and i % 10 == 0:
            out.append(
                f"{t} kernel: EXT4-fs error (device sda1): write failed: No space left on device"
            )
        else:
            out.append(
                f"{t} sshd[{3000 + i}]: Accepted publickey for deploy from 10.0.0.{i % 9} port {40000 + i} ssh2"
            )
    return out


def test_ask_answers_when_what_and_whether_from_the_kept_facts(tmp_path: Path) -> None:
    service = SinkdService(settings(tmp_path, durable=False))
    service.start()
    service.wait_ready(120)
    try:
        day = datetime.datetime(2026, 12, 7).astimezone()
        for hour in (1, 2, 3, 4):  # each hour's lines read at that hour (the stream's clock)
            at = (day + datetime.timedelta(hours=hour, minutes=30)).timestamp()
            service.narrated.clock = lambda at=at: at  # type: ignore[misc]
            service.narrated.feed(
                ALICE, "bastion", sshd_log(hour), True, DigestOptions(every_lines=100)
            )
        service.questions.clock = lambda: (day + datetime.timedelta(hours=5)).timestamp()
        kept = service.narrated.history(ALICE, "bastion")

        def lines_of(hour: int) -> range:
            return range(100 * (hour - 1) + 1, 100 * hour + 1)

        when = service.questions.ask(
            ALICE, "bastion", "When did the failed password attempts start?"
        )
        assert when.held and min(i.first_line for i in when.cites) in lines_of(2)
        assert "Failed password" in when.facts_text
        what = service.questions.ask(ALICE, "bastion", "What happened between 03:00 and 03:59?")
        assert what.held and {i.first_line for i in what.cites} <= set(lines_of(3))
        assert "No space left" in what.facts_text
        seen = service.questions.ask(ALICE, "bastion", "Has the EXT4 write error been seen before?")
        assert seen.held and all(
            i.first_line in lines_of(3) or i.first_line in lines_of(4) for i in seen.cites
        )
        unknown = service.questions.ask(ALICE, "bastion", "Did kubernetes restart any pods?")
        assert not unknown.held and unknown.text == ""
        for answer in (when, what, seen):
            support = words_of(answer.facts_text)
            for sentence in sentences_of(answer.text):
                claims = sentence.removeprefix("According to the facts,")
                assert not unsupported_claims(claims, support, min_words=1), sentence
        assert len(kept) >= 4
    finally:
        service.stop()
