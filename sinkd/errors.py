"""Every error sinkd shows to a user, in one hierarchy: each class carries its gRPC status and CLI
exit code, which the servicer and the CLI read at the edges and nowhere else.

The remote CLI gets the same class back (the servicer names it in the `sinkd-error` trailer), so
embedded and remote runs exit with the same code for the same error. This module is the root of the
hierarchy and imports nothing of sinkd: the pure policy's own errors (`sinkd.cachepolicy.policy_errors`)
derive from `SinkdError` here without the policy importing the daemon.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ERROR_TRAILER",
    "Cancelled",
    "CorruptArchive",
    "CorruptSnapshot",
    "DaemonUnavailable",
    "DeadlineExceeded",
    "DiskFull",
    "EngineError",
    "FailedPrecondition",
    "IllegalTransition",
    "InvalidInput",
    "JournalError",
    "ListenError",
    "Loading",
    "ModelMismatch",
    "ModelMissing",
    "ModelNotAllowed",
    "NotFound",
    "PermissionDenied",
    "PullFailed",
    "Refused",
    "ResourceExhausted",
    "SchemaUnmet",
    "SessionElsewhere",
    "SessionFailed",
    "SessionLimit",
    "ShuttingDown",
    "SinkdError",
    "SnapshotError",
    "StaleGeneration",
    "TenantLimit",
    "Unauthenticated",
    "Unsupported",
    "UntrustedPath",
    "by_name",
    "echo",
    "message_of",
]

ERROR_TRAILER = "sinkd-error"  # trailing metadata: the class name of the error a call raised
MAX_ECHO = 64  # characters of client input an error message repeats (gRPC metadata is bounded)


def echo(value: object) -> str:
    """A client-supplied value as an error message may quote it: at most MAX_ECHO characters."""
    text = str(value)
    if len(text) <= MAX_ECHO:
        return repr(text)
    return f"{text[:MAX_ECHO]!r}... ({len(text)} characters)"


class SinkdError(Exception):
    """Base of every error sinkd means to show to a user."""

    status = "INTERNAL"
    exit_code = 14


# --- input and configuration ---


class InvalidInput(SinkdError, ValueError):
    """A request the engine must refuse before llama.cpp sees it (it would abort the process);
    `field` names the request's field where one is to blame."""

    status = "INVALID_ARGUMENT"
    exit_code = 2

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


# --- identity and access ---


class Unauthenticated(SinkdError):
    """Missing or unknown bearer token."""

    status = "UNAUTHENTICATED"
    exit_code = 13


class PermissionDenied(SinkdError):
    """Authenticated, but not allowed to do this (e.g. a tenant asking for admin operations)."""

    status = "PERMISSION_DENIED"
    exit_code = 13


class NotFound(SinkdError):
    """No such session for this tenant (another tenant's session is reported the same way)."""

    status = "NOT_FOUND"
    exit_code = 11


class StaleGeneration(SinkdError):
    """The handle's generation is not the session's current one (reset, model change, restart)."""

    status = "FAILED_PRECONDITION"
    exit_code = 12


class FailedPrecondition(SinkdError):
    """The session is not in a state that allows this (e.g. recall on a session without memory)."""

    status = "FAILED_PRECONDITION"
    exit_code = 12


class SessionFailed(SinkdError):
    """The session failed a run-time invariant check; its cells were freed."""

    status = "FAILED_PRECONDITION"
    exit_code = 12


# --- capacity and lifecycle ---


class IllegalTransition(SinkdError):
    """A session was asked to move along an edge its state machine does not have: a bug."""

    status = "INTERNAL"
    exit_code = 14


class ResourceExhausted(SinkdError):
    """No room: sessions, queued calls, the journal, or a batch the engine could not take."""

    status = "RESOURCE_EXHAUSTED"
    exit_code = 8


class SessionLimit(ResourceExhausted):
    """No more sessions may be open: the resident sessions and the parked ones beyond them are
    at their limits (closing one makes room; waiting does not)."""


class DiskFull(ResourceExhausted):
    """The state directory's filesystem is below its free-space margin (`min_free_mb`): nothing
    new is written until space returns; what is stored stays."""


class TenantLimit(SessionLimit):
    """The calling tenant is at its own share (its sessions, its stored bytes or responses): the
    message names the limit and the use. Closing or deleting what it holds makes room; waiting
    does not; no other tenant is refused because of it."""


class Cancelled(SinkdError):
    """The client went away or cancelled, or a reset or close overtook the call; the receipt says
    exactly what was applied."""

    status = "CANCELLED"
    exit_code = 14


class ShuttingDown(SinkdError):
    """The daemon is stopping (or its engine thread is gone) and takes no more work."""

    status = "UNAVAILABLE"
    exit_code = 10


class Loading(SinkdError):
    """The daemon is up but its model is still loading (or its sessions resuming): try again in
    a moment. UNAVAILABLE, which gRPC clients retry, as HTTP's 503 with Retry-After."""

    status = "UNAVAILABLE"
    exit_code = 10


