"""A block is cached and served only under the version of the store's object it came from.

Real master and workers, a real S3 server (moto) and a real file:// folder. The object is
replaced in the store behind Strata's back, with bytes of the same length (a length change
was always caught): a reader of the old version gets the old bytes or a clear "the file
changed in the store" error, never the new bytes under the old version's name, and a file
never comes back as a mix of old and new blocks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from strata.contract.errors import FailedPrecondition
from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK_SIZE, Cluster, allow, wait_until

pytestmark = pytest.mark.timeout(240)

BLOCKS = 4
SIZE = BLOCKS * BLOCK_SIZE


def block(data: bytes, index: int) -> bytes:
    return data[index * BLOCK_SIZE:(index + 1) * BLOCK_SIZE]


def two_versions() -> tuple[bytes, bytes]:
    """An old and a new content of the same length that differ in every block."""
    old = os.urandom(SIZE)
    return old, bytes(b ^ 0x5A for b in old[:4096]) + old[4096:BLOCK_SIZE] + os.urandom(SIZE - BLOCK_SIZE)


def read_all_blocks(fs: Any, path: str) -> bytes | FailedPrecondition:
    """The whole file, block by block through one open handle (no readahead), or the
    error that says it changed."""
    out = []
    try:
        with fs.open(path, "rb") as f:
            for index in range(BLOCKS):
                f.seek(index * BLOCK_SIZE)
                out.append(f.read(BLOCK_SIZE))
    except FailedPrecondition as exc:
        return exc
    return b"".join(out)


def assert_changed_error(result: bytes | FailedPrecondition) -> None:
    assert isinstance(result, FailedPrecondition), "a reader got bytes of a file that changed in the store"
    assert "changed in the store" in str(result) and "open it again" in str(result), str(result)


def s3_file(cluster: Cluster, bucket: str) -> tuple[bytes, bytes]:
    """An old and a new content for /d/f.bin, the old one in the store. The master keeps
    what the store said for an hour, and a worker what the master said for a second:
    neither may stand for the store's bytes."""
    old, new = two_versions()
    cluster.s3.put_object(bucket, "f.bin", old)
    cluster.mount_bucket("/d", bucket, metadata_sync_interval=3600)
    return old, new


def test_an_open_handle_never_reads_new_bytes_under_the_old_version(start_cluster: Any, bucket: str) -> None:
    cluster: Cluster = start_cluster(workers=2)
    old, new = s3_file(cluster, bucket)
    with cluster.fs(host="elsewhere", readahead=0).open("/d/f.bin", "rb") as f:
        assert f.read(BLOCK_SIZE) == block(old, 0)  # block 0 cached, the others not
        cluster.s3.put_object(bucket, "f.bin", new)  # same length, other bytes
        f.seek(BLOCK_SIZE)
        with pytest.raises(FailedPrecondition) as raised:
            f.read(BLOCK_SIZE)
    assert_changed_error(raised.value)
    # The worker had the master look again: opening the file again reads the new version.
    assert cluster.fs(host="elsewhere", readahead=0).cat_file("/d/f.bin") == new


def test_a_fresh_open_within_the_sync_interval_reads_one_version_whole(start_cluster: Any, bucket: str) -> None:
    cluster: Cluster = start_cluster(workers=2)
    old, new = s3_file(cluster, bucket)
    # The master holds the old version now, block 0 is cached.
    assert cluster.fs(host="elsewhere", readahead=0).cat_file("/d/f.bin", 0, BLOCK_SIZE) == block(old, 0)
    cluster.s3.put_object(bucket, "f.bin", new)
    # The master keeps the old metadata for an hour: a fresh open names the old version.
    # Block 0 is cached (old bytes); blocks 1-3 are not, and the store has other bytes now.
    for attempt in range(2):
        result = read_all_blocks(cluster.fs(host=f"reader-{attempt}", readahead=0), "/d/f.bin")
        if isinstance(result, bytes):
            assert result in (old, new), "a file came back as a mix of two versions"
        else:
            assert_changed_error(result)
    # The first reader's refused block had the master look again: the next open is new.
    assert read_all_blocks(cluster.fs(host="last", readahead=0), "/d/f.bin") == new


def test_a_file_rewritten_in_place_in_a_file_mount_is_never_mixed(start_cluster: Any, tmp_path: Path) -> None:
    cluster: Cluster = start_cluster(workers=1, **allow(tmp_path))
    source = tmp_path / "source"
    source.mkdir()
    old, new = two_versions()
    target = source / "f.bin"
    target.write_bytes(old)
    cluster.fs().client.mount("/local", f"file://{source}", pb.MountOptions(metadata_sync_interval=3600))
    fs = cluster.fs(host="elsewhere", readahead=0)
    with fs.open("/local/f.bin", "rb") as f:
        assert f.read(BLOCK_SIZE) == block(old, 0)
        with open(target, "r+b") as out:  # in place: same inode, same length
            out.write(new)
        f.seek(BLOCK_SIZE)
        with pytest.raises(FailedPrecondition) as raised:
            f.read(BLOCK_SIZE)
    assert_changed_error(raised.value)
    assert cluster.fs(host="elsewhere", readahead=0).cat_file("/local/f.bin") == new


def test_a_file_written_through_strata_is_fetched_as_its_stored_copy(start_cluster: Any, bucket: str) -> None:
    """A file written through Strata has a version of Strata's own; its blocks come from the
    store only as the object the write stored (the store's version the master recorded)."""
    cluster: Cluster = start_cluster(workers=1)
    old, new = two_versions()
    cluster.mount_bucket("/d", bucket, metadata_sync_interval=3600)
    fs = cluster.fs(host="elsewhere", readahead=0, write_type="ASYNC_THROUGH")
    fs.pipe_file("/d/w.bin", old)
    wait_until(lambda: fs.info("/d/w.bin")["persisted"], 30, "the write to be persisted")
    assert fs.client.free("/d/w.bin") == SIZE
    assert read_all_blocks(fs, "/d/w.bin") == old  # from the store, the stored copy
    assert fs.client.free("/d/w.bin") == SIZE
    cluster.s3.put_object(bucket, "w.bin", new)
    assert_changed_error(read_all_blocks(fs, "/d/w.bin"))
    assert read_all_blocks(fs, "/d/w.bin") == new
