"""Status of CacheClusters and Mounts, computed from what the operator observed. Pure.

Conditions keep their lastTransitionTime while their status stays the same, and every value
shown is rounded so that a status only changes when something a person would notice does;
the caller writes status only when the computed one differs from the stored one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from strata.contract.constants import MEDIA
from strata.contract.proto import strata_pb2 as pb
from strata.operator import constants as c
from strata.operator.builders.common import approximate_quantity, label_selector
from strata.operator.constants import ClusterPhase, MountPhase, PreloadPhase, Reason

Status = dict[str, Any]


def timestamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Problem:
    """Why something is not as wanted: a Reason constant and a message saying what to do."""

    reason: str
    message: str


@dataclass(frozen=True)
class Condition:
    type: str
    ok: bool
    reason: str
    message: str


def merge_conditions(
    old: Sequence[Mapping[str, Any]], new: Sequence[Condition], *, now: datetime, generation: int
) -> list[dict[str, Any]]:
    """The new conditions, keeping each one's lastTransitionTime unless its status changed."""
    previous = {cond.get("type"): cond for cond in old}
    merged = []
    for cond in new:
        status = "True" if cond.ok else "False"
        before = previous.get(cond.type)
        changed = before is None or before.get("status") != status
        merged.append(
            {
                "type": cond.type,
                "status": status,
                "reason": cond.reason,
                "message": cond.message,
                "lastTransitionTime": timestamp(now) if changed else before["lastTransitionTime"],  # type: ignore[index]
                "observedGeneration": generation,
            }
        )
    return merged


def _kstatus(phase_ok: bool, stalled: Problem | None, waiting: Problem | None) -> list[Condition]:
    """Ready, Reconciling, Stalled as kstatus reads them: exactly one story at a time."""
    if phase_ok:
        return [
            Condition(c.READY, True, Reason.AS_EXPECTED, "All resources are ready."),
            Condition(c.RECONCILING, False, Reason.AS_EXPECTED, ""),
            Condition(c.STALLED, False, Reason.AS_EXPECTED, ""),
        ]
    if stalled is not None:
        return [
            Condition(c.READY, False, stalled.reason, stalled.message),
            Condition(c.RECONCILING, False, stalled.reason, ""),
            Condition(c.STALLED, True, stalled.reason, stalled.message),
        ]
    why = waiting or Problem(Reason.AS_EXPECTED, "")
    return [
        Condition(c.READY, False, why.reason, why.message),
        Condition(c.RECONCILING, True, why.reason, why.message),
        Condition(c.STALLED, False, Reason.AS_EXPECTED, ""),
    ]


# -- CacheCluster ------------------------------------------------------------------------

@dataclass(frozen=True)
class ClusterObservation:
    """What one reconcile of a CacheCluster saw."""

    generation: int
    desired_workers: int
    endpoint: str
    terminating: bool = False
    stalled: Problem | None = None       # needs a person: invalid spec, apply refused
    applied: bool = False                # children were applied (at least the master's)
    master_pods_ready: bool = False
    master_waiting: Problem | None = None  # why the master pod cannot be ready yet, if known
    master_error: str | None = None      # why Report failed, if the pods were ready
    report: pb.ReportResponse | None = None
    workers_ready: int = 0               # ready pods of the worker StatefulSet
    worker_ids: frozenset[str] = frozenset()  # pod names the master should know
    draining: frozenset[str] = frozenset()    # of those, the ones that drain (decommissioned meanwhile)
    scaling: Problem | None = None       # scale-in in progress or held back
    rolling: Problem | None = None       # pods not all of their StatefulSet's current spec yet


def _registered(obs: ClusterObservation) -> int | None:
    if obs.report is None:
        return None
    return sum(1 for w in obs.report.workers if w.live and w.worker.worker_id in obs.worker_ids)


def decommissioned_workers(report: pb.ReportResponse | None, worker_ids: Collection[str]) -> list[str]:
    """Of `worker_ids`, those the master's report shows live and decommissioned (taking no
    new blocks), by name."""
    if report is None:
        return []
    return sorted(w.worker.worker_id for w in report.workers
                  if w.live and w.worker.decommissioning and w.worker.worker_id in worker_ids)


