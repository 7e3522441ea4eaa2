from __future__ import annotations

import os
from pathlib import Path

import pytest

from strata.cacheserver.cache.files import (
    FileKind,
    block_file,
    classify,
    copy_atomically,
    meta_file,
    remove_block_files,
    write_atomically,
)

BID = "0123456789abcdef0123456789abcdef"


def test_names_are_classified_and_foreign_files_are_not_ours() -> None:
    assert classify(f"{BID}.blk") == (BID, FileKind.BLOCK)
    assert classify(f"{BID}.meta") == (BID, FileKind.META)
    assert classify(f".{BID}.blk.0a1b2c3d.tmp") == (BID, FileKind.TEMP)
    assert classify(f".{BID}.meta.0a1b2c3d.tmp") == (BID, FileKind.TEMP)
    for foreign in ("README", f"{BID}.blk.bak", f".{BID}.blk", f"{BID}.blk.0a1b2c3d.tmp", f"{BID[:-1]}.blk"):
        assert classify(foreign) is None, foreign


def test_write_atomically_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / f"{BID}.blk"
    write_atomically(target, b"abc")
    write_atomically(target, b"defg")
    assert target.read_bytes() == b"defg"
    assert os.listdir(tmp_path) == [target.name]


def test_write_atomically_keeps_the_old_file_when_the_write_fails(tmp_path: Path) -> None:
    target = tmp_path / f"{BID}.blk"
    write_atomically(target, b"old")
    with pytest.raises(TypeError):
        write_atomically(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == [target.name]


@pytest.mark.parametrize("across_file_systems", [False, True])
def test_copy_atomically(tmp_path: Path, shm_dir: Path, across_file_systems: bool) -> None:
    src = block_file(tmp_path, BID)
    src.write_bytes(b"x" * 100_000)
    dst_dir = shm_dir if across_file_systems else tmp_path / "other"
    dst_dir.mkdir(exist_ok=True)
    dst = block_file(dst_dir, BID)
    copy_atomically(src, dst)
    assert dst.read_bytes() == src.read_bytes()
    assert sorted(os.listdir(dst_dir)) == [dst.name]
    # Linked or copied, removing the source keeps the copy.
    remove_block_files(tmp_path, BID)
    assert not src.exists() and dst.stat().st_size == 100_000


def test_remove_block_files_tolerates_missing_files(tmp_path: Path) -> None:
    meta_file(tmp_path, BID).write_bytes(b"{}")
    remove_block_files(tmp_path, BID)
    remove_block_files(tmp_path, BID)
    assert os.listdir(tmp_path) == []
