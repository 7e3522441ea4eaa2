"""The operator's client of a cluster's master (gRPC, package strata.v1).

Every call carries the cluster token and a deadline, and a failed call raises the
`StrataError` for its status code, so callers can tell a missing bucket (NotFound) from bad
credentials (PermissionDenied) from a master that cannot be reached (Unreachable) from a master
that answered that its store cannot be reached (Unavailable, DeadlineExceeded).
`Masters` keeps one channel per master and shares one Report among the Mounts of a cluster.
A call whose channel is closed under it (the cluster's deletion forgets its master) fails
with Unreachable too, so the step retries instead of ending as cancelled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import TypeVar, cast

import grpc
import grpc.aio
from cachetools import TTLCache

from strata.cacheserver import constants as server
from strata.cacheserver.errors import StrataError, Unreachable, from_status
from strata.cacheserver.rpcutil import answered_by_server
from strata.cacheserver.proto import strata_pb2 as pb
from strata.cacheserver.proto import strata_pb2_grpc as pb_grpc

# Codes that mean "the master is not there (yet)": retry later, do not blame the spec.
_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


_T = TypeVar("_T")


def _error(exc: grpc.aio.AioRpcError) -> StrataError:
    """The error for a failed call; callers name the master in what they tell people."""
    details = exc.details() or exc.code().name
    if exc.code() in _UNREACHABLE and not answered_by_server(exc):
        return Unreachable(details)
    return from_status(exc.code(), details)  # the master's own answer (e.g. its store is down)


class MasterClient:
    """One master, one channel. Use `async with` or call `close()`."""

    def __init__(self, endpoint: str, token: str, *, timeout: float) -> None:
        self.endpoint = endpoint
        self._timeout = timeout
        self._metadata = ((server.AUTH_METADATA_KEY, f"{server.AUTH_SCHEME} {token}"),)
        self._channel = grpc.aio.insecure_channel(endpoint)
        self._stub = pb_grpc.MasterStub(self._channel)

    async def __aenter__(self) -> MasterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, call: Awaitable[_T]) -> _T:
        """The call's answer, or the StrataError for its failure."""
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this task is being stopped: let it stop
            # grpc cancels the calls of a channel that is closed (Masters.forget).
            raise Unreachable(f"the connection to the master at {self.endpoint} was closed during the call "
                              "(its cluster is being deleted, or its channel was replaced)") from None

    async def mount(self, request: pb.MountRequest) -> pb.MountResponse:
        """The mount as the master now holds it, and whether this call changed it."""
        response = await self._call(self._stub.Mount(request, metadata=self._metadata, timeout=self._timeout))
        return cast(pb.MountResponse, response)

    async def unmount(self, path: str, *, free: bool = True) -> None:
        await self._call(self._stub.Unmount(
            pb.UnmountRequest(path=path, free=free), metadata=self._metadata, timeout=self._timeout))

    async def report(self) -> pb.ReportResponse:
        report = await self._call(self._stub.Report(pb.ReportRequest(), metadata=self._metadata,
                                                    timeout=self._timeout))
        return cast(pb.ReportResponse, report)

    async def decommission(self, worker_ids: Sequence[str]) -> None:
        await self._call(self._stub.DecommissionWorkers(
            pb.DecommissionWorkersRequest(worker_ids=list(worker_ids)), metadata=self._metadata,
            timeout=self._timeout))

    async def start_load(self, path: str) -> pb.LoadProgress | None:
        """Start loading `path` into the cache and return its first progress message (None if
        the load finished without one). The master goes on after the stream is cancelled;
        progress is followed through Report."""
        call = self._stub.Load(pb.LoadRequest(path=path), metadata=self._metadata, timeout=self._timeout)
        try:
            async for progress in call:
                return cast(pb.LoadProgress, progress)
            return None
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        finally:
            call.cancel()


# Masters whose Reports are kept at once (one per CacheCluster's master and token).
REPORTS_KEPT = 1024


class Masters:
    """Clients by (endpoint, token), and each master's Report reused for `report_ttl` seconds."""

    def __init__(self, *, timeout: float, report_ttl: float) -> None:
        self._timeout = timeout
        self._clients: dict[tuple[str, str], MasterClient] = {}
        self._reports: TTLCache[tuple[str, str], pb.ReportResponse] = TTLCache(REPORTS_KEPT, report_ttl)
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def client(self, endpoint: str, token: str) -> MasterClient:
        key = (endpoint, token)
        if key not in self._clients:
            self._clients[key] = MasterClient(endpoint, token, timeout=self._timeout)
        return self._clients[key]

    async def report(self, endpoint: str, token: str, *, fresh: bool = False) -> pb.ReportResponse:
        """The master's Report, from the cache unless older than the TTL or `fresh`."""
        key = (endpoint, token)
        async with self._locks.setdefault(key, asyncio.Lock()):
            cached = self._reports.get(key)
            if cached is not None and not fresh:
                return cached
            report = await self.client(endpoint, token).report()
            self._reports[key] = report
            return report

    def invalidate(self, endpoint: str) -> None:
        """Forget cached Reports of a master (after a change such as a mount)."""
        for key in [k for k in self._reports if k[0] == endpoint]:
            del self._reports[key]

    async def forget(self, endpoint: str) -> None:
        """Close the channels to a master that is gone (its cluster was deleted)."""
        self.invalidate(endpoint)
        for key in [k for k in self._clients if k[0] == endpoint]:
            await self._clients.pop(key).close()

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        self._reports.clear()
        for client in clients.values():
            await client.close()