def _master_condition(obs: ClusterObservation) -> tuple[Condition, bool]:
    if obs.master_pods_ready and obs.report is not None:
        return Condition(c.MASTER_READY, True, Reason.AS_EXPECTED, "The master is ready."), True
    if obs.master_pods_ready:
        message = f"The master pod is ready but {obs.endpoint} does not answer: {obs.master_error}"
        return Condition(c.MASTER_READY, False, Reason.MASTER_UNREACHABLE, message), False
    if obs.master_waiting is not None:
        return Condition(c.MASTER_READY, False, obs.master_waiting.reason, obs.master_waiting.message), False
    message = "Waiting for the master pod to become ready."
    return Condition(c.MASTER_READY, False, Reason.WAITING_FOR_MASTER, message), False


def journal_claim_problem(claim: Mapping[str, Any] | None) -> Problem | None:
    """Why the master's journal claim keeps the master from starting (None: bound, or not
    seen yet): it waits for a volume, and when it names no StorageClass the cluster has no
    default one (the API server names the default in a claim that names none)."""
    if claim is None:
        return None
    name = (claim.get("metadata") or {}).get("name", "")
    namespace = (claim.get("metadata") or {}).get("namespace", "")
    phase = (claim.get("status") or {}).get("phase") or "Pending"
    if phase == "Bound":
        return None
    storage_class = (claim.get("spec") or {}).get("storageClassName")
    if phase == "Pending" and not storage_class:
        return Problem(Reason.JOURNAL_CLAIM_PENDING, (
            f"The master's journal claim {name} is Pending: it names no StorageClass and the cluster has no "
            "default one. Name one in spec.master.journal.volume.persistentVolumeClaim.storageClassName "
            "(kubectl get storageclass lists them); or keep the journal in a node folder (volume.hostPath, "
            "with spec.master.nodeSelector pinning the master to that node); or, losing every file not in the "
            "store yet whenever the master pod is replaced, in an emptyDir (volume.emptyDir)."))
    if phase == "Lost":
        return Problem(Reason.JOURNAL_CLAIM_PENDING, (
            f"The master's journal claim {name} lost its volume (phase Lost): the master cannot start on it. "
            f"Bring the volume back, or delete the claim (kubectl delete pvc {name} -n {namespace}) for a new, "
            "empty journal, which forgets the files not in the store yet."))
    shown = f" (StorageClass {storage_class})" if storage_class else ""
    return Problem(Reason.JOURNAL_CLAIM_PENDING, (
        f"The master's journal claim {name}{shown} is {phase}: the master starts once it is bound to a volume; "
        f"kubectl describe pvc {name} -n {namespace} shows what it waits for."))


def _workers_condition(obs: ClusterObservation) -> tuple[Condition, bool]:
    desired, ready, registered = obs.desired_workers, obs.workers_ready, _registered(obs)
    if ready < desired:
        message = f"{ready}/{desired} worker pods are ready."
        return Condition(c.WORKERS_READY, False, Reason.WAITING_FOR_WORKERS, message), False
    if registered is not None and registered < desired:
        message = f"{ready}/{desired} worker pods are ready; {registered} are registered with the master."
        return Condition(c.WORKERS_READY, False, Reason.WORKERS_NOT_REGISTERED, message), False
    if registered is None:
        message = f"{ready}/{desired} worker pods are ready; the master cannot be asked about them."
        return Condition(c.WORKERS_READY, False, Reason.MASTER_UNREACHABLE, message), False
    held = decommissioned_workers(obs.report, obs.worker_ids - obs.draining)
    if held:
        message = (f"{ready}/{desired} worker pods are ready; the master holds {', '.join(held)} decommissioned "
                   "(no new blocks go there): the operator tells it they serve again.")
        return Condition(c.WORKERS_READY, False, Reason.WORKERS_DECOMMISSIONED, message), False
    return Condition(c.WORKERS_READY, True, Reason.AS_EXPECTED, f"{ready}/{desired} workers are ready."), True


