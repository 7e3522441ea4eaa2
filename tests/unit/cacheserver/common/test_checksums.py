"""A range's chunks checked in the compiled core name the same first bad chunk as a check chunk
by chunk with the crc32c package (the one that computes the checksums) would, whatever holds
the bytes."""

from __future__ import annotations

import mmap
import os
import random

import pytest
from crc32c import crc32c

from strata.cacheserver.common.checksums import CHUNK_SIZE, compute_checksums, first_bad_chunk


def one_by_one(data: bytes, start: int, checksums: tuple[int, ...], chunk_size: int) -> int | None:
    first = start // chunk_size
    for i, pos in enumerate(range(0, len(data), chunk_size)):
        if first + i >= len(checksums) or crc32c(data[pos:pos + chunk_size]) != checksums[first + i]:
            return first + i
    return None


@pytest.mark.parametrize("length", [CHUNK_SIZE - 1, CHUNK_SIZE, 2 * CHUNK_SIZE, 5 * CHUNK_SIZE + 7, 64 * CHUNK_SIZE])
@pytest.mark.parametrize("start", [0, 3 * CHUNK_SIZE])
def test_every_flipped_bit_is_found_in_the_chunk_it_lies_in(length: int, start: int) -> None:
    """A range as readers check them: from a chunk's start to the block's end."""
    rng = random.Random(length + start)
    block = os.urandom(start + length)
    sums = compute_checksums(block)
    data = block[start:]
    assert first_bad_chunk(data, start, sums, CHUNK_SIZE) is None
    for _ in range(20):
        at = rng.randrange(length)
        damaged = bytearray(data)
        damaged[at] ^= 1 << rng.randrange(8)
        assert first_bad_chunk(bytes(damaged), start, sums, CHUNK_SIZE) == start // CHUNK_SIZE + at // CHUNK_SIZE
    # Two damaged chunks: the first is named.
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF
    damaged[0] ^= 0xFF
    assert first_bad_chunk(bytes(damaged), start, sums, CHUNK_SIZE) == start // CHUNK_SIZE


def test_bytes_past_the_checksums_and_other_chunk_sizes_are_checked_as_before() -> None:
    data = os.urandom(6 * CHUNK_SIZE)
    sums = compute_checksums(data)
    assert first_bad_chunk(data, 0, sums[:4], CHUNK_SIZE) == 4  # more bytes than checksums
    small = compute_checksums(data, 4096)
    assert first_bad_chunk(data, 0, small, 4096) is None
    damaged = bytearray(data)
    damaged[5 * 4096 + 1] ^= 2
    assert first_bad_chunk(bytes(damaged), 0, small, 4096) == one_by_one(bytes(damaged), 0, small, 4096) == 5


def test_any_buffer_of_bytes_is_checked_and_a_chunk_size_of_zero_is_refused() -> None:
    data = os.urandom(3 * CHUNK_SIZE)
    sums = compute_checksums(data)
    mapped = mmap.mmap(-1, len(data))
    mapped[:] = data
    for holder in (data, bytearray(data), memoryview(data)[CHUNK_SIZE:], mapped):
        start = CHUNK_SIZE if isinstance(holder, memoryview) else 0
        assert first_bad_chunk(holder, start, sums, CHUNK_SIZE) is None
    mapped[2 * CHUNK_SIZE] ^= 1
    assert first_bad_chunk(mapped, 0, sums, CHUNK_SIZE) == 2
    with pytest.raises(ValueError, match="chunk size"):
        first_bad_chunk(data, 0, sums, 0)
