"""The one place where sinkd's typed errors become exit codes and a one-line message."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from sinkd.errors import SinkdError, message_of

F = TypeVar("F", bound=Callable[..., Any])


def exit_code(error: SinkdError) -> int:
    """Each error class carries its exit code (documented in docs/cli.md, "Exit codes"); 1 is left to Python
    itself, 2 to usage errors (typer's own too)."""
    return error.exit_code


def handle_errors(fn: F) -> F:
    """Turn a sinkd error into `sinkd: message` on stderr and its exit code, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SinkdError as e:
            print(f"sinkd: {message_of(e)}", file=sys.stderr)
            raise typer.Exit(exit_code(e)) from None
        except KeyboardInterrupt:
            print("sinkd: interrupted", file=sys.stderr)
            raise typer.Exit(130) from None
        except BrokenPipeError:
            raise typer.Exit(0) from None

    return wrapper  # type: ignore[return-value]
