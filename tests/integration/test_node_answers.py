"""New processes on a node open files with what the node already knows.

A training loader of each epoch is a new process: it holds nothing. The worker of its node
keeps the master's reusable answers (read-only mounts, within their freshness) and answers an
open with the status and the small file's block in one round trip, by short-circuit on the
worker's host and over the data port elsewhere. Real processes throughout: moto's S3 server,
a master and a worker as users start them, and each loader a new Python process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from .conftest import TOKEN, Cluster, metric

pytestmark = pytest.mark.timeout(240)

# One loader process: reads each path whole (with "stat": stats it), prints per path the
# CRC-32 of its bytes (its size) or the name of the error it raised, and the seconds each took.
LOADER = """
import json, sys, time, zlib
from strata.cacheserver.client.fs import StrataFileSystem
job = json.loads(sys.argv[1])
fs = StrataFileSystem(master=job["master"], token=job["token"], host=job["host"], skip_instance_cache=True)
out = {}
for path in job["paths"]:
    started = time.monotonic()
    try:
        if job.get("stat"):
            out[path] = [fs.info(path)["size"], time.monotonic() - started]
            continue
        with fs.open(path, "rb") as f:
            out[path] = [zlib.crc32(f.read()), time.monotonic() - started]
    except Exception as exc:
        out[path] = [type(exc).__name__, time.monotonic() - started]
