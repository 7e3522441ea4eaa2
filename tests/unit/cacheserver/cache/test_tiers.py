from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from strata.cacheserver.cache import BlockMetadata, TierConfig, default_mem_dir
from strata.cacheserver.cache.files import block_file, meta_file, write_atomically
from strata.cacheserver.common.checksums import compute_checksums
from strata.cacheserver.common.keys import BlockKey
from strata.cacheserver.cache.tiers import Tier
from strata.contract.errors import FailedPrecondition, InvalidArgument, ResourceExhausted


def store_block(directory: Path, index: int, data: bytes) -> BlockKey:
    key = BlockKey(1, "/f", "v", index, 1 << 20, len(data))
    write_atomically(block_file(directory, key.block_id), data)
    meta = BlockMetadata(key, len(data), "SSD", compute_checksums(data), created=1.0, last_access=1.0, pinned=False)
    meta.write(meta_file(directory, key.block_id))
    return key


@pytest.mark.parametrize(
    "args, message",
    [
        (("SSD", 0, ("/x",)), "tier SSD: quota must be > 0, got 0"),
        (("HDD", -5, ("/x",)), "tier HDD: quota must be > 0, got -5"),
        (("TAPE", 10, ("/x",)), "tier medium must be one of MEM, SSD, HDD, got 'TAPE'"),
        (("SSD", 10, ()), "tier SSD: give at least one directory"),
        (("SSD", 10, ("relative/dir",)), "tier SSD: directory 'relative/dir' must be an absolute path"),
        (("SSD", 10, ("/a", "/a/")), "tier SSD: a directory is listed twice"),
        (("SSD", 10, "/a"), "tier SSD: dirs must be a list of directories"),
    ],
)
def test_bad_tier_configs_say_what_is_wrong(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        TierConfig(*args)  # type: ignore[arg-type]


def test_dirs_become_paths_and_mem_gets_a_private_default() -> None:
    assert TierConfig("SSD", 1, ["/a", Path("/b")]).dirs == (Path("/a"), Path("/b"))  # type: ignore[arg-type]
    tier = Tier(TierConfig("MEM", 1))
    assert tier.dirs == (default_mem_dir(),) and tier.owns_dirs
    assert default_mem_dir().parent == Path("/dev/shm")
    assert default_mem_dir().name.endswith(f"-{os.getpid()}")
    assert not Tier(TierConfig("MEM", 1, ("/dev/shm/x",))).owns_dirs


def test_reservations_never_pass_the_quota_and_spread_over_dirs(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    tier = Tier(TierConfig("SSD", 100, (a, b)))
    placed = []
    for _ in range(4):
        d = tier.choose_dir()
        tier.reserve(25, d)
        placed.append(d)
    assert placed == [a, b, a, b] and tier.used == 100
    with pytest.raises(ResourceExhausted, match="tier SSD: cannot hold 1B more"):
        tier.reserve(1, a)
    tier.release(25, b)
    assert tier.used == 75 and tier.choose_dir() == b


def test_prepare_creates_dirs_and_reports_unusable_ones(tmp_path: Path) -> None:
    tier = Tier(TierConfig("HDD", 1, (tmp_path / "deep" / "dir",)))
    tier.prepare()
    assert (tmp_path / "deep" / "dir").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(FailedPrecondition, match=f"tier SSD: cannot create block directory {blocker}/sub"):
        Tier(TierConfig("SSD", 1, (blocker / "sub",))).prepare()


def test_scan_keeps_intact_blocks_and_removes_only_our_leftovers(tmp_path: Path) -> None:
    tier = Tier(TierConfig("SSD", 1 << 20, (tmp_path,)))
    good = store_block(tmp_path, 0, b"good bytes")
    truncated = store_block(tmp_path, 1, b"will be cut")
    os.truncate(block_file(tmp_path, truncated.block_id), 3)
    no_meta = store_block(tmp_path, 2, b"x")
    meta_file(tmp_path, no_meta.block_id).unlink()
    no_block = store_block(tmp_path, 3, b"y")
    block_file(tmp_path, no_block.block_id).unlink()
    bad_meta = store_block(tmp_path, 4, b"z")
    meta_file(tmp_path, bad_meta.block_id).write_bytes(b"{not json")
    renamed = store_block(tmp_path, 5, b"w")  # sidecar of another block under this name
    os.replace(meta_file(tmp_path, renamed.block_id), meta_file(tmp_path, "f" * 32))
    block_file(tmp_path, renamed.block_id).rename(block_file(tmp_path, "f" * 32))
    (tmp_path / f".{good.block_id}.blk.0123abcd.tmp").write_bytes(b"partial")
    (tmp_path / "notes.txt").write_text("not ours")

    found = tier.scan()

    assert [(s.directory, s.meta.key, s.meta.medium) for s in found] == [(tmp_path, good, "SSD")]
    assert sorted(os.listdir(tmp_path)) == sorted(
        [f"{good.block_id}.blk", f"{good.block_id}.meta", "notes.txt"]
    )