def _capacity(report: pb.ReportResponse) -> Status:
    live = [w for w in report.workers if w.live]
    by_medium: dict[str, list[int]] = {}
    for worker in live:
        for tier in worker.stats.tiers:
            sums = by_medium.setdefault(tier.medium, [0, 0])
            sums[0] += tier.capacity
            sums[1] += tier.used
    order = sorted(by_medium, key=lambda m: MEDIA.index(m) if m in MEDIA else len(MEDIA))
    total = sum(v[0] for v in by_medium.values())
    used = sum(v[1] for v in by_medium.values())
    return {
        "total": approximate_quantity(total),
        "used": approximate_quantity(used),
        "tiers": [
            {"medium": m, "total": approximate_quantity(by_medium[m][0]), "used": approximate_quantity(by_medium[m][1])}
            for m in order
        ],
    }


def hit_ratio(hits: int, misses: int) -> float:
    """hits / (hits + misses), to two decimals; 0 before any read."""
    reads = hits + misses
    return round(hits / reads, 2) if reads else 0.0


def cluster_status(
    cluster_name: str, obs: ClusterObservation, previous: Mapping[str, Any], now: datetime
) -> Status:
    """The CacheCluster status for an observation, given the status stored before."""
    master_cond, master_ok = _master_condition(obs)
    workers_cond, workers_ok = _workers_condition(obs)
    ready = (obs.applied and master_ok and workers_ok and obs.scaling is None and obs.rolling is None
             and obs.stalled is None)
    if obs.terminating:
        phase = ClusterPhase.TERMINATING
    elif not obs.applied:
        phase = ClusterPhase.PENDING
    elif ready:
        phase = ClusterPhase.READY
    elif previous.get("phase") in (ClusterPhase.READY, ClusterPhase.DEGRADED) and previous.get(
        "observedGeneration"
    ) == obs.generation:
        phase = ClusterPhase.DEGRADED
    else:
        phase = ClusterPhase.PROVISIONING

    waiting = obs.scaling
    if waiting is None and not master_ok:
        waiting = Problem(master_cond.reason, master_cond.message)
    if waiting is None and not workers_ok:
        waiting = Problem(workers_cond.reason, workers_cond.message)
    if waiting is None:
        waiting = obs.rolling
    if obs.terminating:
        waiting = Problem(Reason.TERMINATING, "The cluster is being deleted.")
    conditions = [*_kstatus(ready and not obs.terminating, obs.stalled, waiting), master_cond, workers_cond]

    status: Status = {
        "observedGeneration": obs.generation,
        "phase": phase,
        "conditions": merge_conditions(previous.get("conditions", []), conditions, now=now, generation=obs.generation),
        "master": {"ready": master_ok, "endpoint": obs.endpoint},
        "workers": {
            "desired": obs.desired_workers,
            "ready": obs.workers_ready,
            "selector": label_selector(cluster_name, c.COMPONENT_WORKER),
            "summary": f"{obs.workers_ready}/{obs.desired_workers}",
        },
    }
    registered = _registered(obs)
    if registered is not None:
        status["workers"]["registered"] = registered
    if obs.report is not None:
        status["capacity"] = _capacity(obs.report)
        status["cache"] = {
            "hitRatio": hit_ratio(obs.report.hits, obs.report.misses),
            "cachedBytes": approximate_quantity(obs.report.used),
        }
        status["mounts"] = len(obs.report.mounts)
    return status


# -- Mount ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class PreloadObservation:
    """The master's load of each preload path (None: none yet), and what stands in the way:
    a path that cannot be loaded, a load that failed, or bytes the cache lost since."""

    loads: tuple[pb.LoadProgress | None, ...]
    problems: tuple[Problem, ...] = ()
    next_run: datetime | None = None  # with a schedule: when the next run is due


@dataclass(frozen=True)
class MountObservation:
    """What one reconcile of a Mount saw."""

    generation: int
    phase: str                                # a MountPhase
    problem: Problem | None = None            # why Pending or Failed
    report: pb.MountReport | None = None      # the master's view of this mount
    synced_at: datetime | None = None         # when the mount RPC last changed the mount
    preload: PreloadObservation | None = None  # None: no preload asked for


# What status.preload keeps from the status before when the master shows no run (it
# restarted, or cannot be reached): when the last run was, and the next is due.
KEPT_PRELOAD_FIELDS = ("lastRun", "nextRun")


def _ms_timestamp(unix_ms: int) -> str:
    return timestamp(datetime.fromtimestamp(unix_ms / 1000, tz=UTC))


