"""Glue shared by the handlers: per-object state and turning outcomes into kopf's terms."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from strata.operator.reconcile import Deps, ObjectState, Outcome
from strata.operator.settings import OperatorSettings


def deps_of(memo: kopf.Memo) -> Deps:
    deps = memo.get("deps")
    if not isinstance(deps, Deps):
        raise kopf.TemporaryError("the operator is still starting", delay=1)
    return deps


def state_of(memo: kopf.Memo) -> ObjectState:
    """This object's state; kopf gives each object its own memo (a copy of the global one)."""
    state = memo.get("state")
    if not isinstance(state, ObjectState):
        state = memo["state"] = ObjectState()
    return state


async def run_locked(memo: kopf.Memo, step: Callable[[], Awaitable[Outcome]]) -> Outcome:
    """Run one reconcile of an object at a time: change handlers and timers may overlap."""
    async with state_of(memo).lock:
        return await step()


def settle(outcome: Outcome, *, retry_delay: float, logger: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
    """For change handlers: done returns; waiting retries soon; stalled leaves it to the
    timer (a person must change something first, maybe outside this object)."""
    if outcome.done:
        logger.debug("reconciled: %s", outcome.message)
        return
    if outcome.stalled:
        logger.warning("stalled: %s", outcome.message)
        return
    raise kopf.TemporaryError(outcome.message, delay=retry_delay)


Step = Callable[[Deps, kopf.Body, kopf.Memo], Awaitable[Outcome]]


def register_reconciler(
    registry: kopf.OperatorRegistry,
    settings: OperatorSettings,
    resource: tuple[str, str, str],
    name: str,
    step: Step,
) -> None:
    """Run `step` on create, resume and spec change (retrying soon until done), and on a
    timer that keeps children and status in line with the world."""

    @kopf.on.resume(*resource, id=f"reconcile-{name}", registry=registry)
    @kopf.on.create(*resource, id=f"reconcile-{name}", registry=registry)
    @kopf.on.update(*resource, id=f"reconcile-{name}", field="spec", registry=registry)
    async def changed(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        deps = deps_of(memo)
        outcome = await run_locked(memo, lambda: step(deps, body, memo))
        settle(outcome, retry_delay=settings.retry_delay, logger=logger)

    @kopf.timer(*resource, id=f"refresh-{name}", interval=settings.reconcile_interval,
                initial_delay=settings.reconcile_interval, registry=registry)
    async def refresh(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        deps = deps_of(memo)
        outcome = await run_locked(memo, lambda: step(deps, body, memo))
        if not outcome.done:
            logger.debug("not done: %s", outcome.message)
