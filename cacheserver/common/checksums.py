"""Checksums of block bytes: the CRC-32C of each CHUNK_SIZE chunk of a block, how a byte range
widens to whole chunks, and how a reader finds the first chunk that fails its checksum. Workers
compute them when they cache a block and send them with every answer; readers (the client, a
peer worker) check the bytes they get against them.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

from crc32c import crc32c

from .. import native

# Checksum granularity: a range read verifies only the chunks it touches, so a 4 KiB read
# (a short-circuit or data-port reader's small random read) costs a 64 KiB read and CRC,
# tens of microseconds, while a 16 MiB block carries 256 checksums (a 3 KB sidecar). Each
# sidecar records its chunk size, so blocks cached with another one stay valid.
CHUNK_SIZE = 64 * 1024


def compute_checksums(data: bytes | memoryview, chunk_size: int = CHUNK_SIZE) -> tuple[int, ...]:
    """CRC-32C of each `chunk_size` piece of `data` (the last one may be shorter)."""
    view = memoryview(data)
    return tuple(crc32c(view[i : i + chunk_size]) for i in range(0, len(view), chunk_size))


def chunk_span(offset: int, length: int, chunk_size: int, total: int) -> tuple[int, int]:
    """The chunk-aligned byte range [start, stop) that covers [offset, offset+length) of a
    block of `total` bytes."""
    if length <= 0:
        return offset, offset
    start = offset // chunk_size * chunk_size
    stop = min(-(-(offset + length) // chunk_size) * chunk_size, total)
    return start, stop


def first_bad_chunk(
    data: bytes | memoryview | mmap.mmap, start: int, checksums: Sequence[int], chunk_size: int
) -> int | None:
    """Index of the first chunk of `data` (which begins at chunk-aligned offset `start` of a
    block with these `checksums`) whose CRC-32C is wrong, or None when all match. Checked in
    the compiled core, which lets go of the GIL once for the whole range (a thread checking a
    16 MiB block beside a busy one would otherwise take it back once a chunk, each time after
    up to the 5 ms switch interval)."""
    return native.first_bad_chunk(data, start, checksums, chunk_size)
