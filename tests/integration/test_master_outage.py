"""Opens of read-only Mounts' files go on while the master is down (issue #27, target 6).

The master is killed (SIGKILL) and started again on the same journal 30 s later. Meanwhile
new client processes (a training loader of a new epoch) open and read three kinds of files
of a read-only mount synced every 60 s: files the node read before (warm: their statuses and
blocks are on the workers), files a process of the node only stat'ed (their statuses are on
the node's worker, their blocks nowhere) and files no process ever looked at. The workers
know the mount's store from their mount table: each answers what the master would have
answered, from what it keeps or from the store itself, within the mount's freshness. Writes
wait for the master as before. Real processes throughout: moto's S3 server, a master and two
workers as users start them, each loader a new Python process.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import zlib
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from storeproxy import StoreProxy
from strata.contract import errors
from .conftest import BLOCK_SIZE, Cluster, wait_until
from .test_fuse import mount_fuse  # noqa: F401  (a fixture)
from .test_faults import mount_through
from .test_fuse import FuseProcess
from .test_node_answers import REMOTE, SHORT_CIRCUIT, load

pytestmark = pytest.mark.timeout(300)

OUTAGE = 30.0


def put(cluster: Cluster, bucket: str, files: dict[str, bytes]) -> dict[str, int]:
    """Put `files` (namespace path under /ds -> bytes) in the bucket; the CRC-32 of each."""
    for path, data in files.items():
        cluster.s3.put_object(bucket, path.removeprefix("/ds/"), data)
    return {path: zlib.crc32(data) for path, data in files.items()}


def group(folder: str, count: int) -> dict[str, bytes]:
    """`count` small files (one block, under a MiB) and a file of two and a half blocks."""
    files = {f"/ds/{folder}/s-{i}.bin": os.urandom(40_000 + i) for i in range(count)}
    files[f"/ds/{folder}/big.bin"] = os.urandom(BLOCK_SIZE * 5 // 2)
    return files


def kill_master(cluster: Cluster) -> float:
    master = cluster.master
    assert master.process is not None
    os.killpg(master.process.pid, signal.SIGKILL)
    master.process.wait(timeout=10)
    master.child = None
    return time.monotonic()


def test_new_processes_open_read_only_files_through_a_master_outage(
        start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    cluster: Cluster = start_cluster(workers=2)
    warm, seen, unknown = group("warm", 4), group("seen", 4), group("unknown", 4)
    expected = put(cluster, bucket, {**warm, **seen, **unknown})
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=60)
    cluster.mount_bucket("/rw", bucket, read_only=False)
    for host in (SHORT_CIRCUIT, REMOTE):  # warm: read on both hosts before the outage
        assert {p: r[0] for p, r in load(cluster, host, sorted(warm), tmp_path).items()} == \
            {p: expected[p] for p in warm}
    sizes = {p: r[0] for p, r in load(cluster, SHORT_CIRCUIT, sorted(seen), tmp_path, stat=True).items()}
    assert sizes == {p: len(d) for p, d in seen.items()}  # seen: stat'ed on the worker's node only

    writer = cluster.fs(host=SHORT_CIRCUIT)
    writer.pipe_file("/rw/before.bin", b"written before the outage")
    down_at = kill_master(cluster)
    wrote: list[Any] = []

    def write() -> None:
        started = time.monotonic()
        try:
            writer.pipe_file("/rw/during.bin", b"written during the outage")
            wrote.extend(["written", time.monotonic() - started])
        except errors.StrataError as exc:
            wrote.extend([exc, time.monotonic() - started])

    writing = threading.Thread(target=write)
    writing.start()
    try:
        during = {host: load(cluster, host, sorted(expected), tmp_path, STRATA_CLIENT_MASTER_TIMEOUT="5")
                  for host in (SHORT_CIRCUIT, REMOTE)}
        late = load(cluster, REMOTE, sorted(unknown), tmp_path)  # well into the outage: the same
        writing.join(timeout=60)
        assert time.monotonic() - down_at < OUTAGE, "the outage's checks took longer than the outage"
    finally:
        time.sleep(max(0.0, down_at + OUTAGE - time.monotonic()))
        cluster.master.start()
    for host, got in during.items():
        for name, files in (("warm", warm), ("seen", seen), ("unknown", unknown)):
            times = [round(got[p][1], 2) for p in sorted(files)]
            print(f"\n{host} during the outage, {name}: {[got[p][0] == expected[p] for p in sorted(files)]} "
                  f"in {times} s")
    for host, got in during.items():
        assert {p: r[0] for p, r in got.items()} == expected, host
        assert max(r[1] for r in got.values()) < 2.0, host  # no path waited out a master deadline
    assert {p: r[0] for p, r in late.items()} == {p: expected[p] for p in unknown}
    assert cluster.total_metric("strata_worker_outage_statuses") >= len(unknown)  # the stores stood in
    # The write waited for the master (STRATA_WORKER_MASTER_WAIT, 15 s), then failed naming it.
    assert isinstance(wrote[0], errors.Unavailable), wrote
    assert wrote[1] >= 14, wrote
    assert "on the master" in str(wrote[0]) and "could not be reached" in str(wrote[0])

    cluster.master.wait_healthy()
    cluster.wait_workers(2)
    after = load(cluster, REMOTE, sorted(expected), tmp_path)
    assert {p: r[0] for p, r in after.items()} == expected
    assert not writer.exists("/rw/during.bin")
    writer.pipe_file("/rw/after.bin", b"written after the outage")
    assert writer.cat_file("/rw/after.bin") == b"written after the outage"


def test_during_an_outage_a_file_changed_in_the_store_is_read_new_past_the_freshness_interval(
        start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    """The workers answer no older than the mount's interval while the master is away: a file
    replaced in the store meanwhile is read as its new version by a process that opens it
    once the interval has passed, and as its old version, whole, never a mix, before that."""
    cluster: Cluster = start_cluster(workers=1)
    interval = 3.0
    cluster.s3.put_object(bucket, "f.bin", b"the first version")
    cluster.mount_bucket("/ro", bucket, read_only=True, metadata_sync_interval=int(interval))
    assert load(cluster, SHORT_CIRCUIT, ["/ro/f.bin"], tmp_path)["/ro/f.bin"][0] == zlib.crc32(b"the first version")
    running = {host: cluster.fs(host=host) for host in (SHORT_CIRCUIT, REMOTE)}  # processes that stay up
    for fs in running.values():
        assert fs.cat_file("/ro/f.bin") == b"the first version"  # each holds the status now
    down_at = kill_master(cluster)
    try:
        changed_at = time.monotonic()
        cluster.s3.put_object(bucket, "f.bin", b"the second, longer version")
        time.sleep(max(0.0, changed_at + interval + 0.5 - time.monotonic()))
        for host in (SHORT_CIRCUIT, REMOTE):
            got = load(cluster, host, ["/ro/f.bin"], tmp_path)["/ro/f.bin"]
            assert got[0] == zlib.crc32(b"the second, longer version"), (host, got)
            assert load(cluster, host, ["/ro/f.bin"], tmp_path, stat=True)["/ro/f.bin"][0] == \
                len(b"the second, longer version")
        for host, fs in running.items():  # what a running process held is not used past the interval
            assert fs.cat_file("/ro/f.bin") == b"the second, longer version", host
        assert time.monotonic() - down_at < OUTAGE
    finally:
        cluster.master.start()
    cluster.master.wait_healthy()
    wait_until(lambda: load(cluster, REMOTE, ["/ro/f.bin"], tmp_path)["/ro/f.bin"][0] ==
               zlib.crc32(b"the second, longer version"), 30, "the master to answer the new version")


@pytest.fixture
def store_proxy(s3: Any) -> Iterator[StoreProxy]:
    store = StoreProxy(target_port=int(s3.endpoint_url.rsplit(":", 1)[1]))
    yield store
    store.stop()


def test_with_the_store_away_too_a_held_answer_is_not_used_past_the_interval(
        start_cluster: Any, bucket: str, store_proxy: StoreProxy) -> None:
    """A running process holds a read-only mount's status; the master dies and its store
    cannot be reached either: once the mount's interval has passed the process no longer
    opens the file with what it held (it may have changed in the store meanwhile: the
    Mount's stale-if-error is the master's answer for an unreachable store, not the client's
    for an unreachable master), and the error names the master."""
    cluster: Cluster = start_cluster(workers=1)
    cluster.s3.put_object(bucket, "f.bin", b"the first version")
    interval = 3.0
    mount_through(cluster, store_proxy, "/ro", bucket, read_only=True, metadata_sync_interval=int(interval))
    fs = cluster.fs(host=SHORT_CIRCUIT)
    assert fs.cat_file("/ro/f.bin") == b"the first version"
    read_at = time.monotonic()
    kill_master(cluster)
    try:
        with store_proxy.refusing():
            cluster.s3.put_object(bucket, "f.bin", b"the second, longer version")  # straight to the store
            time.sleep(max(0.0, read_at + interval + 0.5 - time.monotonic()))
            started = time.monotonic()
            with pytest.raises(errors.Unavailable, match="master") as failed:
                fs.cat_file("/ro/f.bin")
            took = time.monotonic() - started
    finally:
        cluster.master.start()
    print(f"\nmaster and store away, past the interval: {type(failed.value).__name__} after {took:.2f}s")
    assert took < 10
    cluster.master.wait_healthy()
    wait_until(lambda: fs.cat_file("/ro/f.bin") == b"the second, longer version", 30, "the new version")


def test_a_fuse_mount_that_is_up_opens_read_only_files_through_a_master_outage(
        start_cluster: Any, bucket: str, tmp_path: Path, mount_fuse: Callable[..., FuseProcess]) -> None:  # noqa: F811
    """A FUSE mount on a worker's node, up before the master dies: files it read, files it
    only stat'ed and files in a folder it never looked up open and read right meanwhile."""
    cluster: Cluster = start_cluster(workers=1)
    warm, seen, unknown = group("warm", 2), group("seen", 2), group("unknown", 2)
    expected = put(cluster, bucket, {**warm, **seen, **unknown})
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=60)
    mnt = mount_fuse(cluster, "--read-only", host=SHORT_CIRCUIT).path
    for path in warm:
        assert zlib.crc32((mnt / path.lstrip("/")).read_bytes()) == expected[path]
    for path in seen:
        assert (mnt / path.lstrip("/")).stat().st_size == len(seen[path])
    down_at = kill_master(cluster)
    try:
        got = {}
        for path in sorted(expected):
            started = time.monotonic()
            try:
                got[path] = [zlib.crc32((mnt / path.lstrip("/")).read_bytes()), time.monotonic() - started]
            except OSError as exc:
                got[path] = [exc.strerror, time.monotonic() - started]
        assert time.monotonic() - down_at < OUTAGE
    finally:
        cluster.master.start()
    print(f"\nFUSE during the outage: {got}")
    assert {p: r[0] for p, r in got.items()} == expected
    assert max(r[1] for r in got.values()) < 2.0


