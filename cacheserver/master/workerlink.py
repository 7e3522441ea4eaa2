"""The master's link to its workers: a channel to each, one request sent to all of them."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import grpc

from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc
from strata.contract.rpc import aio_channel, error_of
from .. import rpcutil
from ..background import BackgroundTasks
from .membership import Membership, WorkerRecord

log = logging.getLogger(__name__)


class WorkerLink:
    """Channels to the workers (one a worker, dropped when it expires) and broadcasts."""

    def __init__(self, membership: Membership, token: str, background: BackgroundTasks) -> None:
        self.membership = membership
        self._background = background
        self._worker_channels: rpcutil.ChannelCache[grpc.aio.Channel] = rpcutil.ChannelCache(
            lambda address: aio_channel(address, token), retire=self._close_channel)

    def _close_channel(self, worker_id: str, channel: grpc.aio.Channel) -> None:
        self._background.spawn(channel.close(), f"close-channel-{worker_id}")

    def _stub(self, record: WorkerRecord) -> pb_grpc.WorkerStub:
        return pb_grpc.WorkerStub(self._worker_channels.get(record.info.worker_id, record.info.address))

    async def broadcast(self, what: str, call: str, request: object) -> list[object]:
        """Send one request to every live worker; a worker that fails is logged, not fatal."""
        records = self.membership.live()

        async def send_to(record: WorkerRecord) -> object | None:
            try:
                result: object = await getattr(self._stub(record), call)(request, timeout=60)
                return result
            except grpc.RpcError as exc:
                log.warning("%s on worker %s failed: %s", what, record.info.worker_id, exc.details() if hasattr(exc, "details") else exc)
                return None

        results = await asyncio.gather(*(send_to(r) for r in records))
        return [r for r in results if r is not None]

    async def free_blocks(self, mount_id: int, prefix: str, keep: list[pb.BlockRef] | None = None) -> int:
        request = pb.FreeBlocksRequest(mount_id=mount_id, path_prefix=prefix, keep=keep or [])
        results = await self.broadcast("free", "FreeBlocks", request)
        return sum(r.bytes_freed for r in results)  # type: ignore[attr-defined]

    async def cache_blocks(self, record: WorkerRecord, blocks: list[pb.BlockRef], what: str) -> pb.CacheBlocksResponse:
        """Have one worker cache `blocks` (how many bytes it had to fetch); its failure as the
        StrataError its status names."""
        try:
            return cast(pb.CacheBlocksResponse,
                        await self._stub(record).CacheBlocks(pb.CacheBlocksRequest(blocks=blocks), timeout=600))
        except grpc.RpcError as exc:
            raise error_of(exc, what) from exc

    def drop(self, worker_id: str) -> None:
        """Forget the channel to a worker that expired."""
        self._worker_channels.drop(worker_id)

    async def close(self) -> None:
        for channel in self._worker_channels.take_all():
            await channel.close()