fs.client.close()
print(json.dumps(out))
"""

SHORT_CIRCUIT, REMOTE = "node-0", "elsewhere"  # worker-0's host / a host without a worker


def load(cluster: Cluster, host: str, paths: list[str], home: Path, *, stat: bool = False,
         **env: str) -> dict[str, list[Any]]:
    """Run a new loader process on `host`; what it read (`stat`: the sizes it saw), by path."""
    job = {"master": cluster.master_address, "token": TOKEN, "host": host, "paths": paths, "stat": stat}
    done = subprocess.run([sys.executable, "-P", "-c", LOADER, json.dumps(job)], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "STRATA_HOME": str(home), **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def get_status_requests(cluster: Cluster) -> float:
    return metric(cluster.master.metrics(), "strata_master_metadata_requests", '{method="GetStatus"}')


def dataset(cluster: Cluster, bucket: str, count: int) -> dict[str, bytes]:
    files = {f"/ds/train/s-{i}.bin": os.urandom(50_000 + i) for i in range(count)}
    for path, data in files.items():
        cluster.s3.put_object(bucket, path.removeprefix("/ds/"), data)
    return files


@pytest.mark.parametrize("host", [SHORT_CIRCUIT, REMOTE], ids=["short-circuit", "remote"])
def test_new_processes_open_what_the_node_knows_without_the_master(
        start_cluster: Any, bucket: str, tmp_path: Path, host: str) -> None:
    cluster: Cluster = start_cluster(workers=1)
    files = dataset(cluster, bucket, 12)
    seen, unseen = sorted(files)[:10], sorted(files)[10:]
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=120)
    expected = {path: zlib.crc32(data) for path, data in files.items()}
    first = load(cluster, host, seen, tmp_path)  # epoch 1: the worker asks the master
    assert {p: r[0] for p, r in first.items()} == {p: expected[p] for p in seen}
    asked = get_status_requests(cluster)
    second = load(cluster, host, seen, tmp_path)  # epoch 2, a new process: the node answers
    assert {p: r[0] for p, r in second.items()} == {p: expected[p] for p in seen}
    assert get_status_requests(cluster) == asked

    master = cluster.master
    assert master.process is not None
    os.killpg(master.process.pid, signal.SIGSTOP)  # the master stops answering
    try:
        # Epoch 3 during the outage: files the node saw open and read right; so do files it
        # never saw, whose statuses the worker takes from the store once the master kept
        # silent past its patience (worker/outagestatuses.py), within the client's deadlines.
        third = load(cluster, host, seen + unseen, tmp_path, STRATA_CLIENT_MASTER_TIMEOUT="3")
    finally:
        os.killpg(master.process.pid, signal.SIGCONT)
    assert {p: r[0] for p, r in third.items()} == {p: expected[p] for p in seen + unseen}
    assert max(r[1] for r in third.values()) < 5, third
    after = load(cluster, host, unseen, tmp_path)
    assert {p: r[0] for p, r in after.items()} == {p: expected[p] for p in unseen}


def test_a_file_changed_in_the_store_is_seen_new_after_the_freshness_interval(
        start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    cluster: Cluster = start_cluster(workers=1)
    cluster.s3.put_object(bucket, "f.bin", b"the first version")
    interval = 2.0
    cluster.mount_bucket("/ro", bucket, read_only=True, metadata_sync_interval=int(interval))
    first = load(cluster, SHORT_CIRCUIT, ["/ro/f.bin"], tmp_path)
    assert first["/ro/f.bin"][0] == zlib.crc32(b"the first version")
    read_at = time.monotonic()
    cluster.s3.put_object(bucket, "f.bin", b"the second, longer version")
    time.sleep(max(0.0, read_at + interval + 0.5 - time.monotonic()))
    for host in (SHORT_CIRCUIT, REMOTE):  # past the interval: every new process sees the new version
        assert load(cluster, host, ["/ro/f.bin"], tmp_path, stat=True)["/ro/f.bin"][0] == len(b"the second, longer version")
        again = load(cluster, host, ["/ro/f.bin"], tmp_path)
        assert again["/ro/f.bin"][0] == zlib.crc32(b"the second, longer version"), host


def cached_on_ssd(start_cluster: Any, bucket: str, tmp_path: Path,
                  count: int) -> tuple[Cluster, Path, dict[str, bytes], dict[str, int]]:
    """A worker with one SSD tier (its folder) and a read-only mount /ds of `count` files
    (their bytes, and the CRC-32 of each, by path)."""
    ssd = tmp_path / "ssd"
    cluster: Cluster = start_cluster(workers=1, tiers=[{"medium": "SSD", "quota": "64Mi", "dirs": [str(ssd)]}])
    files = dataset(cluster, bucket, count)
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=120)
    return cluster, ssd, files, {path: zlib.crc32(data) for path, data in files.items()}


def damage_blocks(tier: Path) -> None:
    """Flip a byte in the middle of every block file of the tier folder."""
    for block in sorted(tier.glob("*.blk")):
        with open(block, "r+b") as f:
            f.seek(block.stat().st_size // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("host", [SHORT_CIRCUIT, REMOTE], ids=["short-circuit", "remote"])
def test_a_damaged_block_the_node_answers_with_is_never_returned(
        start_cluster: Any, bucket: str, tmp_path: Path, host: str) -> None:
    cluster, ssd, _, expected = cached_on_ssd(start_cluster, bucket, tmp_path, 3)
    paths = sorted(expected)
    assert {p: r[0] for p, r in load(cluster, host, paths, tmp_path).items()} == expected  # cached

    damage_blocks(ssd)  # the store still has the files: the damaged copies are fetched again
    assert {p: r[0] for p, r in load(cluster, host, paths, tmp_path).items()} == expected
    assert cluster.worker_metric(0, "strata_worker_corrupt_blocks") >= len(paths)
    damage_blocks(ssd)  # and now the store has lost them: an error, never the damaged bytes
    for path in paths:
        cluster.s3.client().delete_object(Bucket=bucket, Key=path.removeprefix("/ds/"))
    for path, (got, _) in load(cluster, host, paths, tmp_path).items():
        assert isinstance(got, str), f"{path}: bytes returned from a damaged copy whose object is gone"


def kept_opens(cluster: Cluster) -> float:
    return cluster.worker_metric(0, "strata_worker_kept_opens")


@pytest.mark.parametrize("host", [SHORT_CIRCUIT, REMOTE], ids=["short-circuit", "remote"])
def test_the_worker_answers_warm_opens_in_its_socket_thread_and_a_damaged_block_is_still_caught(
        start_cluster: Any, bucket: str, tmp_path: Path, host: str) -> None:
    """A file the worker served before is opened by the next new process from the kept status
    and block alone (worker/keptopens.py), with no master request; the reader still checks
    every byte, so a block file damaged on the node's disk is caught on that path and the
    store's bytes are read instead."""
    cluster, ssd, files, expected = cached_on_ssd(start_cluster, bucket, tmp_path, 6)
    paths = sorted(expected)
    assert {p: r[0] for p, r in load(cluster, host, paths, tmp_path).items()} == expected  # epoch 1: cold
    asked, before = get_status_requests(cluster), kept_opens(cluster)
    assert {p: r[0] for p, r in load(cluster, host, paths, tmp_path).items()} == expected  # epoch 2: warm
    assert kept_opens(cluster) - before == len(paths)
    sizes = {p: r[0] for p, r in load(cluster, host, paths, tmp_path, stat=True).items()}  # stats: what the node keeps
    assert sizes == {p: len(data) for p, data in files.items()}
    assert get_status_requests(cluster) == asked

    damage_blocks(ssd)
    corrupt, before = cluster.worker_metric(0, "strata_worker_corrupt_blocks"), kept_opens(cluster)
    assert {p: r[0] for p, r in load(cluster, host, paths, tmp_path).items()} == expected  # epoch 3: checked
    # The damaged files were handed out by the new path (all of them on the short-circuit
    # socket; over the data port the first, after which the reader holds the folder's statuses
    # and reads the rest block by block)...
    assert kept_opens(cluster) - before >= (len(paths) if host == SHORT_CIRCUIT else 1)
    assert cluster.worker_metric(0, "strata_worker_corrupt_blocks") - corrupt == len(paths)  # ...and caught


