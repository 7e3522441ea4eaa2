from __future__ import annotations

import re

import pytest

from strata.cacheserver.cache import BlockKey
from strata.cacheserver.errors import InvalidArgument


def test_block_id_is_stable_hex_and_distinguishes_every_field() -> None:
    base = BlockKey(1, "/data/a.parquet", "etag-1", 0)
    assert re.fullmatch(r"[0-9a-f]{32}", base.block_id)
    # The digest of the canonical encoding is part of the on-disk format: it must not change
    # between releases, or a restart would orphan every cached block.
    assert base.block_id == BlockKey(1, "/data/a.parquet", "etag-1", 0).block_id
    assert base.block_id == "7b5267d50d782cc1ab65fa03735bc1bb"
    others = [
        BlockKey(2, "/data/a.parquet", "etag-1", 0),
        BlockKey(1, "/data/b.parquet", "etag-1", 0),
        BlockKey(1, "/data/a.parquet", "etag-2", 0),
        BlockKey(1, "/data/a.parquet", "etag-1", 1),
        # Field boundaries are part of the encoding: no concatenation collisions.
        BlockKey(1, "/data/a.parquetetag-1", "", 0),
    ]
    assert len({base.block_id, *(k.block_id for k in others)}) == len(others) + 1


def test_dict_round_trip_and_unicode_paths() -> None:
    k = BlockKey(7, "/datasets/naïve 文件", "", 12)
    assert BlockKey.from_dict(k.to_dict()) == k
    assert BlockKey.from_dict(k.to_dict()).block_id == k.block_id
    assert k.to_dict() == {"mount_id": 7, "path": "/datasets/naïve 文件", "version": "", "index": 12}


@pytest.mark.parametrize(
    "fields, message",
    [
        ((-1, "/a", "v", 0), "mount_id must be an integer >= 0, got -1"),
        ((1, "/a", "v", -3), "index must be an integer >= 0, got -3"),
        ((1, "/a", "v", True), "index must be an integer >= 0, got True"),
        ((1, "", "v", 0), "path must not be empty"),
        ((1, "/a", None, 0), "version must be a string, got None"),
    ],
)
def test_bad_keys_are_refused(fields: tuple[object, ...], message: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        BlockKey(*fields)  # type: ignore[arg-type]


def test_from_dict_names_missing_fields() -> None:
    with pytest.raises(InvalidArgument, match="missing field\\(s\\) version, index"):
        BlockKey.from_dict({"mount_id": 1, "path": "/a"})
    with pytest.raises(InvalidArgument, match="expected a mapping"):
        BlockKey.from_dict([1, "/a", "v", 0])
