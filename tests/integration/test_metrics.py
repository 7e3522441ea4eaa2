"""What a master's and a worker's /metrics show after a read workload, on real processes:
every metric the alert rules and the dashboard use is there with the values the workload
made, and `promtool check metrics` finds nothing to complain about."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from strata.contract.errors import NotFound
from strata.contract.proto import strata_pb2 as pb
from strata.operator.handlers.metrics import MountPhases, metrics_registry
import prometheus
from promtool import metrics_problems

from .conftest import BLOCK_SIZE, Cluster, http_get, metric, wait_until

pytestmark = pytest.mark.timeout(120)

CHART_FILES = Path(__file__).parents[2] / "charts" / "strata" / "files"


def exported_names(exposition: str) -> set[str]:
    """The sample names an exposition's families give (histograms with `_bucket`, `_sum`
    and `_count`)."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.M):
        suffixes = {"histogram": ("_bucket", "_sum", "_count")}.get(kind, ("",))
        names.update(name + suffix for suffix in suffixes)
    return names


def used_names() -> set[str]:
    """The strata_* metric names the alert rules and the dashboard's panels query."""
    rules = yaml.safe_load((CHART_FILES / "alerts.yaml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((CHART_FILES / "dashboard.json").read_text())
    exprs += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    labels = {"strata_cluster", "strata_component"}  # the scrape's target labels
    return {name for expr in exprs for name in re.findall(r"\bstrata_[a-z_]+", expr)} - labels


def test_servers_export_what_the_rules_and_dashboard_use(start_cluster: Any, bucket: str) -> None:
    cluster: Cluster = start_cluster(workers=1)
    data = bytes(range(256)) * (3 * BLOCK_SIZE // 256)
    cluster.s3.put_object(bucket, "a.bin", data)
    cluster.mount_bucket("/m", bucket)
    fs = cluster.fs()
    assert fs.cat_file("/m/a.bin") == data  # misses: from the store
    assert fs.cat_file("/m/a.bin") == data  # hits
    with pytest.raises(FileNotFoundError):
        fs.cat_file("/m/absent.bin")
    # The master's own answer for a missing file, asked of it with time to spare: the client
    # above may have had its answer from a worker standing in for a master slow to answer.
    with pytest.raises(NotFound):
        fs.client.call("GetStatus", pb.GetStatusRequest(path="/m/absent.bin"), what="stat", timeout=60)

    status, master = http_get(cluster.master.http_port, "/metrics")
    assert status == 200
    worker = cluster.workers[0].metrics()
    for text in (master, worker):
        assert metrics_problems(text) == ""

    # The master: requests by method and code, timed; the store's calls, timed.
    assert metric(master, "strata_master_requests", '{code="OK",method="GetStatus"}') >= 1
    assert metric(master, "strata_master_requests", '{code="NOT_FOUND",method="GetStatus"}') >= 1
    assert metric(master, "strata_master_request_seconds_count", '{method="GetStatus"}') >= 2
    assert metric(master, "strata_store_request_seconds_count", '{operation="info"}') >= 1
    # The worker: hits and misses by mount, bytes by path, reader and tier, store reads timed.
    blocks = 3
    assert metric(worker, "strata_worker_mount_cache_misses", '{mount="/m"}') == blocks
    assert metric(worker, "strata_worker_mount_cache_hits", '{mount="/m"}') >= blocks
    served = {client: sum(metric(worker, "strata_worker_served_bytes", f'{{client="{client}",path="{path}"}}')
                          for path in ("short_circuit", "data_port", "grpc"))
              for client in ("fsspec", "fuse", "other")}
    assert served["fsspec"] == metric(worker, "strata_worker_bytes_served") >= 2 * len(data)
    assert served["fuse"] == served["other"] == 0
    assert metric(worker, "strata_worker_cache_hit_bytes", '{medium="MEM"}') >= len(data)
    assert metric(worker, "strata_worker_tier_evicted_blocks", '{medium="MEM"}') == 0
    assert metric(worker, "strata_store_request_seconds_count", '{operation="read"}') == blocks
    assert "strata_store_errors" in worker


    # Every metric the alerts and the dashboard use is one the servers (and the operator) export.
    operator = metrics_registry()
    operator.register(MountPhases(expiry=60))
    exported = exported_names(master) | exported_names(worker) | exported_names(generate_latest(operator).decode())
    assert used_names() - exported == set()


def test_a_real_prometheus_has_data_for_every_dashboard_panel(start_cluster: Any, bucket: str, tmp_path: Path) -> None:
    if not prometheus.available():
        pytest.fail("prometheus is missing: run scripts/install-system-deps.sh (Debian package prometheus)")
    cluster: Cluster = start_cluster(workers=2)
    data = bytes(range(256)) * (2 * BLOCK_SIZE // 256)
    for i in range(3):
        cluster.s3.put_object(bucket, f"f{i}.bin", data)
    cluster.mount_bucket("/d", bucket)
    labels = {"namespace": "local", "strata_cluster": "local"}
    server = prometheus.Prometheus(tmp_path)
    try:
        server.scrape(
            [{"targets": [f"127.0.0.1:{cluster.master.http_port}"],
              "labels": {**labels, "pod": "master", "strata_component": "master"}}]
            + [{"targets": [f"127.0.0.1:{w.http_port}"], "labels": {**labels, "pod": f"worker-{i}", "strata_component": "worker"}}
               for i, w in enumerate(cluster.workers)])
        wait_until(lambda: (t := server.api("targets")["activeTargets"]) and len(t) == 3
                   and all(x["health"] == "up" for x in t), 30, "Prometheus to scrape the master and both workers")
        rules = [r for group in server.api("rules")["groups"] for r in group["rules"]]
        assert len(rules) == 8 and all(r["health"] == "ok" for r in rules), rules
        fs = cluster.fs()
        for _ in range(2):  # misses, then hits
            for i in range(3):
                assert fs.cat_file(f"/d/f{i}.bin") == data
        wait_until(lambda: not prometheus.empty_panels(server, "local", "local"), 30,
                   "every dashboard panel to have data")
    finally:
        server.stop()
