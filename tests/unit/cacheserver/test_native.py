"""The compiled core's block file (native/src/lib.rs): ranges of a real file read and checked
against its chunks' CRC-32C outside the interpreter's lock, the next range of a sequential
reader read ahead in a thread of its own, and every damaged or missing byte refused."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from strata.cacheserver.common.checksums import compute_checksums
from strata.cacheserver.native import BlockFile

CHUNK = 64 * 1024
MiB = 1 << 20


def block_file(path: Path, data: bytes, chunk: int = CHUNK) -> BlockFile:
    """A BlockFile over `data` written at `path`; the descriptor it was made from is closed
    at once (it holds its own)."""
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        return BlockFile(fd, len(data), compute_checksums(data, chunk), chunk)
    finally:
        os.close(fd)


def damage(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.fixture
def data() -> bytes:
    return os.urandom(16 * MiB + 12345)  # a block with a short last chunk


def test_a_reader_going_through_the_block_gets_every_byte_in_order(tmp_path: Path, data: bytes) -> None:
    block = block_file(tmp_path / "b", data)
    assert (block.length, block.chunk_size) == (len(data), CHUNK)
    got = []
    for start in range(0, len(data), MiB):  # each range after the first was read ahead
        got.append(block.read(start, min(start + MiB, len(data))))
    assert b"".join(got) == data  # type: ignore[arg-type]
    assert block.read(0, 3 * CHUNK, ahead=False) == data[:3 * CHUNK]
    block.close()


def test_a_range_read_ahead_is_the_bytes_checked_when_it_was_read(tmp_path: Path, data: bytes) -> None:
    """The next range is read and checked while the reader works on this one: a chunk damaged
    on disk after that (the file's later bytes are not the reader's) does not reach it, and a
    range not read ahead that holds the damage is refused."""
    path = tmp_path / "b"
    block = block_file(path, data)
    assert block.read(0, MiB) == data[:MiB]
    block.close()  # waits for the read-ahead of [1 MiB, 2 MiB)
    block = block_file(path, data)
    assert block.read(0, MiB) == data[:MiB]
    damage(path, MiB + 100)
    # The read-ahead may have started before or after the damage: either its bytes are the
    # block's own, or the range is refused; never the damaged byte.
    got = block.read(MiB, 2 * MiB)
    assert got is None or got == data[MiB:2 * MiB]
    assert block.read(MiB, 2 * MiB, ahead=False) is None  # read anew: the damage is found


@pytest.mark.parametrize("at", [0, CHUNK - 1, 5 * MiB + 7, 16 * MiB + 12344])
def test_a_damaged_chunk_fails_the_range_it_lies_in_and_no_other(tmp_path: Path, data: bytes, at: int) -> None:
    path = tmp_path / "b"
    path.write_bytes(data)
    damage(path, at)
    fd = os.open(path, os.O_RDONLY)
    block = BlockFile(fd, len(data), compute_checksums(data), CHUNK)
    os.close(fd)
    first = at // CHUNK * CHUNK
    assert block.read(first, min(first + CHUNK, len(data)), ahead=False) is None
    whole = bytearray(len(data))
    assert block.read_into(memoryview(whole), 0) is False  # two threads: each half checked
    other = CHUNK if first == 0 else 0
    assert block.read(other, other + CHUNK, ahead=False) == data[other:other + CHUNK]


def test_a_file_shorter_than_the_block_is_refused(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "b"
    block = block_file(path, data)
    os.truncate(path, 8 * MiB)
    assert block.read(8 * MiB, 9 * MiB, ahead=False) is None
    assert block.read_into(memoryview(bytearray(16 * MiB)), 0) is False
    assert block.read(0, MiB, ahead=False) == data[:MiB]


def test_read_into_fills_the_buffer_checked_in_place(tmp_path: Path, data: bytes) -> None:
    block = block_file(tmp_path / "b", data)
    whole = bytearray(len(data))  # long enough to be read by two threads
    assert block.read_into(memoryview(whole), 0) is True
    assert whole == data
    part = bytearray(2 * CHUNK)
    assert block.read_into(memoryview(part), 3 * CHUNK) is True
    assert part == data[3 * CHUNK:5 * CHUNK]
    with pytest.raises(ValueError, match="writable"):
        block.read_into(memoryview(bytes(CHUNK)), 0)


@pytest.mark.parametrize(("start", "stop", "says"), [
    (1, CHUNK, "chunk boundaries"),
    (0, CHUNK + 1, "chunk boundaries"),
    (0, 17 * MiB, "not within"),
    (2 * CHUNK, CHUNK, "not within"),
])
def test_a_range_off_the_chunks_is_refused_with_its_reason(tmp_path: Path, data: bytes, start: int, stop: int,
                                                           says: str) -> None:
    block = block_file(tmp_path / "b", data)
    with pytest.raises(ValueError, match=says):
        block.read(start, stop)


def test_a_description_that_does_not_fit_the_block_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b"
    path.write_bytes(b"x" * (3 * CHUNK))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="2 checksums for a block of 196608 bytes"):
            BlockFile(fd, 3 * CHUNK, [0, 0], CHUNK)
        with pytest.raises(ValueError, match="chunk size 0"):
            BlockFile(fd, 3 * CHUNK, [0, 0, 0], 0)
        with pytest.raises(OverflowError):
            BlockFile(fd, 3 * CHUNK, [0, 0, 1 << 40], CHUNK)  # not a CRC-32C
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="cannot duplicate descriptor"):
        BlockFile(fd, 3 * CHUNK, [0, 0, 0], CHUNK)  # closed


def test_threads_reading_one_block_at_once_each_get_their_own_bytes(tmp_path: Path, data: bytes) -> None:
    """A FUSE mount's reads of one open file come from several threads: none is refused or
    handed another's range (the read-ahead one reader started is another's wait at most)."""
    block = block_file(tmp_path / "b", data)
    wrong: list[tuple[int, int]] = []

    def reader(offset: int) -> None:
        for _ in range(4):
            for start in range(offset * CHUNK, len(data) - MiB, 3 * MiB):
                if block.read(start, start + MiB) != data[start:start + MiB]:
                    wrong.append((offset, start))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
