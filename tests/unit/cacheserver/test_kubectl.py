"""`kubectl strata`'s own parts: the master's pod from a CacheCluster's status, which
cluster a command means, the status view, and the byte relay of the forward."""

from __future__ import annotations

import socket
import threading

import pytest

from strata.cacheserver import kubectl
from strata.contract.errors import FailedPrecondition, NotFound


def test_the_master_pod_and_port_come_from_the_status_endpoint() -> None:
    assert kubectl.master_pod("demo-master-0.demo-master.ns.svc:19998") == ("demo-master-0", 19998)
    assert kubectl.master_pod("demo-master-0.demo-master.ns.svc.cluster.local:19998") == ("demo-master-0", 19998)
    with pytest.raises(FailedPrecondition, match="'demo-master-0' is not HOST:PORT"):
        kubectl.master_pod("demo-master-0")


def cluster(name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "ns"}}


def test_which_cluster_a_command_means() -> None:
    assert kubectl.pick_cluster([cluster("a")], "ns", None)["metadata"] == {"name": "a", "namespace": "ns"}
    assert kubectl.pick_cluster([cluster("a"), cluster("b")], "ns", "b")["metadata"]["name"] == "b"
    with pytest.raises(FailedPrecondition, match="namespace ns has CacheClusters a, b: pick one with -c NAME"):
        kubectl.pick_cluster([cluster("b"), cluster("a")], "ns", None)
    with pytest.raises(NotFound, match="no CacheCluster in namespace ns; pick a namespace with -n"):
        kubectl.pick_cluster([], "ns", None)
    with pytest.raises(NotFound, match="no CacheCluster 'c' in namespace ns"):
        kubectl.pick_cluster([cluster("a")], "ns", "c")


def test_status_shows_the_cluster_and_only_its_mounts_with_why_they_failed() -> None:
    demo = {"metadata": {"name": "demo", "namespace": "ns"},
            "status": {"phase": "Degraded", "master": {"ready": True}, "workers": {"summary": "2/3"},
                       "capacity": {"total": "3Gi", "used": "1Gi"}, "cache": {"hitRatio": 0.93},
                       "conditions": [{"type": "Reconciling", "status": "True", "reason": "WorkersNotReady",
                                       "message": "2 of 3 workers are ready"}]}}
    mounts = [
        {"metadata": {"name": "logs"}, "spec": {"cluster": "demo", "path": "/logs", "source": "s3://l"},
         "status": {"phase": "Failed", "conditions": [
             {"type": "Stalled", "status": "True", "message": "bucket 'l' does not exist"}]}},
        {"metadata": {"name": "data"}, "spec": {"cluster": "demo", "path": "/data", "source": "s3://d"},
         "status": {"phase": "Mounted", "cache": {"cachedBytes": "1Gi"}}},
        {"metadata": {"name": "elsewhere"}, "spec": {"cluster": "other", "path": "/x", "source": "s3://x"}},
    ]
    lines = kubectl.status_lines(demo, mounts)
    assert lines[0] == ("CacheCluster ns/demo: Degraded, master ready, workers 2/3, capacity 3Gi (used 1Gi), "
                        "hit ratio 0.93")
    assert lines[1] == "  Reconciling: WorkersNotReady: 2 of 3 workers are ready"
    table = [line.split(None, 5) for line in lines[3:]]
    assert table == [["MOUNT", "PATH", "SOURCE", "PHASE", "CACHED", "MESSAGE"],
                     ["data", "/data", "s3://d", "Mounted", "1Gi"],
                     ["logs", "/logs", "s3://l", "Failed", "-", "bucket 'l' does not exist"]]


def test_the_relay_moves_bytes_both_ways_and_closes_both_ends() -> None:
    local, near = socket.socketpair()
    far, remote = socket.socketpair()
    thread = threading.Thread(target=kubectl.relay, args=(near, far))
    thread.start()
    big = bytes(range(256)) * 1024  # more than one relay read
    local.sendall(big)
    got = b""
    while len(got) < len(big):
        got += remote.recv(1 << 20)
    assert got == big
    remote.sendall(b"answer")
    assert local.recv(100) == b"answer"
    remote.close()  # the master's side ends: so does the reader's
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert local.recv(100) == b""