def preload_run(loads: Sequence[pb.LoadProgress | None]) -> Status | None:
    """The run the master's loads of the preload paths make up: started with the first,
    ended with the last; None unless every path has a load the master timed."""
    if not loads or any(load is None or load.started_unix_ms <= 0 for load in loads):
        return None
    known = [load for load in loads if load is not None]
    run: Status = {"start": _ms_timestamp(min(load.started_unix_ms for load in known)),
                   "result": "Running", "bytesFetched": sum(load.bytes_fetched for load in known)}
    if all(load.done for load in known):
        run["end"] = _ms_timestamp(max(load.finished_unix_ms for load in known))
        run["result"] = "Failed" if any(load.error for load in known) else "Succeeded"
    return run


def _runs(obs: PreloadObservation, before: Mapping[str, Any]) -> Status:
    """lastRun from the master's loads, else as the status before had it; nextRun."""
    status: Status = {}
    run = preload_run(obs.loads) or before.get("lastRun")
    if run:
        status["lastRun"] = dict(run)
    if obs.next_run is not None:
        status["nextRun"] = timestamp(obs.next_run)
    return status


def _preload(obs: PreloadObservation, before: Mapping[str, Any]) -> tuple[Status, Condition]:
    """Succeeded only when every path's load finished and the cache holds all its bytes."""
    known = [load for load in obs.loads if load is not None]
    status: Status = _runs(obs, before)
    if known:
        status.update({
            "bytesLoaded": approximate_quantity(sum(load.bytes_loaded for load in known)),
            "bytesTotal": approximate_quantity(sum(load.bytes_total for load in known)),
        })
    if obs.problems:
        message = " ".join(problem.message for problem in obs.problems)
        return {"phase": PreloadPhase.FAILED, **status}, Condition(c.PRELOADED, False, obs.problems[0].reason, message)
    if not known:
        return {"phase": PreloadPhase.PENDING}, Condition(c.PRELOADED, False, Reason.PRELOADING,
                                                           "The preload has not started yet.")
    files = sum(load.files_loaded for load in known)
    if len(known) == len(obs.loads) and all(load.done for load in known):
        message = f"Loaded {status['bytesLoaded']} in {files} files; the cache holds all of it."
        return {"phase": PreloadPhase.SUCCEEDED, **status}, Condition(c.PRELOADED, True, Reason.PRELOADED, message)
    message = (f"Loading: {status['bytesLoaded']} of {status['bytesTotal']}, "
               f"{files}/{sum(load.files_total for load in known)} files.")
    return {"phase": PreloadPhase.RUNNING, **status}, Condition(c.PRELOADED, False, Reason.PRELOADING, message)


def _pending_uploads(pending: pb.PendingUploads) -> Status:
    """Acknowledged ASYNC_THROUGH writes not in the store yet. The oldest is a time, not an
    age, so the status changes only when the uploads do."""
    status: Status = {"count": pending.count, "bytes": approximate_quantity(pending.bytes)}
    if pending.count and pending.oldest_unix_ms:
        status["oldestSince"] = timestamp(datetime.fromtimestamp(pending.oldest_unix_ms / 1000, tz=UTC))
    return status


