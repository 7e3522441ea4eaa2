"""Conversions between the wire's BlockRef and the cache's BlockKey."""

from __future__ import annotations

from strata.contract.proto import strata_pb2 as pb
from .keys import BlockKey


def key_of(ref: pb.BlockRef) -> BlockKey:
    """The key of the block a reader asks for: its length follows from the file's length
    (a `length` in the request is not believed). InvalidArgument for a block the file does
    not have or a block size of 0."""
    return BlockKey.of_file(ref.mount_id, ref.path, ref.version, block_size=ref.block_size,
                            file_length=ref.file_length, index=ref.index)


def reported_key(ref: pb.BlockRef) -> BlockKey:
    """The key of a block in a worker's block report (made by `ref_of`)."""
    return BlockKey(ref.mount_id, ref.path, ref.version, ref.index, ref.block_size, ref.length)


def ref_of(key: BlockKey) -> pb.BlockRef:
    return pb.BlockRef(mount_id=key.mount_id, path=key.path, version=key.version, index=key.index,
                       block_size=key.block_size, length=key.length)


def block_count(file_length: int, block_size: int) -> int:
    return (file_length + block_size - 1) // block_size
