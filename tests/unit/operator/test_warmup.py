"""The warm-up gate: which volumes ask for it, the gate the webhook adds, when a held pod is
released (warm, or its timeout), and the operator's checks against the test master."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest

from strata.contract.proto import strata_pb2 as pb
from strata.operator.handlers.warmup import INDEX, register
from strata.operator.locality import MountRef
from strata.operator.reconcile import ObjectState
from strata.operator.reconcile.warmup import WarmState, check_gated_pods
from strata.operator.settings import OperatorSettings
from strata.operator.warmup import (
    DEFAULT_WARM_TIMEOUT,
    WARM_GATE,
    GatedPod,
    WarmVolume,
    gate_for,
    is_gated,
    needs_load,
    release_of,
    warm_volumes,
    warmth_of,
)
from tests.unit.operator.conftest import World, mount_body
from tests.unit.operator.test_reconcile_mount import ready_cluster, reconcile

Obj = dict[str, Any]
CREATED = "2026-01-01T12:00:00Z"


def warm_pod(name: str = "job", gates: list[Obj] | None = None, **attributes: str) -> Obj:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "1",
                     "creationTimestamp": CREATED},
        "spec": {"containers": [{"name": "app", "image": "busybox"}],
                 "schedulingGates": gates if gates is not None else [{"name": WARM_GATE}],
                 "volumes": [{"name": "data", "csi": {"driver": "csi.strata.dev",
                                                      "volumeAttributes": {"mount": "data", **attributes}}}]},
    }


# -- which volumes ask, and the gate -------------------------------------------------------

def test_a_volume_asks_with_a_percentage_and_an_optional_timeout() -> None:
    volumes, notes = warm_volumes(warm_pod(warmPercent="90", warmTimeout="2m", subPath="train/"))
    assert volumes == [WarmVolume(MountRef("ns", "data"), "train", 90.0, 120.0)] and notes == []
    (default,), _ = warm_volumes(warm_pod(warmPercent="50"))
    assert default.timeout == DEFAULT_WARM_TIMEOUT and default.subpath == ""
    assert warm_volumes(warm_pod()) == ([], [])  # no warmPercent: not asked


@pytest.mark.parametrize(("attributes", "named"), [
    ({"warmPercent": "lots"}, "warmPercent 'lots' is not a number"),
    ({"warmPercent": "0"}, "must be above 0 and at most 100"),
    ({"warmPercent": "101"}, "must be above 0 and at most 100"),
    ({"warmPercent": "90", "warmTimeout": "soon"}, "warmTimeout: 'soon' is not a duration"),
    ({"warmPercent": "90", "warmTimeout": "-1"}, "warmTimeout '-1' must be above 0"),
    ({"warmPercent": "90", "warmTimeout": "90000"}, "at most 86400s"),
    ({"warmPercent": "90", "subPath": "../other"}, "subPath '../other' is not a plain folder"),
])
def test_unreadable_attributes_are_a_note_and_hold_nothing(attributes: dict[str, str], named: str) -> None:
    volumes, notes = warm_volumes(warm_pod(**attributes))
    assert volumes == []
    (note,) = notes
    assert named in note and "volume 'data'" in note


def test_the_gate_is_added_once_next_to_others_gates() -> None:
    other = {"name": "example.com/quota"}
    gates, notes = gate_for(warm_pod(gates=[other], warmPercent="90"))
    assert gates == [other, {"name": WARM_GATE}] and notes == []
    assert gate_for(warm_pod(warmPercent="90"))[0] is None  # already there
    assert gate_for(warm_pod(gates=[]))[0] is None  # not asked
    pinned = warm_pod(gates=[], warmPercent="90")
    pinned["spec"]["nodeName"] = "n1"
    gates, notes = gate_for(pinned)
    assert gates is None and "spec.nodeName" in notes[0]


# -- when a held pod is released -----------------------------------------------------------

def at(seconds: float) -> datetime:
    return datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC) + timedelta(seconds=seconds)


def progress(cached: int, total: int, *, done: bool = False, error: str = "") -> pb.LoadProgress:
    return pb.LoadProgress(path="/d", bytes_cached=cached, bytes_loaded=cached, bytes_total=total, done=done,
                           error=error)


def test_released_when_every_volume_reaches_its_percentage() -> None:
    pod = GatedPod.of(warm_pod(warmPercent="90", warmTimeout="60s"))
    (volume,) = pod.volumes
    assert release_of(pod, [warmth_of(volume, "/d", progress(89, 100))], at(10)) is None
    release = release_of(pod, [warmth_of(volume, "/d", progress(90, 100))], at(10))
    assert release is not None and release.reason == "warm"
    assert "/d: 90.0% of 100B cached (wanted 90%)" in release.message


def test_released_at_the_timeout_saying_how_warm_it_got() -> None:
    pod = GatedPod.of(warm_pod(warmPercent="90", warmTimeout="60s"))
    (volume,) = pod.volumes
    cold = [warmth_of(volume, "/d", progress(40, 100, done=True))]
    assert release_of(pod, cold, at(59)) is None
    release = release_of(pod, cold, at(61))
    assert release is not None and release.reason == "timeout"
    assert "after waiting 61s (warmTimeout 60s)" in release.message and "40.0% of 100B" in release.message
    failed = release_of(pod, [warmth_of(volume, "/d", progress(0, 100, done=True, error="no live workers"))], at(61))
    assert failed is not None and "its load failed: no live workers" in failed.message
    unknown = release_of(pod, [warmth_of(volume, "/d", None)], at(61))
    assert unknown is not None and "/d: not known yet (no load of it yet)" in unknown.message


def test_a_running_load_that_has_not_listed_its_data_is_not_warm() -> None:
    (volume,) = GatedPod.of(warm_pod(warmPercent="1")).volumes
    assert not warmth_of(volume, "/d", progress(0, 0)).warm
    assert warmth_of(volume, "/d", progress(0, 0, done=True)).warm  # an empty folder is all cached


def test_a_load_is_started_when_none_runs_and_once_per_pod_after_a_short_one() -> None:
    assert needs_load(None, started_here=False)
    assert not needs_load(progress(10, 100), started_here=False)  # running: wait for it
    assert not needs_load(progress(100, 100, done=True), started_here=False)  # whole
    assert needs_load(progress(40, 100, done=True), started_here=False)  # evicted since: load again
    assert not needs_load(progress(40, 100, done=True), started_here=True)  # larger than the cache: once
    assert needs_load(progress(0, 100, done=True, error="boom"), started_here=False)


# -- the operator's checks -----------------------------------------------------------------

async def mounted_world(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body())
    assert (await reconcile(world, ObjectState())).done


async def test_a_held_pod_gets_its_data_loaded_and_is_released_once_warm(world: World) -> None:
    await mounted_world(world)
    other = {"name": "example.com/quota"}
    body = world.kube.put(warm_pod(gates=[other, {"name": WARM_GATE}], warmPercent="90", subPath="train"))
    world.clock.now = at(5)
    state = WarmState()
    pod = GatedPod.of(body)
    assert await check_gated_pods(world.deps, [pod], state) == []
    assert [r.path for n, r in world.master.state.calls if n == "Load"] == ["/datasets/a/train"]
    world.master.state.set_load("/datasets/a/train", bytes_cached=50, bytes_total=100)
    assert await check_gated_pods(world.deps, [pod], state) == []
    assert is_gated(world.kube.obj("Pod", "job"))
    assert world.master.state.count("Load") == 1  # the running load is waited for, not started again
    world.master.state.set_load("/datasets/a/train", bytes_cached=95, bytes_total=100)
    ((released, note),) = await check_gated_pods(world.deps, [pod], state)
    assert released == pod and (note.type, note.reason) == ("Normal", "WarmedUp")
    assert "/datasets/a/train: 95.0% of 100B cached (wanted 90%)" in note.message
    assert world.kube.obj("Pod", "job")["spec"]["schedulingGates"] == [other]


async def test_a_gated_pods_load_keeps_the_mounts_preload_bandwidth(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body(preload={"bandwidth": "2Mi"}))
    assert (await reconcile(world, ObjectState())).done
    body = world.kube.put(warm_pod(warmPercent="90", subPath="train"))
    world.clock.now = at(5)
    assert await check_gated_pods(world.deps, [GatedPod.of(body)], WarmState()) == []
    ((bandwidth,),) = [(r.bandwidth,) for n, r in world.master.state.calls if n == "Load" and r.path == "/datasets/a/train"]
    assert bandwidth == 2 << 20


async def test_a_pod_whose_data_stays_cold_starts_at_its_timeout_with_a_warning(world: World) -> None:
    await mounted_world(world)
    pod = GatedPod.of(world.kube.put(warm_pod(warmPercent="90", warmTimeout="30s")))
    state = WarmState()
    world.clock.now = at(10)
    world.master.state.set_load("/datasets/a", bytes_cached=10, bytes_total=100, done=True)
    assert await check_gated_pods(world.deps, [pod], state) == []
    assert await check_gated_pods(world.deps, [pod], state) == []
    assert world.master.state.count("Load") == 1  # loaded again once (it was short), not every check
    world.master.state.set_load("/datasets/a", bytes_cached=10, bytes_total=100, done=True)
    world.clock.now = at(31)
    ((_, note),) = await check_gated_pods(world.deps, [pod], state)
    assert (note.type, note.reason) == ("Warning", "WarmUpTimedOut")
    assert "after waiting 31s (warmTimeout 30s)" in note.message and "10.0% of 100B" in note.message
    assert world.kube.obj("Pod", "job")["spec"]["schedulingGates"] == []


async def test_a_missing_mount_still_ends_at_the_timeout_and_a_deleted_pod_is_forgotten(world: World) -> None:
    pod = GatedPod.of(world.kube.put(warm_pod(warmPercent="90", warmTimeout="30s")))
    state = WarmState()
    world.clock.now = at(31)
    ((_, note),) = await check_gated_pods(world.deps, [pod], state)
    assert "Mount ns/data: not known yet (Mount ns/data does not exist)" in note.message
    await mounted_world(world)
    gone = GatedPod.of(warm_pod("gone", warmPercent="90"))  # deleted while held: not in the API
    world.clock.now = at(5)
    assert await check_gated_pods(world.deps, [gone], state) == []
    assert "uid-gone" in state.started
    assert await check_gated_pods(world.deps, [], state) == []
    assert state.started == {}


def test_the_checks_get_the_index_of_gated_pods_by_its_id() -> None:
    """kopf hands an index to the startup handler under the index's id, not its function's name."""
    registry = kopf.OperatorRegistry()
    register(registry, OperatorSettings())
    assert [h.id for h in registry._indexing.get_all_handlers()] == [INDEX]


async def test_a_released_pod_gets_an_event_that_says_why(world: World) -> None:
    pod = GatedPod.of(world.kube.put(warm_pod(warmPercent="90", warmTimeout="30s")))
    world.clock.now = at(31)
    await check_gated_pods(world.deps, [pod], WarmState())
    (event,) = [o for (kind, _, _), o in world.kube.objects.items() if kind == "Event"]
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "ns", "name": "job",
                                       "uid": "uid-job"}
    assert (event["type"], event["reason"]) == ("Warning", "WarmUpTimedOut")
    assert "warmTimeout 30s" in event["message"] and event["source"] == {"component": "strata-operator"}
