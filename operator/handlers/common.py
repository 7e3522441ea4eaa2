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


def post_notes(body: kopf.Body, outcome: Outcome) -> None:
    """Post the Events the reconcile's status change tells of (kopf posts them in the
    background, whatever kopf's own posting level)."""
    for note in outcome.notes:
        kopf.event(body, type=note.type, reason=note.reason, message=note.message)


def log_outcome(outcome: Outcome, logger: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
    """Waiting is normal progress (info); stalled needs a person (warning)."""
    if outcome.stalled:
        logger.warning("stalled: %s", outcome.message)
    elif not outcome.done:
        logger.info("not ready yet: %s", outcome.message)


def next_delay(outcome: Outcome, settings: OperatorSettings) -> float:
    """Check again soon while progressing; otherwise at the regular interval (a stalled
    object may be fixed outside itself, e.g. by creating a Secret); sooner if the reconcile
    asked (a scheduled run is due)."""
    delay = settings.reconcile_interval if outcome.done or outcome.stalled else settings.retry_delay
    return delay if outcome.recheck_in is None else min(delay, outcome.recheck_in)


Step = Callable[[Deps, kopf.Body, kopf.Memo], Awaitable[Outcome]]


def register_reconciler(
    registry: kopf.OperatorRegistry,
    settings: OperatorSettings,
    resource: tuple[str, str, str],
    name: str,
    step: Step,
) -> None:
    """Run `step` once on create, resume and spec change, and keep running it from a
    per-object daemon: every `retry_delay` seconds while the object progresses, every
    `reconcile_interval` seconds once it is done, so children and status follow the world."""

    @kopf.on.resume(*resource, id=f"reconcile-{name}", registry=registry)
    @kopf.on.create(*resource, id=f"reconcile-{name}", registry=registry)
    @kopf.on.update(*resource, id=f"reconcile-{name}", field="spec", registry=registry)
    async def changed(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        deps = deps_of(memo)
        outcome = await run_locked(memo, lambda: step(deps, body, memo))
        post_notes(body, outcome)
        log_outcome(outcome, logger)

    @kopf.daemon(*resource, id=f"refresh-{name}", initial_delay=settings.retry_delay,
                 cancellation_timeout=settings.rpc_timeout, registry=registry)
    async def refresh(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                      stopped: kopf.DaemonStopped, **_: Any) -> None:
        deps = deps_of(memo)
        while not stopped:
            try:
                outcome = await run_locked(memo, lambda: step(deps, body, memo))
            except Exception as exc:  # noqa: BLE001 - the loop must outlive one failed pass
                logger.exception("reconcile failed, retrying: %s", exc)
                outcome = Outcome.waiting(str(exc))
            else:
                logger.debug("refreshed: done=%s %s", outcome.done, outcome.message)
                post_notes(body, outcome)
            await stopped.wait(next_delay(outcome, settings))
