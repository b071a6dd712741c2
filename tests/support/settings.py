"""A daemon's settings for a test: two tenants and an admin, a small context, no HTTP front."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sinkd.daemon.config import Settings
from tests.support.tokens import sha


def settings(tmp: Path, **kw: Any) -> Settings:
    base: dict[str, Any] = {
        "socket": tmp / "sinkd.sock",
        "state_dir": tmp / "state",
        "tenants": [
            {"name": "alice", "token_sha256": sha("alice-token")},
            {"name": "bob", "token_sha256": sha("bob-token")},
        ],
        "admin_token_sha256": sha("admin-token"),
        "max_sessions": 6,
        "n_ctx_seq": 256,
        "step_tokens": 64,
        "n_batch": 256,
        "http": None,  # each daemon of the suite would take the default port
        # a reply no test bounds stops here, not at 4,096 tokens: the suite's time, not a claim
        "max_reply_tokens": 256,
    }
    base.update(kw)
    return Settings(**base)
