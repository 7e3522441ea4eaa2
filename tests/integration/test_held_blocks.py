"""A process opening a file again reads the block files it held a moment before
(client/heldblocks.py), and never a copy the worker let go of.

A real master, worker and S3 server; the reader is on the worker's host, so it reads the
worker's block files by descriptor. The worker counts the block files it hands out
(`strata_worker_short_circuit_reads`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from damage import flip_byte

from strata.cacheserver.client.settings import ClientSettings

from .conftest import BLOCK_SIZE, Cluster, metric, wait_until

pytestmark = pytest.mark.timeout(240)

HANDED = "strata_worker_short_circuit_reads"


def read_whole(fs: Any, path: str) -> bytes:
    with fs.open(path, "rb") as f:
        return bytes(f.read_buffer())


def test_a_file_opened_again_is_read_from_the_block_files_held_before(start_cluster: Any, bucket: str) -> None:
    cluster: Cluster = start_cluster(workers=1)
    data = os.urandom(3 * BLOCK_SIZE + 777)
    cluster.s3.put_object(bucket, "f.bin", data)
    cluster.mount_bucket("/m", bucket)
    local = cluster.fs(host="node-0")
    assert read_whole(local, "/m/f.bin") == data
    handed = metric(cluster.workers[0].metrics(), HANDED)
    for _ in range(3):  # as pyarrow opens a file for its footer, then to scan it
        assert read_whole(local, "/m/f.bin") == data
    assert metric(cluster.workers[0].metrics(), HANDED) == handed
    # Another process (a client of its own) asks the worker for each block.
    other = cluster.fs(host="node-0")
    assert read_whole(other, "/m/f.bin") == data
    assert metric(cluster.workers[0].metrics(), HANDED) == handed + 4


def test_blocks_the_worker_lets_go_of_are_held_anew_and_read_right(start_cluster: Any, bucket: str,
                                                                   tmp_path: Path) -> None:
    ssd = tmp_path / "ssd"
    cluster: Cluster = start_cluster(workers=1, tiers=[{"medium": "SSD", "quota": "256Mi", "dirs": [str(ssd)]}])
    data = os.urandom(2 * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "f.bin", data)
    cluster.mount_bucket("/m", bucket)
    local = cluster.fs(host="node-0")
    assert read_whole(local, "/m/f.bin") == data
    assert len(local.client.held_blocks) == 2
    # Freed from the cache: the worker unlinks the block files, and the client lets go of them.
    assert local.client.free("/m/f.bin") > 0
    wait_until(lambda: len(local.client.held_blocks) == 0, 30, "the client to let go of the freed block files")
    handed = metric(cluster.workers[0].metrics(), HANDED)
    assert read_whole(local, "/m/f.bin") == data  # fetched from the store again
    assert metric(cluster.workers[0].metrics(), HANDED) == handed + 2
    # A block file damaged under the reader: the damaged range is read through the worker (which
    # drops the copy and fetches the block anew) and the damaged file is not given out again.
    for block in sorted(ssd.glob("*.blk")):
        flip_byte(block, block.stat().st_size // 2)
    assert read_whole(local, "/m/f.bin") == data
    assert metric(cluster.workers[0].metrics(), "strata_worker_short_circuit_rechecks") >= 1
    handed = metric(cluster.workers[0].metrics(), HANDED)
    assert read_whole(local, "/m/f.bin") == data
    assert metric(cluster.workers[0].metrics(), HANDED) > handed


def test_held_block_files_are_let_go_after_held_blocks_for(start_cluster: Any, bucket: str) -> None:
    cluster: Cluster = start_cluster(workers=1)
    data = os.urandom(BLOCK_SIZE + 1)
    cluster.s3.put_object(bucket, "f.bin", data)
    cluster.mount_bucket("/m", bucket)
    local = cluster.fs(host="node-0", settings=ClientSettings(held_blocks_for=0.5))
    assert read_whole(local, "/m/f.bin") == data
    wait_until(lambda: len(local.client.held_blocks) == 0, 10, "the held block files to be let go after 0.5 s")
    handed = metric(cluster.workers[0].metrics(), HANDED)
    assert read_whole(local, "/m/f.bin") == data
    assert metric(cluster.workers[0].metrics(), HANDED) == handed + 2
