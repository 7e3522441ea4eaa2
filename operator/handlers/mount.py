"""Mount handlers: mount on create/resume/spec change, keep it mounted and its status fresh
on a timer (also after a master restart or a Secret change), unmount on delete."""

from __future__ import annotations

from typing import Any

import kopf

from strata.operator import constants as c
from strata.operator.handlers.common import deps_of, register_reconciler, run_locked, state_of
from strata.operator.reconcile import Deps, Outcome, reconcile_mount, remove_mount
from strata.operator.settings import OperatorSettings

RESOURCE = (c.GROUP, c.VERSION, c.MOUNT_PLURAL)


async def _reconcile(deps: Deps, body: kopf.Body, memo: kopf.Memo) -> Outcome:
    return await reconcile_mount(deps, body, state_of(memo))


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    register_reconciler(registry, settings, RESOURCE, "mount", _reconcile)

    @kopf.on.delete(*RESOURCE, id="delete-mount", registry=registry)
    async def mount_deleted(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        deps = deps_of(memo)
        outcome = await run_locked(memo, lambda: remove_mount(deps, body))
        if not outcome.done:
            raise kopf.TemporaryError(outcome.message, delay=settings.retry_delay)
        logger.info("%s", outcome.message)
