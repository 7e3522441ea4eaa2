"""CacheCluster handlers: reconcile on create/resume/spec change and on a timer that
re-applies the children and refreshes status from the master; say Terminating on delete."""

from __future__ import annotations

from typing import Any

import kopf

from strata.operator import constants as c
from strata.operator.handlers.common import deps_of, register_reconciler, run_locked
from strata.operator.reconcile import Deps, Outcome, reconcile_cluster
from strata.operator.settings import OperatorSettings

RESOURCE = (c.GROUP, c.VERSION, c.CACHE_CLUSTER_PLURAL)


async def _reconcile(deps: Deps, body: kopf.Body, memo: kopf.Memo) -> Outcome:
    return await reconcile_cluster(deps, body)


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    register_reconciler(registry, settings, RESOURCE, "cluster", _reconcile)

    @kopf.on.delete(*RESOURCE, id="delete-cluster", registry=registry)
    async def cluster_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        """Say Terminating; the children go with the cluster (ownerReferences)."""
        deps = deps_of(memo)
        await run_locked(memo, lambda: reconcile_cluster(deps, body))
