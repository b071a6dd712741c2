"""Typed errors of the cache policy, in sinkd's one error hierarchy (rooted in `sinkd.errors`).

Each class carries what the edges need, as plain data: `status` (a gRPC status name) and `exit_code`
(the CLI's). The servicer and the CLI read them; nothing here imports either. The daemon's errors
(`sinkd.errors`) derive from the same `SinkdError`.
"""

from __future__ import annotations

from sinkd.errors import SinkdError

__all__ = ["CacheFull", "CannotRewind", "ConfigError", "SinkdError"]


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


class CannotRewind(SinkdError):
    """A rewind past what the cache still holds (the stream evicted it)."""

    status = "FAILED_PRECONDITION"
    exit_code = 12
