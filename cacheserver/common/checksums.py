"""Checksums of block bytes: the CRC-32C of each CHUNK_SIZE chunk of a block, how a byte range
widens to whole chunks, and how a reader finds the first chunk that fails its checksum. Workers
compute them when they cache a block and send them with every answer; readers (the client, a
peer worker) check the bytes they get against them.
"""

from __future__ import annotations

import functools
import mmap
from collections.abc import Sequence

from crc32c import crc32c

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
    block with these `checksums`) whose CRC-32C is wrong, or None when all match.

    The whole chunks of CHUNK_SIZE are checked together: one CRC-32C over all of them against
    the one their checksums make when combined (`_combined`), so the check lets go of the GIL
    once for the range rather than once a chunk (a thread checking a 16 MiB block beside a
    busy one took the GIL back 256 times, each after up to the 5 ms switch interval). Only a
    range that fails is looked at chunk by chunk, to name the chunk."""
    first = start // chunk_size
    with memoryview(data) as view:
        whole = len(view) // chunk_size
        if chunk_size == CHUNK_SIZE and whole > 1 and first + -(-len(view) // chunk_size) <= len(checksums):
            end = whole * chunk_size
            if crc32c(view[:end]) == _combined(checksums, first, whole) and (
                    end == len(view) or crc32c(view[end:]) == checksums[first + whole]):
                return None
        for i, pos in enumerate(range(0, len(view), chunk_size)):
            index = first + i
            if index >= len(checksums) or crc32c(view[pos : pos + chunk_size]) != checksums[index]:
                return index
    return None


def _gf2_times(matrix: Sequence[int], vector: int) -> int:
    """`matrix` (its columns, bit 0 first) times `vector` over GF(2)."""
    total = 0
    for column in matrix:
        if not vector:
            break
        if vector & 1:
            total ^= column
        vector >>= 1
    return total


def _zeros_operator(nbytes: int) -> list[int]:
    """The CRC-32C register's change over `nbytes` zero bytes (a power of two), as a matrix:
    one zero bit is a shift right with the reflected polynomial folded in; squaring doubles."""
    matrix = [0x82F63B78] + [1 << (i - 1) for i in range(1, 32)]
    for _ in range((8 * nbytes).bit_length() - 1):
        matrix = [_gf2_times(matrix, column) for column in matrix]
    return matrix


def _byte_tables(matrix: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(_gf2_times(matrix, b << (8 * k)) for b in range(256)) for k in range(4))


@functools.cache
def _chunk_shift() -> tuple[tuple[int, ...], ...]:
    """The CRC-32C of A followed by a chunk B is shift(crc(A)) ^ crc(B), where shift is the
    change of the register over CHUNK_SIZE zero bytes: four tables of a byte each, made on
    first use (~3 ms), not at every process's import."""
    return _byte_tables(_zeros_operator(CHUNK_SIZE))


def _combined(checksums: Sequence[int], first: int, count: int) -> int:
    """The CRC-32C of `count` whole chunks from chunk `first` on, from their checksums."""
    t0, t1, t2, t3 = _chunk_shift()
    crc = checksums[first]
    for index in range(first + 1, first + count):
        crc = t0[crc & 0xFF] ^ t1[(crc >> 8) & 0xFF] ^ t2[(crc >> 16) & 0xFF] ^ t3[crc >> 24] ^ checksums[index]
    return crc
