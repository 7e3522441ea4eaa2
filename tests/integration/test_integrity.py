"""Wrong bytes are impossible: real master and workers, a real S3 server, real block files.

A changed block size, a damaged block file read by short-circuit, a request that names a
block with a made-up geometry or pushes bytes of its own, a disk smaller than the tier's
quota: in each case a reader gets the store's bytes (or a clear error), never other bytes.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from tinydisk import tiny_disk

from strata.cacheserver.common.blockwire import request_line
from strata.contract import rpc
from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK_SIZE, INTERNAL_TOKEN, TOKEN, Cluster, metric, read_by_blocks, start_servers, stop_servers
from .test_data_port import exchange

pytestmark = pytest.mark.timeout(240)

MiB = 1 << 20


def payload(n: int, seed: int = 0) -> bytes:
    """Bytes that differ in every MiB (so a block served at the wrong offset shows)."""
    rng = os.urandom(MiB)
    return b"".join(bytes([i % 251]) + rng[1:] for i in range(seed, seed + n // MiB + 1))[:n]


def ssd_tier(directory: Path, quota: str = "256Mi") -> list[dict[str, Any]]:
    return [{"medium": "SSD", "quota": quota, "dirs": [str(directory)]}]


def block_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.blk"))


def restart_with_block_size(cluster: Cluster, size: str) -> None:
    """Stop the cluster, set the block size in every server's config, start it again."""
    stop_servers([*cluster.workers, cluster.master])
    for config in [cluster.root / "master.yaml", *(cluster.root / f"{w.name}.yaml" for w in cluster.workers)]:
        settings = yaml.safe_load(config.read_text())
        settings["blockSize"] = size
        config.write_text(yaml.safe_dump(settings))
    start_servers([cluster.master, *cluster.workers])
    cluster.wait_workers(len(cluster.workers))


