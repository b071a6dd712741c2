"""Narrated streams over the HTTP front (/v1/sinkd/narrations), with httpx as a client would:
lines in, the kept timeline out, a question answered from it, each tenant its own, errors in
OpenAI's body."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.daemons import http_daemon

pytestmark = pytest.mark.model


def test_a_stream_over_http_keeps_its_timeline_and_answers_from_it(tmp_path: Path) -> None:
    d = http_daemon(tmp_path)
    assert d.http is not None
    alice = httpx.Client(base_url=d.http.address, headers={"Authorization": "Bearer alice-token"})
    bob = httpx.Client(base_url=d.http.address, headers={"Authorization": "Bearer bob-token"})
    try:
        lines = [f"2026-12-07T02:00:{i % 60:02d} api INFO request {i} served" for i in range(300)]
        lines[210] = "2026-12-07T02:03:30 sshd ERROR Failed password for root from 10.0.0.9"
        fed = alice.post("/v1/sinkd/narrations/web/lines", json={"lines": lines, "close": True})
        assert fed.status_code == 200, fed.text
        assert fed.json()["lines"] == 300 and fed.json()["closed"][-1]["last_line"] == 300
        kept = alice.get("/v1/sinkd/narrations/web", params={"severity": "error"}).json()["data"]
        [error] = kept
        assert error["first_line"] <= 211 <= error["last_line"] and error["incidents"] == 1
        assert "Failed password" in error["record"]["text"]
        answer = alice.post(
            "/v1/sinkd/narrations/web/ask", json={"question": "When did the sshd failures start?"}
        ).json()
        cited = [c["number"] for c in answer["cites"]]
        assert answer["held"] and cited[0] == error["number"]  # then the one it was over in
        assert all("sshd" in c["record"]["text"] for c in answer["cites"])
        assert "Failed password" in answer["facts"]
        assert [s["name"] for s in alice.get("/v1/sinkd/narrations").json()["data"]] == ["web"]
        assert bob.get("/v1/sinkd/narrations").json()["data"] == []
        missing = bob.get("/v1/sinkd/narrations/web")
        assert missing.status_code == 404 and missing.json()["error"]["message"]
        bad = alice.get("/v1/sinkd/narrations/web", params={"severity": "loud"})
        assert bad.status_code == 400 and "severity" in bad.json()["error"]["message"]
        too_many = alice.post("/v1/sinkd/narrations/web/lines", json={"lines": ["x"] * 4097})
        assert too_many.status_code == 400
        [opened] = error["record"]["facts"]["opened"]
        tid = opened["template_id"]
        muted = alice.post("/v1/sinkd/narrations/web/muted", json={"template_id": tid})
        assert muted.status_code == 200, muted.text
        assert muted.json()["muted"] == [tid] and "Failed password" in muted.json()["template"]
        listed = alice.get("/v1/sinkd/narrations/web/muted").json()["data"]
        assert [(m["template_id"], "Failed password" in m["template"]) for m in listed] == [
            (tid, True)
        ]
        assert bob.get("/v1/sinkd/narrations/web/muted").status_code == 404
        for who, body, status in (
            (bob, {"template_id": tid}, 404),  # another tenant's stream
            (alice, {"template_id": 10_000}, 404),  # no such template
            (alice, {"template_id": 0}, 400),
            (alice, {"template_id": tid, "loud": True}, 400),
        ):
            refused = who.post("/v1/sinkd/narrations/web/muted", json=body)
            assert refused.status_code == status, refused.text
            assert refused.json()["error"]["message"]
        unmuted = alice.post(
            "/v1/sinkd/narrations/web/muted", json={"template_id": tid, "muted": False}
        )
        assert unmuted.json()["muted"] == []
        assert alice.get("/v1/sinkd/narrations/web/muted").json()["data"] == []
        before = alice.delete("/v1/sinkd/narrations/web", params={"until": 1.0}).json()
        assert (before["intervals"], before["purge_owed"]) == (0, False)  # nothing that old
        for bad_period in ({"since": "soon"}, {"since": 3000.0, "until": 1.0}):
            refused = alice.delete("/v1/sinkd/narrations/web", params=bad_period)
            assert refused.status_code == 400, refused.text
        assert len(alice.get("/v1/sinkd/narrations/web").json()["data"]) == len(
            fed.json()["closed"]
        )  # a period forget took nothing it should not
        gone = alice.delete("/v1/sinkd/narrations/web")
        assert gone.status_code == 200 and gone.json()["intervals"] == len(fed.json()["closed"])
        assert alice.get("/v1/sinkd/narrations/web").status_code == 404
        kept = alice.post(
            "/v1/sinkd/narrations/kept/lines",
            json={"lines": ["api INFO <b>kept</b>"], "close": True, "keep_lines": True},
        ).json()["closed"][-1]["record"]
        assert kept["lines"] == ["api INFO <b>kept</b>"]  # raw lines kept when asked, as sent
        piped = alice.post(
            "/v1/sinkd/narrations/kept/lines",
            json={"lines": ["api INFO again"], "close": True, "new_pipe": True},
        ).json()["closed"][-1]["record"]
        assert piped["new_pipe_at"] == [2]  # where the second pipe began
    finally:
        alice.close()
        bob.close()
        d.stop()
