"""The read-ahead of a folder's small files (worker/folderahead.py): a real master and worker
over moto's S3 server, whose request log counts the store's GETs.

A training loader opens a folder's small files cold in a shuffled order: after a few, the
worker fetches the folder's other files ahead, each object once (a file a reader and the
read-ahead both want is fetched once), a few at a time; the reader's later opens find them
cached. One file read alone in a big folder fetches nothing else. An object replaced after
the listing is never served as the listing's version.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from storeproxy import StoreProxy

from strata.contract.errors import FailedPrecondition
from strata.contract.proto import strata_pb2 as pb

from .conftest import Cluster, metric, wait_until

pytestmark = pytest.mark.timeout(240)

SIZE = 50_000


@pytest.fixture
def proxy(s3: Any) -> Iterator[StoreProxy]:
    p = StoreProxy(target_port=int(s3.endpoint_url.rsplit(":", 1)[1]))
    yield p
    p.stop()


def read_only_mount(cluster: Cluster, bucket: str, endpoint_url: str | None = None) -> None:
    options = cluster.s3.storage_options()
    if endpoint_url is not None:
        options["endpoint_url"] = endpoint_url
    cluster.fs().client.mount("/m", f"s3://{bucket}", pb.MountOptions(
        options=options, read_only=True, metadata_sync_interval=300))


def read(fs: Any, path: str) -> bytes:
    with fs.open(path, "rb") as f:
        return f.read()  # type: ignore[no-any-return]


def fetched_ahead(cluster: Cluster) -> float:
    return metric(cluster.workers[0].metrics(), "strata_worker_folder_readahead_files")


def put_folder(cluster: Cluster, bucket: str, count: int) -> dict[str, bytes]:
    files = {f"ds/img-{i:05d}.jpg": os.urandom(SIZE) for i in range(count)}
    for key, data in files.items():
        cluster.s3.put_object(bucket, key, data)
    cluster.s3.put_object(bucket, "ds/sub/other.jpg", b"below the folder: never fetched ahead")
    return files


def folder_cluster(start_cluster: Any, bucket: str, count: int, *, workers: int = 1,
                   endpoint_url: str | None = None) -> tuple[Cluster, dict[str, bytes]]:
    """A cluster of `workers` with `count` files of a folder in the store, read-only mounted at
    /m (through `endpoint_url` when given); the cluster and the files by key."""
    cluster: Cluster = start_cluster(workers=workers)
    files = put_folder(cluster, bucket, count)
    read_only_mount(cluster, bucket, endpoint_url)
    return cluster, files


@pytest.mark.parametrize("host", ["node-0", "elsewhere"], ids=["short-circuit", "remote"])
def test_cold_opens_of_a_folder_fetch_its_other_files_ahead_each_object_once(
        start_cluster: Any, bucket: str, proxy: StoreProxy, host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_WORKER_FOLDER_READAHEAD_FILES", "3")
    cluster, files = folder_cluster(start_cluster, bucket, 80, endpoint_url=proxy.endpoint_url)
    fs = cluster.fs(host=host)
    order = list(files)
    random.Random(11).shuffle(order)
    # Each store answer takes 50 ms (a store's time to first byte), whoever asks.
    with cluster.s3.recording() as rec, proxy.slowed(0.05):
        # A loader reads on, one file at a time, as the read-ahead fills the cache beside it.
        for key in order:
            assert read(fs, f"/m/{key}") == files[key], key
    ahead = fetched_ahead(cluster)
    gets = [g for g in rec.matching("GET") if "/ds/" in g.path]  # not the listings
    fetched = sorted(g.path.split("/", 2)[2] for g in gets)
    # Each object once, whoever fetched it; nothing below the folder.
    assert fetched == sorted(files), [k for k in fetched if fetched.count(k) > 1][:5]
    # Most of the folder was fetched ahead of the loader: its opens found it cached.
    assert ahead >= len(files) // 2, f"only {ahead:g} of {len(files)} files fetched ahead"
    for get in gets:
        conditions = {k.lower(): v for k, v in get.headers.items()}
        assert conditions.get("if-match"), f"GET {get.path} is not conditional on the listed version"


def test_the_read_ahead_keeps_at_most_its_setting_of_requests_in_flight(
        start_cluster: Any, bucket: str, proxy: StoreProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_WORKER_FOLDER_READAHEAD_FILES", "2")
    cluster, files = folder_cluster(start_cluster, bucket, 60, endpoint_url=proxy.endpoint_url)
    fs = cluster.fs(host="node-0")
    order = list(files)
    random.Random(3).shuffle(order)
    delay, watched = 0.5, 3.0
    with proxy.slowed(delay):  # every store answer waits: only requests in flight overlap
        for key in order[:4]:  # the trigger
            assert read(fs, f"/m/{key}") == files[key]
        wait_until(lambda: fetched_ahead(cluster) > 0, 30, "the read-ahead's first file")
        started = fetched_ahead(cluster)
        time.sleep(watched)
        done = fetched_ahead(cluster) - started
    # Two requests at a time, each at least `delay`: at most 2 * watched / delay (+2 under way).
    assert done <= 2 * watched / delay + 2, f"{done:g} files fetched ahead in {watched}s"


def test_one_file_read_in_a_big_folder_fetches_nothing_else(start_cluster: Any, bucket: str) -> None:
    cluster, files = folder_cluster(start_cluster, bucket, 200)
    fs = cluster.fs(host="node-0")
    with cluster.s3.recording() as rec:
        for key in list(files)[:3]:  # below the trigger (4 cold opens)
            assert read(fs, f"/m/{key}") == files[key]
        time.sleep(2)
    assert fetched_ahead(cluster) == 0
    assert len([g for g in rec.matching("GET") if "/ds/" in g.path]) == 3


def test_a_file_replaced_after_the_listing_is_never_served_as_the_listed_version(
        start_cluster: Any, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_WORKER_FOLDER_READAHEAD_FILES", "1")
    cluster, files = folder_cluster(start_cluster, bucket, 40)
    fs = cluster.fs(host="node-0")
    names = sorted(files)
    # The master lists the folder; the store then holds another object under the last name.
    assert read(fs, f"/m/{names[0]}") == files[names[0]]
    replaced = names[-1]
    new = os.urandom(SIZE)  # the same length: only the version tells them apart
    cluster.s3.put_object(bucket, replaced, new)
    for key in names[1:5]:  # the trigger: the read-ahead goes through the folder to its end
        assert read(fs, f"/m/{key}") == files[key]
    wait_until(lambda: fetched_ahead(cluster) >= 10, 60, "the read-ahead")
    try:
        got = read(cluster.fs(host="node-0"), f"/m/{replaced}")
    except FailedPrecondition as exc:
        assert "changed in the store" in str(exc), str(exc)
        got = read(cluster.fs(host="node-0"), f"/m/{replaced}")
    assert got == new, "bytes of an object replaced after the listing were served as the listed version"


def kept_opens(cluster: Cluster) -> float:
    return metric(cluster.workers[0].metrics(), "strata_worker_kept_opens")


def master_statuses(cluster: Cluster) -> float:
    return metric(cluster.master.metrics(), "strata_master_metadata_requests", '{method="GetStatus"}')


@pytest.mark.parametrize("host", ["node-0", "elsewhere"], ids=["short-circuit", "remote"])
def test_opens_of_the_files_a_read_ahead_fetched_ask_neither_the_master_nor_the_workers_loop(
        start_cluster: Any, bucket: str, host: str) -> None:
    cluster, files = folder_cluster(start_cluster, bucket, 40)
    order = list(files)
    random.Random(5).shuffle(order)
    fs = cluster.fs(host=host)
    for key in order[:4]:  # the trigger
        assert read(fs, f"/m/{key}") == files[key]
    wait_until(lambda: fetched_ahead(cluster) >= len(files) - 4, 60, "the read-ahead of the folder")
    before, kept_before = master_statuses(cluster), kept_opens(cluster)
    # A new loader process opens the rest: the worker answers each open from the listing the
    # read-ahead took from the master (its entries as reusable as the master's answers) and
    # the block it fetched, in the socket's thread (worker/keptopens.py).
    loader = cluster.fs(host=host)
    for key in order[4:]:
        assert read(loader, f"/m/{key}") == files[key], key
    asked = master_statuses(cluster) - before
    assert asked == 0, f"{asked:g} of {len(order) - 4} opens asked the master for a status"
    answered = kept_opens(cluster) - kept_before
    assert answered == len(order) - 4, f"{answered:g} of {len(order) - 4} opens answered without the worker's loop"


def test_the_read_ahead_copies_files_another_worker_holds_instead_of_fetching_them_from_the_store(
        start_cluster: Any, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_WORKER_FOLDER_READAHEAD_FILES", "3")
    cluster, files = folder_cluster(start_cluster, bucket, 40, workers=2)
    # A first job on worker-1's node caches the whole folder there.
    first = cluster.fs(host="node-1")
    for key in files:
        assert read(first, f"/m/{key}") == files[key]

    def located() -> bool:
        return all(b.worker_ids for key in files for b in first.client.block_locations(f"/m/{key}").blocks)

    wait_until(located, 10, "the master to know where every block is")
    # A job on worker-0's node reads it in another order: worker-0 misses every file, and its
    # read-ahead, triggered by those misses, copies the rest from worker-1.
    order = list(files)
    random.Random(7).shuffle(order)
    fs = cluster.fs(host="node-0")
    with cluster.s3.recording() as rec:
        for key in order:
            assert read(fs, f"/m/{key}") == files[key], key
        wait_until(lambda: fetched_ahead(cluster) > 0, 30, "worker-0's read-ahead")
    assert fetched_ahead(cluster) > 0
    fetched = [g.path for g in rec.matching("GET") if "/ds/" in g.path]
    assert not fetched, f"{len(fetched)} files another worker held were fetched from the store, e.g. {fetched[:3]}"
