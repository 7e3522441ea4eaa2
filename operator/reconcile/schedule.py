"""A Mount's scheduled preload: at each time of spec.preload.schedule, load the preload paths
again, asking the store first (only what changed is fetched), within spec.preload.bandwidth.

The last run is what the master reports (its loads' start), else status.preload.lastRun as
written before: a restarted operator counts from there, so a time missed while it was down
starts one run at once. A time that comes while a load of the paths still runs starts its
run when that load ends."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from strata.contract.errors import InvalidArgument, NotFound
from strata.contract.proto import strata_pb2 as pb
from strata.operator.models import MountSpec
from strata.operator.reconcile.common import Deps, ObjectState
from strata.operator.status import preload_run

log = logging.getLogger(__name__)

# A run the master started up to this long after a scheduled time is that time's run: the
# master's and the operator's clocks may differ a little, and cron's times are a minute apart.
CLOCK_SLACK = timedelta(seconds=30)


def _parse_time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def runs_counted_from(loads: list[pb.LoadProgress | None], before: Mapping[str, Any], created: str | None,
                      now: datetime) -> datetime:
    """The time after which the schedule's next run falls: the last run's start (with the
    slack), else the Mount's creation (its first load is not a scheduled run), else now."""
    run = preload_run(loads) or before.get("lastRun")
    if run and run.get("start"):
        return _parse_time(str(run["start"])) + CLOCK_SLACK
    return _parse_time(created) if created else now


async def run_when_due(deps: Deps, endpoint: str, token: str, spec: MountSpec, state: ObjectState,
                       loads: dict[str, pb.LoadProgress], before: Mapping[str, Any],
                       created: str | None) -> datetime | None:
    """Start the scheduled run if it is due, was not started yet, and no load of the paths
    runs (`loads` then holds the new loads); when the next run is due (None: no schedule).
    A path the master cannot load is left to the preload's own retries, which say why."""
    schedule = spec.preload.schedule
    if schedule is None:
        return None
    paths = spec.preload_paths()
    now = deps.clock()
    due = schedule.next_after(runs_counted_from([loads.get(p) for p in paths], before, created, now))
    started = state.scheduled_run is not None and due <= state.scheduled_run
    if due > now or started or any(not loads[p].done for p in paths if p in loads):
        return due if not started else schedule.next_after(max(due, now))
    client = deps.masters.client(endpoint, token)
    state.scheduled_run = due
    for path in paths:
        try:
            first = await client.start_load(path, bandwidth=spec.preload.bandwidth, refresh=True,
                                            what=f"scheduled preload of {path}")
        except (NotFound, InvalidArgument) as exc:
            log.warning("scheduled preload of %s: %s", path, exc)
            continue
        if first is not None:
            first.path = path
            loads[path] = first
    deps.masters.invalidate(endpoint)
    log.info("started the preload of %s scheduled at %s (%s)", spec.path, due.isoformat(), schedule.text)
    return schedule.next_after(max(due, now))
