"""Glue shared by the handlers: per-object state and turning outcomes into kopf's terms."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import kopf

from strata.operator.reconcile import Deps, ObjectState, Outcome


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
