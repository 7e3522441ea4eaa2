"""The other workers of the cluster, as the master lists them: where a copy of a file not
in the store yet finds its blocks."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from strata.contract.errors import FailedPrecondition, StrataError
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc
from strata.contract.rpc import aio_channel
from .. import rpcutil
from ..background import BackgroundTasks
from ..blockrefs import key_of
from ..blockwire import DamagedInTransit, joined_block
from .masterlink import MasterLink

log = logging.getLogger(__name__)

# How often the worker refreshes its list of peers.
PEER_REFRESH_SECONDS = 5.0
# Seconds one peer may take to send one block.
PEER_READ_TIMEOUT = 120.0


class Peers:
    """The live workers other than this one, and a channel to each."""

    def __init__(self, link: MasterLink, *, worker_id: str, token: str) -> None:
        self._link = link
        self.worker_id = worker_id
        self._workers: dict[str, pb.WorkerInfo] = {}
        self._tasks = BackgroundTasks()
        self._channels: rpcutil.ChannelCache[grpc.aio.Channel] = rpcutil.ChannelCache(
            lambda address: aio_channel(address, token), retire=self._close_channel)

    def _close_channel(self, worker_id: str, channel: grpc.aio.Channel) -> None:
        self._tasks.spawn(channel.close(), f"close-channel-{worker_id}")

    def update(self, workers: list[pb.WorkerInfo]) -> None:
        """Take the master's list of live workers."""
        self._workers = {w.worker_id: w for w in workers}

    async def refresh(self) -> None:
        self.update(await self._link.list_workers())

    async def refresh_loop(self) -> None:
        while True:
            with contextlib.suppress(StrataError):
                await self.refresh()
            await asyncio.sleep(PEER_REFRESH_SECONDS)

    def stub(self, info: pb.WorkerInfo) -> pb_grpc.WorkerStub:
        return pb_grpc.WorkerStub(self._channels.get(info.worker_id, info.address))

    async def read_block(self, ref: pb.BlockRef, holders: list[str]) -> bytes:
        """The whole block `ref` from the first of its `holders` (worker ids) that sends it.
        FailedPrecondition when none does."""
        length = key_of(ref).length
        errors = []
        for worker_id in [h for h in holders if h in self._workers and h != self.worker_id]:
            request = pb.ReadBlockRequest(block=ref, length=length)
            try:
                chunks = [c async for c in self.stub(self._workers[worker_id]).ReadBlock(
                    request, timeout=PEER_READ_TIMEOUT)]
                data = joined_block(chunks, f"block {ref.index} of {ref.path} from worker {worker_id}")
            except grpc.RpcError as exc:
                errors.append(f"{worker_id}: {exc.details() if hasattr(exc, 'details') else exc}")
                continue
            except DamagedInTransit as exc:
                errors.append(str(exc))
                continue
            if len(data) == length:
                return data
            errors.append(f"{worker_id}: sent {len(data)} of {length} bytes")
        raise FailedPrecondition(
            f"block {ref.index} of {ref.path} is not in the store and no worker holding it answered "
            f"({'; '.join(errors) or 'no holders'}); the file cannot be copied now"
        )

    async def close(self) -> None:
        await self._tasks.close()
        for channel in self._channels.take_all():
            await channel.close()
