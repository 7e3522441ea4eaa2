"""Drained nodes: a worker whose node is cordoned (the first step of `kubectl drain`) or
whose pod is being evicted (the pod condition DisruptionTarget) leaves the cluster as a
scaled-in worker does. The operator tells the master to decommission its name, so the
worker's stop hands the blocks it alone holds to the workers that stay instead of keeping
them on a node it will not come back to. The name serves again once no pod of it is on a
cordoned node or being evicted: its new pod runs elsewhere, or the node is uncordoned.

`Drains` holds what the operator's watches of nodes and worker pods tell, in memory (the
watches' first listing fills it again when the operator starts). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from strata.operator import constants as c

Obj = Mapping[str, Any]

# The pod condition the API server sets on a pod it is about to delete for a disruption
# (an eviction by `kubectl drain`, a preemption, a taint).
DISRUPTION_TARGET: Final = "DisruptionTarget"
# The labels that mark a Strata worker pod (the operator's kopf watch filters on them).
WORKER_POD_LABELS: Final = {c.LABEL_COMPONENT: c.COMPONENT_WORKER, c.LABEL_MANAGED_BY: c.MANAGED_BY}


def is_unschedulable(node: Obj) -> bool:
    """A cordoned node: no new pods go there (`kubectl cordon`, the first step of a drain)."""
    return bool((node.get("spec") or {}).get("unschedulable"))


def is_disrupted(pod: Obj) -> bool:
    """A pod the API server marked for deletion by a disruption (an eviction)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(cond.get("type") == DISRUPTION_TARGET and cond.get("status") == "True" for cond in conditions)


@dataclass(frozen=True)
class WorkerPod:
    """A Strata worker pod as the drain sees it."""

    uid: str
    namespace: str
    cluster: str  # the CacheCluster's name
    name: str     # the pod's, also the worker's name at the master
    node: str     # "" while unscheduled
    disrupted: bool

    @classmethod
    def of(cls, pod: Obj) -> WorkerPod | None:
        """The worker pod `pod` is, or None if it is no Strata worker pod."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if any(labels.get(k) != v for k, v in WORKER_POD_LABELS.items()) or not labels.get(c.LABEL_INSTANCE):
            return None
        return cls(uid=str(meta.get("uid", "")), namespace=str(meta.get("namespace", "")),
                   cluster=str(labels[c.LABEL_INSTANCE]), name=str(meta.get("name", "")),
                   node=str((pod.get("spec") or {}).get("nodeName") or ""), disrupted=is_disrupted(pod))


ClusterKey = tuple[str, str]  # (namespace, CacheCluster name)


class Drains:
    """The cordoned nodes and the worker pods, from the operator's watches; which workers
    drain. Its size is the cluster's worker pods and cordoned nodes."""

    def __init__(self) -> None:
        self._cordoned: set[str] = set()
        self._pods: dict[str, WorkerPod] = {}  # by uid: a pod's successor has the same name

    def _drains(self, pod: WorkerPod) -> bool:
        return pod.disrupted or (bool(pod.node) and pod.node in self._cordoned)

    def node_changed(self, node: str, unschedulable: bool) -> list[ClusterKey]:
        """Take a node's state (`unschedulable` False also when it is deleted); returns the
        clusters with a worker pod that drains now and did not before."""
        before = [p for p in self._pods.values() if p.node == node and not self._drains(p)]
        if unschedulable:
            self._cordoned.add(node)
        else:
            self._cordoned.discard(node)
        return sorted({(p.namespace, p.cluster) for p in before if self._drains(p)})

    def pod_changed(self, pod: WorkerPod) -> bool:
        """Take a worker pod's state; True when it drains now and did not before."""
        previous = self._pods.get(pod.uid)
        self._pods[pod.uid] = pod
        return self._drains(pod) and not (previous is not None and self._drains(previous))

    def pod_gone(self, uid: str) -> None:
        self._pods.pop(uid, None)

    def draining(self, namespace: str, cluster: str) -> list[str]:
        """The names of the cluster's workers that drain, sorted."""
        return sorted({p.name for p in self._pods.values()
                       if p.namespace == namespace and p.cluster == cluster and self._drains(p)})
