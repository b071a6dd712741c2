"""Typed errors of the cache policy.

They carry what a user needs to act on (the field, the limit); the servicer and the CLI turn them into
a gRPC status or an exit code. Nothing here knows about either.
"""

from __future__ import annotations


class SinkdError(Exception):
    """Base of every error sinkd means to show to a user."""


class ConfigError(SinkdError, ValueError):
    """An invalid policy configuration; `field` names the offending setting."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class CacheFull(SinkdError):
    """The `full` policy cannot take more tokens: it never evicts and never truncates silently."""

    def __init__(self, retained: int, incoming: int, capacity: int) -> None:
        super().__init__(
            f"cache full: {retained} cells retained + {incoming} incoming > capacity {capacity}"
            " (the full policy never evicts; reset the session or use the sink policy)"
        )
        self.retained = retained
        self.incoming = incoming
        self.capacity = capacity
