"""Mount handlers: mount on create/resume/spec change, keep it mounted and its status fresh
on a timer (also after a master restart or a Secret change), unmount on delete."""

from __future__ import annotations

from typing import Any

import kopf

from strata.operator import constants as c
from strata.operator.handlers.common import deps_of, register_reconciler, run_locked, state_of
from strata.operator.handlers.metrics import MountPhases
from strata.operator.reconcile import Deps, Outcome, reconcile_mount, remove_mount
from strata.operator.settings import OperatorSettings

RESOURCE = (c.GROUP, c.VERSION, c.MOUNT_PLURAL)


def phase_of(outcome: Outcome) -> str:
    """The phase a reconcile's outcome left the Mount in (see `reconcile_mount`)."""
    if outcome.done:
        return c.MountPhase.MOUNTED
    return c.MountPhase.FAILED if outcome.stalled else c.MountPhase.PENDING


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings, phases: MountPhases) -> None:
    async def reconcile(deps: Deps, body: kopf.Body, memo: kopf.Memo) -> Outcome:
        outcome = await reconcile_mount(deps, body, state_of(memo))
        phases.record(body["metadata"]["namespace"], body["metadata"]["name"], phase_of(outcome))
        return outcome

    register_reconciler(registry, settings, RESOURCE, "mount", reconcile)

    @kopf.on.delete(*RESOURCE, id="delete-mount", registry=registry)
    async def mount_deleted(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        deps = deps_of(memo)
        phases.record(body["metadata"]["namespace"], body["metadata"]["name"], c.MountPhase.UNMOUNTING)
        outcome = await run_locked(memo, lambda: remove_mount(deps, body))
        if not outcome.done:
            raise kopf.TemporaryError(outcome.message, delay=settings.retry_delay)
        phases.forget(body["metadata"]["namespace"], body["metadata"]["name"])
        logger.info("%s", outcome.message)
