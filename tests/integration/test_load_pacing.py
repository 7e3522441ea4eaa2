"""A load keeps to its bandwidth, all workers together, and a load again after the store
changed (with refresh) fetches only what changed. A real master and two workers over a
file:// store; store bytes are the workers' `strata_worker_ufs_bytes_read`."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK_SIZE, Cluster, allow

MiB = 1024 * 1024
WINDOW = 3.0  # seconds: the span over which the bandwidth is kept


def dataset(root: Path, count: int, size: int) -> dict[str, bytes]:
    files = {f"f{i}.bin": os.urandom(size) for i in range(count)}
    (root / "set").mkdir(parents=True)
    for name, data in files.items():
        (root / "set" / name).write_bytes(data)
    return files


def load(cluster: Cluster, path: str, **kwargs: Any) -> tuple[pb.LoadProgress, float]:
    """The load's last progress and how long it took (s)."""
    start = time.monotonic()
    progress = list(cluster.fs().client.load(path, **kwargs))
    assert progress[-1].done and not progress[-1].error, progress[-1]
    return progress[-1], time.monotonic() - start


def report_of(cluster: Cluster, path: str) -> pb.LoadProgress:
    report = cluster.fs().client.report()
    return next(load for m in report.mounts for load in m.loads if load.path == path)


def test_a_load_with_a_bandwidth_keeps_to_it_over_all_workers_and_caches_everything(
        start_cluster: Any, tmp_path: Path) -> None:
    source = tmp_path / "store"
    files = dataset(source, 6, 2 * BLOCK_SIZE)  # 48 MiB, 12 blocks over two workers
    total = sum(map(len, files.values()))
    cluster: Cluster = start_cluster(workers=2, **allow(source))
    cluster.fs().client.mount("/d", f"file://{source}")
    limit = 12 * MiB

    samples: list[tuple[float, float]] = []  # (time, store bytes so far)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            samples.append((time.monotonic(), cluster.total_metric("strata_worker_ufs_bytes_read")))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        last, took = load(cluster, "/d/set", bandwidth=limit)
    finally:
        stop.set()
        sampler.join()

    rate = total / took
    window = WINDOW * limit  # what the limit allows over any WINDOW seconds
    burst = max(b1 - b0 for t0, b0 in samples for t1, b1 in samples if 0 < t1 - t0 <= WINDOW)
    print(f"loaded {total / MiB:.0f} MiB in {took:.2f}s: {rate / MiB:.2f} MiB/s at a limit of {limit / MiB:.0f} MiB/s; "
          f"at most {burst / MiB:.0f} MiB in any {WINDOW:.0f}s (the limit: {window / MiB:.0f} MiB)")
    assert rate <= 1.1 * limit, f"{rate / MiB:.2f} MiB/s is more than 10% over the limit of {limit / MiB} MiB/s"
    # The pace is kept a block at a time: one block more than the window's share at most.
    assert burst <= 1.1 * window + BLOCK_SIZE, f"{burst / MiB:.0f} MiB in {WINDOW}s"
    assert cluster.total_metric("strata_worker_ufs_bytes_read") == total
    assert last.bytes_fetched == total
    assert all(cluster.worker_metric(i, "strata_worker_ufs_bytes_read") > 0 for i in range(2)), \
        "one worker fetched everything: the test needs the limit shared"
    done = report_of(cluster, "/d/set")
    assert done.bytes_cached == total
    assert 0 < done.started_unix_ms < done.finished_unix_ms
    assert done.finished_unix_ms - done.started_unix_ms >= (total / limit) * 1000 * 0.9


def test_a_refreshed_load_after_one_object_changed_fetches_only_that_object(
        start_cluster: Any, tmp_path: Path) -> None:
    source = tmp_path / "store"
    files = dataset(source, 4, BLOCK_SIZE + 12345)
    total = sum(map(len, files.values()))
    cluster: Cluster = start_cluster(workers=2, **allow(source))
    fs = cluster.fs()
    fs.client.mount("/d", f"file://{source}")
    first, _ = load(cluster, "/d/set", bandwidth=64 * MiB)
    assert first.bytes_fetched == total
    assert cluster.total_metric("strata_worker_ufs_bytes_read") == total

    changed = os.urandom(len(files["f2.bin"]) - 100)
    (source / "set" / "f2.bin").write_bytes(changed)
    stamp = time.time() + 10
    os.utime(source / "set" / "f2.bin", (stamp, stamp))

    second, _ = load(cluster, "/d/set", bandwidth=64 * MiB, refresh=True)

    print(f"first load fetched {first.bytes_fetched} bytes, the second {second.bytes_fetched}")
    assert second.bytes_fetched == len(changed)
    assert cluster.total_metric("strata_worker_ufs_bytes_read") == total + len(changed)
    assert report_of(cluster, "/d/set").bytes_cached == total - len(files["f2.bin"]) + len(changed)
    assert fs.cat_file("/d/set/f2.bin") == changed
    assert cluster.total_metric("strata_worker_ufs_bytes_read") == total + len(changed), "the new version was not cached"
