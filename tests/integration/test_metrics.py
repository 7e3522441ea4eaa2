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

from strata.operator.handlers.metrics import MountPhases, metrics_registry
from tests.support.promtool import metrics_problems

from .conftest import BLOCK_SIZE, Cluster, http_get, metric

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
    # The worker: hits and misses by mount, bytes by path and by tier, store reads timed.
    blocks = 3
    assert metric(worker, "strata_worker_mount_cache_misses", '{mount="/m"}') == blocks
    assert metric(worker, "strata_worker_mount_cache_hits", '{mount="/m"}') >= blocks
    served = sum(metric(worker, "strata_worker_served_bytes", f'{{path="{path}"}}')
                 for path in ("short_circuit", "data_port", "grpc"))
    assert served == metric(worker, "strata_worker_bytes_served") >= 2 * len(data)
    assert metric(worker, "strata_worker_cache_hit_bytes", '{medium="MEM"}') >= len(data)
    assert metric(worker, "strata_worker_tier_evicted_blocks", '{medium="MEM"}') == 0
    assert metric(worker, "strata_store_request_seconds_count", '{operation="read"}') == blocks
    assert "strata_store_errors" in worker


    # Every metric the alerts and the dashboard use is one the servers (and the operator) export.
    operator = metrics_registry()
    operator.register(MountPhases(expiry=60))
    exported = exported_names(master) | exported_names(worker) | exported_names(generate_latest(operator).decode())
    assert used_names() - exported == set()