def metadata_requests(cluster: Cluster, method: str) -> float:
    """The master's metadata requests of `method` so far (0 before the first)."""
    try:
        return metric(cluster.master.metrics(), "strata_master_metadata_requests", f'{{method="{method}"}}')
    except AssertionError:  # none yet: the metric has no line for it
        return 0.0


def test_new_processes_stat_a_folder_with_one_listing_the_node_keeps(
        start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    """New processes without the node's status table (on a host without a worker) stat'ing
    the files of a read-only mount's folder get every status from one listing of the folder
    that the worker asked the master for once (worker/folders.py): no master request per
    file, and none for the second process. (On the worker's host the table answers:
    test_node_table.py.)"""
    host = REMOTE
    cluster: Cluster = start_cluster(workers=1)
    files = dataset(cluster, bucket, 20)
    paths = sorted(files)
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=120)
    sizes = {path: len(data) for path, data in files.items()}
    asked, listed = metadata_requests(cluster, "GetStatus"), metadata_requests(cluster, "ListStatus")
    for _ in range(2):  # two new processes, one after the other
        assert {p: r[0] for p, r in load(cluster, host, paths, tmp_path, stat=True).items()} == sizes
    assert metadata_requests(cluster, "ListStatus") - listed == 1
    assert metadata_requests(cluster, "GetStatus") == asked


def test_stats_of_a_writable_mount_stay_close_to_open(start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    """A writable mount's statuses are not reusable: a new process's stat after a change made
    elsewhere sees the change, however the node answered the stats before it."""
    cluster: Cluster = start_cluster(workers=1)
    cluster.mount_bucket("/rw", bucket)
    writer = cluster.fs(host=SHORT_CIRCUIT)
    for name in ("a", "b"):
        writer.pipe_file(f"/rw/d/{name}.bin", b"first")
    assert load(cluster, SHORT_CIRCUIT, ["/rw/d/a.bin", "/rw/d/b.bin"], tmp_path, stat=True)["/rw/d/a.bin"][0] == 5
    writer.pipe_file("/rw/d/a.bin", b"the second version")
    got = load(cluster, SHORT_CIRCUIT, ["/rw/d/b.bin", "/rw/d/a.bin"], tmp_path, stat=True)
    assert got["/rw/d/a.bin"][0] == len(b"the second version")
