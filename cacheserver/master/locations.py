"""Where blocks are cached: the holders of blocks a worker misses, and of each block of a file."""

from __future__ import annotations

from strata.contract.config import ServerConfig
from strata.contract.errors import InvalidArgument
from strata.contract.proto import strata_pb2 as pb
from ..common.blockrefs import key_of
from ..common.keys import BlockKey
from ..namespace.tree import Namespace
from ..common.paths import received
from .blocks import MAX_LOCATE_BLOCKS, BlockIndex
from .membership import Membership
from .messages import FileInfos


class Locations:
    """Block locations answered from the block index and the workers' hosts."""

    def __init__(self, *, config: ServerConfig, namespace: Namespace, blocks: BlockIndex, membership: Membership,
                 infos: FileInfos) -> None:
        self.config = config
        self.namespace = namespace
        self.blocks = blocks
        self.membership = membership
        self.infos = infos

    async def locate_blocks(self, request: pb.LocateBlocksRequest) -> pb.LocateBlocksResponse:
        """The holders of each block asked for, from the block index alone: answered from
        memory whatever the store does, bounded by MAX_LOCATE_BLOCKS."""
        if len(request.blocks) > MAX_LOCATE_BLOCKS:
            raise InvalidArgument(f"LocateBlocks asks for {len(request.blocks)} blocks; at most "
                                  f"{MAX_LOCATE_BLOCKS} a request")
        response = pb.LocateBlocksResponse()
        for ref in request.blocks:
            holders = sorted(self.blocks.holders(key_of(ref)))
            response.blocks.append(pb.BlockLocation(
                index=ref.index, worker_ids=holders, hosts=sorted({self.membership.host_of(w) for w in holders} - {""})))
        return response

    async def get_block_locations(self, request: pb.GetBlockLocationsRequest) -> pb.GetBlockLocationsResponse:
        entry = await self.namespace.get_status(received(request.path))
        if entry.is_dir:
            raise InvalidArgument(f"{entry.path} is a directory; block locations exist for files only")
        response = pb.GetBlockLocationsResponse(file=self.infos.of(entry))
        size = entry.block_size or self.config.block_size
        for index in range((entry.length + size - 1) // size):
            key = BlockKey.of_file(entry.mount_id, entry.path, entry.version, block_size=size,
                                   file_length=entry.length, index=index)
            holders = sorted(self.blocks.holders(key))
            offset = index * size
            response.blocks.append(
                pb.BlockLocation(
                    index=index,
                    offset=offset,
                    length=min(size, entry.length - offset),
                    worker_ids=holders,
                    hosts=sorted({self.membership.host_of(w) for w in holders} - {""}),
                )
            )
        return response
