"""The cluster token: every RPC carries it, servers refuse calls without it.

Where a process finds its token, first match wins: `STRATA_TOKEN`, the file named by
`STRATA_TOKEN_FILE`, the token of the cluster `strata local up` started.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from . import constants
from .errors import InvalidArgument


def generate_token() -> str:
    return secrets.token_urlsafe(32)


def load_token(local_token_file: Path | None = None) -> str:
    """The token this process presents and expects, or InvalidArgument saying where to put it."""
    if os.environ.get(constants.ENV_TOKEN):
        return os.environ[constants.ENV_TOKEN].strip()
    candidates = []
    if os.environ.get(constants.ENV_TOKEN_FILE):
        candidates.append(Path(os.environ[constants.ENV_TOKEN_FILE]))
    if local_token_file is not None:
        candidates.append(local_token_file)
    for path in candidates:
        try:
            token = path.read_text().strip()
        except OSError:
            continue
        if token:
            return token
    raise InvalidArgument(
        "no cluster token: set STRATA_TOKEN or STRATA_TOKEN_FILE, or start a local cluster "
        "with `strata local up`"
    )


def call_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return ((constants.AUTH_METADATA_KEY, f"{constants.AUTH_SCHEME} {token}"),)


def token_matches(metadata: Any, token: str) -> bool:
    for key, value in metadata or ():
        if key == constants.AUTH_METADATA_KEY and isinstance(value, str):
            scheme, _, presented = value.partition(" ")
            return scheme == constants.AUTH_SCHEME and hmac.compare_digest(
                presented.encode(), token.encode()
            )
    return False


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses every call that does not carry the cluster token (UNAUTHENTICATED)."""

    def __init__(self, token: str) -> None:
        self._token = token

        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or wrong cluster token: pass the token of this Strata cluster "
                "(STRATA_TOKEN / STRATA_TOKEN_FILE)",
            )

        self._refuse_unary = grpc.unary_unary_rpc_method_handler(refuse)
        self._refuse_unary_stream = grpc.unary_stream_rpc_method_handler(refuse)
        self._refuse_stream_unary = grpc.stream_unary_rpc_method_handler(refuse)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if token_matches(handler_call_details.invocation_metadata, self._token):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if handler.request_streaming:
            return self._refuse_stream_unary
        if handler.response_streaming:
            return self._refuse_unary_stream
        return self._refuse_unary