def test_a_stopped_master_costs_a_node_one_wait_not_one_a_folder(start_cluster: Any, bucket: str,
                                                                tmp_path: Path) -> None:
    """A master that stops answering (SIGSTOP: a hung process, a partition) is waited for
    once; then each worker of the node goes to the store at once for its new processes'
    stats and opens, folder after folder, while asking the master too (whose answers take
    over when it answers again)."""
    cluster: Cluster = start_cluster(workers=1)
    files = {f"/ds/f{i}/s.bin": os.urandom(1000 + i) for i in range(4)}
    expected = put(cluster, bucket, files)
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=60)
    cluster.s3.put_object(bucket, "other.bin", b"read before")
    assert load(cluster, SHORT_CIRCUIT, ["/ds/other.bin"], tmp_path)  # the node's processes know the workers
    master = cluster.master
    assert master.process is not None
    os.killpg(master.process.pid, signal.SIGSTOP)
    try:
        first = load(cluster, SHORT_CIRCUIT, ["/ds/f0/s.bin"], tmp_path, stat=True)  # the one wait
        stats = load(cluster, SHORT_CIRCUIT, ["/ds/f1/s.bin", "/ds/f2/s.bin"], tmp_path, stat=True)
        opens = load(cluster, SHORT_CIRCUIT, ["/ds/f3/s.bin", "/ds/f1/s.bin"], tmp_path)
    finally:
        os.killpg(master.process.pid, signal.SIGCONT)
    print(f"\nstopped master: first stat {first}, stats {stats}, opens {opens}")
    assert first["/ds/f0/s.bin"][0] == len(files["/ds/f0/s.bin"])
    assert {p: r[0] for p, r in stats.items()} == {p: len(files[p]) for p in stats}
    assert {p: r[0] for p, r in opens.items()} == {p: expected[p] for p in opens}
    # Each new process waits for the master's worker list once (STRATA_CLIENT_MASTER_QUICK_TIMEOUT,
    # 2 s; then it reads with the workers its host was told of), and a worker for the master to
    # say where a missed block is at most once in 5 s (1 s, worker/peers.py): no other wait on
    # the master, and none a folder (the first stat's listing waited 5 s).
    assert stats["/ds/f1/s.bin"][1] < 3.0 and opens["/ds/f3/s.bin"][1] < 4.0
    assert stats["/ds/f2/s.bin"][1] < 1.0 and opens["/ds/f1/s.bin"][1] < 1.0
