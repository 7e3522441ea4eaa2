"""Acknowledged writes are never lost: a store outage, a worker restart, a free, an unpin, a
full cache or a TTL never drop a write the writer was told succeeded; a write the writer was
told failed leaves nothing behind.

Real master and worker processes, moto's S3 server behind a StoreProxy that refuses
connections (the store is down) while the test says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from storeproxy import StoreProxy

from strata.contract.errors import StrataError, Unreachable
from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK_SIZE, TOKEN, Cluster, allow, metric, read_by_blocks, wait_until

# Seconds the store stays down while an ASYNC_THROUGH write waits (STRATA_OUTAGE_SECONDS makes
# it longer, to measure what an upload survives).
OUTAGE = float(os.environ.get("STRATA_OUTAGE_SECONDS", "12"))

pytestmark = pytest.mark.timeout(240 + OUTAGE)


def payload(n: int) -> bytes:
    return (os.urandom(min(n, 1 << 20)) * (n // (1 << 20) + 1))[:n]


@pytest.fixture
def proxy(s3: Any) -> Iterator[StoreProxy]:
    port = int(s3.endpoint_url.rsplit(":", 1)[1])
    p = StoreProxy(target_port=port)
    yield p
    p.stop()


def mount_via(cluster: Cluster, proxy: StoreProxy, path: str, bucket: str, **options: Any) -> None:
    """Mount a bucket that master and workers reach through the proxy."""
    store_options = {**cluster.s3.storage_options(), "endpoint_url": proxy.endpoint_url}
    cluster.fs().client.mount(path, f"s3://{bucket}", pb.MountOptions(options=store_options, **options))


def store_keys(cluster: Cluster, bucket: str) -> list[str]:
    return [o["Key"] for o in cluster.s3.client().list_objects_v2(Bucket=bucket).get("Contents", [])]


def cli(cluster: Cluster, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**cluster.env, "STRATA_MASTER": cluster.master_address, "STRATA_TOKEN": TOKEN}
    return subprocess.run([sys.executable, "-P", "-m", "strata.cacheserver", *args], env=env, input=input,
                          capture_output=True, timeout=120)


def staged(cluster: Cluster, worker: int = 0) -> list[Path]:
    folder = cluster.root / f"worker-{worker}" / "staging"
    return sorted(folder.glob("*.part")) if folder.is_dir() else []


def pending_metric(cluster: Cluster, server: str, name: str, mount: str = "/w") -> float:
    text = cluster.master.metrics() if server == "master" else cluster.workers[0].metrics()
    return metric(text, name, f'{{mount="{mount}"}}')


def test_an_async_write_survives_a_store_outage_and_a_worker_restart(start_cluster: Any, bucket: str,
                                                                    proxy: StoreProxy) -> None:
    cluster = start_cluster(workers=1)
    mount_via(cluster, proxy, "/w", bucket)
    fs = cluster.fs()
    data = payload(2 * BLOCK_SIZE + 123)
    with proxy.refusing():
        put = cli(cluster, "fs", "put", "--write-type", "ASYNC_THROUGH", "-", "/w/out/a.bin", input=data)
        # Accepted: staged durably on the worker and committed; the upload follows.
        assert put.returncode == 0, put.stderr.decode()
        acked = time.monotonic()
        info = fs.info("/w/out/a.bin")
        assert info["size"] == len(data) and not info["persisted"]
        assert fs.cat_file("/w/out/a.bin") == data
        # Well past the ~3 s after which the upload used to give up and delete its copy.
        time.sleep(OUTAGE)
        assert len(staged(cluster)) == 1, "the staged copy must stay while the store is down"
        report = cluster.fs().client.report()
        assert report.pending_uploads.count == 1 and report.pending_uploads.bytes == len(data)
        assert time.time() - report.pending_uploads.oldest_unix_ms / 1000 >= OUTAGE - 2
        [mount_report] = [m for m in report.mounts if m.mount.path == "/w"]
        assert mount_report.pending_uploads.count == 1
        text = cli(cluster, "report").stdout.decode()
        assert "pending uploads 1 (" in text, text
        assert pending_metric(cluster, "worker", "strata_worker_pending_uploads") == 1
        assert pending_metric(cluster, "worker", "strata_worker_pending_upload_bytes") == len(data)
        assert pending_metric(cluster, "master", "strata_mount_pending_upload_oldest_seconds") >= OUTAGE - 2

        # A worker killed during the outage keeps the acknowledged write.
        cluster.workers[0].stop(signal.SIGKILL)
        cluster.workers[0].start()
        cluster.workers[0].wait_healthy()
        assert len(staged(cluster)) == 1
        wait_until(lambda: cluster.fs().client.report().pending_uploads.count == 1, 10,
                   "the restarted worker to report its pending upload")
        assert not fs.info("/w/out/a.bin")["persisted"]
        assert "out/a.bin" not in store_keys(cluster, bucket)
        outage = time.monotonic() - acked
    recovered = time.monotonic()
    wait_until(lambda: fs.info("/w/out/a.bin")["persisted"], 30, "the upload after the store came back", interval=0.1)
    to_persisted = time.monotonic() - recovered
    print(f"outage survived {outage:.1f}s; persisted {to_persisted:.1f}s after the store came back")
    assert cluster.s3.get_object(bucket, "out/a.bin") == data
    assert not [k for k in store_keys(cluster, bucket) if k.startswith(".strata-uploads")]
    wait_until(lambda: not staged(cluster), 10, "the staged copy to be removed")
    wait_until(lambda: cluster.fs().client.report().pending_uploads.count == 0, 10, "no pending uploads")
    assert fs.cat_file("/w/out/a.bin") == data
    assert [e["name"] for e in fs.ls("/w/out")] == ["/w/out/a.bin"]


@pytest.mark.parametrize("write_type", ["THROUGH", "CACHE_THROUGH", "MUST_CACHE", "ASYNC_THROUGH"])
def test_a_write_while_the_store_is_down_is_acknowledged_as_promised_or_leaves_nothing(
        start_cluster: Any, bucket: str, proxy: StoreProxy, write_type: str) -> None:
    cluster = start_cluster(workers=1)
    mount_via(cluster, proxy, "/w", bucket)
    fs = cluster.fs(write_type=write_type)
    data = payload(BLOCK_SIZE + 5)
    with proxy.refusing():
        try:
            fs.pipe_file("/w/f.bin", data)
            failed = None
        except (StrataError, OSError) as exc:
            failed = exc
        if write_type in ("THROUGH", "CACHE_THROUGH"):
            assert failed is not None, f"{write_type} cannot be in the store at ack while the store is down"
            assert not fs.exists("/w/f.bin")
        else:
            assert failed is None, f"{write_type} needs no store to be acknowledged: {failed}"
            assert fs.cat_file("/w/f.bin") == data
    fresh = cluster.fs()
    if write_type in ("THROUGH", "CACHE_THROUGH"):
        assert not fresh.exists("/w/f.bin") and fresh.ls("/w") == []
        assert store_keys(cluster, bucket) == []
        assert not staged(cluster)
        return
    if write_type == "ASYNC_THROUGH":
        wait_until(lambda: fresh.info("/w/f.bin")["persisted"], 30, "the upload after the store came back")
        assert cluster.s3.get_object(bucket, "f.bin") == data
    else:
        assert not fresh.info("/w/f.bin")["persisted"] and "f.bin" not in store_keys(cluster, bucket)
    assert fresh.cat_file("/w/f.bin") == data
    assert [e["name"] for e in fresh.ls("/w")] == ["/w/f.bin"]


def test_rm_drops_a_pending_upload_and_a_newer_write_supersedes_one(start_cluster: Any, bucket: str,
                                                                    proxy: StoreProxy) -> None:
    cluster = start_cluster(workers=2)
    mount_via(cluster, proxy, "/w", bucket)
    old, new, newest = payload(BLOCK_SIZE + 1), payload(1000), payload(2000)
    cluster.fs(write_type="THROUGH").pipe_file("/w/removed.bin", b"an older copy in the store")
    async_fs = cluster.fs(host="node-0", write_type="ASYNC_THROUGH")  # through worker-0
    with proxy.refusing():
        for name in ("removed.bin", "replaced.bin", "through.bin"):
            async_fs.pipe_file(f"/w/{name}", old)
        cluster.fs(write_type="MUST_CACHE").pipe_file("/w/replaced.bin", new)
        # rm must also remove the store's older copy: while the store is down it fails,
        # and changes nothing.
        with pytest.raises(StrataError, match="could not be reached"):
            cluster.fs().rm("/w/removed.bin")
        assert cluster.fs().cat_file("/w/removed.bin") == old
        # worker-0, holding the pending uploads, stops; the store comes back meanwhile.
        os.killpg(cluster.workers[0].process.pid, signal.SIGSTOP)  # type: ignore[union-attr]
    try:
        cluster.wait_workers(1)
        cluster.fs().rm("/w/removed.bin")  # the only way to drop an acknowledged write
        cluster.fs(host="node-1", write_type="THROUGH").pipe_file("/w/through.bin", newest)
    finally:
        os.killpg(cluster.workers[0].process.pid, signal.SIGCONT)  # type: ignore[union-attr]
    cluster.wait_workers(2)
    wait_until(lambda: not staged(cluster, 0) and not staged(cluster, 1), 30, "the pending uploads to be dropped")
    wait_until(lambda: cluster.fs().client.report().pending_uploads.count == 0, 10, "no pending uploads")
    fs = cluster.fs()
    assert not fs.exists("/w/removed.bin")
    assert fs.cat_file("/w/replaced.bin") == new and not fs.info("/w/replaced.bin")["persisted"]
    assert fs.cat_file("/w/through.bin") == newest
    time.sleep(2)  # an upload that was wrongly still running would land now
    assert sorted(k for k in store_keys(cluster, bucket) if not k.startswith(".strata-uploads")) == ["through.bin"]
    assert cluster.s3.get_object(bucket, "through.bin") == newest
    assert sorted(e["name"] for e in fs.ls("/w")) == ["/w/replaced.bin", "/w/through.bin"]


def test_a_stopping_worker_uploads_the_writes_it_acknowledged_before_it_exits(start_cluster: Any, bucket: str,
                                                                              proxy: StoreProxy) -> None:
    # What a rolling update or a scale-in does: SIGTERM, the pod's grace period, then the
    # worker is gone (a scaled-in worker's staging folder may never be read again).
    cluster = start_cluster(workers=1)
    worker = cluster.workers[0]
    worker.stop()
    worker.env = {**worker.env, "STRATA_UPLOAD_DRAIN_TIMEOUT": "12"}
    worker.start()
    worker.wait_healthy()
    mount_via(cluster, proxy, "/w", bucket)
    data = payload(BLOCK_SIZE + 5)
    with proxy.slowed(0.3):  # each store call waits: the upload is under way at SIGTERM
        put = cli(cluster, "fs", "put", "--write-type", "ASYNC_THROUGH", "-", "/w/drained.bin", input=data)
        assert put.returncode == 0, put.stderr.decode()
        assert not cluster.fs().info("/w/drained.bin")["persisted"]
        worker.stop(signal.SIGTERM)
    assert staged(cluster) == []
    assert cluster.s3.get_object(bucket, "drained.bin") == data
    assert cluster.fs().info("/w/drained.bin")["persisted"]


def test_unpersisted_writes_stay_pinned_through_free_unpin_ttl_eviction_and_restart(start_cluster: Any, bucket: str,
                                                                                   proxy: StoreProxy) -> None:
    # One small tier: 8 blocks. Two written files take 4 of them; reading 40 MiB of other
    # data cycles the rest many times.
    cluster = start_cluster(workers=1, tiers=[{"medium": "SSD", "quota": f"{8 * BLOCK_SIZE}"}])
    mount_via(cluster, proxy, "/w", bucket, ttl_seconds=1.0)
    cluster.s3.create_bucket(f"{bucket}-other")
    cluster.mount_bucket("/other", f"{bucket}-other")  # straight to the store, not through the proxy
    for i in range(10):
        cluster.s3.put_object(f"{bucket}-other", f"big-{i}", payload(BLOCK_SIZE))
    fs = cluster.fs()
    must = payload(2 * BLOCK_SIZE)
    pending = payload(2 * BLOCK_SIZE - 7)
    with proxy.refusing():
        cluster.fs(write_type="MUST_CACHE").pipe_file("/w/must.bin", must)
        cluster.fs(write_type="ASYNC_THROUGH").pipe_file("/w/pending.bin", pending)
        fs.client.free("/w")
        fs.client.set_pinned("/w", True)
        fs.client.set_pinned("/w", False)
        for i in range(10):
            assert fs.cat_file(f"/other/big-{i}") == cluster.s3.get_object(f"{bucket}-other", f"big-{i}")
        time.sleep(2.5)  # past the mount's TTL, and at least one TTL sweep
        cluster.workers[0].stop()
        cluster.workers[0].start()
        cluster.workers[0].wait_healthy()
        assert fs.cat_file("/w/must.bin") == must
        assert fs.cat_file("/w/pending.bin") == pending
        assert fs.info("/w/must.bin")["cached_bytes"] == len(must)
    wait_until(lambda: fs.info("/w/pending.bin")["persisted"], 30, "the upload after the store came back")
    assert cluster.s3.get_object(bucket, "pending.bin") == pending
    # Persisted: its blocks are ordinary cache now and may go; the MUST_CACHE file's stay.
    fs.client.free("/w")
    wait_until(lambda: cluster.fs().info("/w/pending.bin")["cached_bytes"] == 0, 10, "the persisted file's blocks to be freed")
    assert cluster.fs().info("/w/must.bin")["cached_bytes"] == len(must)
    assert fs.cat_file("/w/must.bin") == must


def mem_dir(cluster: Cluster, worker: int = 0) -> Path:
    """The MEM tier folder conftest.make_worker gives a worker."""
    return Path(f"/dev/shm/strata-it-{os.getpid()}-{cluster.root.name}-worker-{worker}")


def restart_worker(cluster: Cluster, sig: int, *, wipe: tuple[Path, ...] = ()) -> None:
    """Stop worker 0 with `sig`, empty the folders `wipe` (what a new pod finds of an
    emptyDir), start it again and wait until it registered."""
    cluster.workers[0].stop(sig)
    for folder in wipe:
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    cluster.workers[0].start()
    cluster.workers[0].wait_healthy()
    cluster.wait_workers(1)


@pytest.mark.parametrize("write_type", ["MUST_CACHE", "ASYNC_THROUGH"])
def test_a_written_files_only_copy_is_on_the_disk_tier_and_outlives_the_loss_of_the_memory_tier(
        start_cluster: Any, bucket: str, proxy: StoreProxy, write_type: str) -> None:
    # A worker with MEM and SSD tiers (conftest's), like a CacheCluster with both: a new pod
    # of the worker finds its MEM emptyDir empty, its SSD hostPath as it was. The written
    # blocks are the file's only copy (ASYNC_THROUGH: with the store down, not uploaded).
    cluster = start_cluster(workers=1)
    mount_via(cluster, proxy, "/w", bucket)
    data = payload(2 * BLOCK_SIZE + 5)
    with proxy.refusing():
        cluster.fs(write_type=write_type).pipe_file("/w/only-here.bin", data)
        ssd = cluster.root / "worker-0" / "ssd"
        assert len(list(ssd.glob("*.blk"))) == 3 and not list(mem_dir(cluster).glob("*.blk"))
        restart_worker(cluster, signal.SIGKILL, wipe=(mem_dir(cluster),))
        fs = cluster.fs()
        assert fs.info("/w/only-here.bin")["cached_bytes"] == len(data)
        assert fs.cat_file("/w/only-here.bin") == data


def test_a_must_cache_write_in_memory_alone_outlives_worker_restarts(start_cluster: Any, bucket: str) -> None:
    # With MEM alone the written blocks stay there: the worker's MEM folder is named after
    # the worker (not its process), kept at its exit and found by the next process.
    cluster = start_cluster(workers=1, tiers=[{"medium": "MEM", "quota": "64Mi", "dirs": [
        f"/dev/shm/strata-it-{os.getpid()}-memonly-worker-0"]}])
    cluster.mount_bucket("/w", bucket)
    data = payload(2 * BLOCK_SIZE + 5)
    cluster.fs(write_type="MUST_CACHE").pipe_file("/w/must.bin", data)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        restart_worker(cluster, sig)
        assert cluster.fs().cat_file("/w/must.bin") == data


def test_rename_of_an_unpersisted_file_is_refused_and_keeps_it(start_cluster: Any, bucket: str) -> None:
    cluster = start_cluster(workers=1)
    cluster.mount_bucket("/w", bucket)
    fs = cluster.fs(write_type="MUST_CACHE")
    data = payload(BLOCK_SIZE + 3)
    fs.pipe_file("/w/d/only-here.bin", data)
    with pytest.raises(StrataError, match="/w/d/only-here.bin is not in the store yet"):
        fs.client.mv("/w/d", "/w/e")
    assert fs.cat_file("/w/d/only-here.bin") == data


def test_free_and_unpin_leave_a_must_cache_file_whole(start_cluster: Any, bucket: str) -> None:
    # MUST_CACHE data lives only in the cache: `fs free` and `fs unpin` must not drop it.
    cluster = start_cluster(workers=2)
    cluster.mount_bucket("/w", bucket)
    fs = cluster.fs(write_type="MUST_CACHE")
    data = payload(3 * BLOCK_SIZE + 9)
    fs.pipe_file("/w/only-here.bin", data)
    fs.client.free("/w")
    fs.client.set_pinned("/w", True)
    fs.client.set_pinned("/w", False)
    assert cluster.fs().cat_file("/w/only-here.bin") == data


def test_a_failed_overwrite_leaves_the_pending_file_as_it_was(start_cluster: Any, bucket: str, proxy: StoreProxy) -> None:
    cluster = start_cluster(workers=1)
    mount_via(cluster, proxy, "/w", bucket)
    first = payload(BLOCK_SIZE + 77)
    with proxy.refusing():
        cluster.fs(write_type="ASYNC_THROUGH").pipe_file("/w/f.bin", first)
        with pytest.raises(StrataError):
            cluster.fs(write_type="THROUGH").pipe_file("/w/f.bin", b"this overwrite cannot reach the store")
        assert cluster.fs().cat_file("/w/f.bin") == first
    wait_until(lambda: cluster.fs().info("/w/f.bin")["persisted"], 30, "the first write's upload")
    assert cluster.s3.get_object(bucket, "f.bin") == first
    assert cluster.fs().cat_file("/w/f.bin") == first


@pytest.mark.parametrize("write_type", ["THROUGH", "CACHE_THROUGH"])
def test_a_write_commits_the_version_it_put_into_the_store_not_a_later_one(start_cluster: Any, bucket: str,
                                                                           proxy: StoreProxy, write_type: str) -> None:
    # Another writer replaces the object between this write's upload and the worker's next
    # look at the store (here one writing to the store directly; a second Strata writer does
    # the same). Strata must serve the store's bytes, never this write's under the other's
    # version.
    cluster = start_cluster(workers=1)
    mount_via(cluster, proxy, "/w", bucket)
    ours, theirs = payload(BLOCK_SIZE + 10), payload(BLOCK_SIZE + 4000)
    failed: list[BaseException] = []

    def write() -> None:
        try:
            cluster.fs(write_type=write_type).pipe_file("/w/f.bin", ours)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failed.append(exc)

    # Status lookups wait: a worker that looks at the store after its upload does so after
    # theirs landed (one that takes the version from the upload's answer has committed).
    with proxy.holding(b"HEAD "):
        writer = threading.Thread(target=write)
        writer.start()
        wait_until(lambda: proxy.holds or not writer.is_alive(), 30, "the write's upload to land")
        assert cluster.s3.get_object(bucket, "f.bin") == ours
        cluster.s3.put_object(bucket, "f.bin", theirs)
    writer.join(timeout=60)
    assert not writer.is_alive() and not failed, failed
    fs = cluster.fs()
    assert cluster.s3.get_object(bucket, "f.bin") == theirs
    assert fs.cat_file("/w/f.bin") == theirs
    assert read_by_blocks(fs.client, "/w/f.bin") == theirs


def test_concurrent_appends_keep_every_acknowledged_append(start_cluster: Any, bucket: str) -> None:
    # Four writers append to one file through two workers. Each append reads the file and
    # writes it whole again with its bytes added: two that overlapped kept only one's bytes,
    # both acknowledged.
    cluster = start_cluster(workers=2)
    cluster.mount_bucket("/w", bucket)
    acknowledged: list[str] = []
    failed: list[BaseException] = []

    def appender(writer: int) -> None:
        fs = cluster.fs(host=f"node-{writer % 2}")
        for k in range(5):
            try:
                with fs.open("/w/log.txt", "ab") as f:
                    f.write(f"{writer}-{k}\n".encode())
                acknowledged.append(f"{writer}-{k}")
            except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
                failed.append(exc)

    writers = [threading.Thread(target=appender, args=(i,)) for i in range(4)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join(timeout=120)
    lines = cluster.fs().cat_file("/w/log.txt").decode().split()
    assert not set(acknowledged) - set(lines), f"acknowledged appends lost: {sorted(set(acknowledged) - set(lines))}"
    assert not failed, failed
    assert sorted(lines) == sorted(f"{i}-{k}" for i in range(4) for k in range(5))
    for writer in range(4):  # each writer's appends in the order it made them
        assert [line for line in lines if line.startswith(f"{writer}-")] == [f"{writer}-{k}" for k in range(5)]
    assert cluster.s3.get_object(bucket, "log.txt").decode().split() == lines


def test_an_append_cut_by_a_worker_restart_holds_back_no_later_write(start_cluster: Any, bucket: str,
                                                                    proxy: StoreProxy) -> None:
    # An append holds back the other writes of its file until it ends; one whose worker was
    # killed ends when that worker starts again (not when its lease runs out, minutes later).
    cluster = start_cluster(workers=1)
    mount_via(cluster, proxy, "/w", bucket)
    cluster.fs(write_type="THROUGH").pipe_file("/w/log.txt", b"first\n")
    failed: list[BaseException] = []

    def append() -> None:
        try:
            with cluster.fs(write_type="THROUGH").open("/w/log.txt", "ab") as f:
                f.write(b"cut\n")
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failed.append(exc)

    with proxy.holding(b"PUT "):  # the append's upload waits: its worker is killed meanwhile
        writer = threading.Thread(target=append)
        writer.start()
        wait_until(lambda: proxy.holds, 30, "the append's upload")
        cluster.workers[0].stop(signal.SIGKILL)
        writer.join(timeout=30)
        assert failed, "the append's worker was killed before the append reached the store"
    cluster.workers[0].start()
    cluster.workers[0].wait_healthy()
    cluster.wait_workers(1)
    with cluster.fs(write_type="THROUGH").open("/w/log.txt", "ab") as f:
        f.write(b"second\n")
    assert cluster.fs().cat_file("/w/log.txt") == b"first\nsecond\n"


def writer_thread(write: Any) -> tuple[threading.Thread, list[BaseException]]:
    """`write()` in a started thread; what it raised lands in the list."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            write()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, failed


