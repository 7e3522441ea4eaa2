"""Which workers drain: the operator's view of cordoned nodes and evicted worker pods."""

from __future__ import annotations

from typing import Any

from strata.operator.drain import Drains, WorkerPod, is_disrupted, is_unschedulable


def pod(name: str, node: str = "node-1", *, uid: str = "", cluster: str = "demo", namespace: str = "ns",
        evicted: bool = False, labels: dict[str, str] | None = None) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if evicted:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"})
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
                         "labels": labels if labels is not None else {
                             "app.kubernetes.io/instance": cluster, "app.kubernetes.io/component": "worker",
                             "app.kubernetes.io/managed-by": "strata-operator"}},
            "spec": {"nodeName": node}, "status": {"conditions": conditions}}


def worker(body: dict[str, Any]) -> WorkerPod:
    found = WorkerPod.of(body)
    assert found is not None
    return found


def test_only_a_strata_worker_pod_is_a_worker_pod() -> None:
    assert worker(pod("demo-worker-0")) == WorkerPod("uid-demo-worker-0", "ns", "demo", "demo-worker-0", "node-1", False)
    assert WorkerPod.of(pod("demo-master-0", labels={"app.kubernetes.io/instance": "demo",
                                                      "app.kubernetes.io/component": "master",
                                                      "app.kubernetes.io/managed-by": "strata-operator"})) is None
    assert WorkerPod.of(pod("other", labels={"app.kubernetes.io/component": "worker"})) is None


def test_the_conditions_read() -> None:
    assert is_unschedulable({"spec": {"unschedulable": True}})
    assert not is_unschedulable({"spec": {}}) and not is_unschedulable({})
    assert is_disrupted(pod("w", evicted=True))
    assert not is_disrupted(pod("w")) and not is_disrupted({"status": {"conditions": [
        {"type": "DisruptionTarget", "status": "False"}]}})


def test_a_cordoned_node_drains_its_workers_until_it_is_uncordoned() -> None:
    drains = Drains()
    for name, node in (("demo-worker-0", "node-1"), ("demo-worker-1", "node-2"), ("demo-worker-2", "node-2")):
        assert not drains.pod_changed(worker(pod(name, node)))
    assert drains.node_changed("node-3", True) == []  # no worker there
    assert drains.node_changed("node-2", True) == [("ns", "demo")]
    assert drains.draining("ns", "demo") == ["demo-worker-1", "demo-worker-2"]
    assert drains.node_changed("node-2", True) == []  # told once
    assert drains.draining("other", "demo") == []
    assert drains.node_changed("node-2", False) == []
    assert drains.draining("ns", "demo") == []


def test_an_evicted_worker_drains_until_its_next_pod_runs_elsewhere() -> None:
    drains = Drains()
    assert not drains.pod_changed(worker(pod("demo-worker-0", "node-1")))
    assert drains.pod_changed(worker(pod("demo-worker-0", "node-1", evicted=True)))
    assert not drains.pod_changed(worker(pod("demo-worker-0", "node-1", evicted=True)))  # told once
    assert drains.draining("ns", "demo") == ["demo-worker-0"]
    # The StatefulSet's next pod of the same name, while the old one is still listed: the
    # name drains until the old pod is gone.
    assert not drains.pod_changed(worker(pod("demo-worker-0", "node-2", uid="next")))
    assert drains.draining("ns", "demo") == ["demo-worker-0"]
    drains.pod_gone("uid-demo-worker-0")
    assert drains.draining("ns", "demo") == []


def test_a_worker_pod_scheduled_onto_a_cordoned_node_drains() -> None:
    drains = Drains()
    drains.node_changed("node-1", True)
    assert not drains.pod_changed(worker(pod("demo-worker-0", "")))  # not scheduled yet
    assert drains.pod_changed(worker(pod("demo-worker-0", "node-1")))
