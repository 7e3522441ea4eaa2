"""Mount handlers: mount on create/resume/spec change, keep it mounted and its status fresh
on a timer (also after a master restart or a Secret change), unmount on delete."""

from __future__ import annotations

from typing import Any

import kopf

from strata.operator import constants as c
from strata.operator.handlers.common import deps_of, run_locked, settle, state_of
from strata.operator.reconcile import reconcile_mount, remove_mount
from strata.operator.settings import OperatorSettings

RESOURCE = (c.GROUP, c.VERSION, c.MOUNT_PLURAL)


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    @kopf.on.resume(*RESOURCE, registry=registry)
    @kopf.on.create(*RESOURCE, registry=registry)
    @kopf.on.update(*RESOURCE, field="spec", registry=registry)
    async def mount_changed(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        deps = deps_of(memo)
        outcome = await run_locked(memo, lambda: reconcile_mount(deps, body, state_of(memo)))
        settle(outcome, retry_delay=settings.retry_delay, logger=logger)

    @kopf.timer(*RESOURCE, interval=settings.reconcile_interval, initial_delay=settings.reconcile_interval,
                registry=registry)
    async def mount_tick(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        deps = deps_of(memo)
        outcome = await run_locked(memo, lambda: reconcile_mount(deps, body, state_of(memo)))
        if not outcome.done:
            logger.debug("not mounted: %s", outcome.message)

    @kopf.on.delete(*RESOURCE, registry=registry)
    async def mount_deleted(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        deps = deps_of(memo)
        outcome = await run_locked(memo, lambda: remove_mount(deps, body))
        if not outcome.done:
            raise kopf.TemporaryError(outcome.message, delay=settings.retry_delay)
        logger.info("%s", outcome.message)