@pytest.mark.parametrize("write_type", ["THROUGH", "CACHE_THROUGH"])
@pytest.mark.parametrize("other_writer", [True, False])
def test_a_failed_write_never_removes_another_writers_acknowledged_object(start_cluster: Any, bucket: str,
                                                                        proxy: StoreProxy, write_type: str,
                                                                        other_writer: bool,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Ours lands in the store; before its worker hears so, theirs (a second writer of the
    # path) lands and is acknowledged; then the master goes away, so ours cannot be committed
    # and its worker undoes it. What it may undo is its own object (alone, it does), never theirs.
    monkeypatch.setenv("STRATA_STORE_READ_TIMEOUT", "60")  # the held answer is not given up on
    monkeypatch.setenv("STRATA_WORKER_MASTER_WAIT", "2")  # ours fails 2 s after the master left, not 15
    cluster = start_cluster(workers=1)
    mount_via(cluster, proxy, "/w", bucket)
    ours, theirs = payload(200_000), payload(300_000)
    with proxy.holding_answer(b"PUT "):
        writer, failed = writer_thread(lambda: cluster.fs(write_type=write_type).pipe_file("/w/f.bin", ours))
        wait_until(lambda: proxy.answers_held, 30, "our upload to reach the store")
        wait_until(lambda: store_keys(cluster, bucket) == ["f.bin"], 10, "our object in the store")
        assert cluster.s3.get_object(bucket, "f.bin") == ours
        if other_writer:
            cluster.fs(write_type=write_type).pipe_file("/w/f.bin", theirs)  # acknowledged
            assert cluster.s3.get_object(bucket, "f.bin") == theirs
        cluster.master.stop()
    writer.join(timeout=60)
    assert not writer.is_alive() and failed, "our write cannot be committed without a master"
    cluster.master.start()
    cluster.master.wait_healthy()
    cluster.wait_workers(1)
    fs = cluster.fs()
    if not other_writer:
        assert store_keys(cluster, bucket) == [] and fs.ls("/w") == []
        return
    assert cluster.s3.get_object(bucket, "f.bin") == theirs
    assert fs.cat_file("/w/f.bin") == theirs
    assert read_by_blocks(fs.client, "/w/f.bin") == theirs


def test_an_older_upload_moved_into_place_after_a_master_restart_never_replaces_a_newer_write(
        start_cluster: Any, bucket: str, proxy: StoreProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    # An ASYNC_THROUGH write waits for its upload; a THROUGH write of the same file is under
    # way (its object in the store, not yet committed) when the master restarts, forgetting
    # that write; the older upload is then moved into place over the newer object. The newer
    # write must not be acknowledged with the older bytes in the store.
    monkeypatch.setenv("STRATA_STORE_READ_TIMEOUT", "60")  # the held answer is not given up on
    cluster = start_cluster(workers=2)
    mount_via(cluster, proxy, "/w", bucket)
    older, newer = payload(200_000), payload(300_000)
    with proxy.refusing():
        cluster.fs(host="node-0", write_type="ASYNC_THROUGH").pipe_file("/w/f.bin", older)  # through worker-0
    uploader = cluster.workers[0].process
    assert uploader is not None
    os.killpg(uploader.pid, signal.SIGSTOP)  # its upload waits
    try:
        with proxy.holding_answer(b"PUT "):
            writer, failed = writer_thread(
                lambda: cluster.fs(host="node-1", write_type="THROUGH").pipe_file("/w/f.bin", newer))
            wait_until(lambda: proxy.answers_held, 30, "the newer write's upload to reach the store")
            wait_until(lambda: "f.bin" in store_keys(cluster, bucket), 10, "the newer object in the store")
            assert cluster.s3.get_object(bucket, "f.bin") == newer
            cluster.master.stop()
            cluster.master.start()
            cluster.master.wait_healthy()
            os.killpg(uploader.pid, signal.SIGCONT)
            wait_until(lambda: cluster.s3.get_object(bucket, "f.bin") == older, 60, "the older upload to land")
            wait_until(lambda: cluster.fs().info("/w/f.bin")["persisted"], 30, "the older upload to be recorded")
            cluster.wait_workers(2)  # the newer write's worker talks to the new master
    finally:
        os.killpg(uploader.pid, signal.SIGCONT)
    writer.join(timeout=60)
    assert not writer.is_alive()
    fs = cluster.fs()
    assert failed, "the newer write was acknowledged, but the store holds the older bytes"
    assert "while this write was under way" in str(failed[0]), failed[0]
    assert cluster.s3.get_object(bucket, "f.bin") == older
    assert fs.cat_file("/w/f.bin") == older
    assert read_by_blocks(fs.client, "/w/f.bin") == older


def test_a_mount_whose_credentials_cannot_be_opened_keeps_its_unpersisted_writes(start_cluster: Any, bucket: str,
                                                                                proxy: StoreProxy) -> None:
    # The cluster's internal token changes (a recreated auth Secret): the master cannot open
    # the credentials it sealed with the old one. A configuration error must not lose the
    # mount's acknowledged writes that are not in the store yet.
    cluster = start_cluster(workers=1)
    s3_options = cluster.s3.storage_options()
    credentials = {"key": s3_options.pop("key"), "secret": s3_options.pop("secret")}
    options = pb.MountOptions(options={**s3_options, "endpoint_url": proxy.endpoint_url}, credentials=credentials)
    cluster.fs().client.mount("/w", f"s3://{bucket}", options)
    must, pending = payload(BLOCK_SIZE + 11), payload(300_000)
    with proxy.refusing():
        cluster.fs(write_type="MUST_CACHE").pipe_file("/w/must.bin", must)
        cluster.fs(write_type="ASYNC_THROUGH").pipe_file("/w/pending.bin", pending)
        for server in [*cluster.workers, cluster.master]:
            server.stop()
        for server in [cluster.master, *cluster.workers]:
            server.env = {**server.env, "STRATA_INTERNAL_TOKEN": "another-internal-token"}
            server.start()
            server.wait_healthy()
    cluster.wait_workers(1)
    asked = proxy.connections
    fs = cluster.fs()
    for call in (lambda: fs.info("/w/must.bin"), lambda: fs.cat_file("/w/pending.bin"), lambda: fs.ls("/w")):
        with pytest.raises(StrataError, match=r"mount /w .*cannot be opened with this cluster key"):
            call()
    listed = cli(cluster, "mount", "ls")
    assert listed.returncode == 0 and "cannot be opened" in listed.stdout.decode(), listed
    [mounted] = [m for m in fs.client.report().mounts if m.mount.path == "/w"]
    assert "cannot be opened" in mounted.mount.unusable
    time.sleep(3)  # several tries of the upload: it waits, keeps its copy, uses no other credentials
    assert len(staged(cluster)) == 1 and store_keys(cluster, bucket) == []
    assert proxy.connections == asked, "the store was asked with credentials the mount does not hold"
    # Its owner mounts it again with its credentials: the same data, so the same mount id.
    fs.client.mount("/w", f"s3://{bucket}", options, replace=True)
    assert fs.cat_file("/w/must.bin") == must
    wait_until(lambda: fs.info("/w/pending.bin")["persisted"], 30, "the upload once the mount is usable")
    assert cluster.s3.get_object(bucket, "pending.bin") == pending
    assert fs.cat_file("/w/pending.bin") == pending


def restart_allowing(cluster: Cluster, *roots: Path) -> None:
    """Restart master and workers with localSources.allowedRoots `roots` (the owner changed
    spec.localSources of the CacheCluster)."""
    for server in [*cluster.workers, cluster.master]:
        server.stop()
    for server in [cluster.master, *cluster.workers]:
        config = Path(server.args[server.args.index("--config") + 1])
        settings = yaml.safe_load(config.read_text())
        settings["localSources"] = {"allowedRoots": [str(r) for r in roots]}
        config.write_text(yaml.safe_dump(settings))
        server.start()
        server.wait_healthy()
    cluster.wait_workers(len(cluster.workers))


def test_a_file_mount_no_longer_allowed_is_kept_unusable_with_its_unpersisted_writes(
        start_cluster: Any, tmp_path: Path) -> None:
    # The cluster's owner narrows localSources.allowedRoots: the journaled file:// mount it no
    # longer covers must not be read or written, and must not take its acknowledged writes
    # that are not in the store yet with it.
    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    store.mkdir()
    elsewhere.mkdir()
    cluster = start_cluster(workers=1, **allow(store))
    cluster.fs().client.mount("/w", f"file://{store}")
    (store / ".strata-uploads").write_bytes(b"")  # a file where the upload folder goes: uploads wait
    must, pending = payload(BLOCK_SIZE + 11), payload(300_000)
    cluster.fs(write_type="MUST_CACHE").pipe_file("/w/must.bin", must)
    cluster.fs(write_type="ASYNC_THROUGH").pipe_file("/w/pending.bin", pending)
    restart_allowing(cluster, elsewhere)
    fs = cluster.fs()
    for call in (lambda: fs.info("/w/must.bin"), lambda: fs.cat_file("/w/pending.bin"), lambda: fs.ls("/w")):
        with pytest.raises(StrataError, match=r"mount /w .*not under a folder this cluster allows"):
            call()
    listed = cli(cluster, "mount", "ls").stdout.decode()
    assert "UNUSABLE" in listed and "files not in the store yet are kept" in listed, listed
    (store / ".strata-uploads").unlink()
    time.sleep(2)  # several tries of the upload: nothing is written under a folder no longer allowed
    assert sorted(p.name for p in store.iterdir()) == [] and len(staged(cluster)) == 1
    restart_allowing(cluster, store)
    assert fs.cat_file("/w/must.bin") == must
    wait_until(lambda: fs.info("/w/pending.bin")["persisted"], 30, "the upload once the folder is allowed again")
    assert (store / "pending.bin").read_bytes() == pending and fs.cat_file("/w/pending.bin") == pending
    cli(cluster, "mount", "rm", "/w")  # its owner unmounts it: gone, with what was not in the store
    assert "/w" not in cli(cluster, "mount", "ls").stdout.decode()


def read_once_reachable(cluster: Cluster, path: str) -> bytes:
    """The bytes of `path`, read by a new client once it reaches the master (a client's
    connection to it may still be in its reconnect back-off, up to a second)."""

    def attempt() -> bytes | None:
        try:
            return bytes(cluster.fs().cat_file(path))
        except Unreachable:
            return None

    read: bytes = wait_until(attempt, 10, "a client to reach the master again")
    return read


def test_a_write_while_the_master_restarts_waits_for_it_for_a_bounded_time(
        start_cluster: Any, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Right after a master restart the worker's channel to it is in reconnect back-off: its
    # write-path calls failed at once ("Connection refused"). They wait for the master, up
    # to STRATA_WORKER_MASTER_WAIT, then fail naming it.
    monkeypatch.setenv("STRATA_WORKER_MASTER_WAIT", "6")
    cluster = start_cluster(workers=1)
    cluster.mount_bucket("/w", bucket)
    writers = {write_type: cluster.fs(write_type=write_type) for write_type in ("CACHE_THROUGH", "MUST_CACHE")}
    for writer in writers.values():  # the worker knows the mount, the clients the worker
        writer.pipe_file("/w/before.bin", b"before")
    data = payload(300_000)
    for write_type, writer in writers.items():
        cluster.master.stop()
        back = threading.Timer(1.5, cluster.master.start)
        back.start()
        try:
            writer.pipe_file(f"/w/{write_type}.bin", data)
        finally:
            back.join()
        cluster.master.wait_healthy()
        assert read_once_reachable(cluster, f"/w/{write_type}.bin") == data
    fs = writers["CACHE_THROUGH"]
    cluster.master.stop()
    started = time.monotonic()
    with pytest.raises(StrataError) as failed:
        fs.pipe_file("/w/never.bin", data)
    waited = time.monotonic() - started
    assert f"the master at {cluster.master_address}" in str(failed.value), failed.value
    assert "STRATA_WORKER_MASTER_WAIT" in str(failed.value), failed.value
    assert waited < 60, f"the write waited {waited:.0f}s for an absent master"


def test_what_an_upload_killed_mid_write_left_in_a_file_store_is_cleaned_at_the_next_master_start(
        start_cluster: Any, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    cluster = start_cluster(workers=1, **allow(tmp_path))
    cluster.fs().client.mount("/w", f"file://{store}")
    uploads = store / ".strata-uploads"
    writer, failed = writer_thread(lambda: cluster.fs(write_type="THROUGH").pipe_file("/w/big.bin", payload(512 << 20)))
    wait_until(lambda: list(uploads.glob(".*.tmp")) if uploads.is_dir() else [], 60,
               "the upload's temporary file", interval=0.001)
    cluster.workers[0].stop(signal.SIGKILL)
    writer.join(timeout=60)
    assert failed and not writer.is_alive()
    [left] = uploads.glob(".*.tmp")
    hour_ago = time.time() - 3601
    os.utime(left, (hour_ago, hour_ago))  # as if the master started an hour later
    cluster.master.stop()
    cluster.master.start()
    cluster.master.wait_healthy()
    wait_until(lambda: not left.exists(), 10, "the dead upload's file to be removed")
    assert sorted(p.name for p in store.rglob("*")) == [".strata-uploads"]
