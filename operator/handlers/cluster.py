"""CacheCluster handlers: on create/resume/spec change, and on a timer that re-applies the
children and refreshes status from the master."""

from __future__ import annotations

from typing import Any

import kopf

from strata.operator import constants as c
from strata.operator.handlers.common import deps_of, run_locked, settle
from strata.operator.reconcile import reconcile_cluster
from strata.operator.settings import OperatorSettings

RESOURCE = (c.GROUP, c.VERSION, c.CACHE_CLUSTER_PLURAL)


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    @kopf.on.resume(*RESOURCE, registry=registry)
    @kopf.on.create(*RESOURCE, registry=registry)
    @kopf.on.update(*RESOURCE, field="spec", registry=registry)
    async def cluster_changed(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        deps = deps_of(memo)
        outcome = await run_locked(memo, lambda: reconcile_cluster(deps, body))
        settle(outcome, retry_delay=settings.retry_delay, logger=logger)

    @kopf.timer(*RESOURCE, interval=settings.reconcile_interval, initial_delay=settings.reconcile_interval,
                registry=registry)
    async def cluster_tick(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        deps = deps_of(memo)
        outcome = await run_locked(memo, lambda: reconcile_cluster(deps, body))
        if not outcome.done:
            logger.debug("not ready: %s", outcome.message)

    @kopf.on.delete(*RESOURCE, registry=registry)
    async def cluster_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        """Say Terminating; the children go with the cluster (ownerReferences)."""
        deps = deps_of(memo)
        await run_locked(memo, lambda: reconcile_cluster(deps, body))
