"""The one place where sinkd's typed errors become exit codes and a one-line message."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from cachepolicy.errors import CacheFull, ConfigError, SinkdError
from daemon.errors import (
    EngineError,
    InvalidInput,
    ModelMismatch,
    ModelMissing,
    ModelNotAllowed,
    PullFailed,
    Unsupported,
)
from daemon.journal import JournalError
from daemon.sessions import (
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    SessionFailed,
    StaleGeneration,
)

# Documented in the README; 1 is left to Python itself, 2 to usage errors (typer's own too).
EXIT_CODES: list[tuple[type[SinkdError], int]] = [
    (NotFound, 11),
    (StaleGeneration, 12),
    (SessionFailed, 12),
    (ResourceExhausted, 8),
    (PermissionDenied, 13),
    (ConfigError, 2),
    (InvalidInput, 2),
    (ModelMissing, 3),
    (ModelNotAllowed, 4),
    (ModelMismatch, 4),
    (Unsupported, 5),
    (EngineError, 6),
    (PullFailed, 7),
    (CacheFull, 8),
    (JournalError, 9),
]

F = TypeVar("F", bound=Callable[..., Any])


# What a daemon's refusal (a gRPC status name) means for the exit code.
REFUSED_CODES = {
    "INVALID_ARGUMENT": 2,
    "RESOURCE_EXHAUSTED": 8,
    "NOT_FOUND": 11,
    "FAILED_PRECONDITION": 12,
    "UNAUTHENTICATED": 13,
    "PERMISSION_DENIED": 13,
}


def exit_code(error: SinkdError) -> int:
    from cli.backend import DaemonUnavailable, Refused

    if isinstance(error, DaemonUnavailable):
        return 10
    if isinstance(error, Refused):
        return REFUSED_CODES.get(error.code, 14)
    return next((code for cls, code in EXIT_CODES if isinstance(error, cls)), 1)


def handle_errors(fn: F) -> F:
    """Turn a sinkd error into `sinkd: message` on stderr and its exit code, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SinkdError as e:
            print(f"sinkd: {e}", file=sys.stderr)
            raise typer.Exit(exit_code(e)) from None
        except KeyboardInterrupt:
            print("sinkd: interrupted", file=sys.stderr)
            raise typer.Exit(130) from None
        except BrokenPipeError:
            raise typer.Exit(0) from None

    return wrapper  # type: ignore[return-value]
