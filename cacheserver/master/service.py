"""The master's gRPC service: a thin adapter that turns each call into one call of the
master's mount table, files, block locations, writes, loads, retention, workers or reports,
and StrataErrors into gRPC statuses."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc
from .. import rpcutil
from .files import Files
from .loads import Loads
from .locations import Locations
from .mounting import Mounting
from .reports import Reports
from .retention import Retention
from .workers import Workers
from .writes import Writes


class MasterService(pb_grpc.MasterServicer):
    def __init__(self, *, mounting: Mounting, files: Files, locations: Locations, writes: Writes, loads: Loads,
                 retention: Retention, workers: Workers, reports: Reports) -> None:
        self._mounting = mounting
        self._files = files
        self._locations = locations
        self._writes = writes
        self._loads = loads
        self._retention = retention
        self._workers = workers
        self._reports = reports

    # -- mount table ---------------------------------------------------------------------------

    @rpcutil.unary
    async def Mount(self, request: pb.MountRequest, context: grpc.aio.ServicerContext) -> pb.MountResponse:
        return await self._mounting.mount(request)

    @rpcutil.unary
    async def Unmount(self, request: pb.UnmountRequest, context: grpc.aio.ServicerContext) -> pb.UnmountResponse:
        return await self._mounting.unmount(request)

    @rpcutil.unary
    async def ListMounts(self, request: pb.ListMountsRequest, context: grpc.aio.ServicerContext) -> pb.ListMountsResponse:
        return await self._mounting.list_mounts(request)

    @rpcutil.unary
    async def GetMountTable(self, request: pb.GetMountTableRequest, context: grpc.aio.ServicerContext) -> pb.GetMountTableResponse:
        return await self._mounting.get_mount_table(request)

    # -- metadata ------------------------------------------------------------------------------

    @rpcutil.unary
    async def GetStatus(self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext) -> pb.FileInfo:
        return await self._files.get_status(request)

    @rpcutil.unary
    async def ListStatus(self, request: pb.ListStatusRequest, context: grpc.aio.ServicerContext) -> pb.ListStatusResponse:
        return await self._files.list_status(request)

    @rpcutil.streaming
    async def ListStatusPages(self, request: pb.ListStatusRequest,
                              context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ListStatusResponse]:
        async for answer in self._files.list_status_pages(request):
            yield answer

    @rpcutil.unary
    async def Delete(self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext) -> pb.DeleteResponse:
        return await self._files.delete(request)

    @rpcutil.unary
    async def Rename(self, request: pb.RenameRequest, context: grpc.aio.ServicerContext) -> pb.RenameResponse:
        return await self._files.rename(request)

    @rpcutil.unary
    async def SetTimes(self, request: pb.SetTimesRequest, context: grpc.aio.ServicerContext) -> pb.FileInfo:
        return await self._files.set_times(request)

    @rpcutil.unary
    async def LocateBlocks(self, request: pb.LocateBlocksRequest, context: grpc.aio.ServicerContext) -> pb.LocateBlocksResponse:
        return await self._locations.locate_blocks(request)

    @rpcutil.unary
    async def GetBlockLocations(
        self, request: pb.GetBlockLocationsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetBlockLocationsResponse:
        return await self._locations.get_block_locations(request)

    # -- writes --------------------------------------------------------------------------------

    @rpcutil.unary
    async def CommitFile(self, request: pb.CommitFileRequest, context: grpc.aio.ServicerContext) -> pb.CommitFileResponse:
        return await self._writes.commit_file(request)

    @rpcutil.unary
    async def PrepareWrite(self, request: pb.PrepareWriteRequest, context: grpc.aio.ServicerContext) -> pb.PrepareWriteResponse:
        return await self._writes.prepare_write(request)

    @rpcutil.unary
    async def PersistFile(self, request: pb.PersistFileRequest, context: grpc.aio.ServicerContext) -> pb.PersistFileResponse:
        return await self._writes.persist_file(request)

    @rpcutil.unary
    async def AbortWrite(self, request: pb.AbortWriteRequest, context: grpc.aio.ServicerContext) -> pb.AbortWriteResponse:
        return await self._writes.abort_write(request)

    # -- cache management ----------------------------------------------------------------------

    @rpcutil.streaming
    async def Load(self, request: pb.LoadRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.LoadProgress]:
        async for answer in self._loads.load(request):
            yield answer

    @rpcutil.unary
    async def Free(self, request: pb.FreeRequest, context: grpc.aio.ServicerContext) -> pb.FreeResponse:
        return await self._retention.free(request)

    @rpcutil.unary
    async def SetPinned(self, request: pb.SetPinnedRequest, context: grpc.aio.ServicerContext) -> pb.SetPinnedResponse:
        return await self._retention.set_pinned(request)

    # -- membership ----------------------------------------------------------------------------

    @rpcutil.unary
    async def RegisterWorker(
        self, request: pb.RegisterWorkerRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterWorkerResponse:
        return await self._workers.register_worker(request)

    @rpcutil.unary
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext) -> pb.HeartbeatResponse:
        return await self._workers.heartbeat(request)

    @rpcutil.unary
    async def ListWorkers(self, request: pb.ListWorkersRequest, context: grpc.aio.ServicerContext) -> pb.ListWorkersResponse:
        return await self._workers.list_workers(request)

    @rpcutil.unary
    async def DecommissionWorkers(
        self, request: pb.DecommissionWorkersRequest, context: grpc.aio.ServicerContext
    ) -> pb.DecommissionWorkersResponse:
        return await self._workers.decommission_workers(request)

    # -- report --------------------------------------------------------------------------------

    @rpcutil.unary
    async def GetCapacity(self, request: pb.GetCapacityRequest, context: grpc.aio.ServicerContext) -> pb.GetCapacityResponse:
        return await self._reports.get_capacity(request)

    @rpcutil.unary
    async def Report(self, request: pb.ReportRequest, context: grpc.aio.ServicerContext) -> pb.ReportResponse:
        return await self._reports.report(request)
