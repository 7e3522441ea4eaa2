"""Blocks of a mount the master no longer knows: a master restarted on a fresh journal (an
emptyDir) forgets its mounts and the source is mounted again under a new id; the worker frees
the old id's blocks after `orphanBlockGrace`, and keeps those holding a write never persisted."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK_SIZE, Cluster, wait_until

pytestmark = pytest.mark.timeout(300)

GRACE = 3.0  # seconds (orphanBlockGrace); the worker looks every GRACE / 2


def _report(cluster: Cluster) -> pb.ReportResponse:
    return cluster.fs().client.report()


def _restart_master_on_a_fresh_journal(cluster: Cluster) -> None:
    cluster.master.stop()
    shutil.rmtree(cluster.root / "journal")
    cluster.master.start()
    cluster.master.wait_healthy()
    cluster.wait_workers(1)


def test_blocks_of_a_forgotten_mount_are_freed_after_the_grace(start_cluster: Any, bucket: str) -> None:
    cluster: Cluster = start_cluster(workers=1, extra={"orphanBlockGrace": GRACE})
    data = bytes(range(256)) * (3 * BLOCK_SIZE // 256)  # 3 blocks
    cluster.s3.put_object(bucket, "data.bin", data)
    cluster.mount_bucket("/data", bucket)
    fs = cluster.fs()
    assert fs.cat_file("/data/data.bin") == data
    (old,) = [m.mount.mount_id for m in _report(cluster).mounts]
    wait_until(lambda: _report(cluster).used == len(data), 30, "the file's blocks counted as used")

    _restart_master_on_a_fresh_journal(cluster)
    cluster.mount_bucket("/data", bucket)
    fs = cluster.fs()
    assert fs.cat_file("/data/data.bin") == data
    (new,) = [m.mount.mount_id for m in _report(cluster).mounts]
    assert new != old
    # The old id's blocks held the worker's capacity (the re-read may have been answered from
    # them: the same version of the same file): freed after the grace, and only those.
    def only_known_mounts_hold_blocks() -> bool:
        report = _report(cluster)
        return report.used == sum(m.cached_bytes for m in report.mounts)
    wait_until(only_known_mounts_hold_blocks, 60, "the blocks of the forgotten mount to be freed (used bytes = cached bytes)")
    assert fs.cat_file("/data/data.bin") == data
    wait_until(lambda: _report(cluster).used == len(data), 30, "the file's blocks cached under the new mount")
    report = _report(cluster)
    assert report.used == sum(m.cached_bytes for m in report.mounts) == len(data)
    assert {m.mount.mount_id for m in report.mounts} == {new}
    assert fs.cat_file("/data/data.bin") == data


def test_blocks_of_a_write_never_persisted_are_kept(start_cluster: Any, bucket: str) -> None:
    """A MUST_CACHE write lives in the cache only: its blocks are the one copy, and a master
    that forgot the mount may yet be one that comes back with it. They stay."""
    cluster: Cluster = start_cluster(workers=1, extra={"orphanBlockGrace": GRACE})
    cluster.s3.put_object(bucket, "read.bin", b"r" * BLOCK_SIZE)
    cluster.mount_bucket("/data", bucket)
    fs = cluster.fs()
    assert fs.cat_file("/data/read.bin") == b"r" * BLOCK_SIZE
    written = b"w" * (BLOCK_SIZE + 100)
    fs.client.write_file("/data/cache-only.bin", [written], write_type=pb.MUST_CACHE)
    wait_until(lambda: _report(cluster).used == BLOCK_SIZE + len(written), 30, "both files counted as used")

    _restart_master_on_a_fresh_journal(cluster)
    cluster.mount_bucket("/data", bucket)
    # The read file's block goes after the grace; the written file's two blocks stay.
    wait_until(lambda: _report(cluster).used == len(written), 60, "the read block of the forgotten mount freed")
    worker_log = (cluster.root / "logs" / "worker-0.log").read_text()
    assert "hold writes never persisted" in worker_log
