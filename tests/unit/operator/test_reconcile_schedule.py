"""A Mount's scheduled preload against an in-memory API server and a gRPC master servicer:
runs at its times with refresh and the bandwidth, status.preload.lastRun/nextRun, a time
missed while the operator was down run once, a due run waits for a running load."""

from __future__ import annotations

from typing import Any

from strata.contract.proto import strata_pb2 as pb
from strata.operator.handlers.common import next_delay
from strata.operator.reconcile import ObjectState
from tests.unit.operator.conftest import World, mount_body
from tests.unit.operator.test_reconcile_mount import condition, ready_cluster, reconcile

PATH = "/datasets/a"


def scheduled_mount(world: World, **preload: Any) -> None:
    ready_cluster(world)
    world.master.state.load_clock = world.clock
    body = mount_body(preload={"onCreate": True, "schedule": "0 * * * *", "bandwidth": "50Mi", **preload})
    body["metadata"]["creationTimestamp"] = "2026-01-01T12:00:00Z"
    world.kube.put(body)


def loads(world: World) -> list[pb.LoadRequest]:
    return [r for n, r in world.master.state.calls if n == "Load"]


def finish(world: World, fetched: int, ended_ms: int) -> None:
    load = next(x for x in world.master.state.mount_reports[PATH].loads if x.path == PATH)
    world.master.state.set_load(PATH, bytes_loaded=100, bytes_total=100, files_loaded=2, files_total=2, done=True,
                                bytes_cached=100, bytes_fetched=fetched, started_unix_ms=load.started_unix_ms,
                                finished_unix_ms=ended_ms)


def preload_status(world: World) -> dict[str, Any]:
    return dict(world.kube.obj("Mount", "data")["status"]["preload"])


async def test_a_scheduled_preload_runs_at_its_times_with_refresh_and_the_bandwidth(world: World) -> None:
    scheduled_mount(world)
    state = ObjectState()
    out = await reconcile(world, state)
    (first,) = loads(world)
    assert first.bandwidth == 50 << 20 and not first.refresh  # the first load: nothing to refresh
    status = preload_status(world)
    assert status["lastRun"] == {"start": "2026-01-01T12:00:00Z", "result": "Running", "bytesFetched": 0}
    assert status["nextRun"] == "2026-01-01T13:00:00Z"
    assert out.recheck_in == world.deps.settings.retry_delay  # following the running load

    world.clock.advance(10)
    finish(world, fetched=100, ended_ms=int(world.clock.now.timestamp() * 1000))
    out = await reconcile(world, state)
    assert preload_status(world)["lastRun"] == {"start": "2026-01-01T12:00:00Z", "end": "2026-01-01T12:00:10Z",
                                                "result": "Succeeded", "bytesFetched": 100}
    assert out.recheck_in is not None and 3589 < out.recheck_in < 3591  # just after 13:00
    assert next_delay(out, world.deps.settings) == world.deps.settings.reconcile_interval

    world.clock.advance(3589)  # 12:59:59: not yet
    await reconcile(world, state)
    assert len(loads(world)) == 1
    world.clock.advance(1)
    await reconcile(world, state)
    second = loads(world)[-1]
    assert len(loads(world)) == 2 and second.refresh and second.bandwidth == 50 << 20
    status = preload_status(world)
    assert status["lastRun"]["start"] == "2026-01-01T13:00:00Z" and status["lastRun"]["result"] == "Running"
    assert status["nextRun"] == "2026-01-01T14:00:00Z"
    world.clock.advance(5)
    finish(world, fetched=7, ended_ms=int(world.clock.now.timestamp() * 1000))
    await reconcile(world, state)
    assert preload_status(world)["lastRun"]["bytesFetched"] == 7
    assert len(loads(world)) == 2  # one run a scheduled time


async def test_a_time_missed_while_the_operator_was_down_runs_once_when_it_is_back(world: World) -> None:
    scheduled_mount(world)
    await reconcile(world, ObjectState())
    world.clock.advance(10)
    finish(world, fetched=100, ended_ms=int(world.clock.now.timestamp() * 1000))
    await reconcile(world, ObjectState())
    # Down from 12:00:10 to 15:20 (three times missed), and the master restarted meanwhile:
    # the run is counted from status.preload.lastRun, and the lost load is loaded again.
    world.master.state.set_load(PATH)
    world.clock.advance(3 * 3600 + 1190)
    state = ObjectState()
    await reconcile(world, state)
    assert len(loads(world)) == 2 and loads(world)[-1].refresh
    assert preload_status(world)["nextRun"] == "2026-01-01T16:00:00Z"
    world.clock.advance(5)
    finish(world, fetched=0, ended_ms=int(world.clock.now.timestamp() * 1000))
    await reconcile(world, state)
    await reconcile(world, ObjectState())  # another restart: nothing is due
    assert len(loads(world)) == 2
    assert preload_status(world)["lastRun"]["start"] == "2026-01-01T15:20:00Z"


async def test_a_due_run_waits_for_the_running_load_then_starts(world: World) -> None:
    scheduled_mount(world, schedule="* * * * *")
    state = ObjectState()
    await reconcile(world, state)
    world.clock.advance(90)  # 12:01:30, the first load still runs
    await reconcile(world, state)
    assert len(loads(world)) == 1
    assert preload_status(world)["nextRun"] == "2026-01-01T12:01:00Z"  # due, waiting
    finish(world, fetched=100, ended_ms=int(world.clock.now.timestamp() * 1000))
    await reconcile(world, state)
    assert len(loads(world)) == 2 and loads(world)[-1].refresh
    assert preload_status(world)["nextRun"] == "2026-01-01T12:02:00Z"


async def test_a_bad_schedule_fails_the_mount_naming_the_field(world: World) -> None:
    scheduled_mount(world, schedule="0 25 * * *")
    out = await reconcile(world, ObjectState())
    assert out.stalled
    message = condition(world.kube.obj("Mount", "data")["status"], "Ready")["message"]
    assert "preload.schedule" in message and "the hour field: 25 is outside 0-23" in message
    assert loads(world) == []
