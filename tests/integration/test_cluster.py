"""A real master, real workers and a real S3 server: what a user of the cache relies on."""

from __future__ import annotations

import concurrent.futures
import os
import signal
from pathlib import Path
from typing import Any

import fsspec
import grpc
import pytest

from strata.contract import errors
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc

from .conftest import BLOCK_SIZE, TOKEN, Cluster, http_get, metric, wait_until

pytestmark = pytest.mark.timeout(180)


def payload(n: int, seed: int = 0) -> bytes:
    # Not compressible, different per seed, cheap to make.
    return (os.urandom(min(n, 1 << 20)) * (n // (1 << 20) + 1))[:n] if n else b""


def object_gets(recording: Any, bucket: str, key: str = "") -> int:
    return len(recording.matching("GET", f"/{bucket}/{key}" if key else f"/{bucket}/"))


@pytest.fixture
def cluster(start_cluster: Any) -> Cluster:
    return start_cluster(workers=2)  # type: ignore[no-any-return]


SIZES = [0, 1, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 100 * 1024 * 1024]


def test_bytes_read_through_the_cache_equal_the_store(cluster: Cluster, bucket: str) -> None:
    files = {f"f-{n}": payload(n) for n in SIZES}
    for name, data in files.items():
        cluster.s3.put_object(bucket, f"dir/{name}", data)
    cluster.mount_bucket("/data", bucket)
    fs = cluster.fs()
    for name, data in files.items():
        assert fs.cat_file(f"/data/dir/{name}") == data, name
        # warm, and through the fsspec URL a user would type
        with fsspec.open(f"strata:///data/dir/{name}", "rb", master=cluster.master_address, token=TOKEN,
                         skip_instance_cache=True) as f:
            assert f.read() == data, name
    assert sorted(fs.ls("/data/dir", detail=False)) == sorted(f"/data/dir/{n}" for n in files)
    # ranged reads across block boundaries
    big = files[f"f-{100 * 1024 * 1024}"]
    for start, end in [(0, 10), (BLOCK_SIZE - 5, BLOCK_SIZE + 5), (3 * BLOCK_SIZE + 7, 9 * BLOCK_SIZE - 3)]:
        assert fs.cat_file(f"/data/dir/f-{100 * 1024 * 1024}", start, end) == big[start:end]


def test_second_read_makes_no_store_request(cluster: Cluster, bucket: str) -> None:
    data = payload(3 * BLOCK_SIZE + 100)
    cluster.s3.put_object(bucket, "x.bin", data)
    cluster.mount_bucket("/d", bucket)
    fs = cluster.fs()
    assert fs.cat_file("/d/x.bin") == data
    misses = cluster.total_metric("strata_worker_cache_misses")
    assert misses == 4
    with cluster.s3.recording() as rec:
        assert fs.cat_file("/d/x.bin") == data
    assert object_gets(rec, bucket, "x.bin") == 0
    assert cluster.total_metric("strata_worker_cache_misses") == misses
    assert cluster.total_metric("strata_worker_cache_hits") >= 4


def test_ten_concurrent_readers_of_a_cold_block_make_one_store_request(cluster: Cluster, bucket: str) -> None:
    data = payload(BLOCK_SIZE)
    cluster.s3.put_object(bucket, "hot.bin", data)
    cluster.mount_bucket("/hot", bucket)
    filesystems = [cluster.fs() for _ in range(10)]
    with cluster.s3.recording() as rec:
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            results = list(pool.map(lambda fs: fs.cat_file("/hot/hot.bin"), filesystems))
    assert all(r == data for r in results)
    gets = rec.matching("GET", f"/{bucket}/hot.bin")
    assert len(gets) == 1, [(g.url, g.range) for g in gets]


def test_threads_reading_one_open_file_at_once_get_its_bytes(cluster: Cluster, bucket: str) -> None:
    # What a FUSE mount does with one open file: reads from many threads, interleaved.
    data = payload(8 * BLOCK_SIZE + 3)
    cluster.s3.put_object(bucket, "x.bin", data)
    cluster.mount_bucket("/p", bucket)
    piece = 128 * 1024
    starts = [i * BLOCK_SIZE + 999 * i for i in range(8)]
    with cluster.fs().open("/p/x.bin", "rb") as f:
        def read(start: int) -> bytes:
            return b"".join(f.pread(piece, off) for off in range(start, start + BLOCK_SIZE, piece))

        with concurrent.futures.ThreadPoolExecutor(len(starts)) as pool:
            got = list(pool.map(read, starts))
        assert f.tell() == 0  # pread leaves the position alone
    for start, chunk in zip(starts, got):
        assert chunk == data[start:start + BLOCK_SIZE], f"reader at {start}"


def test_eviction_keeps_each_tier_under_quota(start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    tiers = [{"medium": "MEM", "quota": "8Mi", "dirs": [f"/dev/shm/strata-it-{os.getpid()}-evict"]},
             {"medium": "SSD", "quota": "16Mi", "dirs": [str(tmp_path / "ssd")]}]
    cluster = start_cluster(workers=1, tiers=tiers)
    files = {f"part-{i}": payload(BLOCK_SIZE, i) for i in range(10)}
    for name, data in files.items():
        cluster.s3.put_object(bucket, name, data)
    cluster.mount_bucket("/e", bucket)
    fs = cluster.fs()
    for name, data in files.items():
        assert fs.cat_file(f"/e/{name}") == data
    def tiers_reported() -> Any:
        report = fs.client.report()
        return report if report.workers and report.workers[0].stats.tiers else None

    report = wait_until(tiers_reported, 10, "a report with tiers")
    for tier in report.workers[0].stats.tiers:
        assert 0 < tier.used <= tier.capacity, tier
    # evicted blocks are fetched again, correctly
    for name, data in files.items():
        assert fs.cat_file(f"/e/{name}") == data


def test_restarted_worker_keeps_its_ssd_blocks(start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    cluster = start_cluster(workers=1, tiers=[{"medium": "SSD", "quota": "64Mi", "dirs": [str(tmp_path / "ssd")]}])
    data = payload(2 * BLOCK_SIZE + 3)
    cluster.s3.put_object(bucket, "keep.bin", data)
    cluster.mount_bucket("/k", bucket)
    fs = cluster.fs()
    assert fs.cat_file("/k/keep.bin") == data
    worker = cluster.workers[0]
    worker.stop(signal.SIGKILL)
    worker.start()
    worker.wait_healthy()
    cluster.wait_workers(1)
    with cluster.s3.recording() as rec:
        assert fs.cat_file("/k/keep.bin") == data
    assert object_gets(rec, bucket, "keep.bin") == 0
    assert fs.info("/k/keep.bin")["cached_bytes"] == len(data)


@pytest.mark.parametrize("write_type", ["MUST_CACHE", "CACHE_THROUGH", "THROUGH", "ASYNC_THROUGH"])
def test_each_write_type_persists_as_promised(cluster: Cluster, bucket: str, write_type: str) -> None:
    cluster.mount_bucket("/w", bucket)
    fs = cluster.fs(write_type=write_type)
    data = payload(2 * BLOCK_SIZE + 11)
    with fs.open("/w/out/file.bin", "wb") as f:
        f.write(data[:1000])
        f.write(data[1000:])
    info = fs.info("/w/out/file.bin")
    assert info["size"] == len(data)
    in_store = "out/file.bin" in [o["Key"] for o in cluster.s3.client().list_objects_v2(Bucket=bucket).get("Contents", [])]
    if write_type == "MUST_CACHE":
        assert not info["persisted"] and not in_store
    elif write_type in ("CACHE_THROUGH", "THROUGH"):
        assert info["persisted"] and in_store
        assert cluster.s3.get_object(bucket, "out/file.bin") == data
    else:  # ASYNC_THROUGH: persisted in the background
        wait_until(lambda: fs.info("/w/out/file.bin")["persisted"], 30, "the async write to be persisted")
        assert cluster.s3.get_object(bucket, "out/file.bin") == data
    expect_cached = 0 if write_type == "THROUGH" else len(data)
    wait_until(lambda: fs.info("/w/out/file.bin")["cached_bytes"] == expect_cached, 10, f"{expect_cached} cached bytes")
    assert fs.cat_file("/w/out/file.bin") == data
    assert "/w/out/file.bin" in fs.find("/w")


def test_an_async_upload_cut_short_by_a_killed_worker_is_finished_after_restart(start_cluster: Any, bucket: str) -> None:
    cluster = start_cluster(workers=1)
    cluster.mount_bucket("/a", bucket)
    fs = cluster.fs(write_type="ASYNC_THROUGH")
    data = payload(96 * 1024 * 1024)  # big enough that its upload outlasts the kill below
    fs.pipe_file("/a/big.bin", data)
    worker = cluster.workers[0]
    worker.stop(signal.SIGKILL)

    def keys() -> list[str]:
        return [o["Key"] for o in cluster.s3.client().list_objects_v2(Bucket=bucket).get("Contents", [])]

    assert "big.bin" not in keys() and not fs.info("/a/big.bin")["persisted"]
    worker.start()
    worker.wait_healthy()
    wait_until(lambda: fs.info("/a/big.bin")["persisted"], 60, "the staged upload to be finished")
    assert cluster.s3.get_object(bucket, "big.bin") == data
    staging = cluster.root / "worker-0" / "staging"
    wait_until(lambda: not any(staging.iterdir()), 10, "the staging folder to be emptied")
    assert fs.cat_file("/a/big.bin") == data


def test_a_staged_upload_of_a_file_replaced_meanwhile_is_dropped(cluster: Cluster, bucket: str) -> None:
    cluster.mount_bucket("/a", bucket)
    old = payload(96 * 1024 * 1024)
    cluster.fs(host="node-0", write_type="ASYNC_THROUGH").pipe_file("/a/f.bin", old)  # through worker-0
    cluster.workers[0].stop(signal.SIGKILL)
    new = b"the newer file"
    cluster.fs(host="node-1", write_type="THROUGH").pipe_file("/a/f.bin", new)  # through worker-1
    cluster.workers[0].start()
    cluster.workers[0].wait_healthy()
    staging = cluster.root / "worker-0" / "staging"
    wait_until(lambda: not any(staging.iterdir()), 30, "worker-0 to drop its staged upload")
    assert cluster.s3.get_object(bucket, "f.bin") == new
    assert cluster.fs().cat_file("/a/f.bin") == new


def test_read_only_mount_refuses_writes(cluster: Cluster, bucket: str) -> None:
    cluster.mount_bucket("/ro", bucket, read_only=True)
    fs = cluster.fs()
    with pytest.raises(PermissionError, match="read-only"):
        fs.pipe_file("/ro/x", b"data")


def test_a_killed_worker_does_not_fail_a_read(cluster: Cluster, bucket: str) -> None:
    data = payload(8 * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "big.bin", data)
    cluster.mount_bucket("/f", bucket)
    fs = cluster.fs()
    assert fs.cat_file("/f/big.bin") == data
    cluster.workers[0].stop(signal.SIGKILL)
    assert fs.cat_file("/f/big.bin") == data
    assert cluster.worker_metric(1, "strata_worker_cache_misses") > 0


def test_short_circuit_on_the_same_host_and_not_across(cluster: Cluster, bucket: str) -> None:
    data = payload(2 * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "sc.bin", data)
    cluster.mount_bucket("/sc", bucket)
    remote = cluster.fs(host="elsewhere")
    assert remote.cat_file("/sc/sc.bin") == data
    assert cluster.total_metric("strata_worker_short_circuit_reads") == 0
    local = cluster.fs(host="node-0")  # worker-0's host
    assert local.cat_file("/sc/sc.bin") == data
    assert cluster.worker_metric(0, "strata_worker_short_circuit_reads") == 2
    assert cluster.worker_metric(1, "strata_worker_short_circuit_reads") == 0


def test_every_rpc_needs_the_token(cluster: Cluster) -> None:
    for token in (None, "wrong-token"):
        channel = grpc.insecure_channel(cluster.master_address)
        stub = pb_grpc.MasterStub(channel)
        metadata = [("authorization", f"Bearer {token}")] if token else None
        with pytest.raises(grpc.RpcError) as caught:
            stub.ListMounts(pb.ListMountsRequest(), metadata=metadata, timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        channel.close()
    worker = cluster.fs().client.workers()[0]
    channel = grpc.insecure_channel(worker.address)
    with pytest.raises(grpc.RpcError) as caught:
        pb_grpc.WorkerStub(channel).FreeBlocks(pb.FreeBlocksRequest(mount_id=1), timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel.close()


def test_bad_input_gets_clear_errors_and_servers_keep_serving(cluster: Cluster, bucket: str) -> None:
    cluster.s3.put_object(bucket, "ok.txt", b"still here")
    cluster.mount_bucket("/data/a", bucket)
    client = cluster.fs().client
    opts = pb.MountOptions(options=cluster.s3.storage_options())
    with pytest.raises(errors.StrataError, match="/data/a"):
        client.mount("/data/a/inner", f"s3://{bucket}", opts)
    with pytest.raises(errors.InvalidArgument, match="absolute"):
        client.mount("relative/path", f"s3://{bucket}", opts)
    with pytest.raises(errors.InvalidArgument, match="nosuchscheme"):
        client.mount("/x", "nosuchscheme://b/c", opts)
    with pytest.raises(errors.NotFound, match="no-such-bucket"):
        client.mount("/missing", "s3://no-such-bucket", opts)
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        cluster.fs().cat_file("/data/a/nope.txt")
    with pytest.raises(FileNotFoundError, match="no mount"):
        cluster.fs().info("/not/mounted")
    assert cluster.fs().cat_file("/data/a/ok.txt") == b"still here"


def test_wrong_credentials_are_refused_by_name(start_cluster: Any, tmp_path: Path) -> None:
    from .conftest import s3server

    secure = s3server.start_moto_server(enforce_auth=True)
    try:
        secure.create_bucket("locked")
        cluster = start_cluster(workers=1)
        client = cluster.fs().client
        bad = pb.MountOptions(options={**secure.storage_options(), "secret": "wrong-secret"})
        with pytest.raises(errors.PermissionDenied, match="credentials"):
            client.mount("/locked", "s3://locked", bad)
        good = pb.MountOptions(options=secure.storage_options())
        client.mount("/locked", "s3://locked", good)
        assert [m.path for m in client.mounts()] == ["/locked"]
    finally:
        secure.stop()


def test_a_deleted_block_file_is_fetched_again(start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    cluster = start_cluster(workers=1, tiers=[{"medium": "SSD", "quota": "64Mi", "dirs": [str(tmp_path / "ssd")]}])
    data = payload(BLOCK_SIZE + 5)
    cluster.s3.put_object(bucket, "del.bin", data)
    cluster.mount_bucket("/del", bucket)
    fs = cluster.fs()
    assert fs.cat_file("/del/del.bin") == data
    block_files = [p for p in (tmp_path / "ssd").rglob("*") if p.is_file() and not p.name.endswith(".meta")]
    assert block_files
    for p in block_files:
        p.unlink()
    assert fs.cat_file("/del/del.bin") == data
    # and a corrupted one is never served
    for p in [p for p in (tmp_path / "ssd").rglob("*") if p.is_file() and not p.name.endswith(".meta")]:
        raw = bytearray(p.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        p.write_bytes(bytes(raw))
    assert fs.cat_file("/del/del.bin") == data


def test_metrics_and_health_endpoints(cluster: Cluster, bucket: str) -> None:
    cluster.mount_bucket("/m", bucket)
    status, text = http_get(cluster.master.http_port, "/metrics")
    assert status == 200
    assert metric(text, "strata_master_workers_live") == 2
    assert metric(text, "strata_master_mounts") == 1
    assert http_get(cluster.master.http_port, "/healthz")[0] == 200
    assert http_get(cluster.workers[0].http_port, "/healthz")[0] == 200
    assert "strata_worker_tier_capacity_bytes" in cluster.workers[0].metrics()


def test_mount_table_survives_a_master_restart(cluster: Cluster, bucket: str) -> None:
    cluster.s3.put_object(bucket, "a.txt", b"hello")
    cluster.mount_bucket("/persist", bucket)
    cluster.master.stop()
    cluster.master.start()
    cluster.master.wait_healthy()
    cluster.wait_workers(2)
    fs = cluster.fs()
    assert [m.path for m in fs.client.mounts()] == ["/persist"]
    assert fs.cat_file("/persist/a.txt") == b"hello"


def test_load_free_pin_and_block_locations(cluster: Cluster, bucket: str) -> None:
    data = payload(3 * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "set/a.bin", data)
    cluster.s3.put_object(bucket, "set/b.bin", data[:100])
    cluster.mount_bucket("/l", bucket)
    fs = cluster.fs()
    progress = list(fs.client.load("/l/set"))
    assert progress[-1].done and progress[-1].bytes_loaded == progress[-1].bytes_total == len(data) + 100
    with cluster.s3.recording() as rec:
        assert fs.cat_file("/l/set/a.bin") == data
    assert object_gets(rec, bucket) == 0
    # block reports reach the master with the next heartbeat
    def reported() -> list[dict[str, Any]] | None:
        locations = fs.block_locations("/l/set/a.bin")
        return locations if all(b["hosts"] for b in locations) else None

    locations = wait_until(reported, 10, "block reports")
    assert [b["index"] for b in locations] == [0, 1, 2]
    assert all(set(b["hosts"]) <= {"node-0", "node-1"} for b in locations)
    fs.client.set_pinned("/l/set", True)
    assert fs.info("/l/set/a.bin")["pinned"]
    assert fs.client.free("/l/set/b.bin") == 100
    wait_until(lambda: fs.info("/l/set/b.bin")["cached_bytes"] == 0, 10, "b.bin to be freed")
    assert fs.info("/l/set/a.bin")["cached_bytes"] == len(data)


def _load_report(fs: Any, mount: str, path: str) -> Any:
    (report,) = [m for m in fs.client.report().mounts if m.mount.path == mount]
    return next((load for load in report.loads if load.path == path), None)


def test_a_finished_load_reports_how_much_of_it_the_cache_still_holds(cluster: Cluster, bucket: str) -> None:
    """What a preload's status is built on: done is not enough, the bytes must still be cached."""
    data = payload(2 * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "set/a.bin", data)
    cluster.s3.put_object(bucket, "set/b.bin", data[:100])
    cluster.mount_bucket("/l", bucket)
    fs = cluster.fs()
    list(fs.client.load("/l/set"))
    total = len(data) + 100
    load = wait_until(lambda: (r := _load_report(fs, "/l", "/l/set")) and r.bytes_cached == total and r, 10,
                      "the load's blocks to be reported")
    assert load.done and not load.error and load.bytes_total == total
    fs.client.free("/l/set/a.bin")  # the cache loses most of it
    wait_until(lambda: _load_report(fs, "/l", "/l/set").bytes_cached == 100, 10, "the report to show the loss")


def test_a_load_with_no_live_worker_fails_and_says_why(start_cluster: Any, bucket: str) -> None:
    cluster = start_cluster(workers=1)
    cluster.s3.put_object(bucket, "set/a.bin", payload(BLOCK_SIZE))
    cluster.mount_bucket("/l", bucket)
    fs = cluster.fs()
    cluster.workers[0].stop(signal.SIGKILL)
    wait_until(lambda: not any(w.live for w in fs.client.report().workers), 60, "the master to see the worker gone")
    with pytest.raises(errors.StrataError, match="no live workers"):
        list(fs.client.load("/l/set"))
    load = _load_report(fs, "/l", "/l/set")
    assert load.done and "no live workers" in load.error and load.bytes_cached == 0


def test_pandas_and_pyarrow_read_parquet_through_strata(cluster: Cluster, bucket: str) -> None:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"x": [float(i) for i in range(10_000)], "y": [2.0 * i for i in range(10_000)]})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    cluster.s3.put_object(bucket, "t/part-0.parquet", sink.getvalue().to_pybytes())
    cluster.mount_bucket("/pq", bucket)
    fs = cluster.fs()
    assert pq.read_table("/pq/t/part-0.parquet", filesystem=fs).equals(table)
    frame = pd.read_parquet("strata:///pq/t/part-0.parquet",
                            storage_options={"master": cluster.master_address, "token": TOKEN})
    assert frame["y"].sum() == 2.0 * sum(range(10_000))


def test_read_types_no_cache_and_cache_promote(start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    tiers = [{"medium": "MEM", "quota": "8Mi", "dirs": [f"/dev/shm/strata-it-{os.getpid()}-promote"]},
             {"medium": "SSD", "quota": "64Mi", "dirs": [str(tmp_path / "ssd")]}]
    cluster = start_cluster(workers=1, tiers=tiers)
    data = payload(BLOCK_SIZE)
    for name in ("nocache.bin", "a.bin", "b.bin", "c.bin"):
        cluster.s3.put_object(bucket, name, data)
    cluster.mount_bucket("/nc", bucket, read_type=pb.NO_CACHE)
    fs = cluster.fs()
    assert fs.cat_file("/nc/nocache.bin") == data
    assert fs.info("/nc/nocache.bin")["cached_bytes"] == 0
    assert cluster.worker_metric(0, "strata_worker_cache_misses") == 1
    # a.bin lands in MEM, then b.bin and c.bin push it down to SSD
    cluster.fs().client.mount("/p", f"s3://{bucket}", pb.MountOptions(options=cluster.s3.storage_options(),
                                                                      read_type=pb.CACHE_PROMOTE))
    for name in ("a.bin", "b.bin", "c.bin"):
        assert fs.cat_file(f"/p/{name}") == data

    def mem_blocks() -> int:
        return int(metric(cluster.workers[0].metrics(), "strata_worker_tier_blocks", '{medium="MEM"}'))

    assert fs.cat_file("/p/a.bin") == data  # a hit in SSD, promoted to MEM
    assert mem_blocks() >= 1
    with cluster.s3.recording() as rec:
        assert fs.cat_file("/p/a.bin") == data
    assert object_gets(rec, bucket) == 0


def test_ttl_frees_blocks_unused_that_long(cluster: Cluster, bucket: str) -> None:
    data = payload(BLOCK_SIZE)
    cluster.s3.put_object(bucket, "old.bin", data)
    cluster.mount_bucket("/ttl", bucket, ttl_seconds=3.0)
    fs = cluster.fs()
    assert fs.cat_file("/ttl/old.bin") == data
    wait_until(lambda: fs.info("/ttl/old.bin")["cached_bytes"] == len(data), 2, "the block report")
    wait_until(lambda: fs.info("/ttl/old.bin")["cached_bytes"] == 0, 15, "the TTL to free the block")
    assert fs.cat_file("/ttl/old.bin") == data


@pytest.mark.parametrize("host", ["test-client", "node-0"])  # over the data port; short-circuit
def test_reading_lines_returns_the_store_s_lines(cluster: Cluster, bucket: str, host: str) -> None:
    lines = [f"line {i} {'x' * (i % 97)}\n".encode() for i in range(200_000)]
    lines[100_000] = b"a line longer than a window of the block file " + b"y" * 300_000 + b"\n"
    data = b"".join(lines) + b"no newline at the end"
    cluster.s3.put_object(bucket, "lines.txt", data)
    cluster.mount_bucket("/t", bucket)
    fs = cluster.fs(host=host)
    with fs.open("/t/lines.txt", "rb") as f:
        got = list(f)
    assert got == [*lines, b"no newline at the end"]
    with fs.open("/t/lines.txt", "rb") as f:
        f.seek(BLOCK_SIZE - 3)
        assert f.readline(2) == data[BLOCK_SIZE - 3:BLOCK_SIZE - 1]
        assert f.readline() == data[BLOCK_SIZE - 1:data.index(b"\n", BLOCK_SIZE - 1) + 1]


def count_stats(fs: Any) -> list[str]:
    """The paths `fs` asks the master to stat from now on (the real calls, counted)."""
    asked: list[str] = []
    real = fs.client.stat

    def stat(path: str) -> pb.FileInfo:
        asked.append(path)
        return real(path)

    fs.client.stat = stat
    return asked


def test_a_listing_answers_stats_of_its_files_until_a_change(cluster: Cluster, bucket: str) -> None:
    for i in range(20):
        cluster.s3.put_object(bucket, f"many/f{i:02d}", b"x" * i)
    cluster.mount_bucket("/m", bucket)
    fs = cluster.fs()
    stats = count_stats(fs)
    listing = fs.ls("/m/many", detail=True)
    assert len(listing) == 20 and stats == []  # one ListStatus, no stat of the folder
    infos = [fs.info(f"/m/many/f{i:02d}") for i in range(20)]
    assert [i["size"] for i in infos] == list(range(20)) and stats == []
    # A change made through this filesystem shows at once.
    fs.pipe_file("/m/many/f03", b"changed")
    assert fs.info("/m/many/f03")["size"] == 7
    assert fs.ls("/m/many", detail=True)[3]["size"] == 7
    fs.rm("/m/many/f04")
    assert "/m/many/f04" not in fs.ls("/m/many", detail=False)
    with pytest.raises(FileNotFoundError):
        fs.info("/m/many/f04")
    # Without the listings cache every info asks the master.
    uncached = cluster.fs(use_listings_cache=False)
    uncached_stats = count_stats(uncached)
    uncached.ls("/m/many")
    assert uncached.info("/m/many/f05")["size"] == 5
    assert uncached_stats == ["/m/many/f05"]