def flip_middle_bytes(files: list[Path]) -> None:
    for path in files:
        with open(path, "r+b") as f:
            f.seek(path.stat().st_size // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))


def data_port(worker: pb.WorkerInfo) -> tuple[str, int]:
    return worker.address.rsplit(":", 1)[0], worker.data_port


# -- item 1: block geometry -------------------------------------------------------------------


def test_a_block_size_change_serves_the_store_s_bytes(start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    ssd = tmp_path / "ssd"
    cluster = start_cluster(workers=1, tiers=ssd_tier(ssd))
    restart_with_block_size(cluster, "16Mi")
    data = payload(40 * MiB)
    cluster.s3.put_object(bucket, "f.bin", data)
    cluster.mount_bucket("/d", bucket)
    written = payload(20 * MiB, seed=7)
    cluster.fs(write_type="MUST_CACHE").pipe_file("/d/written.bin", written)  # only copy: in the cache
    assert cluster.fs(host="elsewhere").cat_file("/d/f.bin") == data  # 16 + 16 + 8 MiB cached
    assert len(block_files(ssd)) == 3 + 2

    restart_with_block_size(cluster, "8Mi")
    # The store file's blocks of 16 MiB are gone; the written file's stay (it keeps its size).
    assert len(block_files(ssd)) == 2
    fs = cluster.fs(host="elsewhere")
    assert fs.info("/d/f.bin")["block_size"] == 8 * MiB
    assert fs.info("/d/written.bin")["block_size"] == 16 * MiB
    assert fs.cat_file("/d/f.bin") == data
    assert fs.cat_file("/d/f.bin", 16 * MiB, 24 * MiB) == data[16 * MiB:24 * MiB]
    assert fs.cat_file("/d/written.bin") == written
    local = cluster.fs(host="node-0")  # short-circuit reads too
    assert local.cat_file("/d/f.bin") == data and local.cat_file("/d/written.bin") == written


# -- item 2: short-circuit reads verify checksums --------------------------------------------


def test_short_circuit_reads_never_return_damaged_bytes(start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    ssd = tmp_path / "ssd"
    cluster = start_cluster(workers=1, tiers=ssd_tier(ssd))
    data = payload(3 * BLOCK_SIZE + 5)
    cluster.s3.put_object(bucket, "sc.bin", data)
    cluster.mount_bucket("/sc", bucket)
    local = cluster.fs(host="node-0")  # worker-0's host: block files by descriptor
    assert local.cat_file("/sc/sc.bin") == data
    files = block_files(ssd)
    assert len(files) == 4
    fetched = cluster.worker_metric(0, "strata_worker_ufs_bytes_read")

    flip_middle_bytes(files)  # whole blocks, mapped
    assert local.cat_file("/sc/sc.bin") == data
    middle = BLOCK_SIZE + BLOCK_SIZE // 2
    flip_middle_bytes(block_files(ssd))  # a small read inside a block
    assert local.cat_file("/sc/sc.bin", middle - 100, middle + 100) == data[middle - 100:middle + 100]
    shortened = block_files(ssd)[0]  # a block file cut short under the worker
    with open(shortened, "r+b") as f:
        f.truncate(shortened.stat().st_size // 2)
    assert local.cat_file("/sc/sc.bin") == data

    metrics = cluster.workers[0].metrics()
    assert metric(metrics, "strata_worker_short_circuit_reads") >= 9
    assert metric(metrics, "strata_worker_data_port_reads") == 0  # none fell back to the network
    assert metric(metrics, "strata_worker_short_circuit_rechecks") >= 5
    assert metric(metrics, "strata_worker_corrupt_blocks") >= 5
    # Each damaged block was fetched again, once.
    assert cluster.worker_metric(0, "strata_worker_ufs_bytes_read") - fetched >= len(data)


def test_remote_reads_never_return_bytes_damaged_on_the_workers_disk(
        start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    # Whole blocks go out with the checksums made when they were cached, and the reader
    # checks them; a range inside a block is checked by the worker before it is sent.
    ssd = tmp_path / "ssd"
    cluster = start_cluster(workers=1, tiers=ssd_tier(ssd))
    data = payload(3 * BLOCK_SIZE + 5)
    cluster.s3.put_object(bucket, "dp.bin", data)
    cluster.mount_bucket("/dp", bucket)
    remote = cluster.fs(host="elsewhere")  # no worker on this host: the data port
    assert remote.cat_file("/dp/dp.bin") == data
    fetched = cluster.worker_metric(0, "strata_worker_ufs_bytes_read")

    flip_middle_bytes(block_files(ssd))
    assert remote.cat_file("/dp/dp.bin") == data
    assert cluster.worker_metric(0, "strata_worker_corrupt_blocks") == 4
    middle = BLOCK_SIZE + BLOCK_SIZE // 2
    flip_middle_bytes(block_files(ssd))
    assert remote.cat_file("/dp/dp.bin", middle - 100, middle + 100) == data[middle - 100:middle + 100]
    assert cluster.worker_metric(0, "strata_worker_corrupt_blocks") == 5
    # Each damaged block was fetched again, once.
    assert cluster.worker_metric(0, "strata_worker_ufs_bytes_read") - fetched == len(data) + BLOCK_SIZE
    assert cluster.worker_metric(0, "strata_worker_short_circuit_reads") == 0


# -- item 3: no request puts bytes into the cache ---------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def test_no_call_takes_block_bytes(start_cluster: Any, bucket: str) -> None:
    cluster = start_cluster(workers=1)
    data = payload(BLOCK_SIZE)
    cluster.s3.put_object(bucket, "p.bin", data)
    cluster.mount_bucket("/p", bucket)
    client = cluster.fs(host="elsewhere").client
    ref = client.block_ref(client.stat("/p/p.bin"), 0)
    worker = client.workers()[0]
    # PutBlock(stream PutBlockChunk{block = 1, data = 3}) as it was on the wire.
    chunk = _field(1, ref.SerializeToString()) + _field(3, b"X" * BLOCK_SIZE)
    channel = rpc.sync_channel(worker.address, INTERNAL_TOKEN)  # not even the servers' own credential
    try:
        put = channel.stream_unary("/strata.v1.Worker/PutBlock")
        with pytest.raises(grpc.RpcError) as refused:
            put(iter([chunk]), timeout=30)
        # No such method: the role table opens it to nobody (and no handler would take it).
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "not open to any caller" in (refused.value.details() or "")
    finally:
        channel.close()
    assert cluster.fs(host="elsewhere").cat_file("/p/p.bin") == data


def test_a_request_with_a_made_up_geometry_caches_nothing_readers_get(start_cluster: Any, bucket: str) -> None:
    cluster = start_cluster(workers=1)
    data = payload(2 * BLOCK_SIZE + BLOCK_SIZE // 2)  # blocks of 4, 4 and 2 MiB
    cluster.s3.put_object(bucket, "g.bin", data)
    cluster.mount_bucket("/g", bucket)
    client = cluster.fs(host="elsewhere").client
    info = client.stat("/g/g.bin")
    address = data_port(client.workers()[0])
    forged = []
    # Block 2 "of 2 MiB blocks" is bytes 4-6 MiB, as long as the real (last) block 2.
    halved = client.block_ref(info, 2)
    halved.block_size = BLOCK_SIZE // 2
    forged.append((halved, "block size"))
    stale = client.block_ref(info, 2)
    stale.version = "an-old-version"
    forged.append((stale, "version"))
    longer = client.block_ref(info, 1)
    longer.file_length = 2 * BLOCK_SIZE  # block 1 "is the last one"
    forged.append((longer, "length"))
    for ref, named in forged:
        reply, _ = exchange(address, request_line(TOKEN, ref, pb.CACHE))
        assert reply["ok"] is False and reply["code"] == "FAILED_PRECONDITION", reply
        assert named in reply["message"] and "open it again" in reply["message"], reply
    assert read_by_blocks(client, "/g/g.bin") == data
    assert cluster.fs(host="elsewhere").cat_file("/g/g.bin") == data


def test_a_worker_that_does_not_hold_a_written_file_never_fetches_it_from_the_store(
    start_cluster: Any, bucket: str
) -> None:
    cluster = start_cluster(workers=2)
    old = payload(BLOCK_SIZE, seed=1)
    cluster.s3.put_object(bucket, "m.bin", old)  # what the store held before
    cluster.mount_bucket("/m", bucket)
    new = payload(BLOCK_SIZE, seed=2)
    cluster.fs(host="node-0", write_type="MUST_CACHE").pipe_file("/m/m.bin", new)  # held by worker-0 only
    client = cluster.fs(host="elsewhere").client
    info = client.stat("/m/m.bin")
    assert not info.persisted
    other = next(w for w in client.workers() if w.worker_id == "worker-1")
    ref = client.block_ref(info, 0)
    ref.in_store = True  # a lie: the store has other bytes at that path
    for in_store in (True, False):  # True: a lie, the store has other bytes at that path
        ref.in_store = in_store
        reply, body = exchange(data_port(other), request_line(TOKEN, ref, pb.CACHE))
        # Refused while the master does not know worker-0 holds the block yet; copied from
        # worker-0 once it does: never the store's old bytes.
        refused = reply.get("code") == "FAILED_PRECONDITION" and "not in the store yet" in reply["message"]
        assert refused or (reply["ok"] and body == new), (in_store, reply)
    assert metric(cluster.workers[1].metrics(), "strata_worker_ufs_bytes_read") == 0, "worker-1 read the store"
    assert cluster.fs(host="elsewhere").cat_file("/m/m.bin") == new


# -- item 14: a disk smaller than the quota -----------------------------------------------------


def test_a_tier_on_a_small_disk_evicts_and_fetches_each_block_once(start_cluster: Any, bucket: str) -> None:
    with tiny_disk("64m") as disk:
        cluster = start_cluster(workers=1, tiers=ssd_tier(disk / "ssd", quota="1Gi"))
        try:
            data = payload(24 * BLOCK_SIZE)  # 96 MiB through a 64 MiB disk
            cluster.s3.put_object(bucket, "big.bin", data)
            cluster.mount_bucket("/big", bucket)
            fs = cluster.fs(host="elsewhere")
            assert fs.cat_file("/big/big.bin") == data
            metrics = cluster.workers[0].metrics()
            assert metric(metrics, "strata_worker_ufs_bytes_read") == len(data)  # each block once
            capacity = metric(metrics, "strata_worker_tier_capacity_bytes", '{medium="SSD"}')
            used = metric(metrics, "strata_worker_tier_used_bytes", '{medium="SSD"}')
            assert 0 < used <= capacity <= 64 * MiB
            assert "less than the tier's quota of 1GiB" in cluster.workers[0].log.read_text()
            tail = data[-4 * BLOCK_SIZE:]
            assert fs.cat_file("/big/big.bin", len(data) - len(tail)) == tail  # the last blocks: cached
            assert metric(cluster.workers[0].metrics(), "strata_worker_ufs_bytes_read") == len(data)
            report = fs.client.report()
            assert report.capacity <= 64 * MiB
        finally:
            cluster.stop()  # before the disk goes


def test_a_block_file_damaged_after_a_short_circuit_reader_took_it_is_never_returned(
        start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    # A reader takes whole blocks by descriptor and reads ahead: the bytes it returns later
    # from a block it holds must be the ones it checked, whatever the file holds by then.
    ssd = tmp_path / "ssd"
    cluster = start_cluster(workers=1, tiers=ssd_tier(ssd))
    data = payload(3 * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "held.bin", data)
    cluster.mount_bucket("/h", bucket)
    local = cluster.fs(host="node-0", readahead=2)  # worker-0's host: block files by descriptor
    assert local.cat_file("/h/held.bin") == data  # cached
    with local.open("/h/held.bin", "rb") as f:
        assert f.read(MiB) == data[:MiB]  # block 0 taken, blocks 1 and 2 read ahead
        flip_middle_bytes(block_files(ssd))  # damage every block file on the worker's disk
        assert f.read() == data[MiB:]


def test_a_tier_that_cannot_be_written_serves_the_store_s_bytes(start_cluster: Any, bucket: str) -> None:
    # A tier's disk goes read-only (the kernel does so after an I/O error) under a running
    # worker: its readers get the store's bytes, uncached, not an error about the worker's files.
    with tiny_disk("64m") as disk:
        cluster = start_cluster(workers=1, tiers=ssd_tier(disk / "ssd", quota="32Mi"))
        try:
            data = payload(2 * BLOCK_SIZE + 5)
            cluster.s3.put_object(bucket, "ro.bin", data)
            cluster.mount_bucket("/ro", bucket)
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True, timeout=30)
            try:
                assert cluster.fs(host="elsewhere").cat_file("/ro/ro.bin") == data
                assert cluster.fs(host="node-0").cat_file("/ro/ro.bin") == data
            finally:
                subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True, timeout=30)
            assert not block_files(disk / "ssd")
        finally:
            cluster.stop()  # before the disk goes
