"""New processes on a node stat what the node knows from its status table, with no request.

The node's worker publishes the reusable statuses it keeps in shared memory
(worker/published.py); a new process maps it once and answers stats by a lookup
(client/nodetable.py). Real processes: moto's S3 server, a master and a worker as users start
them, and each stat'ing process a new Python process.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from strata.contract.errors import StrataError
from strata.cacheserver.client.nodetable import NodeTable
from strata.cacheserver.client.transfer import Patience, ShortCircuitReader
from sealing import assert_no_reader_can_write

from .conftest import DATA_TOKEN, Cluster
from .test_node_answers import SHORT_CIRCUIT, load, metadata_requests

pytestmark = pytest.mark.timeout(240)


def socket_requests(cluster: Cluster) -> float:
    return cluster.worker_metric(0, "strata_worker_block_socket_requests")


def spread_dataset(cluster: Cluster, bucket: str, folders: int, each: int) -> dict[str, int]:
    """`folders` folders of `each` files in the bucket; the size of each file by its path under /ds."""
    sizes = {}
    for f in range(folders):
        for i in range(each):
            data = os.urandom(1000 + 10 * f + i)
            cluster.s3.put_object(bucket, f"train/{f}/s-{i}.bin", data)
            sizes[f"/ds/train/{f}/s-{i}.bin"] = len(data)
    return sizes


def test_a_new_process_stats_warm_files_with_no_request_per_stat(start_cluster: Any, bucket: str,
                                                                 tmp_path: Path) -> None:
    """After one process stat'ed a read-only mount's files, the next new process stats them
    all with one request to the worker in all (the table's descriptor) and none to the master,
    however many folders they lie in."""
    cluster: Cluster = start_cluster(workers=1)
    sizes = spread_dataset(cluster, bucket, folders=5, each=4)
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=120)
    paths = sorted(sizes)
    assert {p: r[0] for p, r in load(cluster, SHORT_CIRCUIT, paths, tmp_path, stat=True).items()} == sizes  # warm
    before = socket_requests(cluster), metadata_requests(cluster, "GetStatus"), metadata_requests(cluster, "ListStatus")
    for _ in range(2):
        assert {p: r[0] for p, r in load(cluster, SHORT_CIRCUIT, paths, tmp_path, stat=True).items()} == sizes
    after = socket_requests(cluster), metadata_requests(cluster, "GetStatus"), metadata_requests(cluster, "ListStatus")
    assert after[0] - before[0] == 2, "one request a process (the table), none a stat"
    assert after[1:] == before[1:], "no stat reached the master"


def socket_path(cluster: Cluster) -> str:
    workers = cluster.fs(host=SHORT_CIRCUIT).client.workers()
    return next(w.domain_socket for w in workers if w.domain_socket)


def patience() -> Patience:
    return Patience(connect_timeout=5.0, check_after=5.0, block_timeout=10.0, alive=lambda: True)


def test_the_table_goes_to_a_data_token_only_and_no_reader_can_write_it(start_cluster: Any, bucket: str,
                                                                        tmp_path: Path) -> None:
    cluster: Cluster = start_cluster(workers=1)
    sizes = spread_dataset(cluster, bucket, folders=1, each=3)
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=120)
    load(cluster, SHORT_CIRCUIT, sorted(sizes), tmp_path, stat=True)
    where = socket_path(cluster)
    with pytest.raises(StrataError) as refused:
        ShortCircuitReader(where, "not-a-token", patience()).status_table()
    assert refused.value.code.name in ("UNAUTHENTICATED", "PERMISSION_DENIED"), refused.value

    fd = ShortCircuitReader(where, DATA_TOKEN, patience()).status_table()
    try:
        table = NodeTable(fd)
        path = sorted(sizes)[0]
        info = table.status(path)
        assert info is not None and info.length == sizes[path] and 0 < info.valid_for_ms <= 120_000
        assert_no_reader_can_write(fd)
    finally:
        os.close(fd)


def test_the_table_answers_a_changed_file_only_within_the_mounts_interval(start_cluster: Any, bucket: str,
                                                                          tmp_path: Path) -> None:
    """A read-only mount synced every 6 s: a file changed in the store is answered from the
    table as it was (the master would answer the same) until its validity ends, and a new
    process after that sees the new size."""
    cluster: Cluster = start_cluster(workers=1)
    cluster.s3.put_object(bucket, "f.bin", b"the first version")
    interval = 6.0
    cluster.mount_bucket("/ro", bucket, read_only=True, metadata_sync_interval=int(interval))
    # The master's validity counts from its store's answer, taken between these two times (at
    # the mount, or at the first stat: a loader process may take seconds to start on a busy host).
    asked_at = time.monotonic()
    assert load(cluster, SHORT_CIRCUIT, ["/ro/f.bin"], tmp_path, stat=True)["/ro/f.bin"][0] == 17
    answered_by = time.monotonic()
    cluster.s3.put_object(bucket, "f.bin", b"the second, longer version")
    requests = socket_requests(cluster)
    got = load(cluster, SHORT_CIRCUIT, ["/ro/f.bin"], tmp_path, stat=True)["/ro/f.bin"]
    if time.monotonic() - asked_at < interval - 2.5:  # well within the interval: from the table
        assert (got[0], socket_requests(cluster) - requests) == (17, 1)
    time.sleep(max(0.0, answered_by + interval + 0.5 - time.monotonic()))
    assert load(cluster, SHORT_CIRCUIT, ["/ro/f.bin"], tmp_path, stat=True)["/ro/f.bin"][0] == 26


def test_a_process_finds_the_table_of_a_restarted_worker(start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    """A worker killed and started again writes a new table and cannot retire the old one: a
    process that mapped the old one notices (a status the worker answered as reusable is not
    in it) and maps the new one, whose statuses then answer its stats with no request."""
    cluster: Cluster = start_cluster(workers=1)
    sizes = spread_dataset(cluster, bucket, folders=1, each=4)
    a, b, c, d = sorted(sizes)
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=120)
    fs = cluster.fs(host=SHORT_CIRCUIT)
    assert fs.info(a)["size"] == sizes[a]  # maps the first worker's table
    worker = cluster.workers[0]
    worker.stop(signal.SIGKILL)
    worker.start()
    worker.wait_healthy()
    assert fs.info(b)["size"] == sizes[b]  # asked of the new worker: published in its table only
    assert {p: r[0] for p, r in load(cluster, SHORT_CIRCUIT, [c, d], tmp_path, stat=True).items()} == \
        {c: sizes[c], d: sizes[d]}
    requests = socket_requests(cluster)
    assert fs.info(c)["size"] == sizes[c] and fs.info(d)["size"] == sizes[d]
    assert socket_requests(cluster) - requests == 1, "the new table asked for once, then no request a stat"
