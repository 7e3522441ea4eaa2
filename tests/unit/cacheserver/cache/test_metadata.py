from __future__ import annotations

import json
import os
from crc32c import crc32c
from pathlib import Path

import pytest

from strata.cacheserver.cache import BlockMetadata
from strata.cacheserver.common.checksums import CHUNK_SIZE, compute_checksums
from strata.cacheserver.common.keys import BlockKey
from strata.contract.errors import InvalidArgument

def key_for(length: int) -> BlockKey:
    return BlockKey(3, "/logs/day-1.json", "mtime-1700000000", 4, 4 * CHUNK_SIZE, length)


def meta_for(data: bytes) -> BlockMetadata:
    return BlockMetadata(key_for(len(data)), len(data), "SSD", compute_checksums(data), created=1000.0,
                         last_access=1000.0, pinned=True)


@pytest.mark.parametrize("length, chunks", [(0, 0), (1, 1), (CHUNK_SIZE, 1), (CHUNK_SIZE + 1, 2), (3 * CHUNK_SIZE, 3)])
def test_one_checksum_per_chunk(length: int, chunks: int) -> None:
    data = os.urandom(length)
    meta = meta_for(data)
    assert len(meta.checksums) == chunks
    assert meta.checksums[:1] == tuple(crc32c(data[:CHUNK_SIZE]) for _ in range(min(chunks, 1)))
    assert meta.bad_chunk(data, 0) is None


def test_chunk_span_covers_the_range_with_whole_chunks() -> None:
    meta = meta_for(b"x" * (2 * CHUNK_SIZE + 10))
    assert meta.chunk_span(0, 1) == (0, CHUNK_SIZE)
    assert meta.chunk_span(CHUNK_SIZE - 1, 2) == (0, 2 * CHUNK_SIZE)
    assert meta.chunk_span(2 * CHUNK_SIZE + 5, 5) == (2 * CHUNK_SIZE, 2 * CHUNK_SIZE + 10)
    assert meta.chunk_span(17, 0) == (17, 17)


def test_bad_chunk_names_the_damaged_chunk_of_a_range() -> None:
    data = bytearray(os.urandom(3 * CHUNK_SIZE))
    meta = meta_for(bytes(data))
    data[2 * CHUNK_SIZE + 7] ^= 0xFF
    assert meta.bad_chunk(bytes(data[:CHUNK_SIZE]), 0) is None
    assert meta.bad_chunk(bytes(data[CHUNK_SIZE:]), CHUNK_SIZE) == 2


def test_sidecar_round_trip(tmp_path: Path) -> None:
    meta = meta_for(b"hello")
    meta.last_access = 2000.5
    path = tmp_path / "x.meta"
    meta.write(path)
    again = BlockMetadata.read(path)
    assert again == meta
    assert again.persisted_access == 2000.5
    assert (again.key, again.length, again.pinned, again.checksums) == (key_for(5), 5, True, compute_checksums(b"hello"))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(format=99), "unknown format"),
        (lambda d: d.pop("length"), "missing field 'length'"),
        (lambda d: d.update(length="5"), "expected an integer"),
        (lambda d: d.update(length=4), "sidecar says 4 bytes, its key 5"),
        # Format 2 keys had no block size: such a block may belong to another geometry.
        (lambda d: (d.update(format=2), d["key"].pop("block_size"), d["key"].pop("length")), "unknown format"),
        (lambda d: d["key"].pop("block_size"), "missing field\\(s\\) block_size"),
        (lambda d: d.update(checksums=[1, 2]), "2 checksums for 5 bytes, expected 1"),
        (lambda d: d.update(medium="TAPE"), "unknown medium 'TAPE'"),
        (lambda d: d["key"].pop("path"), "missing field\\(s\\) path"),
    ],
)
def test_bad_sidecars_are_refused_with_a_reason(mutate: object, message: str) -> None:
    data = json.loads(meta_for(b"hello").to_json())
    mutate(data)  # type: ignore[operator]
    with pytest.raises(InvalidArgument, match=message):
        BlockMetadata.from_json(json.dumps(data).encode())


def test_garbage_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="not JSON"):
        BlockMetadata.from_json(b"\x00\xff garbage")
