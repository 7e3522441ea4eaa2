"""What a cold read of a folder's small files costs the store, as a training loader reads
them (each file once, in a shuffled order, no listing first).

A real master and worker over moto's S3 server, whose request log is the count. The
master learns a folder's statuses from one page of its listing on the first miss there
(`StoreAnswers._look_around`): every later file of the folder costs one GET of the whole
file, made on the condition that the object is still the one the listing named (If-Match),
and no HEAD. An object replaced after the listing is never served as the listing's version,
nor mixed with it.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from strata.contract.errors import FailedPrecondition
from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK_SIZE, Cluster, metric, wait_until

pytestmark = pytest.mark.timeout(180)

FILES = 30
SIZE = 100_000


def read_only_mount(cluster: Cluster, bucket: str) -> None:
    cluster.fs().client.mount("/m", f"s3://{bucket}", pb.MountOptions(
        options=cluster.s3.storage_options(), read_only=True, metadata_sync_interval=300))


def master_lists(cluster: Cluster) -> float:
    """Store listings the master has finished (its store metrics; none before the first)."""
    text = cluster.master.metrics()
    if 'operation="list"' not in text:
        return 0.0
    return metric(text, "strata_store_request_seconds_count", '{operation="list"}')


def master_calls(cluster: Cluster, method: str) -> float:
    """Calls of `method` the master has answered (its request metrics)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in cluster.master.metrics().splitlines()
               if line.startswith("strata_master_requests_total{") and f'method="{method}"' in line)


def read(fs: Any, path: str) -> bytes:
    with fs.open(path, "rb") as f:
        return f.read()  # type: ignore[no-any-return]


@pytest.mark.parametrize("host", ["node-0", "elsewhere"], ids=["short-circuit", "remote"])
def test_each_cold_small_file_of_a_folder_costs_one_get_and_no_head(start_cluster: Any, bucket: str,
                                                                    host: str) -> None:
    cluster: Cluster = start_cluster(workers=1)
    files = {f"ds/img-{i:05d}.jpg": os.urandom(SIZE) for i in range(FILES)}
    for key, data in files.items():
        cluster.s3.put_object(bucket, key, data)
    cluster.s3.put_object(bucket, "ds/sub/other.jpg", b"not in the folder's page")
    read_only_mount(cluster, bucket)
    fs = cluster.fs(host=host)
    order = list(files)
    random.Random(7).shuffle(order)
    lists = master_lists(cluster)
    with cluster.s3.recording() as first:
        assert read(fs, f"/m/{order[0]}") == files[order[0]]
    assert len(first.matching("HEAD")) <= 1 and len(first.matching("GET", order[0])) == 1
    # The master's look at the folder runs beside the first read: a page from the file on,
    # which reaches the folder's end, then one from its beginning. Wait until both answered.
    wait_until(lambda: master_lists(cluster) >= lists + 2, 30, "the master's look at the folder")
    locates = master_calls(cluster, "LocateBlocks")
    with cluster.s3.recording() as rec:
        for key in order[1:]:
            assert read(fs, f"/m/{key}") == files[key], key
    # No worker held a byte of these files when the master gave their status: the worker
    # went to the store without asking it where their blocks are.
    assert master_calls(cluster, "LocateBlocks") == locates
    heads = rec.matching("HEAD")
    assert heads == [], f"{len(heads)} HEADs for {FILES - 1} files: {[h.path for h in heads][:5]}"
    gets = rec.matching("GET")
    assert sorted(g.path.split("/", 2)[2] for g in gets) == sorted(order[1:]), [g.url for g in gets]
    for get in gets:
        conditions = {k.lower(): v for k, v in get.headers.items()}
        assert conditions.get("if-match"), f"GET {get.path} is not conditional on the listed version"
        assert get.range in (None, f"bytes=0-{SIZE - 1}"), f"GET {get.path} asks for {get.range}, not the whole file"


def test_an_object_replaced_after_the_listing_is_never_served_as_the_listed_version(start_cluster: Any,
                                                                                      bucket: str) -> None:
    cluster: Cluster = start_cluster(workers=1)
    size = 2 * BLOCK_SIZE + 1000
    old = os.urandom(size)
    new = os.urandom(size)  # same length: only the version tells them apart
    cluster.s3.put_object(bucket, "ds/a.bin", b"first")
    cluster.s3.put_object(bucket, "ds/b.bin", old)
    read_only_mount(cluster, bucket)
    lists = master_lists(cluster)
    assert read(cluster.fs(host="node-0"), "/m/ds/a.bin") == b"first"
    wait_until(lambda: master_lists(cluster) >= lists + 2, 30, "the master's look at the folder")
    # The master knows b.bin from the listing, as the old object; the store has another now.
    cluster.s3.put_object(bucket, "ds/b.bin", new)
    for host in ("node-0", "elsewhere"):
        try:
            got = read(cluster.fs(host=host, readahead=0), "/m/ds/b.bin")
        except FailedPrecondition as exc:
            assert "changed in the store" in str(exc), str(exc)
            continue
        assert got == new, "bytes of an object replaced after the listing were served as the listed version"
    # The refused read had the master look again: the next open reads the new object whole.
    assert read(cluster.fs(host="last"), "/m/ds/b.bin") == new
