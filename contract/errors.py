"""Errors a user sees. Each says what was wrong, with the value, and what to do.

Every error maps to one gRPC status code (its `code`): a server aborts a call with it
(the cache server's rpcutil), marked as its own answer (ANSWERED), and a client turns the
status back into the same error type (`from_status`; rpc.error_of for a failed call).
"""

from __future__ import annotations

import grpc


class StrataError(Exception):
    """Base class: a problem the caller can act on."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN


class InvalidArgument(StrataError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(StrataError, FileNotFoundError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(StrataError, FileExistsError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(StrataError, PermissionError):
    """Wrong credentials for a store, or a write to a read-only mount."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(StrataError, PermissionError):
    """A call without the cluster token or with a wrong one."""

    code = grpc.StatusCode.UNAUTHENTICATED


class ResourceExhausted(StrataError, OSError):
    """A tier (or the whole cache) cannot take a block, e.g. everything is pinned."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(StrataError, ConnectionError):
    """A server or the store cannot be reached; retrying may help."""

    code = grpc.StatusCode.UNAVAILABLE


class Unreachable(Unavailable):
    """No answer at all from a server: it could not be reached, or nothing came back within
    the caller's deadline. A server's own error answer (e.g. "its store is down") is never
    this: only this means the server itself is away."""


class DeadlineExceeded(StrataError, TimeoutError):
    """The store (or a server) took longer than its deadline to answer; another worker
    would wait on the same store, so readers get this error rather than a failover."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class DataLoss(StrataError, OSError):
    """Bytes failed their checksum and no good copy could be had."""

    code = grpc.StatusCode.DATA_LOSS


class FailedPrecondition(StrataError, OSError):
    code = grpc.StatusCode.FAILED_PRECONDITION


_BY_CODE: dict[grpc.StatusCode, type[StrataError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        Unauthenticated,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        DataLoss,
        FailedPrecondition,
    )
}


def from_status(code: grpc.StatusCode, details: str) -> StrataError:
    """The error a client raises for a failed RPC."""
    return _BY_CODE.get(code, StrataError)(details)


# Trailing metadata on every error a Strata server answers itself, so that a client tells a
# server that answered UNAVAILABLE (say, its store is down) from one it could not reach.
ANSWERED_KEY = "strata-answered"
ANSWERED = ((ANSWERED_KEY, "1"),)


def answered_by_server(exc: grpc.RpcError) -> bool:
    """Whether the server itself answered with this error (see ANSWERED_KEY)."""
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return any(key == ANSWERED_KEY for key, _ in trailing or ())
