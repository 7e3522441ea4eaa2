"""The drain's handlers: kopf's watches of Nodes and of Strata worker pods keep the
operator's `Drains` (strata.operator.drain) current, and a worker that starts to drain (its
node cordoned, its pod evicted) is told to the master at once, so that the worker learns at
its stop that it leaves. Event handlers only: nothing is written to nodes or pods.
"""

from __future__ import annotations

from typing import Any

import kopf

from strata.operator.drain import WORKER_POD_LABELS, WorkerPod, is_unschedulable
from strata.operator.handlers.common import deps_of
from strata.operator.reconcile.cluster import tell_master_of_drain

DELETED = "DELETED"


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event("", "v1", "nodes", id="drain-nodes", registry=registry)
    async def node_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        deps = deps_of(memo)
        cordoned = event.get("type") != DELETED and is_unschedulable(body)
        for namespace, cluster in deps.drains.node_changed(str(body.metadata.name), cordoned):
            await tell_master_of_drain(deps, namespace, cluster)

    @kopf.on.event("", "v1", "pods", id="drain-pods", labels=dict(WORKER_POD_LABELS), registry=registry)
    async def pod_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        deps = deps_of(memo)
        pod = WorkerPod.of(body)
        if pod is None:
            return
        if event.get("type") == DELETED:
            deps.drains.pod_gone(pod.uid)
        elif deps.drains.pod_changed(pod):
            await tell_master_of_drain(deps, pod.namespace, pod.cluster)
