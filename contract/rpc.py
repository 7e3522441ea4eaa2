"""The client side of gRPC as every caller of a Strata server uses it (operator, workers,
client library, CLI): channels whose every call carries the token, and the mapping of a
failed call to the StrataError it means. The servers' side (servicer wrappers, listening)
is the cache server's rpcutil."""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

from . import constants
from .errors import StrataError, Unreachable, answered_by_server, from_status

# What a client channel accepts: answers such as the listing of a large folder can be big.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.enable_retries", 0),
    # After a server restart, a channel tries to connect again at most 1 s apart (gRPC's
    # default back-off grows to 2 min): workers re-register and clients resume within about
    # a second of the master answering again.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

# Codes of a call that got no answer from the server, unless the server marked the error as
# its own (ANSWERED): it could not be reached, or said nothing within the caller's deadline.
NO_ANSWER = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def call_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The metadata that carries `token` (`authorization: Bearer <token>`)."""
    return ((constants.AUTH_METADATA_KEY, f"{constants.AUTH_SCHEME} {token}"),)


def error_of(exc: grpc.RpcError, what: str = "", *, no_answer: tuple[grpc.StatusCode, ...] = NO_ANSWER) -> StrataError:
    """The StrataError a client raises for a failed call (`raise ... from exc`): Unreachable
    when the server did not answer (codes in `no_answer` without the server's mark), else
    the type of the status code. `what` names the call in messages of unreachable or late
    servers ("what: details", "what: timed out (details)"); without it the server's details
    stand alone."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if what and code == grpc.StatusCode.UNAVAILABLE:
        details = f"{what}: {details}"
    elif what and code == grpc.StatusCode.DEADLINE_EXCEEDED:
        details = f"{what}: timed out ({details})"
    details = details or (f"{what} failed" if what else code.name)
    if code in no_answer and not answered_by_server(exc):
        return Unreachable(details)
    return from_status(code, details)


def aio_channel(address: str, token: str) -> grpc.aio.Channel:
    """An asyncio channel whose every call carries the token."""
    return grpc.aio.insecure_channel(
        address, options=CHANNEL_OPTIONS,
        interceptors=[_AioUnaryUnaryAuth(token), _AioUnaryStreamAuth(token), _AioStreamUnaryAuth(token)],
    )


def sync_channel(address: str, token: str) -> grpc.Channel:
    """A blocking channel whose every call carries the token (client library)."""
    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    return grpc.intercept_channel(channel, _SyncAuthInterceptor(token))


def _with_token(details: Any, token: str, cls: Any) -> Any:
    metadata = list(details.metadata or ()) + list(call_metadata(token))
    fields = {f: getattr(details, f, None) for f in cls._fields}
    fields["metadata"] = metadata
    return cls(**fields)


class _AioAuth:
    def __init__(self, token: str) -> None:
        self._token = token

    def _details(self, details: Any) -> Any:
        return _with_token(details, self._token, grpc.aio.ClientCallDetails)


# One class per kind of call: an asyncio channel files each interceptor under the first
# kind it implements only (grpc.aio's channel tests them in turn), so one class of all three
# kinds would leave streaming calls (a peer's ReadBlock, a WriteFile) without the token.
class _AioUnaryUnaryAuth(_AioAuth, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioUnaryStreamAuth(_AioAuth, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioStreamUnaryAuth(_AioAuth, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


class _SyncCallDetails(grpc.ClientCallDetails):  # type: ignore[misc]
    _fields = ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")

    def __init__(self, **fields: Any) -> None:
        for name in self._fields:
            setattr(self, name, fields.get(name))


class _SyncAuthInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
):
    def __init__(self, token: str) -> None:
        self._token = token

    def _details(self, details: Any) -> Any:
        return _with_token(details, self._token, _SyncCallDetails)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)