class SessionElsewhere(SinkdError):
    """The session is not on this node but lives on another one (made there, or moved there),
    which the proxy cannot reach now: down, restarting, or its sessions moving. Retry later."""

    status = "UNAVAILABLE"
    exit_code = 10


class DaemonUnavailable(SinkdError):
    """No daemon answers at the address."""

    status = "UNAVAILABLE"
    exit_code = 10


class DeadlineExceeded(SinkdError):
    """A wait ran past its deadline; what was applied is in the receipt."""

    status = "DEADLINE_EXCEEDED"
    exit_code = 14


class ListenError(SinkdError):
    """The daemon could not bind its socket or port."""

    status = "UNAVAILABLE"
    exit_code = 10


class UntrustedPath(SinkdError):
    """A directory or socket someone else could change or own: sinkd will not use it."""

    status = "FAILED_PRECONDITION"
    exit_code = 13


# --- models and the engine ---


class ModelMissing(SinkdError):
    """The model file is not where it should be; `sinkd models pull NAME` fetches it."""

    status = "FAILED_PRECONDITION"
    exit_code = 3


class ModelNotAllowed(SinkdError):
    """The model is not in models.lock (an explicit flag may run it, with the full policy only)."""

    status = "FAILED_PRECONDITION"
    exit_code = 4


class ModelMismatch(SinkdError):
    """A model file differs from its models.lock entry; `field` names what differs."""

    status = "FAILED_PRECONDITION"
    exit_code = 4

    def __init__(
        self,
        name: str,
        field: str,
        expected: object,
        actual: object,
        source: str = "models.lock",
    ) -> None:
        super().__init__(
            f"model {name}: {field} differs from {source}: expected {expected}, got {actual}"
        )
        self.field = field


class PullFailed(SinkdError):
    """Downloading or extracting a model failed; nothing was stored."""

    status = "UNAVAILABLE"
    exit_code = 7


class SchemaUnmet(SinkdError):
    """A finished reply breaks its JSON schema where the grammar could not hold it (a float's
    bound, `multipleOf`): refused naming the keyword, never returned as valid."""

    status = "ABORTED"
    exit_code = 9


class Unsupported(SinkdError):
    """The engine cannot run this combination (e.g. a shifting policy on a cache that cannot shift)."""

    status = "FAILED_PRECONDITION"
    exit_code = 5


class EngineError(SinkdError):
    """llama.cpp reported a failure (a non-zero return code or a refused memory operation)."""

    status = "INTERNAL"
    exit_code = 6


# --- the state directory ---


class JournalError(SinkdError):
    """The journal cannot be used: damaged, not a database, or held by another daemon."""

    status = "INTERNAL"
    exit_code = 9


class SnapshotError(SinkdError):
    """A snapshot could not be written (disk full, I/O error); the previous one stays."""

    status = "INTERNAL"
    exit_code = 9


class CorruptSnapshot(SinkdError):
    """A snapshot file is truncated, damaged or not a snapshot."""

    status = "INTERNAL"
    exit_code = 9


class CorruptArchive(InvalidInput):
    """A session archive (`sinkd sessions import`) is truncated, damaged, of another format
    version, or not an archive; nothing of it was loaded."""


# --- a refusal from a daemon that did not name its class ---


class Refused(SinkdError):
    """The daemon refused the request with `status` and did not name an error class (a gRPC-level
    refusal such as a message above the size limit)."""

    STATUS_EXIT: ClassVar[dict[str, int]] = {
        "INVALID_ARGUMENT": 2,
        "RESOURCE_EXHAUSTED": 8,
        "UNAVAILABLE": 10,
        "NOT_FOUND": 11,
        "FAILED_PRECONDITION": 12,
        "UNAUTHENTICATED": 13,
        "PERMISSION_DENIED": 13,
    }

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{message} ({status})")
        self.status = status
        self.exit_code = self.STATUS_EXIT.get(status, 14)


def _classes() -> dict[str, type[SinkdError]]:
    import sinkd.cachepolicy.policy_errors  # noqa: F401  (the policy's classes, by name too)

    found: dict[str, type[SinkdError]] = {}
    todo: list[type[SinkdError]] = [SinkdError]
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return found


def by_name(name: str, status: str, message: str) -> SinkdError:
    """Rebuild, on the client side, the error a daemon named in its `sinkd-error` trailer."""
    cls = _classes().get(name)
    if cls is None or cls is Refused:
        return Refused(status, message)
    error = cls.__new__(cls)  # some constructors take structured fields: the message is all we have
    Exception.__init__(error, message)
    return error


def message_of(error: BaseException) -> str:
    """The one-line message for a user, bounded (a long message would overflow gRPC metadata)."""
    text = str(error).replace("\n", " ")
    return text if len(text) <= 1024 else text[:1024] + "..."
