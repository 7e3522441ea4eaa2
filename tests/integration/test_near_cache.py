"""The near cache of a host that runs no worker (client/nearcache.py): new processes open
warm small files from it with no request, within the Mount's freshness, and never take a
damaged record's bytes. Real processes throughout: moto's S3 server, a master and workers as
users start them, and each loader a new Python process with STRATA_CLIENT_NEAR_CACHE set.
"""

from __future__ import annotations

import os
import re
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from .conftest import Cluster
from .test_node_answers import REMOTE, dataset, get_status_requests, load

pytestmark = pytest.mark.timeout(240)


def requests(cluster: Cluster) -> tuple[float, float, float, float]:
    """What the cluster answered so far: the master's statuses, the workers' opens by path,
    their data port reads, and the master's worker lists."""
    listed = re.findall(r'^strata_master_requests_total\{code="OK",method="ListWorkers"\}\s+([0-9.e+-]+)$',
                        cluster.master.metrics(), re.M)
    return (get_status_requests(cluster), cluster.total_metric("strata_worker_kept_opens"),
            cluster.total_metric("strata_worker_data_port_reads"), sum(float(v) for v in listed))


def records(near: Path) -> list[Path]:
    return sorted(p for p in near.rglob("*") if p.is_file() and not p.name.endswith(".tmp"))


@pytest.mark.parametrize("workers", [1, 2], ids=["one-worker", "two-workers"])
def test_a_new_process_opens_warm_files_with_no_request(start_cluster: Any, bucket: str, tmp_path: Path,
                                                        workers: int) -> None:
    cluster: Cluster = start_cluster(workers=workers)
    files = dataset(cluster, bucket, 10)
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=120)
    expected = {path: zlib.crc32(data) for path, data in files.items()}
    near = tmp_path / "near"
    first = load(cluster, REMOTE, sorted(files), tmp_path, STRATA_CLIENT_NEAR_CACHE=str(near))
    assert {p: r[0] for p, r in first.items()} == expected
    assert len(records(near)) == len(files)
    before = requests(cluster)
    assert before[3] > 0  # the first process listed the workers
    second = load(cluster, REMOTE, sorted(files), tmp_path, STRATA_CLIENT_NEAR_CACHE=str(near))
    assert {p: r[0] for p, r in second.items()} == expected
    assert requests(cluster) == before  # no status asked, no open, no block read, not even the worker list
    plain = load(cluster, REMOTE, sorted(files), tmp_path)  # the same without the near cache asks
    assert {p: r[0] for p, r in plain.items()} == expected
    assert requests(cluster) != before


def test_a_file_changed_in_the_store_is_read_new_after_the_mount_interval(start_cluster: Any, bucket: str,
                                                                          tmp_path: Path) -> None:
    cluster: Cluster = start_cluster(workers=1)
    cluster.s3.put_object(bucket, "f.bin", b"the first version")
    interval = 2.0
    cluster.mount_bucket("/ro", bucket, read_only=True, metadata_sync_interval=int(interval))
    near = {"STRATA_CLIENT_NEAR_CACHE": str(tmp_path / "near")}
    assert load(cluster, REMOTE, ["/ro/f.bin"], tmp_path, **near)["/ro/f.bin"][0] == zlib.crc32(b"the first version")
    read_at = time.monotonic()
    cluster.s3.put_object(bucket, "f.bin", b"the second, longer version")
    time.sleep(max(0.0, read_at + interval + 0.5 - time.monotonic()))
    for _ in range(2):  # the process that finds the record stale, and the one after it
        again = load(cluster, REMOTE, ["/ro/f.bin"], tmp_path, **near)
        assert again["/ro/f.bin"][0] == zlib.crc32(b"the second, longer version")


def test_a_writable_mount_asks_for_the_status_and_takes_only_that_versions_bytes(
        start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    cluster: Cluster = start_cluster(workers=2)
    cluster.mount_bucket("/rw", bucket)
    fs = cluster.fs()
    fs.pipe("/rw/f.bin", b"one" * 1000)
    near = {"STRATA_CLIENT_NEAR_CACHE": str(tmp_path / "near")}
    assert load(cluster, REMOTE, ["/rw/f.bin"], tmp_path, **near)["/rw/f.bin"][0] == zlib.crc32(b"one" * 1000)
    asked, opens, reads, _ = requests(cluster)
    assert load(cluster, REMOTE, ["/rw/f.bin"], tmp_path, **near)["/rw/f.bin"][0] == zlib.crc32(b"one" * 1000)
    after = requests(cluster)
    assert after[0] > asked and after[2] == reads  # close-to-open: the status is asked; the bytes are near
    fs.pipe("/rw/f.bin", b"two" * 999)
    assert load(cluster, REMOTE, ["/rw/f.bin"], tmp_path, **near)["/rw/f.bin"][0] == zlib.crc32(b"two" * 999)


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_damaged_record_is_never_returned(start_cluster: Any, bucket: str, tmp_path: Path, damage: str) -> None:
    cluster: Cluster = start_cluster(workers=1)
    files = dataset(cluster, bucket, 6)
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=120)
    expected = {path: zlib.crc32(data) for path, data in files.items()}
    near = tmp_path / "near"
    load(cluster, REMOTE, sorted(files), tmp_path, STRATA_CLIENT_NEAR_CACHE=str(near))
    for i, record in enumerate(records(near)):
        size = record.stat().st_size
        if damage == "truncated":
            os.truncate(record, size - 1 - i * 1000)
            continue
        with open(record, "r+b") as f:  # one bit in the bytes, the checksums or the status
            f.seek([size - 1, size // 2, 40][i % 3])
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x04]))
    before = requests(cluster)
    again = load(cluster, REMOTE, sorted(files), tmp_path, STRATA_CLIENT_NEAR_CACHE=str(near))
    assert {p: r[0] for p, r in again.items()} == expected
    assert requests(cluster)[1] >= before[1] + len(files)  # each asked anew
    kept_again = requests(cluster)
    load(cluster, REMOTE, sorted(files), tmp_path, STRATA_CLIENT_NEAR_CACHE=str(near))
    assert requests(cluster) == kept_again  # the records written anew serve the next process


def test_the_quota_holds(start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    cluster: Cluster = start_cluster(workers=1)
    files = {f"/ds/q/f-{i}.bin": os.urandom(1800) for i in range(700)}  # ~1.3 MiB of records
    for path, data in files.items():
        cluster.s3.put_object(bucket, path.removeprefix("/ds/"), data)
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=120)
    expected = {path: zlib.crc32(data) for path, data in files.items()}
    near = tmp_path / "near"
    env = {"STRATA_CLIENT_NEAR_CACHE": str(near), "STRATA_CLIENT_NEAR_CACHE_BYTES": str(1 << 20)}
    for _ in range(2):  # the second process finds part of them there, and reads the rest anew
        got = load(cluster, REMOTE, sorted(files), tmp_path, **env)
        assert {p: r[0] for p, r in got.items()} == expected
        kept = records(near)
        assert sum(p.stat().st_size for p in kept) <= 1 << 20
        assert 200 < len(kept) < len(files)
