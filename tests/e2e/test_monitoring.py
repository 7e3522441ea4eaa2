"""What operators look at, on the real cluster: a real Prometheus (Debian's package, started
by the test on this machine, listening on 127.0.0.1) scrapes the chart's operator and a
CacheCluster's master and workers with the chart's own scrape job, loads the chart's alert
rules, and after a read workload every dashboard panel's query returns data; every server's
/metrics passes `promtool check metrics`; `kubectl strata` runs against the cluster.

Debian's Prometheus has no Kubernetes discovery, so the targets come from a file: each pod's
labels and annotations as `__meta_kubernetes_pod_*` labels (what pod discovery gives), and
Prometheus applies files/scrape-config.yaml's relabelings to them unchanged.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import prometheus
from kit import REPO, Cluster, wait_until
from prometheus import Prometheus
from test_strata import (  # noqa: F401 - fixtures
    RELEASE_NS,
    _finished,
    _master_report,
    _reader_pod,
    dataset,
    ready_cluster,
    s3,
    s3_mount,
    strata,
)

Obj = dict[str, Any]
FILES = REPO / "charts" / "strata" / "files"


def _cached_bytes(cluster: Cluster, namespace: str) -> int:
    mounts = _master_report(cluster, namespace).get("mounts", [])
    return sum(int(m.get("cachedBytes", 0)) for m in mounts if m.get("mount", {}).get("path") == "/data")


def _meta(pod: Obj) -> dict[str, str]:
    """The labels Kubernetes pod discovery gives a pod (the ones the scrape job reads)."""
    meta = pod["metadata"]
    labels = {"__meta_kubernetes_namespace": meta["namespace"], "__meta_kubernetes_pod_name": meta["name"],
              "__meta_kubernetes_pod_ip": pod["status"].get("podIP", ""),
              "__meta_kubernetes_pod_phase": pod["status"].get("phase", "")}
    for kind, values in (("label", meta.get("labels") or {}), ("annotation", meta.get("annotations") or {})):
        for key, value in values.items():
            labels[f"__meta_kubernetes_pod_{kind}_{re.sub(r'[^a-zA-Z0-9_]', '_', key)}"] = value
    return labels


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Prometheus]:
    """Prometheus with the chart's scrape job (its relabelings) and alert rules."""
    if not prometheus.available():
        pytest.fail("prometheus is missing: run scripts/install-system-deps.sh (Debian package prometheus)")
    running = Prometheus(tmp_path, yaml.safe_load((FILES / "scrape-config.yaml").read_text()))
    try:
        yield running
    finally:
        running.stop()


