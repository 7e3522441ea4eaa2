"""The worker's calls to the master, each with its deadline and its error: a failed call
raises the StrataError a reader or writer should see, naming what was asked."""

from __future__ import annotations

import logging

import grpc

from strata.contract.errors import Unavailable
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc
from .. import rpcutil

log = logging.getLogger(__name__)

# Seconds a worker waits for the master's status of a file whose block it fetches.
FILE_STATUS_TIMEOUT = 10.0
# Seconds for the master calls of a write (prepare, commit, withdraw).
MASTER_WRITE_TIMEOUT = 30.0
# Seconds for the calls the master answers from memory or its journal (mount table, block
# locations, registration).
MASTER_CALL_TIMEOUT = 30.0
# Seconds for the calls a worker repeats every few seconds (heartbeat, list of peers): one
# that hangs must not hold back the next.
MASTER_TICK_TIMEOUT = 10.0


class MasterLink:
    """The master as one worker sees it, over one channel."""

    def __init__(self, address: str, token: str, *, worker_id: str, block_size: int) -> None:
        self.address = address
        self._channel = rpcutil.aio_channel(address, token)
        # The raw stub, for the ASYNC_THROUGH uploads (they retry on gRPC errors themselves).
        self.stub = pb_grpc.MasterStub(self._channel)
        self.worker_id = worker_id
        self.block_size = block_size

    # -- namespace ---------------------------------------------------------------------------

    async def file_status(self, path: str, *, refresh: bool = False) -> pb.FileInfo:
        """The namespace's status of `path`; `refresh` makes the master ask the store again."""
        try:
            info: pb.FileInfo = await self.stub.GetStatus(pb.GetStatusRequest(path=path, refresh=refresh),
                                                          timeout=FILE_STATUS_TIMEOUT)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Unavailable(f"the master did not tell the status of {path} within "
                                  f"{FILE_STATUS_TIMEOUT:g}s") from exc
            raise rpcutil.raise_from_rpc_error(exc, f"status of {path} from the master") from exc
        return info

    async def locate(self, path: str) -> pb.GetBlockLocationsResponse:
        """The file at `path` and its blocks' holders. NotFound if no file."""
        try:
            located: pb.GetBlockLocationsResponse = await self.stub.GetBlockLocations(
                pb.GetBlockLocationsRequest(path=path), timeout=MASTER_CALL_TIMEOUT)
        except grpc.RpcError as exc:
            raise rpcutil.raise_from_rpc_error(exc, f"locating the blocks of {path}") from exc
        return located

    async def mount_table(self) -> pb.GetMountTableResponse:
        """The mount table with the stores' credentials (only workers may ask for it)."""
        table: pb.GetMountTableResponse = await self.stub.GetMountTable(pb.GetMountTableRequest(),
                                                                        timeout=MASTER_CALL_TIMEOUT)
        return table

    # -- writes ------------------------------------------------------------------------------

    async def prepare_write(self, path: str, *, overwrite: bool) -> str:
        """Ask the master before writing: refuses an existing file (unless overwrite) and
        holds back older uploads of it until this write ends. Returns the write's id."""
        try:
            response = await self.stub.PrepareWrite(pb.PrepareWriteRequest(path=path, overwrite=overwrite),
                                                    timeout=MASTER_WRITE_TIMEOUT)
        except grpc.RpcError as exc:
            raise rpcutil.raise_from_rpc_error(exc, f"preparing the write of {path} on the master") from exc
        return str(response.write_id)

    async def commit_file(self, path: str, length: int, version: str, *, persisted: bool, ufs_version: str,
                          write_id: str) -> pb.FileInfo:
        """Record a written file in the namespace, cut at this cluster's block size."""
        try:
            response = await self.stub.CommitFile(pb.CommitFileRequest(
                path=path, length=length, version=version, block_size=self.block_size,
                persisted=persisted, worker_id=self.worker_id, ufs_version=ufs_version, write_id=write_id,
            ), timeout=MASTER_WRITE_TIMEOUT)
        except grpc.RpcError as exc:
            raise rpcutil.raise_from_rpc_error(exc, f"committing {path} on the master") from exc
        file: pb.FileInfo = response.file
        return file

    async def abort_write(self, path: str, version: str, write_id: str) -> None:
        """Tell the master a write ended without an acknowledgement: its commit (`version`,
        if the master recorded it) is dropped. Best effort: the write's lease runs out anyway."""
        try:
            await self.stub.AbortWrite(pb.AbortWriteRequest(path=path, version=version, write_id=write_id),
                                       timeout=MASTER_WRITE_TIMEOUT)
        except grpc.RpcError as exc:
            log.warning("could not withdraw the failed write of %s: %s", path,
                        exc.details() if hasattr(exc, "details") else exc)

    # -- membership --------------------------------------------------------------------------

    async def register(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerResponse:
        response: pb.RegisterWorkerResponse = await self.stub.RegisterWorker(request, timeout=MASTER_CALL_TIMEOUT)
        return response

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        response: pb.HeartbeatResponse = await self.stub.Heartbeat(request, timeout=MASTER_TICK_TIMEOUT)
        return response

    async def list_workers(self) -> list[pb.WorkerInfo]:
        response = await self.stub.ListWorkers(pb.ListWorkersRequest(), timeout=MASTER_TICK_TIMEOUT)
        return list(response.workers)

    async def close(self) -> None:
        await self._channel.close()
