"""Conversions between the wire's BlockRef and the cache's BlockKey."""

from __future__ import annotations

from .cache.keys import BlockKey
from .proto import strata_pb2 as pb


def block_length(ref: pb.BlockRef) -> int:
    """Bytes in the block: its reported length, else what its index and file length give."""
    if ref.length:
        return ref.length
    start = ref.index * ref.block_size
    return max(0, min(ref.block_size, ref.file_length - start))


def key_of(ref: pb.BlockRef) -> BlockKey:
    return BlockKey(mount_id=ref.mount_id, path=ref.path, version=ref.version, index=ref.index)


def ref_of(key: BlockKey, *, length: int = 0) -> pb.BlockRef:
    return pb.BlockRef(mount_id=key.mount_id, path=key.path, version=key.version, index=key.index, length=length)


def block_count(file_length: int, block_size: int) -> int:
    return (file_length + block_size - 1) // block_size
