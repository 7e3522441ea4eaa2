"""The worker's calls to the master (through the shared master client), each with its
deadline and its error: a failed call raises the StrataError a reader or writer should see,
naming what was asked."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Sequence

import grpc

from strata.contract.errors import StrataError
from strata.contract.master import MasterClient
from strata.contract.proto import strata_pb2 as pb
from strata.contract.rpc import error_of
from .settings import MASTER_WAIT_SETTING, MasterLinkSettings

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
    """The master as one worker sees it: the shared master client with this worker's id,
    block size, deadlines and messages. The calls of a write wait for a master that is
    coming back (`MasterLinkSettings.master_wait`) rather than fail at once."""

    def __init__(self, address: str, token: str, *, worker_id: str, block_size: int,
                 settings: MasterLinkSettings | None = None) -> None:
        self.address = address
        self.settings = settings or MasterLinkSettings()
        self.client = MasterClient(address, token, timeout=MASTER_CALL_TIMEOUT)
        # The raw stub, for the ASYNC_THROUGH uploads (they retry on gRPC errors themselves).
        self.stub = self.client.stub
        self.worker_id = worker_id
        self.block_size = block_size

    # -- namespace ---------------------------------------------------------------------------

    async def file_status(self, path: str, *, refresh: bool = False) -> pb.FileInfo:
        """The namespace's status of `path`; `refresh` makes the master ask the store again.
        Unreachable when the master did not answer, refused or silent for FILE_STATUS_TIMEOUT
        (worker/outagestatuses.py then stands in for it)."""
        return await self.client.get_status(
            path, refresh=refresh, timeout=FILE_STATUS_TIMEOUT,
            what=f"status of {path} from the master")

    async def folder_statuses(self, path: str, limit: int, *, timeout: float) -> list[pb.FileInfo] | None:
        """The statuses of the entries of the folder at `path` (not below it), as the master
        lists them, page by page; None when it has more than `limit` (the listing is cut off
        there). The whole listing within `timeout` seconds (DeadlineExceeded otherwise)."""
        what = f"listing {path} at the master"
        call = self.stub.ListStatusPages(pb.ListStatusRequest(path=path, page_size=min(limit + 1, 1000)),
                                         timeout=timeout)
        files: list[pb.FileInfo] = []
        try:
            async for page in call:
                files.extend(page.files)
                if len(files) > limit:
                    call.cancel()
                    return None
        except grpc.RpcError as exc:
            raise error_of(exc, what) from exc
        return files

    async def folder_pages(self, path: str, *, timeout: float) -> AsyncGenerator[Sequence[pb.FileInfo], None]:
        """The statuses of the entries of the folder at `path` (not below it), a page of the
        master's listing at a time, as the caller takes them; the whole listing within
        `timeout` seconds (DeadlineExceeded otherwise). Closing the generator ends the call."""
        call = self.stub.ListStatusPages(pb.ListStatusRequest(path=path), timeout=timeout)
        try:
            async for page in call:
                yield page.files
        except grpc.RpcError as exc:
            raise error_of(exc, f"listing {path} at the master") from exc
        finally:
            call.cancel()

    async def locate(self, path: str) -> pb.GetBlockLocationsResponse:
        """The file at `path` and its blocks' holders (a copy's or an append's). NotFound if
        no file."""
        what = f"locating the blocks of {path}"
        await self._reachable(what)
        return await self.client.block_locations(path, what=what)

    async def mount_table(self) -> pb.GetMountTableResponse:
        """The mount table with the stores' credentials (only workers may ask for it)."""
        return await self.client.mount_table(what="the mount table from the master")

    # -- writes ------------------------------------------------------------------------------

    async def _reachable(self, what: str) -> None:
        """Wait for the channel to the master, up to `master_wait`: a write's calls made in
        the reconnect back-off after a master restart would fail at once."""
        await self.client.wait_ready(self.settings.master_wait, what=what, limit=MASTER_WAIT_SETTING)

    async def prepare_write(self, path: str, *, overwrite: bool, exclusive: bool = False) -> str:
        """Ask the master before writing: refuses an existing file (unless overwrite) and
        holds back older uploads of it until this write ends; `exclusive` (an append) waits
        for the other writes of the file to end and holds back those that come after it.
        Returns the write's id."""
        what = f"preparing the write of {path} on the master"
        await self._reachable(what)
        response = await self.client.prepare_write(
            pb.PrepareWriteRequest(path=path, overwrite=overwrite, exclusive=exclusive, worker_id=self.worker_id),
            timeout=MASTER_WRITE_TIMEOUT, what=what)
        return str(response.write_id)

    async def commit_file(self, path: str, length: int, version: str, *, persisted: bool, ufs_version: str,
                          write_id: str) -> pb.FileInfo:
        """Record a written file in the namespace, cut at this cluster's block size."""
        what = f"committing {path} on the master"
        await self._reachable(what)
        response = await self.client.commit_file(pb.CommitFileRequest(
            path=path, length=length, version=version, block_size=self.block_size,
            persisted=persisted, worker_id=self.worker_id, ufs_version=ufs_version, write_id=write_id,
        ), timeout=MASTER_WRITE_TIMEOUT, what=what)
        file: pb.FileInfo = response.file
        return file

    async def abort_write(self, path: str, version: str, write_id: str) -> None:
        """Tell the master a write ended without an acknowledgement: its commit (`version`,
        if the master recorded it) is dropped. Best effort: the write's lease runs out anyway."""
        try:
            await self._reachable(f"withdrawing the write of {path}")
            await self.client.abort_write(pb.AbortWriteRequest(path=path, version=version, write_id=write_id),
                                          timeout=MASTER_WRITE_TIMEOUT)
        except StrataError as exc:
            log.warning("could not withdraw the failed write of %s: %s", path, exc)

    # -- membership --------------------------------------------------------------------------

    async def register(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerResponse:
        return await self.client.register_worker(request, timeout=MASTER_CALL_TIMEOUT)

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        return await self.client.heartbeat(request, timeout=MASTER_TICK_TIMEOUT)

    async def list_workers(self) -> list[pb.WorkerInfo]:
        return await self.client.list_workers(timeout=MASTER_TICK_TIMEOUT)

    async def close(self) -> None:
        await self.client.close()
