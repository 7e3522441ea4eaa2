from __future__ import annotations

import re

import pytest

from strata.cacheserver.common.keys import BlockKey
from strata.contract.errors import InvalidArgument

MiB = 1 << 20


def test_block_id_is_stable_hex_and_distinguishes_every_field() -> None:
    base = BlockKey(1, "/data/a.parquet", "etag-1", 0, 16 * MiB, 16 * MiB)
    assert re.fullmatch(r"[0-9a-f]{32}", base.block_id)
    # The digest of the canonical encoding is part of the on-disk format: it must not change
    # between releases, or a restart would orphan every cached block.
    assert base.block_id == BlockKey(1, "/data/a.parquet", "etag-1", 0, 16 * MiB, 16 * MiB).block_id
    assert base.block_id == "d065fb160476a5f21d4a428dd237801a"
    others = [
        BlockKey(2, "/data/a.parquet", "etag-1", 0, 16 * MiB, 16 * MiB),
        BlockKey(1, "/data/b.parquet", "etag-1", 0, 16 * MiB, 16 * MiB),
        BlockKey(1, "/data/a.parquet", "etag-2", 0, 16 * MiB, 16 * MiB),
        BlockKey(1, "/data/a.parquet", "etag-1", 1, 16 * MiB, 16 * MiB),
        # Geometry: the same index cut with another block size, or with another length,
        # holds other bytes.
        BlockKey(1, "/data/a.parquet", "etag-1", 0, 8 * MiB, 8 * MiB),
        BlockKey(1, "/data/a.parquet", "etag-1", 0, 16 * MiB, 8 * MiB),
        # Field boundaries are part of the encoding: no concatenation collisions.
        BlockKey(1, "/data/a.parquetetag-1", "", 0, 16 * MiB, 16 * MiB),
    ]
    assert len({base.block_id, *(k.block_id for k in others)}) == len(others) + 1


def test_a_file_s_blocks_carry_their_geometry() -> None:
    # 40 MiB in 16 MiB blocks: the last block has 8 MiB, like block 2 of the same file cut
    # in 8 MiB blocks; they hold different bytes and are different blocks.
    last16 = BlockKey.of_file(1, "/f", "v", block_size=16 * MiB, file_length=40 * MiB, index=2)
    third8 = BlockKey.of_file(1, "/f", "v", block_size=8 * MiB, file_length=40 * MiB, index=2)
    assert (last16.length, last16.offset) == (8 * MiB, 32 * MiB)
    assert (third8.length, third8.offset) == (8 * MiB, 16 * MiB)
    assert last16.block_id != third8.block_id
    with pytest.raises(InvalidArgument, match=re.escape("block 5 of /f does not exist: the file has 41943040 bytes, 3 block(s)")):
        BlockKey.of_file(1, "/f", "v", block_size=16 * MiB, file_length=40 * MiB, index=5)
    with pytest.raises(InvalidArgument, match="block size of /f must be an integer > 0, got 0"):
        BlockKey.of_file(1, "/f", "v", block_size=0, file_length=40 * MiB, index=0)


def test_dict_round_trip_and_unicode_paths() -> None:
    k = BlockKey(7, "/datasets/naïve 文件", "", 12, 4096, 100)
    assert BlockKey.from_dict(k.to_dict()) == k
    assert BlockKey.from_dict(k.to_dict()).block_id == k.block_id
    assert k.to_dict() == {"mount_id": 7, "path": "/datasets/naïve 文件", "version": "", "index": 12,
                           "block_size": 4096, "length": 100}


@pytest.mark.parametrize(
    "fields, message",
    [
        ((-1, "/a", "v", 0, 10, 10), "mount_id must be an integer >= 0, got -1"),
        ((1, "/a", "v", -3, 10, 10), "index must be an integer >= 0, got -3"),
        ((1, "/a", "v", True, 10, 10), "index must be an integer >= 0, got True"),
        ((1, "", "v", 0, 10, 10), "path must not be empty"),
        ((1, "/a", None, 0, 10, 10), "version must be a string, got None"),
        ((1, "/a", "v", 0, 0, 0), "block_size must be an integer > 0, got 0"),
        ((1, "/a", "v", 0, 10, 11), "length 11 is larger than the block size 10"),
        ((1, "/a", "v", 0, 10, -1), "length must be an integer >= 0, got -1"),
    ],
)
def test_bad_keys_are_refused(fields: tuple[object, ...], message: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        BlockKey(*fields)  # type: ignore[arg-type]


def test_from_dict_names_missing_fields() -> None:
    with pytest.raises(InvalidArgument, match=r"missing field\(s\) version, index, block_size, length"):
        BlockKey.from_dict({"mount_id": 1, "path": "/a"})
    with pytest.raises(InvalidArgument, match="expected a mapping"):
        BlockKey.from_dict([1, "/a", "v", 0])
