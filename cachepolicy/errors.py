"""Typed errors of the cache policy, the root of sinkd's one error hierarchy.

Each class carries what the edges need, as plain data: `status` (a gRPC status name) and `exit_code`
(the CLI's). The servicer and the CLI read them; nothing here imports either. The daemon's errors
(`sinkd.daemon.errors`) derive from `SinkdError` too.
"""

from __future__ import annotations


class SinkdError(Exception):
    """Base of every error sinkd means to show to a user."""

    status = "INTERNAL"
    exit_code = 14


class ConfigError(SinkdError, ValueError):
    """An invalid policy configuration; `field` names the offending setting."""

    status = "INVALID_ARGUMENT"
    exit_code = 2

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class CacheFull(SinkdError):
    """The `full` policy cannot take more tokens: it never evicts and never truncates silently."""

    status = "RESOURCE_EXHAUSTED"
    exit_code = 8

    def __init__(self, retained: int, incoming: int, capacity: int) -> None:
        super().__init__(
            f"cache full: {retained} cells retained + {incoming} incoming > capacity {capacity}"
            " (the full policy never evicts; reset the session or use the sink policy)"
        )
        self.retained = retained
        self.incoming = incoming
        self.capacity = capacity