def _plugin(cluster: Cluster, *args: str) -> str:
    """`kubectl strata ARGS` as a user runs it (the package's kubectl-strata, the kubeconfig)."""
    plugin = Path(sys.executable).parent / "kubectl-strata"
    proc = subprocess.run([str(plugin), *args], capture_output=True, text=True, env=cluster.env(), timeout=120)
    assert proc.returncode == 0, f"kubectl strata {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def test_prometheus_scrapes_every_server_and_every_panel_has_data(
    strata: Cluster, namespace: str, s3: dict[str, str], dataset: dict[str, bytes], server: Prometheus,
) -> None:
    ready_cluster(strata, namespace)
    strata.apply(s3_mount(s3), namespace)
    wait_until(lambda: strata.get("mount", "data", namespace).get("status", {}).get("phase") == "Mounted",
               timeout=120, what="Mount data phase Mounted")
    servers = strata.items("pods", namespace, selector="app.kubernetes.io/managed-by=strata-operator")
    operators = strata.items("pods", RELEASE_NS, selector="app.kubernetes.io/component=operator")
    # What Kubernetes pod discovery would give: each pod's labels and annotations.
    server.scrape([{"targets": [f"{p['status'].get('podIP', '')}:80"], "labels": _meta(p)} for p in servers + operators])

    def all_up() -> list[Obj] | None:
        active = server.api("targets")["activeTargets"]
        return active if len(active) == len(servers) + len(operators) and all(t["health"] == "up" for t in active) else None

    active = wait_until(all_up, timeout=60, what="every server to be scraped",
                        diagnose=lambda: json.dumps(server.api("targets")["activeTargets"], indent=1)[-4000:])
    components = sorted(t["labels"].get("strata_component", "") for t in active)
    assert components == sorted(["master", "worker", "worker"] + ["operator"] * len(operators))
    assert {t["labels"].get("strata_cluster") for t in active if t["labels"]["strata_component"] != "operator"} == {"demo"}
    # Every server's /metrics, as Prometheus scrapes it, passes promtool.
    for target in active:
        with urllib.request.urlopen(target["scrapeUrl"], timeout=10) as answer:
            text = answer.read().decode()
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), (target["scrapeUrl"], check.stdout,
                                                                                      check.stderr)
    # The chart's rules load, and none is broken.
    rules = [r for g in server.api("rules")["groups"] for r in g["rules"]]
    assert len(rules) == 8 and all(r["health"] == "ok" for r in rules), rules

    # A read workload: misses, then hits from a pod on another node (the first node's FUSE
    # mount may answer a second reader there from the page cache, asking no worker).
    first = _reader_pod("first-read", sorted(dataset), {"strata.dev/locality": "disabled"})
    strata.apply(first, namespace)
    node = _finished(strata, namespace, "first-read")["spec"]["nodeName"]
    # The second reader's worker copies the blocks from their holder (hits there) once the
    # master knows where they are; asked before, it would fetch them from the store again.
    wait_until(lambda: _cached_bytes(strata, namespace) >= sum(map(len, dataset.values())), timeout=60,
               what="the master to know the first read's blocks are cached")
    second = _reader_pod("second-read", sorted(dataset), {"strata.dev/locality": "disabled"})
    second["spec"]["nodeName"] = next(n["metadata"]["name"] for n in strata.items("nodes") if n["metadata"]["name"] != node)
    strata.apply(second, namespace)
    _finished(strata, namespace, "second-read")

    # Every panel answers once the workload's counters were scraped twice (rates need two).
    wait_until(lambda: not prometheus.empty_panels(server, namespace, "demo"), timeout=60,
               what="every dashboard panel to have data",
               diagnose=lambda: "\n".join(prometheus.empty_panels(server, namespace, "demo")))
    picture = prometheus.dashboard_picture()
    panels = picture.panels()
    # Over the whole workload: a one-minute window (the dashboard's default) may already have
    # passed the reads when the slowest panel got its data on a loaded machine (ratio 0).
    ratio = server.api("query", query=picture.concrete(panels[1]["targets"][0]["expr"], namespace, "demo",
                                                       rate_interval="10m"))["result"]
    assert [r["metric"]["mount"] for r in ratio] == ["/data"] and 0 < float(ratio[0]["value"][1]) < 1
    phase = server.api("query", query=f'strata_operator_mount_phase{{mount_namespace="{namespace}",mount="data"}} == 1')
    assert [r["metric"]["phase"] for r in phase["result"]] == ["Mounted"]

    saved = os.environ.get("STRATA_E2E_DASHBOARD_DATA")
    if saved:  # scripts/dashboard_picture.py --data FILE draws it
        Path(saved).write_text(json.dumps(picture.collect(server.url, namespace, "demo", minutes=3, step=2)))

    # kubectl strata, as a user runs it: the cluster found from the kubeconfig.
    status = _plugin(strata, "-n", namespace, "status")
    assert f"CacheCluster {namespace}/demo: Ready, master ready, workers 2/2" in status, status
    assert any(line.split()[:4] == ["data", "/data", "s3://e2e-data", "Mounted"] for line in status.splitlines()), status
    assert "hit ratio" in status and "demo-worker-0" in status, status
    assert "loaded" in _plugin(strata, "-n", namespace, "load", "/data/train")
    blocks = json.loads(_plugin(strata, "-n", namespace, "-c", "demo", "blocks", "/data/train/part-0.bin"))["blocks"]
    assert blocks and all(b["hosts"] for b in blocks), blocks
    assert "pinned" in _plugin(strata, "-n", namespace, "pin", "/data/train")
    assert "freed" in _plugin(strata, "-n", namespace, "free", "/data/README")
