"""Ranges across blocks read by short-circuit: put together in one buffer, every byte checked.

A real master, worker and S3 server; the reader is on the worker's host, so it reads the
worker's block files by descriptor. pyarrow reads a file through read_buffer, in ranges that
start and end anywhere.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Any

import pytest
from damage import flip_byte

from .conftest import BLOCK_SIZE, Cluster, metric

pytestmark = pytest.mark.timeout(240)

CHUNK = 64 * 1024  # the block files' checksum chunks


def test_ranges_across_blocks_are_the_file_s_bytes_even_when_a_block_file_is_damaged(
        start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    ssd = tmp_path / "ssd"
    cluster: Cluster = start_cluster(workers=1, tiers=[{"medium": "SSD", "quota": "256Mi", "dirs": [str(ssd)]}])
    data = os.urandom(3 * BLOCK_SIZE + 12345)
    cluster.s3.put_object(bucket, "f.bin", data)
    cluster.mount_bucket("/m", bucket)
    local = cluster.fs(host="node-0", readahead=3)  # worker-0's host: block files by descriptor
    assert local.cat_file("/m/f.bin") == data  # every block cached
    ranges = [(BLOCK_SIZE - 7, 2 * BLOCK_SIZE + 9),  # partial chunks at both ends
              (CHUNK, 3 * BLOCK_SIZE),  # whole chunks only
              (5, len(data)),  # to the end of the file, its last chunk short
              (2 * BLOCK_SIZE - 1, 2 * BLOCK_SIZE + 1)]  # two bytes, one from each block
    with local.open("/m/f.bin", "rb") as f:
        for start, end in ranges:
            f.seek(start)
            got = f.read_buffer(end - start)
            assert bytes(got) == data[start:end], (start, end)
        # Damage the middle of every block file under the reader that holds them: the
        # damaged chunks are read again through the worker, never returned.
        for block in sorted(ssd.glob("*.blk")):
            flip_byte(block, block.stat().st_size // 2)
        for start, end in ranges:
            f.seek(start)
            assert bytes(f.read_buffer(end - start)) == data[start:end], (start, end)
    assert metric(cluster.workers[0].metrics(), "strata_worker_short_circuit_rechecks") >= 1
    assert metric(cluster.workers[0].metrics(), "strata_worker_data_port_reads") == 0


def test_ranges_are_read_into_memory_used_again_and_never_while_a_reader_holds_it(
        start_cluster: Any, bucket: str) -> None:
    cluster: Cluster = start_cluster(workers=1)
    data = os.urandom(3 * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "f.bin", data)
    cluster.mount_bucket("/m", bucket)
    local = cluster.fs(host="node-0", readahead=2)
    assert local.cat_file("/m/f.bin") == data
    with local.open("/m/f.bin", "rb") as f:
        # pyarrow's reads: ranges within a block and across blocks, views it decodes from
        held = f.read_buffer(BLOCK_SIZE + 3 * CHUNK)  # across blocks 0 and 1
        f.seek(5)
        inside = f.read_buffer(BLOCK_SIZE - 10)  # inside block 0: read into memory as well
        assert held.obj is not inside.obj
        assert bytes(held) == data[:BLOCK_SIZE + 3 * CHUNK] and bytes(inside) == data[5:BLOCK_SIZE - 5]
        memory = weakref.ref(inside.obj)  # kept alive by the client's pool, not by this test
        del inside
        f.seek(2 * BLOCK_SIZE + 1)
        again = f.read_buffer(BLOCK_SIZE - 2)  # the memory let go of is used again, the held one never
        assert again.obj is memory() and again.obj is not held.obj
        assert bytes(again) == data[2 * BLOCK_SIZE + 1:3 * BLOCK_SIZE - 1]
        assert bytes(held) == data[:BLOCK_SIZE + 3 * CHUNK]


def test_a_sequential_reader_gets_right_bytes_past_a_damaged_range_and_a_block_file_cut_short_under_it(
        start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    ssd = tmp_path / "ssd"
    cluster: Cluster = start_cluster(workers=1, tiers=[{"medium": "SSD", "quota": "256Mi", "dirs": [str(ssd)]}])
    data = os.urandom(2 * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "f.bin", data)
    cluster.mount_bucket("/m", bucket)
    local = cluster.fs(host="node-0", readahead=2)
    assert local.cat_file("/m/f.bin") == data
    first, second = sorted(ssd.glob("*.blk"), key=lambda p: data.index(p.read_bytes()[:64]))
    flip_byte(first, 5 * CHUNK + 3)  # in the third read of 2 chunks
    fetched = cluster.worker_metric(0, "strata_worker_ufs_bytes_read")
    got = []
    with local.open("/m/f.bin", "rb") as f:
        while piece := f.read(2 * CHUNK):  # as a line counter reads: read(n) front to back
            got.append(piece)
            if len(got) == 3:  # the reader holds both block files by now (blocks read ahead)
                with open(second, "r+b") as cut:
                    cut.truncate(CHUNK)  # cut short under the reader: read again, never a crash
    assert b"".join(got) == data
    metrics = cluster.workers[0].metrics()
    assert metric(metrics, "strata_worker_short_circuit_rechecks") >= 1  # the damaged range
    assert metric(metrics, "strata_worker_data_port_reads") == 0
    # Both copies were dropped and fetched again from the store, each once.
    assert metric(metrics, "strata_worker_ufs_bytes_read") - fetched == len(data)
