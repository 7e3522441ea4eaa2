"""New processes on a node open warm small files from its data table, with no request a file.

The node's worker publishes the bytes of small files it hands to the node's readers in shared
memory (worker/published.py, STRATA_WORKER_DATA_TABLE_BYTES); a new process maps it with the
status table and answers an open of such a file by a lookup and a checksum (client/core.py).
Real processes: moto's S3 server, a master and a worker as users start them, and each loader
a new Python process.
"""

from __future__ import annotations

import signal
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from .conftest import Cluster
from .test_node_answers import SHORT_CIRCUIT, dataset, get_status_requests, load
from .test_node_table import socket_requests

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(autouse=True)
def data_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_WORKER_DATA_TABLE_BYTES", str(16 << 20))


def crcs(files: dict[str, bytes]) -> dict[str, int]:
    return {path: zlib.crc32(data) for path, data in files.items()}


def read(cluster: Cluster, paths: list[str], home: Path) -> dict[str, Any]:
    return {p: r[0] for p, r in load(cluster, SHORT_CIRCUIT, paths, home).items()}


def test_new_processes_open_warm_small_files_with_no_request_a_file(start_cluster: Any, bucket: str,
                                                                   tmp_path: Path) -> None:
    cluster: Cluster = start_cluster(workers=1)
    files = dataset(cluster, bucket, 12)
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=120)
    paths = sorted(files)
    assert read(cluster, paths, tmp_path) == crcs(files)  # epoch 1: cold, then published
    requests, asked = socket_requests(cluster), get_status_requests(cluster)
    for _ in range(2):  # each epoch a new process
        assert read(cluster, paths, tmp_path) == crcs(files)
    assert socket_requests(cluster) - requests == 2, "one request a process (the tables), none a file"
    assert get_status_requests(cluster) == asked

    cluster.fs(host=SHORT_CIRCUIT).client.free("/ds")  # the node's copies go with the blocks
    requests = socket_requests(cluster)
    assert read(cluster, paths, tmp_path) == crcs(files)
    assert socket_requests(cluster) - requests >= len(paths), "freed: every open asks the worker"


def test_a_writable_mounts_files_are_never_published(start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    cluster: Cluster = start_cluster(workers=1)
    files = dataset(cluster, bucket, 4)
    cluster.mount_bucket("/ds", bucket, read_only=False)
    paths = sorted(files)
    assert read(cluster, paths, tmp_path) == crcs(files)
    requests = socket_requests(cluster)
    assert read(cluster, paths, tmp_path) == crcs(files)
    assert socket_requests(cluster) - requests >= len(paths), "every open asks (close-to-open)"
    changed = {path: data[::-1] for path, data in files.items()}  # written through another way
    fs = cluster.fs(host=SHORT_CIRCUIT)
    for path, data in changed.items():
        with fs.open(path, "wb") as f:
            f.write(data)
    assert read(cluster, paths, tmp_path) == crcs(changed)


def test_a_file_changed_in_the_store_is_read_new_after_the_mounts_interval(start_cluster: Any, bucket: str,
                                                                           tmp_path: Path) -> None:
    """Read-only, synced every 6 s: within the interval the table's bytes are the old
    version's (what the master would answer), after it a new process reads the new bytes."""
    cluster: Cluster = start_cluster(workers=1)
    first, second = b"the first version " * 1000, b"the second, longer version " * 1000
    cluster.s3.put_object(bucket, "f.bin", first)
    interval = 6.0
    cluster.mount_bucket("/ro", bucket, read_only=True, metadata_sync_interval=int(interval))
    asked_at = time.monotonic()
    assert read(cluster, ["/ro/f.bin"], tmp_path) == {"/ro/f.bin": zlib.crc32(first)}
    assert read(cluster, ["/ro/f.bin"], tmp_path) == {"/ro/f.bin": zlib.crc32(first)}  # published
    cluster.s3.put_object(bucket, "f.bin", second)
    got = read(cluster, ["/ro/f.bin"], tmp_path)["/ro/f.bin"]
    assert got == zlib.crc32(first) or time.monotonic() - asked_at >= interval - 1
    time.sleep(max(0.0, asked_at + interval + 0.5 - time.monotonic()))
    for _ in range(2):  # the new version read, then published in its place
        assert read(cluster, ["/ro/f.bin"], tmp_path) == {"/ro/f.bin": zlib.crc32(second)}


def test_a_process_reads_right_across_a_worker_restart(start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    """A worker killed and started again leaves its tables unretired: a process that mapped
    them reads every file right, notices the worker answering from other tables, and moves to
    them, which then answer its opens with no request."""
    cluster: Cluster = start_cluster(workers=1)
    files = dataset(cluster, bucket, 8)
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=120)
    paths = sorted(files)
    assert read(cluster, paths[:3], tmp_path) == crcs({p: files[p] for p in paths[:3]})
    fs = cluster.fs(host=SHORT_CIRCUIT)
    with fs.open(paths[0], "rb") as f:  # from the first worker's tables
        assert f.read() == files[paths[0]]
    worker = cluster.workers[0]
    worker.stop(signal.SIGKILL)
    worker.start()
    worker.wait_healthy()
    assert read(cluster, paths, tmp_path) == crcs(files)  # published in the new worker's tables
    for path in paths[1:4]:  # the old tables' files, then one they lack (the worker answers it)
        with fs.open(path, "rb") as f:
            assert f.read() == files[path]
    requests = socket_requests(cluster)
    for path in paths[4:]:
        with fs.open(path, "rb") as f:
            assert f.read() == files[path]
    assert socket_requests(cluster) - requests == 1, "the new tables asked for once, then no request a file"
