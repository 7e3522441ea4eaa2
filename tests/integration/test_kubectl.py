"""`kubectl strata` against a real master and worker: the commands reach the master only
through the connections the plugin's forward makes, with the token from the cluster's
Secret. Kubernetes itself is stood in for by `Objects` (the e2e suite runs the plugin
against a real API server's port-forward)."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from strata.cacheserver import kubectl
from strata.contract import constants

from .conftest import BLOCK_SIZE, TOKEN, Cluster

pytestmark = pytest.mark.timeout(120)


class Objects(kubectl.Kube):
    """A namespace holding one CacheCluster whose master is `cluster`'s, its auth Secret and
    a Mount; forwards go straight to the master's port and are counted."""

    def __init__(self, cluster: Cluster) -> None:  # no kubeconfig: nothing of Kube's own
        self.namespace = "ns"
        self.forwards = 0
        self._port = cluster.master.port
        self.items = {
            constants.CACHE_CLUSTER_PLURAL: [{
                "metadata": {"name": "demo", "namespace": "ns"},
                "status": {"phase": "Ready", "master": {"ready": True, "endpoint": f"demo-master-0.demo-master.ns.svc:{self._port}"},
                           "workers": {"summary": "1/1"}, "capacity": {"total": "64Mi", "used": "1Mi"},
                           "cache": {"hitRatio": 0.5}},
            }],
            constants.MOUNT_PLURAL: [{
                "metadata": {"name": "data", "namespace": "ns"},
                "spec": {"cluster": "demo", "path": "/k", "source": "s3://bucket"},
                "status": {"phase": "Mounted", "cache": {"cachedBytes": "1Mi"}},
            }],
        }

    def objects(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        assert namespace == "ns"
        return self.items[plural]

    def secret_value(self, namespace: str, name: str, key: str) -> str:
        assert (namespace, name, key) == ("ns", "demo-auth", "token")
        return TOKEN

    def forward(self, namespace: str, pod: str, port: int) -> socket.socket:
        assert (namespace, pod, port) == ("ns", "demo-master-0", self._port)
        self.forwards += 1
        return socket.create_connection(("127.0.0.1", port), timeout=10)


def plugin(kube: Objects, *argv: str) -> int:
    return kubectl.run(kubectl.build_parser().parse_args(list(argv)), kube)


def test_status_load_blocks_pin_and_free(start_cluster: Any, bucket: str, capsys: pytest.CaptureFixture[str]) -> None:
    cluster: Cluster = start_cluster(workers=1)
    data = bytes(range(256)) * (2 * BLOCK_SIZE // 256)
    cluster.s3.put_object(bucket, "a.bin", data)
    cluster.mount_bucket("/k", bucket)
    kube = Objects(cluster)

    assert plugin(kube, "status") == 0
    out = capsys.readouterr().out
    assert "CacheCluster ns/demo: Ready, master ready, workers 1/1" in out
    assert any(line.split()[:4] == ["data", "/k", "s3://bucket", "Mounted"] for line in out.splitlines())
    assert "hit ratio" in out and "node-0" in out  # the master's report: workers and tiers

    assert plugin(kube, "load", "/k/a.bin") == 0
    assert "loaded 1/1 files" in capsys.readouterr().out
    assert plugin(kube, "blocks", "/k/a.bin") == 0
    blocks = json.loads(capsys.readouterr().out)["blocks"]
    assert [b["index"] for b in blocks] == [0, 1]
    assert plugin(kube, "pin", "/k/a.bin") == 0
    assert plugin(kube, "-c", "demo", "free", "/k/a.bin") == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("freed")
    assert kube.forwards >= 5  # every command went through the forward


def test_a_namespace_with_two_clusters_needs_a_name(start_cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    cluster: Cluster = start_cluster(workers=1)
    kube = Objects(cluster)
    other = json.loads(json.dumps(kube.items[constants.CACHE_CLUSTER_PLURAL][0]))
    other["metadata"]["name"] = "other"
    kube.items[constants.CACHE_CLUSTER_PLURAL].append(other)
    with pytest.raises(kubectl.FailedPrecondition, match="CacheClusters demo, other: pick one with -c NAME"):
        plugin(kube, "status")
    assert plugin(kube, "-c", "demo", "status") == 0
