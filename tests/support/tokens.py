"""The suite's tenants and admin, as gRPC metadata, and the sha256 the settings store for them."""

from __future__ import annotations

import hashlib

ALICE = [("authorization", "Bearer alice-token")]
BOB = [("authorization", "Bearer bob-token")]
ADMIN = [("authorization", "Bearer admin-token")]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
