"""The worker's data port: remote readers get block bytes over plain TCP (sendfile on the
worker), with the same answers, errors and integrity checks as over gRPC."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
from typing import Any

import flaky
import pytest

from strata.cacheserver.common.blockwire import request_line
from strata.contract import errors
from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK_SIZE, TOKEN, Cluster, free_port, read_by_blocks

pytestmark = pytest.mark.timeout(180)


def payload(n: int) -> bytes:
    return (os.urandom(1 << 20) * (n // (1 << 20) + 1))[:n]


@pytest.fixture
def cluster(start_cluster: Any) -> Cluster:
    return start_cluster(workers=2)  # type: ignore[no-any-return]


def exchange(address: tuple[str, int], line: bytes) -> tuple[dict[str, Any], bytes]:
    """One raw request on a new connection: the reply and the bytes after it."""
    with socket.create_connection(address, timeout=30) as sock, sock.makefile("rb") as f:
        sock.sendall(line)
        reply = json.loads(f.readline())
        body = f.read(reply["length"]) if reply.get("ok") else b""
    return reply, body


def test_remote_reads_come_over_the_data_port(cluster: Cluster, bucket: str) -> None:
    data = payload(3 * BLOCK_SIZE + 5)
    cluster.s3.put_object(bucket, "f.bin", data)
    cluster.mount_bucket("/d", bucket)
    fs = cluster.fs(host="elsewhere")  # no worker on this host: no short-circuit
    assert all(w.data_port > 0 for w in fs.client.workers())
    assert fs.cat_file("/d/f.bin") == data  # cold: fetched by the workers, then sent
    assert fs.cat_file("/d/f.bin") == data  # warm
    for start, end in [(0, 1), (BLOCK_SIZE - 3, BLOCK_SIZE + 3), (2 * BLOCK_SIZE + 10, 3 * BLOCK_SIZE + 5)]:
        assert fs.cat_file("/d/f.bin", start, end) == data[start:end]
    assert cluster.total_metric("strata_worker_data_port_reads") >= 8
    assert cluster.total_metric("strata_worker_short_circuit_reads") == 0


def test_a_reader_that_cannot_reach_the_data_port_reads_over_grpc(cluster: Cluster, bucket: str) -> None:
    data = payload(2 * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "g.bin", data)
    cluster.mount_bucket("/g", bucket)
    client = cluster.fs(host="elsewhere").client
    # A firewall between reader and worker, as far as the reader can tell: each worker's data
    # port is replaced by one that nothing listens on.
    workers = client.workers()
    for worker in workers:
        worker.data_port = free_port()
    client._workers.at = float("inf")  # type: ignore[union-attr]  # keep this list
    info = client.stat("/g/g.bin")
    got = b"".join(bytes(client.read_block(client.block_ref(info, i))) for i in range(2))
    assert got == data
    assert cluster.total_metric("strata_worker_data_port_reads") == 0


def test_bytes_damaged_between_worker_and_reader_are_read_again_never_returned(
        start_cluster: Any, bucket: str, caplog: pytest.LogCaptureFixture) -> None:
    cluster = start_cluster(workers=1)
    data = payload(2 * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "d.bin", data)
    cluster.mount_bucket("/dm", bucket)
    client = cluster.fs(host="elsewhere").client
    # A link that changes one bit of the first answer on the worker's data port, in the
    # middle of the block's bytes.
    [worker] = client.workers()
    proxy = flaky.FlakyProxy(f"127.0.0.1:{worker.data_port}", failures=0, flip_at=BLOCK_SIZE // 2)
    try:
        worker.data_port = proxy.port
        client._workers.at = float("inf")  # type: ignore[union-attr]  # keep this list
        info = client.stat("/dm/d.bin")
        with caplog.at_level(logging.WARNING, logger="strata.cacheserver.client"):
            assert bytes(client.read_block(client.block_ref(info, 0))) == data[:BLOCK_SIZE]
            assert proxy.flipped
            assert caplog.text.count("failed their CRC-32C check in transit; the bytes are not used") == 1
            caplog.clear()
            # The block came over gRPC; the next reads take the data port again.
            before = cluster.total_metric("strata_worker_data_port_reads")
            assert b"".join(bytes(client.read_block(client.block_ref(info, i))) for i in range(2)) == data
            assert cluster.total_metric("strata_worker_data_port_reads") == before + 2
            assert caplog.text == ""
    finally:
        proxy.stop()


def test_bad_requests_get_named_errors_and_the_port_keeps_serving(cluster: Cluster, bucket: str) -> None:
    data = payload(BLOCK_SIZE)
    cluster.s3.put_object(bucket, "b.bin", data)
    cluster.mount_bucket("/b", bucket)
    client = cluster.fs(host="elsewhere").client
    info = client.stat("/b/b.bin")
    ref = client.block_ref(info, 0)
    worker = client.workers()[0]
    address = (worker.address.rsplit(":", 1)[0], worker.data_port)

    reply, _ = exchange(address, request_line("wrong-token", ref, 0))
    assert reply["code"] == "UNAUTHENTICATED" and "missing or wrong cluster token" in reply["message"]
    reply, _ = exchange(address, b"not json\n")
    assert reply["code"] == "INVALID_ARGUMENT" and "bad block request" in reply["message"]
    reply, _ = exchange(address, b'{"token": "' + TOKEN.encode() + b'", "block": {"no_such_field": 1}}\n')
    assert reply["code"] == "INVALID_ARGUMENT" and "no_such_field" in reply["message"]
    reply, _ = exchange(address, request_line(TOKEN, ref, 0, offset=BLOCK_SIZE + 1))
    assert reply["code"] == "INVALID_ARGUMENT" and "past the end of block 0" in reply["message"]
    reply, _ = exchange(address, request_line(TOKEN, ref, 0, offset=-1))
    assert reply["code"] == "INVALID_ARGUMENT" and ">= 0" in reply["message"]
    reply, _ = exchange(address, b"x" * (70 * 1024) + b"\n")
    assert reply["code"] == "INVALID_ARGUMENT" and "too large" in reply["message"]
    missing = pb.BlockRef()
    missing.CopyFrom(ref)
    missing.path, missing.in_store = "/b/not-written-yet", False
    reply, _ = exchange(address, request_line(TOKEN, missing, 0))
    assert reply["code"] == "FAILED_PRECONDITION" and "not in the store yet" in reply["message"]

    # Several requests on one connection, the ranges exactly as asked.
    with socket.create_connection(address, timeout=30) as sock, sock.makefile("rb") as f:
        for offset, length in [(0, 10), (BLOCK_SIZE - 7, 0), (12345, 1 << 20)]:
            sock.sendall(request_line(TOKEN, ref, 0, offset=offset, length=length))
            reply = json.loads(f.readline())
            assert reply["ok"], reply
            end = offset + length if length else BLOCK_SIZE
            assert f.read(reply["length"]) == data[offset:end]
    # The client maps error replies to the errors gRPC would raise.
    with pytest.raises(errors.InvalidArgument, match="past the end"):
        client.read_block(ref, BLOCK_SIZE + 1, 1)
    assert read_by_blocks(client, "/b/b.bin") == data


def test_a_reader_keeps_using_the_data_port_after_the_worker_restarts(start_cluster: Any, bucket: str) -> None:
    cluster = start_cluster(workers=1)
    data = payload(2 * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "w.bin", data)
    cluster.mount_bucket("/w", bucket)
    fs = cluster.fs(host="elsewhere")
    assert fs.cat_file("/w/w.bin") == data
    worker = cluster.workers[0]
    worker.stop(signal.SIGKILL)  # the reader's kept connections now lead nowhere
    worker.start()
    worker.wait_healthy()
    cluster.wait_workers(1)
    assert fs.cat_file("/w/w.bin") == data
    # The restarted worker counts from zero: both blocks came over its data port, not gRPC.
    assert cluster.worker_metric(0, "strata_worker_data_port_reads") == 2


def test_pyarrow_and_readinto_take_the_blocks_bytes_without_extra_copies(cluster: Cluster, bucket: str) -> None:
    """read_buffer (what pyarrow reads a Python file through) hands over a read-only view of
    a block's memory when the range lies in one block (the block itself when it is the whole
    block), of one buffer read into when it spans blocks; readinto
    fills the caller's buffer straight from the blocks. Same bytes as read() either way."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    data = payload(2 * BLOCK_SIZE + 7)
    cluster.s3.put_object(bucket, "v.bin", data)
    table = pa.table({"a": pa.array(range(1_200_000), pa.float64()), "b": pa.array(range(1_200_000), pa.int64())})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=200_000, compression="none")  # ~19 MiB: row groups span blocks
    cluster.s3.put_object(bucket, "t.parquet", sink.getvalue())
    cluster.mount_bucket("/v", bucket)
    fs = cluster.fs(host="elsewhere")
    with fs.open("/v/v.bin", "rb") as f:
        f.seek(10)
        small = f.read_buffer(1000)
        assert memoryview(small).readonly and small == data[10:1010]  # the bytes received, as they came
        f.seek(0)
        whole = f.read_buffer(BLOCK_SIZE)  # a whole block, read ahead as a sequential reader's: itself
        assert isinstance(whole, bytes) and whole == data[:BLOCK_SIZE]
        assert f.read_buffer(BLOCK_SIZE - 5) == data[BLOCK_SIZE:2 * BLOCK_SIZE - 5]
        across = f.read_buffer(10)
        assert isinstance(across, memoryview) and across.readonly
        assert across == data[2 * BLOCK_SIZE - 5:2 * BLOCK_SIZE + 5]
        f.seek(BLOCK_SIZE - 3)
        out = bytearray(BLOCK_SIZE + 100)
        assert f.readinto(out) == BLOCK_SIZE + 10 and out[:BLOCK_SIZE + 10] == data[BLOCK_SIZE - 3:]
        assert f.tell() == len(data) and f.read_buffer(5) == b"" and f.readinto(out) == 0
    assert pq.read_table("/v/t.parquet", filesystem=fs).equals(table)
    assert pq.read_table("/v/t.parquet", filesystem=fs).equals(table)  # warm: from the workers' memory


def test_a_file_dropped_unclosed_lets_go_of_its_blocks_at_once(cluster: Cluster, bucket: str) -> None:
    """pyarrow drops the files it reads without closing them: the blocks such a file holds
    are let go when the last reference to the file goes, not at some later garbage
    collection (the file's reads call back into it through a weak reference)."""
    import gc
    import weakref

    data = payload(BLOCK_SIZE)  # one block: no readahead holds a block in between
    cluster.s3.put_object(bucket, "d.bin", data)
    cluster.mount_bucket("/u", bucket)
    fs = cluster.fs(host="elsewhere")
    gc.disable()
    try:
        f = fs.open("/u/d.bin", "rb")
        assert f.read(BLOCK_SIZE) == data[:BLOCK_SIZE]
        held = weakref.ref(f._blocks[0])  # the block's future, which holds its bytes
        gone = weakref.ref(f)
        del f
        assert gone() is None and held() is None
    finally:
        gc.enable()
