"""Credentials and roles: every RPC carries a token, the token says which role the caller has,
and one table says which roles may call each method.

Three credentials, three roles:
- admin (`STRATA_TOKEN`): the operator, `strata mount`, `free`, `pin`, `load`, `report`;
  also everything the data role may do.
- data (`STRATA_DATA_TOKEN`): read and write files. What pods and CSI volumes get.
- internal (`STRATA_INTERNAL_TOKEN`): master and workers among themselves (registration,
  heartbeats, the mount table with the stores' credentials, block management on workers);
  also everything the data role may do (peers read blocks from each other).

Each variable has a `*_FILE` twin naming a file that holds the token. A server that is given
only the admin token derives the other two from it (HMAC-SHA256), so a one-token setup keeps
working; the operator gives each its own random token. Where a client finds its token, first
match wins: `STRATA_TOKEN`, `STRATA_TOKEN_FILE`, `STRATA_DATA_TOKEN`,
`STRATA_DATA_TOKEN_FILE`, the admin token of the cluster `strata local up` started.

The server interceptor decides from the call's metadata alone, before a request body is
read: a refused call never has its message received.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import os
import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from strata.contract import constants
from strata.contract.errors import InvalidArgument


class Role(enum.Enum):
    DATA = "data"
    ADMIN = "admin"
    INTERNAL = "internal"


# Roles that may call a method, by the least one it needs.
_DATA = frozenset({Role.DATA, Role.ADMIN, Role.INTERNAL})
_ADMIN = frozenset({Role.ADMIN})
_INTERNAL = frozenset({Role.INTERNAL})

# What a block socket (data port, short-circuit socket) serves: block reads.
BLOCK_SOCKET = "block-socket"

# The one table of who may call what. A method missing here is refused to every caller.
METHOD_ROLES: dict[str, frozenset[Role]] = {
    **{f"/{constants.GRPC_PACKAGE}.Master/{name}": roles for name, roles in {
        "Mount": _ADMIN, "Unmount": _ADMIN, "Load": _ADMIN, "Free": _ADMIN, "SetPinned": _ADMIN,
        "DecommissionWorkers": _ADMIN, "Report": _ADMIN,
        "ListMounts": _DATA, "GetStatus": _DATA, "ListStatus": _DATA, "ListStatusPages": _DATA, "Delete": _DATA,
        "Rename": _DATA, "GetBlockLocations": _DATA, "ListWorkers": _DATA, "GetCapacity": _DATA,
        "SetTimes": _DATA,
        "CommitFile": _INTERNAL, "RegisterWorker": _INTERNAL, "Heartbeat": _INTERNAL,
        "GetMountTable": _INTERNAL, "PrepareWrite": _INTERNAL, "PersistFile": _INTERNAL, "AbortWrite": _INTERNAL,
        "LocateBlocks": _INTERNAL,
    }.items()},
    **{f"/{constants.GRPC_PACKAGE}.Worker/{name}": roles for name, roles in {
        "ReadBlock": _DATA, "WriteFile": _DATA, "AppendFile": _DATA, "CopyFile": _DATA,
        "CacheBlocks": _INTERNAL, "FreeBlocks": _INTERNAL, "PinBlocks": _INTERNAL,
    }.items()},
    BLOCK_SOCKET: _DATA,
}

ROLE_ENV = {
    Role.ADMIN: (constants.ENV_TOKEN, constants.ENV_TOKEN_FILE),
    Role.DATA: (constants.ENV_DATA_TOKEN, constants.ENV_DATA_TOKEN_FILE),
    Role.INTERNAL: (constants.ENV_INTERNAL_TOKEN, constants.ENV_INTERNAL_TOKEN_FILE),
}

# Every variable that carries a credential.
CREDENTIAL_ENV = frozenset(name for pair in ROLE_ENV.values() for name in pair)


def generate_token() -> str:
    return secrets.token_urlsafe(32)


def derive_token(admin: str, role: Role) -> str:
    """The token of `role` for a server given only the admin token."""
    digest = hmac.new(admin.encode(), f"strata {role.value} credential".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _from_env(role: Role) -> str | None:
    """The token of `role` from its variable or its file variable, if either is set."""
    value_env, file_env = ROLE_ENV[role]
    if os.environ.get(value_env, "").strip():
        return os.environ[value_env].strip()
    if os.environ.get(file_env):
        path = Path(os.environ[file_env])
        token = _read(path)
        if token is None:
            raise InvalidArgument(f"{file_env}={path}: the file cannot be read or is empty")
        return token
    return None


def _read(path: Path) -> str | None:
    try:
        token = path.read_text().strip()
    except OSError:
        return None
    return token or None


def load_token(local_token_file: Path | None = None) -> str:
    """The token a client presents, or InvalidArgument saying where to put it."""
    for role in (Role.ADMIN, Role.DATA):
        token = _from_env(role)
        if token:
            return token
    token = _read(local_token_file) if local_token_file is not None else None
    if token:
        return token
    raise InvalidArgument(
        "no cluster token: set STRATA_TOKEN (admin) or STRATA_DATA_TOKEN (read and write files), "
        "or their *_FILE variants, or start a local cluster with `strata local up`"
    )


@dataclass(frozen=True)
class Credentials:
    """The tokens a server accepts; `internal` is also what it presents to its peers."""

    admin: str = field(repr=False)
    data: str = field(repr=False)
    internal: str = field(repr=False)

    @classmethod
    def from_admin(cls, admin: str, *, data: str | None = None, internal: str | None = None) -> Credentials:
        return cls(admin=admin, data=data or derive_token(admin, Role.DATA),
                   internal=internal or derive_token(admin, Role.INTERNAL))

    def __post_init__(self) -> None:
        tokens = [self.admin, self.data, self.internal]
        if not all(tokens):
            raise InvalidArgument("every credential (admin, data, internal) must be non-empty")
        if len(set(tokens)) != len(tokens):
            raise InvalidArgument("the admin, data and internal tokens must differ: each names one role")

    def role_of(self, presented: str) -> Role | None:
        found = None
        for role, token in ((Role.ADMIN, self.admin), (Role.DATA, self.data), (Role.INTERNAL, self.internal)):
            # Compare with every token (constant time each): no early exit that times the match.
            if hmac.compare_digest(presented.encode(), token.encode()):
                found = role
        return found


def load_credentials() -> Credentials:
    """A server's credentials from the environment; data and internal tokens not given are
    derived from the admin token."""
    tokens = {role: _from_env(role) for role in Role}
    admin = tokens[Role.ADMIN]
    if not admin:
        raise InvalidArgument(
            "no admin token: set STRATA_TOKEN or STRATA_TOKEN_FILE (and, to give each role its own "
            "token, STRATA_DATA_TOKEN and STRATA_INTERNAL_TOKEN or their *_FILE variants)"
        )
    return Credentials.from_admin(admin, data=tokens[Role.DATA], internal=tokens[Role.INTERNAL])


def local_token_name(role: Role) -> str:
    """File name of a role's token in a local cluster's folder."""
    return "token" if role is Role.ADMIN else f"{role.value}-token"


def presented_token(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    for key, value in metadata or ():
        if key == constants.AUTH_METADATA_KEY and isinstance(value, str):
            scheme, _, presented = value.partition(" ")
            return presented if scheme == constants.AUTH_SCHEME else None
    return None


def check_access(credentials: Credentials, method: str, presented: str | None) -> tuple[grpc.StatusCode, str] | None:
    """None when a caller presenting `presented` may call `method`, else the status and the
    message to refuse it with."""
    role = credentials.role_of(presented) if presented else None
    if role is None:
        return grpc.StatusCode.UNAUTHENTICATED, (
            "missing or wrong cluster token: pass a token of this Strata cluster "
            "(STRATA_TOKEN or STRATA_DATA_TOKEN, or their *_FILE variants)"
        )
    allowed = METHOD_ROLES.get(method, frozenset())
    if role in allowed:
        return None
    if not allowed:
        return grpc.StatusCode.PERMISSION_DENIED, f"{method} is not open to any caller"
    needs = " or ".join(sorted(r.value for r in allowed))
    return grpc.StatusCode.PERMISSION_DENIED, (
        f"{method} needs the {needs} credential; this call carries the {role.value} credential"
    )


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses, from the metadata alone, every call whose token is unknown
    (UNAUTHENTICATED) or whose role may not call the method (PERMISSION_DENIED).

    A refused call is answered by a handler that streams requests and never reads one:
    however large the message the caller sends, the server does not receive it.
    """

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        refusal = check_access(self._credentials, method, presented_token(handler_call_details.invocation_metadata))
        if refusal is None:
            return await continuation(handler_call_details)
        code, message = refusal

        async def refuse(request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(code, message)

        return grpc.stream_stream_rpc_method_handler(refuse)
