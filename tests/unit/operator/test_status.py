"""Status computation from observations and Reports; condition transitions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from strata.contract.proto import strata_pb2 as pb
from strata.operator.status import (
    ClusterObservation,
    Condition,
    MountObservation,
    PreloadObservation,
    Problem,
    cluster_status,
    hit_ratio,
    merge_conditions,
    mount_status,
)
from tests.unit.operator.conftest import worker_report

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GiB = 1 << 30


def obs(**kw: object) -> ClusterObservation:
    base = dict(generation=1, desired_workers=2, endpoint="demo-master-0.demo-master.ns.svc:19998",
                worker_ids=frozenset({"demo-worker-0", "demo-worker-1"}))
    base.update(kw)
    return ClusterObservation(**base)  # type: ignore[arg-type]


def report() -> pb.ReportResponse:
    return pb.ReportResponse(
        workers=[
            worker_report("demo-worker-0", tiers=(("SSD", 100 * GiB, 10 * GiB), ("MEM", GiB, GiB // 2))),
            worker_report("demo-worker-1", tiers=(("MEM", GiB, GiB // 2), ("SSD", 100 * GiB, 0))),
            worker_report("old-worker-7", live=False, tiers=(("HDD", 1000 * GiB, 5 * GiB),)),
        ],
        mounts=[pb.MountReport(), pb.MountReport()],
        used=11 * GiB, hits=930, misses=70,
    )


def cond(status: dict, kind: str) -> dict:  # type: ignore[type-arg]
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_capacity_sums_live_workers_per_medium_fastest_first() -> None:
    status = cluster_status("demo", obs(applied=True, master_pods_ready=True, report=report(), workers_ready=2), {}, T0)
    assert status["capacity"] == {
        "total": "202Gi", "used": "11Gi",
        "tiers": [{"medium": "MEM", "total": "2Gi", "used": "1Gi"},
                  {"medium": "SSD", "total": "200Gi", "used": "10Gi"}],
    }
    assert status["cache"] == {"hitRatio": 0.93, "cachedBytes": "11Gi"}
    assert status["mounts"] == 2
    assert status["workers"]["registered"] == 2
    assert status["phase"] == "Ready"


def test_phases() -> None:
    assert cluster_status("demo", obs(), {}, T0)["phase"] == "Pending"
    assert cluster_status("demo", obs(applied=True), {}, T0)["phase"] == "Provisioning"
    broken = obs(applied=True, master_pods_ready=True, report=report(), workers_ready=1)
    assert cluster_status("demo", broken, {"phase": "Ready", "observedGeneration": 1}, T0)["phase"] == "Degraded"
    assert cluster_status("demo", broken, {"phase": "Degraded", "observedGeneration": 1}, T0)["phase"] == "Degraded"
    # A new generation being rolled out is progress, not degradation.
    changed = obs(generation=2, applied=True, master_pods_ready=True, report=report(), workers_ready=1)
    assert cluster_status("demo", changed, {"phase": "Ready", "observedGeneration": 1}, T0)["phase"] == "Provisioning"
    assert cluster_status("demo", obs(terminating=True, applied=True), {}, T0)["phase"] == "Terminating"


def test_registered_workers_count_toward_ready() -> None:
    r = report()
    r.workers[1].live = False
    status = cluster_status("demo", obs(applied=True, master_pods_ready=True, report=r, workers_ready=2), {}, T0)
    workers = cond(status, "WorkersReady")
    assert workers["status"] == "False" and workers["reason"] == "WorkersNotRegistered"
    assert "1 are registered" in workers["message"]
    assert status["phase"] == "Provisioning"


def test_stalled_is_not_reconciling() -> None:
    status = cluster_status("demo", obs(stalled=Problem("InvalidSpec", "tiers: bad")), {}, T0)
    assert cond(status, "Stalled")["status"] == "True"
    assert cond(status, "Reconciling")["status"] == "False"
    assert cond(status, "Ready")["message"] == "tiers: bad"


def test_transition_time_moves_only_when_status_changes() -> None:
    first = merge_conditions([], [Condition("Ready", False, "WaitingForMaster", "a")], now=T0, generation=1)
    later = T0 + timedelta(minutes=5)
    same = merge_conditions(first, [Condition("Ready", False, "WaitingForWorkers", "b")], now=later, generation=2)
    assert same[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert same[0]["reason"] == "WaitingForWorkers" and same[0]["observedGeneration"] == 2
    flipped = merge_conditions(same, [Condition("Ready", True, "AsExpected", "")], now=later, generation=2)
    assert flipped[0]["lastTransitionTime"] == "2026-01-01T00:05:00Z"


def test_same_observation_gives_an_equal_status() -> None:
    o = obs(applied=True, master_pods_ready=True, report=report(), workers_ready=2)
    first = cluster_status("demo", o, {}, T0)
    assert cluster_status("demo", o, first, T0 + timedelta(hours=1)) == first


def test_hit_ratio() -> None:
    assert hit_ratio(0, 0) == 0.0
    assert hit_ratio(2, 1) == 0.67


def test_mount_status_without_ufs_totals_has_no_percentage() -> None:
    r = pb.MountReport(cached_bytes=GiB)
    status = mount_status(MountObservation(1, "Mounted", report=r), {}, T0)
    assert status["cache"] == {"cachedBytes": "1Gi", "nodes": []}
    assert "ufs" not in status
    assert "preload" not in status and [c["type"] for c in status["conditions"]] == ["Ready", "Reconciling", "Stalled"]


def test_mount_status_shows_pending_uploads() -> None:
    oldest = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    r = pb.MountReport(pending_uploads=pb.PendingUploads(count=3, bytes=5 * GiB,
                                                         oldest_unix_ms=int(oldest.timestamp() * 1000)))
    status = mount_status(MountObservation(1, "Mounted", report=r), {}, T0)
    assert status["pendingUploads"] == {"count": 3, "bytes": "5Gi", "oldestSince": "2026-01-02T03:04:05Z"}
    # Nothing pending: the count says so, and the status does not change as time passes.
    idle = mount_status(MountObservation(1, "Mounted", report=pb.MountReport()), {}, T0)
    assert idle["pendingUploads"] == {"count": 0, "bytes": "0"}
    assert mount_status(MountObservation(1, "Mounted", report=pb.MountReport()), idle, T0 + timedelta(hours=1)) == idle


def test_mount_keeps_last_sync_time_and_shows_pending_preload() -> None:
    previous = {"lastSyncTime": "2025-12-31T00:00:00Z"}
    status = mount_status(MountObservation(1, "Mounted", report=pb.MountReport(), preload=PreloadObservation((None,))), previous, T0)
    assert status["lastSyncTime"] == "2025-12-31T00:00:00Z"
    assert status["preload"] == {"phase": "Pending"}
    assert cond(status, "Preloaded")["status"] == "False"


def test_failed_mount_is_stalled_with_its_reason() -> None:
    problem = Problem("AccessDenied", "The store refused access")
    status = mount_status(MountObservation(3, "Failed", problem), {}, T0)
    assert status["phase"] == "Failed" and status["observedGeneration"] == 3
    assert cond(status, "Stalled") | {"lastTransitionTime": None} == {
        "type": "Stalled", "status": "True", "reason": "AccessDenied", "message": "The store refused access",
        "lastTransitionTime": None, "observedGeneration": 3,
    }
