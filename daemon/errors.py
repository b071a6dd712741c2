"""Typed domain errors of the daemon, translated to gRPC status codes and exit codes at the edges only."""

from __future__ import annotations

from cachepolicy.errors import CacheFull, ConfigError, SinkdError

__all__ = [
    "CacheFull",
    "ConfigError",
    "EngineError",
    "InvalidInput",
    "ModelMismatch",
    "ModelMissing",
    "ModelNotAllowed",
    "PullFailed",
    "SinkdError",
    "Unsupported",
]


class ModelNotAllowed(SinkdError):
    """The model is not in models.lock (an explicit flag may run it, with the full policy only)."""


class ModelMissing(SinkdError):
    """The model file is not where it should be; `sinkd models pull NAME` fetches it."""


class ModelMismatch(SinkdError):
    """A model file differs from its models.lock entry; `field` names what differs."""

    def __init__(self, name: str, field: str, expected: object, actual: object) -> None:
        super().__init__(
            f"model {name}: {field} differs from models.lock: expected {expected}, got {actual}"
        )
        self.field = field


class PullFailed(SinkdError):
    """Downloading or extracting a model failed; nothing was stored."""


class Unsupported(SinkdError):
    """The engine cannot run this combination (e.g. a shifting policy on a cache that cannot shift)."""


class InvalidInput(SinkdError, ValueError):
    """A request the engine must refuse before llama.cpp sees it (it would abort the process)."""


class EngineError(SinkdError):
    """llama.cpp reported a failure (a non-zero return code or a refused memory operation)."""
