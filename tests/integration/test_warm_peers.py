"""A warm cache is read from the workers, not from the store again: a worker that misses a
block another live worker holds copies it from that worker (checked in transit); the store is
asked only when no live worker holds it or its holder does not send it in time. A real master
and workers over moto's S3; store bytes are the workers' `strata_worker_ufs_bytes_read`."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from strata.cacheserver.client.fs import StrataFileSystem
from strata.cacheserver.worker.peers import ALONE_FOR

from .conftest import BLOCK_SIZE, Cluster, metric, wait_until
from .test_integrity import flip_middle_bytes


def payload(size: int, seed: int) -> bytes:
    return (seed.to_bytes(4, "big") * (size // 4 + 1))[:size] if seed % 2 else os.urandom(size)


def preloaded(cluster: Cluster, bucket: str, files: dict[str, bytes]) -> StrataFileSystem:
    """The files put in the store, mounted at /d and loaded whole into the cache, each block
    on one worker (the load's placement), with the master told where each block is."""
    for name, data in files.items():
        cluster.s3.put_object(bucket, f"set/{name}", data)
    cluster.mount_bucket("/d", bucket)
    fs = cluster.fs()
    progress = list(fs.client.load("/d/set"))
    assert progress[-1].done and not progress[-1].error

    def located() -> bool:
        return all(all(b.worker_ids for b in fs.client.block_locations(f"/d/set/{name}").blocks) for name in files)

    wait_until(located, 10, "the master to know where every loaded block is")
    # A worker trusts a list of workers naming only itself for ALONE_FOR seconds (its misses
    # then go to the store without asking where their blocks are): a list taken before the
    # other workers registered is stale by then, and the next miss asks again.
    time.sleep(ALONE_FOR)
    return fs


def holders(fs: StrataFileSystem, path: str) -> list[list[str]]:
    return [list(b.worker_ids) for b in fs.client.block_locations(path).blocks]


def read_all(fs: StrataFileSystem, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        assert fs.cat_file(f"/d/set/{name}") == data, f"{name}: wrong bytes"


def test_a_preloaded_dataset_read_through_a_worker_that_does_not_hold_it_costs_no_store_bytes(
        start_cluster: Any, bucket: str) -> None:
    cluster: Cluster = start_cluster(workers=2)
    files = {f"f{i}.bin": payload(BLOCK_SIZE + 1000 * i, i) for i in range(6)}
    fs = preloaded(cluster, bucket, files)
    loaded = cluster.total_metric("strata_worker_ufs_bytes_read")
    assert loaded == sum(map(len, files.values()))
    held_by_1 = sum(1 for name in files for h in holders(fs, f"/d/set/{name}") if h == ["worker-1"])
    assert held_by_1 > 0, "the load put every block on worker-0: the test needs some on worker-1"
    hits_on_1 = metric(cluster.workers[1].metrics(), "strata_worker_mount_cache_hits", '{mount="/d"}')
    # A reader on worker-0's node reads through worker-0 (short-circuit), which holds only
    # part of the dataset: the rest is worker-1's.
    read_all(cluster.fs(host="node-0"), files)
    assert cluster.total_metric("strata_worker_ufs_bytes_read") == loaded, "the warm dataset was fetched again"
    assert cluster.worker_metric(0, "strata_worker_peer_reads") == held_by_1
    # The blocks worker-1 sent are hits of the mount's cache (the dashboard's hit ratio): the
    # store was not asked for them.
    served = metric(cluster.workers[1].metrics(), "strata_worker_mount_cache_hits", '{mount="/d"}') - hits_on_1
    assert served == held_by_1
    # Now both hold those blocks; a reader on the other node costs the store nothing either.
    read_all(cluster.fs(host="node-1"), files)
    assert cluster.total_metric("strata_worker_ufs_bytes_read") == loaded


def test_many_readers_on_every_node_read_a_warm_dataset_with_no_store_bytes_and_bounded_peer_bytes(
        start_cluster: Any, bucket: str) -> None:
    cluster: Cluster = start_cluster(workers=3)
    files = {f"f{i}.bin": payload(2 * BLOCK_SIZE + 4096 * i, i) for i in range(5)}
    size = sum(map(len, files.values()))
    fs = preloaded(cluster, bucket, files)
    loaded = cluster.total_metric("strata_worker_ufs_bytes_read")
    blocks = [b for name in files for b in fs.client.block_locations(f"/d/set/{name}").blocks]
    missing = [float(sum(b.length for b in blocks if f"worker-{i}" not in b.worker_ids)) for i in range(3)]
    failures: list[BaseException] = []

    def reader(node: int) -> None:
        try:
            read_all(cluster.fs(host=f"node-{node}"), files)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failures.append(exc)

    threads = [threading.Thread(target=reader, args=(node,)) for node in range(3) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(t.is_alive() for t in threads) and not failures, failures
    assert cluster.total_metric("strata_worker_ufs_bytes_read") == loaded, "the warm dataset was fetched again"
    # Each node's worker copies at most the part of the dataset it did not hold, once,
    # however many of its readers missed a block at the same time.
    copied = [cluster.worker_metric(i, "strata_worker_peer_bytes_read") for i in range(3)]
    assert copied == missing, f"peer bytes {copied}, the bytes each worker did not hold {missing}"
    assert sum(copied) <= 2 * size


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["SIGKILL", "SIGSTOP"])
def test_a_holder_killed_or_stopped_mid_copy_leaves_the_reader_the_stores_bytes(
        start_cluster: Any, bucket: str, monkeypatch: pytest.MonkeyPatch, sig: int) -> None:
    if sig == signal.SIGKILL:
        monkeypatch.setenv("STRATA_WORKER_PEER_WAIT", "30")  # the kill ends the copy, not the deadline
    cluster: Cluster = start_cluster(workers=2)
    files = {f"f{i}.bin": payload(BLOCK_SIZE, i) for i in range(8)}
    fs = preloaded(cluster, bucket, files)
    # The holder: a worker the load gave at least two files alone (worker-1 as a rule; the
    # load's placement follows the workers the master hears from, which a loaded machine can
    # make worker-0 alone), read through the other worker's node.
    alone = {w: [name for name in files if holders(fs, f"/d/set/{name}") == [[f"worker-{w}"]]] for w in (0, 1)}
    held = 1 if len(alone[1]) >= 2 else 0
    reading = 1 - held
    assert len(alone[held]) >= 2, f"the load put fewer than two files on either worker alone: {alone}"
    loaded = cluster.total_metric("strata_worker_ufs_bytes_read")
    reader = cluster.fs(host=f"node-{reading}")
    first, second = alone[held][:2]
    # The reading worker copies the first from the holder: no store bytes.
    assert reader.cat_file(f"/d/set/{first}") == files[first]
    assert cluster.total_metric("strata_worker_ufs_bytes_read") == loaded
    # The holder stops; the reading worker asks it for the second and waits on it: until it is
    # killed (SIGKILL), or until the peer wait runs out (SIGSTOP, the default 2 s).
    victim = cluster.workers[held]
    assert victim.process is not None
    pid = victim.process.pid
    os.killpg(pid, signal.SIGSTOP)
    got: list[bytes] = []
    failed: list[BaseException] = []

    def read() -> None:
        try:
            got.append(reader.cat_file(f"/d/set/{second}"))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failed.append(exc)

    thread = threading.Thread(target=read)
    started = time.monotonic()
    thread.start()
    try:
        if sig == signal.SIGKILL:
            time.sleep(1.0)  # the reader's worker is waiting on the stopped holder
            os.killpg(pid, signal.SIGKILL)
        thread.join(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    took = time.monotonic() - started
    assert not thread.is_alive() and not failed, failed
    assert got == [files[second]], "wrong bytes after the holder was lost mid-copy"
    assert cluster.worker_metric(reading, "strata_worker_ufs_bytes_read") >= BLOCK_SIZE, "not from the store"
    assert cluster.worker_metric(reading, "strata_worker_peer_failures") == 1
    print(f"\nholder {signal.Signals(sig).name} mid-copy: the reader had the store's bytes {took:.1f}s after it asked")
    assert took < 15, "the reader waited on a lost holder"


def test_a_holder_whose_copy_is_damaged_on_its_disk_sends_nothing_and_the_reader_gets_the_stores_bytes(
        start_cluster: Any, bucket: str) -> None:
    """A copy is checked twice: the holder checks its block file's checksums before it sends
    (a damaged copy is dropped, never sent), and the copying worker checks the CRC-32C of the
    bytes received before it caches or serves them."""
    cluster: Cluster = start_cluster(workers=2)
    files = {f"f{i}.bin": payload(BLOCK_SIZE, i) for i in range(6)}
    fs = preloaded(cluster, bucket, files)
    on_1 = [name for name in files if holders(fs, f"/d/set/{name}") == [["worker-1"]]]
    assert on_1, "the load put no file on worker-1 alone"
    loaded = cluster.total_metric("strata_worker_ufs_bytes_read")
    tiers = [Path(f"/dev/shm/strata-it-{os.getpid()}-{cluster.root.name}-worker-1"), cluster.root / "worker-1" / "ssd"]
    damaged = [path for tier in tiers for path in tier.rglob("*.blk")]
    assert len(damaged) >= len(on_1)
    flip_middle_bytes(damaged)
    read_all(cluster.fs(host="node-0"), files)
    assert cluster.worker_metric(1, "strata_worker_corrupt_blocks") == len(on_1)
    assert cluster.worker_metric(1, "strata_worker_peer_bytes_served") == 0
    assert cluster.total_metric("strata_worker_ufs_bytes_read") - loaded == len(on_1) * BLOCK_SIZE
