"""The worker's gRPC service: a thin adapter that turns each call into one call of the
worker's reads, writes or retention, and StrataErrors into gRPC statuses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from strata.contract import constants
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc
from .. import rpcutil
from ..common.blockwire import client_label
from ..common.checksums import CHUNK_SIZE
from ..common.paths import check_limits
from .reads import BlockReads
from .retention import Retention
from .writes import Writes


class WorkerService(pb_grpc.WorkerServicer):
    def __init__(self, *, reads: BlockReads, writes: Writes, retention: Retention) -> None:
        self._reads = reads
        self._writes = writes
        self._retention = retention

    @rpcutil.streaming
    async def ReadBlock(self, request: pb.ReadBlockRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ReadBlockChunk]:
        check_limits(request.block.path, what="block path")
        if request.held_only:  # a worker that misses the block: only what is cached here
            source = await self._reads.held_source(request.block, request.offset, request.length)
        else:
            source = await self._reads.read_source(request.block, request.read_type, offset=request.offset,
                                                   length=request.length, readahead=request.readahead_blocks,
                                                   as_file=False)
            self._reads.counters.served_bytes["grpc", client_label(request.client)] += source.length
        data = source.data
        view = memoryview(data)
        step = constants.STREAM_CHUNK_SIZE
        checksums = await asyncio.to_thread(source.sent_checksums)  # CPU for a whole block: off the loop
        yield pb.ReadBlockChunk(data=bytes(view[:step]), cache_hit=source.hit, checksums=checksums,
                                checksum_chunk_size=CHUNK_SIZE)
        for i in range(step, len(data), step):
            yield pb.ReadBlockChunk(data=bytes(view[i:i + step]))

    @rpcutil.unary
    async def CacheBlocks(self, request: pb.CacheBlocksRequest, context: grpc.aio.ServicerContext) -> pb.CacheBlocksResponse:
        for ref in request.blocks:
            check_limits(ref.path, what="block path")
        cached, fetched, from_store = await self._reads.cache_blocks(list(request.blocks))
        return pb.CacheBlocksResponse(bytes_cached=cached, bytes_fetched=fetched, bytes_from_store=from_store)

    @rpcutil.unary
    async def WriteFile(self, request_iterator: AsyncIterator[pb.WriteFileChunk], context: grpc.aio.ServicerContext) -> pb.WriteFileResponse:
        return pb.WriteFileResponse(file=await self._writes.write_file(request_iterator))

    @rpcutil.unary
    async def AppendFile(self, request_iterator: AsyncIterator[pb.WriteFileChunk], context: grpc.aio.ServicerContext) -> pb.WriteFileResponse:
        return pb.WriteFileResponse(file=await self._writes.append_file(request_iterator))

    @rpcutil.unary
    async def CopyFile(self, request: pb.CopyFileRequest, context: grpc.aio.ServicerContext) -> pb.WriteFileResponse:
        return pb.WriteFileResponse(file=await self._writes.copy_file(request))

    @rpcutil.unary
    async def FreeBlocks(self, request: pb.FreeBlocksRequest, context: grpc.aio.ServicerContext) -> pb.FreeBlocksResponse:
        return pb.FreeBlocksResponse(bytes_freed=self._retention.free(request))

    @rpcutil.unary
    async def PinBlocks(self, request: pb.PinBlocksRequest, context: grpc.aio.ServicerContext) -> pb.PinBlocksResponse:
        return pb.PinBlocksResponse(blocks=self._retention.pin(request))
