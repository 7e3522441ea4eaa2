"""Checksums of bytes in transit: what a reader or a worker accepts from the network; the
kind of reader a request names, as the worker counts it."""

from __future__ import annotations

import os

import pytest

from strata.cacheserver.common.blockwire import (
    DamagedInTransit,
    check_pieces,
    check_write_chunk,
    client_label,
    joined_block,
    open_line,
    parse_line,
    request_line,
    write_chunk,
)
from strata.cacheserver.common.checksums import CHUNK_SIZE, compute_checksums
from strata.contract.errors import DataLoss, InvalidArgument, Unavailable
from strata.contract.proto import strata_pb2 as pb

DATA = os.urandom(2 * CHUNK_SIZE + 1000)


def answer(data: bytes, checksums: tuple[int, ...], step: int = CHUNK_SIZE // 2) -> list[pb.ReadBlockChunk]:
    """A ReadBlock answer as a worker streams it: the checksums on the first message."""
    first = pb.ReadBlockChunk(data=data[:step], cache_hit=True, checksums=checksums, checksum_chunk_size=CHUNK_SIZE)
    return [first] + [pb.ReadBlockChunk(data=data[i:i + step]) for i in range(step, len(data), step)]


def test_a_readblock_answer_is_joined_once_every_piece_matches() -> None:
    assert joined_block(answer(DATA, compute_checksums(DATA)), "block 0") == DATA
    assert joined_block(answer(b"", ()), "block 0") == b""


def test_a_damaged_or_unchecked_answer_is_refused_and_the_reader_may_ask_elsewhere() -> None:
    damaged = bytearray(DATA)
    damaged[-1] ^= 0x80
    with pytest.raises(DamagedInTransit, match=rf"block 3: bytes {2 * CHUNK_SIZE}-{len(DATA) - 1} failed their CRC-32C"):
        joined_block(answer(bytes(damaged), compute_checksums(DATA)), "block 3")
    with pytest.raises(DamagedInTransit, match="0 checksums came with"):
        joined_block(answer(DATA, ()), "block 3")
    with pytest.raises(DamagedInTransit, match="had no message"):
        joined_block([], "block 3")
    # One piece short (a truncated answer with the checksums of the whole).
    with pytest.raises(DamagedInTransit, match="3 checksums came with"):
        check_pieces(DATA[:CHUNK_SIZE], compute_checksums(DATA), CHUNK_SIZE, "block 3")
    assert issubclass(DamagedInTransit, Unavailable)  # the client fails over on it


def test_a_write_message_carries_its_crc_and_the_worker_checks_it() -> None:
    first = write_chunk(b"hello", path="/m/f", overwrite=True)
    assert (first.path, first.overwrite, first.data) == ("/m/f", True, b"hello")
    check_write_chunk(first, 0, "WriteFile")
    check_write_chunk(write_chunk(b""), 1, "WriteFile")  # an empty file's one message
    first.data = b"hellp"
    with pytest.raises(DataLoss, match="the 5 bytes of message 0 failed their CRC-32C check"):
        check_write_chunk(first, 0, "WriteFile")
    with pytest.raises(InvalidArgument, match="AppendFile: message 2 carries no crc32c"):
        check_write_chunk(pb.WriteFileChunk(data=b"x"), 2, "AppendFile")


def test_a_request_names_its_kind_of_reader_and_the_worker_counts_only_known_kinds() -> None:
    ref = pb.BlockRef(mount_id=1, path="/m/a", version="v1", index=0, block_size=4096, file_length=10)
    assert parse_line(request_line("t", ref, 0, client="fuse", offset=5))["client"] == "fuse"
    assert parse_line(open_line("t", "/m/a", 0, whole_below=1, fetch=False, client="fsspec"))["client"] == "fsspec"
    assert "client" not in parse_line(request_line("t", ref, 0))  # an older reader's request
    assert [client_label(k) for k in ("fuse", "fsspec")] == ["fuse", "fsspec"]
    # Whatever else a request says is one label: the metric's series stay bounded.
    for made_up in (None, "", "FUSE", "fuse ", "x" * 10_000, 7, ["fuse"], {"a": 1}):
        assert client_label(made_up) == "other"
