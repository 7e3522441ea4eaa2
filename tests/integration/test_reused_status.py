"""Clients reuse the master's answers for read-only mounts while the master would give them
(FileInfo.valid_for_ms), and only then.

Real processes: moto's S3 server, a master and workers started as users start them; the
master's GetStatus requests are counted from its /metrics. Objects are changed in the store
behind Strata's back and through other clients.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from strata.contract.errors import FailedPrecondition

from .conftest import BLOCK_SIZE, Cluster, metric

pytestmark = pytest.mark.timeout(240)


def get_status_requests(cluster: Cluster) -> float:
    return metric(cluster.master.metrics(), "strata_master_metadata_requests", '{method="GetStatus"}')


def test_opens_of_a_read_only_mount_ask_the_master_once_per_interval(start_cluster: Any, bucket: str) -> None:
    cluster: Cluster = start_cluster(workers=1)
    files = {f"s-{i}.bin": os.urandom(1000 + i) for i in range(20)}
    for key, data in files.items():
        cluster.s3.put_object(bucket, f"train/{key}", data)
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=60)
    fs = cluster.fs()
    for key, data in files.items():  # the first epoch asks for each file
        assert fs.cat_file(f"/ds/train/{key}") == data
    asked = get_status_requests(cluster)
    for _ in range(3):
        for key, data in files.items():
            assert fs.cat_file(f"/ds/train/{key}") == data
    assert get_status_requests(cluster) == asked
    # A listing, then an open of each file listed: no stat at all.
    other = cluster.fs()
    listed = other.ls("/ds/train", detail=False)
    for path in listed:
        with other.open(path, "rb") as f:
            assert f.read() == files[path.rsplit("/", 1)[1]]
    assert get_status_requests(cluster) == asked


def test_a_writable_mount_asks_on_every_open(start_cluster: Any, bucket: str) -> None:
    """Close-to-open for writes through other clients: the next open reads the new version."""
    cluster: Cluster = start_cluster(workers=1)
    cluster.s3.put_object(bucket, "f.bin", b"first version")
    cluster.mount_bucket("/rw", bucket, metadata_sync_interval=3600)
    reader, writer = cluster.fs(), cluster.fs(host="writer")
    assert reader.cat_file("/rw/f.bin") == b"first version"
    asked = get_status_requests(cluster)
    for _ in range(3):
        assert reader.cat_file("/rw/f.bin") == b"first version"
    assert get_status_requests(cluster) == asked + 3
    writer.pipe_file("/rw/f.bin", b"the second, longer version")
    assert reader.cat_file("/rw/f.bin") == b"the second, longer version"


def test_an_open_from_a_held_status_reads_the_new_version_whole(start_cluster: Any, bucket: str) -> None:
    """The file changes in the store; another client's read makes the master notice. A
    client that holds the old status opens from it: its first read is refused, and the file
    is opened again as the new version, read whole and without an error. A first read of a
    range keeps the refusal when the length changed, and one that already returned bytes of
    the old version never goes on with the new one."""
    cluster: Cluster = start_cluster(workers=2)
    old = os.urandom(2 * BLOCK_SIZE)
    new = os.urandom(2 * BLOCK_SIZE + 100)  # another length too: a read to the end reads to the new end
    cluster.s3.put_object(bucket, "f.bin", old)
    cluster.mount_bucket("/ro", bucket, read_only=True, metadata_sync_interval=3600)
    holder, returned, ranged, other = (cluster.fs(host=name, readahead=0)
                                       for name in ("holder", "returned", "ranged", "other"))
    status = holder.client.stat("/ro/f.bin")
    assert status.valid_for_ms > 0
    assert ranged.client.stat("/ro/f.bin") == status
    with returned.open("/ro/f.bin", "rb") as f:  # block 0 of the old version cached
        assert f.read(BLOCK_SIZE) == old[:BLOCK_SIZE]
    cluster.s3.put_object(bucket, "f.bin", new)
    # Another client reads block 1 of the old version: refused, and the master looks again.
    with pytest.raises(FailedPrecondition, match="open it again"):
        other.client.read_block(other.client.block_ref(status, 1))
    with holder.open("/ro/f.bin", "rb") as f:
        assert f.file_info.version == status.version  # opened from what it held
        assert f.read() == new
        assert f.size == len(new)
    with ranged.open("/ro/f.bin", "rb") as f:  # a range (of block 1, not cached) of a file whose length
        f.seek(BLOCK_SIZE)                      # changed: its reader may have used the old length
        with pytest.raises(FailedPrecondition, match="open it again"):
            f.read(100)
    assert ranged.cat_file("/ro/f.bin") == new
    with returned.open("/ro/f.bin", "rb") as f:  # opened from its held status too
        assert f.read(BLOCK_SIZE) == old[:BLOCK_SIZE]  # served from the cache: this open is the old version
        with pytest.raises(FailedPrecondition, match="open it again"):
            f.read()
    assert returned.cat_file("/ro/f.bin") == new  # the refusal dropped what it held
