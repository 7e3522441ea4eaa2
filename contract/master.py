"""The one asyncio client of a master (gRPC service strata.v1.Master), used by the operator,
the workers and the CLI.

Every call carries the token (the channel's interceptors: METHOD_ROLES of the cache server's
auth decides what the token's role may call) and a deadline (the client's, or the call's
own), and a failed call raises the StrataError of its status code, so callers can tell a
missing bucket (NotFound) from bad credentials (PermissionDenied) from a master that cannot be
reached or did not answer in time (Unreachable) from a master that answered that its store
cannot be reached (Unavailable, DeadlineExceeded). A call whose channel is closed under it
(`close()` while it runs) fails with Unreachable too, so a caller retries it like any call to
an absent master; a task that is itself cancelled still ends cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Sequence
from typing import TypeVar, cast

import grpc
import grpc.aio

from .errors import StrataError, Unavailable, Unreachable
from .proto import strata_pb2 as pb
from .proto import strata_pb2_grpc as pb_grpc
from .rpc import NO_ANSWER, aio_channel, error_of

_T = TypeVar("_T")

# A call cancelled without the master's answer (the channel went away under it) is as
# unanswered as one that could not connect.
_NO_ANSWER = (*NO_ANSWER, grpc.StatusCode.CANCELLED)


class MasterClient:
    """One master over one channel. `timeout` (seconds) bounds each call that names none;
    `what` names a call in the message of an absent or late master (rpc.error_of: the worker
    and the CLI say what they asked; the operator's own messages name the master, so it
    passes none). Use `async with` or call `close()`."""

    def __init__(self, address: str, token: str, *, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self._channel = aio_channel(address, token)
        # The raw stub over the same channel, for callers that handle gRPC errors themselves
        # (the worker's ASYNC_THROUGH uploads retry on them).
        self.stub = pb_grpc.MasterStub(self._channel)

    async def __aenter__(self) -> MasterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    def _error(self, exc: grpc.RpcError, what: str) -> StrataError:
        return error_of(exc, what, no_answer=_NO_ANSWER)

    def _closed(self) -> Unreachable:
        return Unreachable(f"the connection to the master at {self.address} was closed during the call "
                           "(its client was closed: e.g. its cluster is being deleted, or its channel was replaced)")

    async def _answer(self, call: Awaitable[_T], what: str, *, late: str = "") -> _T:
        """The call's answer, or the StrataError for its failure; with `late`, a call that
        ends DEADLINE_EXCEEDED raises Unavailable(late) instead."""
        try:
            return await call
        except grpc.RpcError as exc:
            if late and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Unavailable(late) from exc
            raise self._error(exc, what) from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this task is being stopped: let it stop
            raise self._closed() from None  # grpc cancels the calls of a channel that is closed

    def _deadline(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout

    async def wait_ready(self, timeout: float, *, what: str, limit: str = "") -> None:
        """Wait, at most `timeout` seconds, until the channel is connected to the master
        (connecting it if idle): right after the master restarts the channel is in reconnect
        back-off, and a call made then fails at once. Unreachable naming `what`, the master
        and `limit` (what sets the wait) if it is not connected by then."""
        if self._channel.get_state(try_to_connect=True) is grpc.ChannelConnectivity.READY:
            return
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except TimeoutError:
            raise Unreachable(f"{what}: the master at {self.address} could not be reached for {timeout:g}s "
                              f"(down or restarting){f'; {limit} sets this wait' if limit else ''}") from None

    # -- mounts and the cache (admin) --------------------------------------------------------

    async def mount(self, request: pb.MountRequest, *, what: str = "") -> pb.MountResponse:
        """The mount as the master now holds it, and whether this call changed it."""
        return cast(pb.MountResponse, await self._answer(self.stub.Mount(request, timeout=self.timeout), what))

    async def unmount(self, path: str, *, free: bool = True, what: str = "") -> None:
        await self._answer(self.stub.Unmount(pb.UnmountRequest(path=path, free=free), timeout=self.timeout), what)

    async def list_mounts(self, *, what: str = "") -> list[pb.MountInfo]:
        response = await self._answer(self.stub.ListMounts(pb.ListMountsRequest(), timeout=self.timeout), what)
        return list(cast(pb.ListMountsResponse, response).mounts)

    async def report(self, *, what: str = "") -> pb.ReportResponse:
        return cast(pb.ReportResponse, await self._answer(self.stub.Report(pb.ReportRequest(), timeout=self.timeout),
                                                          what))

    async def decommission(self, worker_ids: Sequence[str], *, serving: Sequence[str] = (), what: str = "") -> None:
        """Tell the master that `worker_ids` leave (no new placements) and that `serving`
        are wanted in service (out of decommissioning)."""
        request = pb.DecommissionWorkersRequest(worker_ids=list(worker_ids), serving=list(serving))
        await self._answer(self.stub.DecommissionWorkers(request, timeout=self.timeout), what)

    async def free(self, path: str, *, what: str = "") -> int:
        """Bytes of cached blocks under `path` freed."""
        response = await self._answer(self.stub.Free(pb.FreeRequest(path=path), timeout=self.timeout), what)
        return int(cast(pb.FreeResponse, response).bytes_freed)

    async def set_pinned(self, path: str, pinned: bool, *, what: str = "") -> None:
        request = pb.SetPinnedRequest(path=path, pinned=pinned)
        await self._answer(self.stub.SetPinned(request, timeout=self.timeout), what)

    async def load(self, path: str, *, bandwidth: int = 0, refresh: bool = False, timeout: float | None = None,
                   what: str = "") -> AsyncGenerator[pb.LoadProgress, None]:
        """The progress of loading `path` into the cache, message by message, until it ends;
        at most `bandwidth` bytes a second (0: no limit), after asking the store again with
        `refresh`."""
        request = pb.LoadRequest(path=path, bandwidth=bandwidth, refresh=refresh)
        call = self.stub.Load(request, timeout=self._deadline(timeout))
        try:
            async for progress in call:
                yield cast(pb.LoadProgress, progress)
        except grpc.RpcError as exc:
            raise self._error(exc, what) from exc
        finally:
            call.cancel()

    async def start_load(self, path: str, *, bandwidth: int = 0, refresh: bool = False,
                         what: str = "") -> pb.LoadProgress | None:
        """Start loading `path` into the cache (see `load`) and return its first progress
        message (None if the load finished without one). The master goes on after the stream
        is cancelled; progress is followed through Report."""
        progress = self.load(path, bandwidth=bandwidth, refresh=refresh, what=what)
        try:
            return await anext(progress, None)
        finally:
            await progress.aclose()

    # -- the namespace -----------------------------------------------------------------------

    async def get_status(self, path: str, *, refresh: bool = False, timeout: float | None = None,
                         what: str = "", late: str = "") -> pb.FileInfo:
        """The namespace's status of `path`; `refresh` makes the master ask the store again."""
        call = self.stub.GetStatus(pb.GetStatusRequest(path=path, refresh=refresh), timeout=self._deadline(timeout))
        return cast(pb.FileInfo, await self._answer(call, what, late=late))

    async def block_locations(self, path: str, *, timeout: float | None = None,
                              what: str = "") -> pb.GetBlockLocationsResponse:
        call = self.stub.GetBlockLocations(pb.GetBlockLocationsRequest(path=path), timeout=self._deadline(timeout))
        return cast(pb.GetBlockLocationsResponse, await self._answer(call, what))

    # -- what workers ask (internal) ---------------------------------------------------------

    async def locate_blocks(self, refs: list[pb.BlockRef], *, timeout: float | None = None,
                            what: str = "") -> list[pb.BlockLocation]:
        """The workers holding each block of `refs`, in their order (from the master's block
        index; no store call)."""
        call = self.stub.LocateBlocks(pb.LocateBlocksRequest(blocks=refs), timeout=self._deadline(timeout))
        return list(cast(pb.LocateBlocksResponse, await self._answer(call, what)).blocks)

    async def mount_table(self, *, timeout: float | None = None, what: str = "") -> pb.GetMountTableResponse:
        """The mount table with the stores' credentials (only workers may ask for it)."""
        call = self.stub.GetMountTable(pb.GetMountTableRequest(), timeout=self._deadline(timeout))
        return cast(pb.GetMountTableResponse, await self._answer(call, what))

    async def prepare_write(self, request: pb.PrepareWriteRequest, *, timeout: float | None = None,
                            what: str = "") -> pb.PrepareWriteResponse:
        call = self.stub.PrepareWrite(request, timeout=self._deadline(timeout))
        return cast(pb.PrepareWriteResponse, await self._answer(call, what))

    async def commit_file(self, request: pb.CommitFileRequest, *, timeout: float | None = None,
                          what: str = "") -> pb.CommitFileResponse:
        call = self.stub.CommitFile(request, timeout=self._deadline(timeout))
        return cast(pb.CommitFileResponse, await self._answer(call, what))

    async def abort_write(self, request: pb.AbortWriteRequest, *, timeout: float | None = None,
                          what: str = "") -> None:
        await self._answer(self.stub.AbortWrite(request, timeout=self._deadline(timeout)), what)

    async def register_worker(self, request: pb.RegisterWorkerRequest, *, timeout: float | None = None,
                              what: str = "") -> pb.RegisterWorkerResponse:
        call = self.stub.RegisterWorker(request, timeout=self._deadline(timeout))
        return cast(pb.RegisterWorkerResponse, await self._answer(call, what))

    async def heartbeat(self, request: pb.HeartbeatRequest, *, timeout: float | None = None,
                        what: str = "") -> pb.HeartbeatResponse:
        call = self.stub.Heartbeat(request, timeout=self._deadline(timeout))
        return cast(pb.HeartbeatResponse, await self._answer(call, what))

    async def list_workers(self, *, timeout: float | None = None, what: str = "") -> list[pb.WorkerInfo]:
        call = self.stub.ListWorkers(pb.ListWorkersRequest(), timeout=self._deadline(timeout))
        return list(cast(pb.ListWorkersResponse, await self._answer(call, what)).workers)