def mount_status(obs: MountObservation, previous: Mapping[str, Any], now: datetime) -> Status:
    """The Mount status for an observation, given the status stored before."""
    mounted = obs.phase == MountPhase.MOUNTED
    stalled = obs.problem if obs.phase == MountPhase.FAILED else None
    waiting = obs.problem if obs.phase in (MountPhase.PENDING, MountPhase.UNMOUNTING) else None
    conditions = _kstatus(mounted, stalled, waiting)
    if mounted:
        conditions[0] = Condition(c.READY, True, Reason.MOUNTED, "The source is mounted.")
    status: Status = {"observedGeneration": obs.generation, "phase": obs.phase}
    report = obs.report
    if report is not None and (report.ufs_total_bytes or report.ufs_files):
        status["ufs"] = {"totalBytes": approximate_quantity(report.ufs_total_bytes), "files": report.ufs_files}
    if report is not None:
        nodes = sorted(report.cached_bytes_by_host.items(), key=lambda kv: (-kv[1], kv[0]))
        cache: Status = {
            "cachedBytes": approximate_quantity(report.cached_bytes),
            "nodes": [{"node": node, "bytes": approximate_quantity(n)} for node, n in nodes if n],
        }
        if report.ufs_total_bytes:
            # Blocks of versions the store no longer holds (kept until evicted) and the
            # store's total being up to a minute old can put the sum above the total.
            cache["cachedPercentage"] = min(100.0, round(100.0 * report.cached_bytes / report.ufs_total_bytes, 1))
        status["cache"] = cache
        status["pendingUploads"] = _pending_uploads(report.pending_uploads)
    before = previous.get("preload") or {}
    if obs.preload is not None and mounted:
        status["preload"], preloaded = _preload(obs.preload, before)
        conditions.append(preloaded)
    elif not mounted and (kept := {k: before[k] for k in KEPT_PRELOAD_FIELDS if k in before}):
        status["preload"] = kept  # a schedule's runs are counted from the last one
    status["conditions"] = merge_conditions(
        previous.get("conditions", []), conditions, now=now, generation=obs.generation
    )
    synced = timestamp(obs.synced_at) if obs.synced_at else previous.get("lastSyncTime")
    if synced:
        status["lastSyncTime"] = synced
    return status


# -- Events ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Note:
    """A Kubernetes Event for a person: posted once, when the status it tells of is written."""

    type: str  # "Normal" or "Warning"
    reason: str
    message: str


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    return next((cond for cond in status.get("conditions", []) if cond.get("type") == kind), {})


def _stalled(previous: Mapping[str, Any], status: Mapping[str, Any]) -> list[Note]:
    """A Warning when the object became Stalled, or stalls for another reason."""
    before, after = _condition(previous, c.STALLED), _condition(status, c.STALLED)
    if after.get("status") != "True":
        return []
    if before.get("status") == "True" and before.get("reason") == after.get("reason"):
        return []
    return [Note("Warning", str(after.get("reason") or "Stalled"), str(after.get("message") or ""))]


def cluster_notes(previous: Mapping[str, Any], status: Mapping[str, Any]) -> list[Note]:
    """Events for a CacheCluster status change: Ready, Degraded, scaled, stalled."""
    notes = _stalled(previous, status)
    phase, before = status.get("phase"), previous.get("phase")
    if phase != before and phase == ClusterPhase.READY:
        workers = status.get("workers", {})
        notes.append(Note("Normal", "Ready", f"Master and {workers.get('summary', '?')} workers are ready."))
    if phase == ClusterPhase.READY and _condition(previous, c.RECONCILING).get("reason") == Reason.ROLLING_OUT:
        notes.append(Note("Normal", "RolledOut",
                          f"Master and workers run generation {status.get('observedGeneration', '?')} of the spec."))
    if phase != before and phase == ClusterPhase.DEGRADED:
        ready = _condition(status, c.READY)
        notes.append(Note("Warning", str(ready.get("reason") or "Degraded"), str(ready.get("message") or "")))
    old, new = (previous.get("workers") or {}).get("desired"), (status.get("workers") or {}).get("desired")
    if old is not None and new is not None and old != new:
        notes.append(Note("Normal", "Scaled", f"Workers scaled from {old} to {new}."))
    return notes


def mount_notes(previous: Mapping[str, Any], status: Mapping[str, Any]) -> list[Note]:
    """Events for a Mount status change: mounted, failed, preloaded."""
    notes = _stalled(previous, status)
    if status.get("phase") != previous.get("phase") and status.get("phase") == MountPhase.MOUNTED:
        notes.append(Note("Normal", Reason.MOUNTED, "The source is mounted."))
    preload, before = status.get("preload") or {}, previous.get("preload") or {}
    if preload.get("phase") != before.get("phase"):
        preloaded = _condition(status, c.PRELOADED)
        if preload.get("phase") == PreloadPhase.SUCCEEDED:
            notes.append(Note("Normal", "Preloaded", str(preloaded.get("message") or "The preload finished.")))
        elif preload.get("phase") == PreloadPhase.FAILED:
            notes.append(Note("Warning", str(preloaded.get("reason") or "PreloadFailed"),
                              str(preloaded.get("message") or "")))
    return notes
