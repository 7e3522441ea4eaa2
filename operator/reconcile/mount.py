"""Reconcile a Mount: wait for its cluster's master, mount the source there (with the keys
of its credentials Secret), start a preload, and report what the master sees. On delete,
unmount and free, giving up after a bounded time if the cluster or master is gone."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from strata.contract.errors import (
    AlreadyExists,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    StrataError,
    Unauthenticated,
    Unavailable,
    Unreachable,
)
from strata.contract.proto import strata_pb2 as pb
from strata.contract.urls import shown_url
from strata.operator import constants as c
from strata.operator.builders.common import approximate_quantity, master_endpoint, worker_name
from strata.operator.builders.mount import build_mount_request, request_fingerprint
from strata.operator.constants import MountPhase, Reason
from strata.operator.kube import KubeError
from strata.operator.models import LOCAL_SOURCE_SCHEMES, MountSpec, parse_spec, paths_overlap
from strata.operator.reconcile.cluster import rollout_left
from strata.operator.reconcile.common import (
    Deps,
    ObjectKey,
    ObjectState,
    Outcome,
    Retry,
    read_token,
    secret_data,
    write_status,
)
from strata.operator.reconcile.schedule import run_when_due
from strata.operator.status import (
    MountObservation,
    PreloadObservation,
    Problem,
    mount_notes,
    mount_status,
    timestamp,
)

log = logging.getLogger(__name__)

# The longest wait before loading a failed or no longer whole preload again (seconds).
PRELOAD_RETRY_MAX = 3600.0
# Seconds after a scheduled time to reconcile (a timer may wake a little early), and the
# shortest wait between checks of a schedule.
SCHEDULE_RECHECK_MIN = 0.5


@dataclass(frozen=True)
class MasterTarget:
    """The cluster a Mount lives in, once its master can be called."""

    cluster: str
    endpoint: str
    token: str


def mount_problem(exc: StrataError, spec: MountSpec, endpoint: str) -> tuple[str, Problem]:
    """Phase and reason for a failed mount call, with what a person should do."""
    secret = spec.credentials.secret_ref.name if spec.credentials else None
    where = f"Secret {secret} (spec.credentials)" if secret else "spec.credentials (none given)"
    if isinstance(exc, Unreachable):
        return MountPhase.PENDING, Problem(
            Reason.MASTER_UNREACHABLE, f"The master at {endpoint} cannot be reached ({exc}); retrying."
        )
    if isinstance(exc, Unavailable | DeadlineExceeded):  # the master answered: its store did not
        return MountPhase.PENDING, Problem(
            Reason.STORE_UNREACHABLE, f"The store {shown_url(spec.source)} cannot be reached ({exc}); retrying."
        )
    if isinstance(exc, NotFound):
        return MountPhase.FAILED, Problem(
            Reason.SOURCE_NOT_FOUND,
            f"The source {shown_url(spec.source)} was not found: {exc}. Check the bucket and prefix in spec.source.",
        )
    if isinstance(exc, PermissionDenied) and urlsplit(spec.source).scheme in LOCAL_SOURCE_SCHEMES:
        return MountPhase.FAILED, Problem(
            Reason.SOURCE_NOT_ALLOWED,
            f"The servers refused {shown_url(spec.source)}: {exc}.",
        )
    if isinstance(exc, PermissionDenied):
        return MountPhase.FAILED, Problem(
            Reason.ACCESS_DENIED,
            f"The store refused access to {shown_url(spec.source)}: {exc}. Check the keys in {where} "
            "and the bucket's policy.",
        )
    if isinstance(exc, Unauthenticated):
        return MountPhase.FAILED, Problem(
            Reason.TOKEN_REJECTED,
            f"The master refused the operator's token ({exc}); the cluster's -auth Secret and "
            "the running master disagree: restart the master pod.",
        )
    if isinstance(exc, AlreadyExists):
        return MountPhase.FAILED, Problem(
            Reason.PATH_CONFLICT, f"{exc}. Choose a spec.path that no other mount uses or contains."
        )
    if isinstance(exc, InvalidArgument):
        return MountPhase.FAILED, Problem(
            Reason.INVALID_MOUNT, f"The master refused the mount: {exc}. Fix spec.path, spec.source or spec.options."
        )
    return MountPhase.FAILED, Problem(Reason.MOUNT_FAILED, f"Mounting {shown_url(spec.source)} failed: {exc}")


def _store_patience(deps: Deps, state: ObjectState, phase: str, problem: Problem) -> tuple[str, Problem]:
    """A store that does not answer keeps the Mount Pending for `store_patience` seconds (a
    hiccup), then Failed until it answers (tried again every reconcile either way)."""
    if problem.reason != Reason.STORE_UNREACHABLE:
        state.store_away_since = None
        return phase, problem
    now = deps.clock()
    since = state.store_away_since = state.store_away_since or now
    away = (now - since).total_seconds()
    if away < deps.settings.store_patience:
        return phase, problem
    return MountPhase.FAILED, Problem(problem.reason, f"{problem.message} No answer for {away:.0f}s: Failed "
                                      f"until it answers (tried every {deps.settings.reconcile_interval:.0f}s).")


def mount_report(report: pb.ReportResponse, path: str) -> pb.MountReport | None:
    return next((m for m in report.mounts if m.mount.path == path), None)


def _older(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether object a was created before b (names break ties)."""
    ka = (a["metadata"].get("creationTimestamp", ""), a["metadata"]["name"])
    kb = (b["metadata"].get("creationTimestamp", ""), b["metadata"]["name"])
    return ka < kb


async def _other_mounts(deps: Deps, body: Mapping[str, Any], spec: MountSpec) -> list[dict[str, Any]]:
    """Live Mounts of the same cluster, other than this one, whose paths overlap this one's."""
    key = ObjectKey.of(body)
    others = []
    for other in await deps.kube.list(c.API_VERSION, c.MOUNT_KIND, key.namespace):
        meta, ospec = other["metadata"], other.get("spec") or {}
        if meta.get("uid") == key.uid or meta.get("deletionTimestamp") or ospec.get("cluster") != spec.cluster:
            continue
        if paths_overlap(str(ospec.get("path", "")), spec.path):
            others.append(other)
    return others


async def master_target(deps: Deps, namespace: str, spec: MountSpec, *, ready: bool = True) -> MasterTarget | Problem:
    """The cluster's master and token; with `ready`, only once the cluster says its master is ready."""
    cluster = await deps.kube.get(c.API_VERSION, c.CACHE_CLUSTER_KIND, namespace, spec.cluster)
    if cluster is None:
        return Problem(Reason.CLUSTER_NOT_FOUND,
                       f"CacheCluster {namespace}/{spec.cluster} does not exist; create it or fix spec.cluster.")
    if cluster["metadata"].get("deletionTimestamp"):
        return Problem(Reason.CLUSTER_NOT_READY, f"CacheCluster {spec.cluster} is being deleted.")
    if ready and not ((cluster.get("status") or {}).get("master") or {}).get("ready"):
        return Problem(Reason.CLUSTER_NOT_READY, f"Waiting for the master of CacheCluster {spec.cluster}.")
    token = await read_token(deps, namespace, spec.cluster)
    if token is None:
        return Problem(Reason.CLUSTER_NOT_READY, f"Waiting for the token Secret of CacheCluster {spec.cluster}.")
    return MasterTarget(spec.cluster, master_endpoint(spec.cluster, namespace, deps.settings.cluster_domain), token)


async def _credentials(deps: Deps, namespace: str, spec: MountSpec) -> dict[str, str] | Problem:
    if spec.credentials is None:
        return {}
    name = spec.credentials.secret_ref.name
    secret = await deps.kube.get("v1", "Secret", namespace, name)
    if secret is None:
        return Problem(Reason.CREDENTIALS_NOT_FOUND,
                       f"Secret {namespace}/{name} (spec.credentials.secretRef) does not exist; create it "
                       "with the store's keys as data (e.g. key and secret for S3).")
    return secret_data(secret)


def _preload_trouble(load: pb.LoadProgress) -> Problem | None:
    """Why a finished load is not a preload that holds: it failed, or the cache lost bytes of
    it since (evicted, freed, or gone with a worker). None while running or whole."""
    if not load.done:
        return None
    if load.error:
        return Problem(Reason.PRELOAD_FAILED, f"Preloading {load.path} failed: {load.error}.")
    if load.bytes_cached < load.bytes_total:
        return Problem(Reason.PRELOAD_INCOMPLETE,
                       f"The cache holds {approximate_quantity(load.bytes_cached)} of the "
                       f"{approximate_quantity(load.bytes_total)} preloaded from {load.path} "
                       "(evicted, freed, or lost with a worker).")
    return None


def _backoff(deps: Deps, retry: Retry | None, problem: Problem, now: datetime) -> Retry:
    failures = (retry.failures if retry else 0) + 1
    delay = min(PRELOAD_RETRY_MAX, deps.settings.reconcile_interval * 2 ** (failures - 1))
    return Retry(now + timedelta(seconds=delay), failures, problem)


async def _workers_rolling(deps: Deps, namespace: str, cluster: str) -> bool:
    """Whether the cluster's workers roll out (a rolling update, a scale-in under way)."""
    statefulset = await deps.kube.get("apps/v1", "StatefulSet", namespace, worker_name(cluster))
    return statefulset is not None and rollout_left(statefulset) is not None


async def _preload(deps: Deps, target: MasterTarget, spec: MountSpec, state: ObjectState,
                   report: pb.MountReport, body: Mapping[str, Any]) -> PreloadObservation:
    """Start the scheduled run when it is due (see `schedule`). Load each preload path the
    master has no load of (never started, or the master restarted), and again each one that
    failed or whose bytes the cache no longer holds, with a backoff from `reconcile_interval`
    doubling up to PRELOAD_RETRY_MAX. What is whole is left alone: an operator restart starts
    nothing that is already true. While the workers roll out, nothing is loaded again: a
    replaced worker brings its disk tiers' blocks (and its MEM tier's, moved to a disk tier)
    back, and a load meanwhile would fetch its share from the store again. The master keeps
    loading after we hang up."""
    loads = {load.path: load for load in report.loads}
    before = (body.get("status") or {}).get("preload") or {}
    next_run = await run_when_due(deps, target.endpoint, target.token, spec, state, loads, before,
                                  body["metadata"].get("creationTimestamp"))
    now = deps.clock()
    problems: list[Problem] = []
    started = False
    for path in spec.preload_paths():
        load = loads.get(path)
        trouble = _preload_trouble(load) if load is not None else None
        if load is not None and trouble is None:  # running, or done and whole
            if load.done:
                state.preload_retries.pop(path, None)
            continue
        if (load is None or (trouble is not None and trouble.reason == Reason.PRELOAD_INCOMPLETE)) \
                and await _workers_rolling(deps, body["metadata"]["namespace"], spec.cluster):
            if trouble is not None:
                problems.append(Problem(trouble.reason, f"{trouble.message} Loading it again once the workers "
                                        f"of {spec.cluster} have rolled out."))
            continue
        retry = state.preload_retries.get(path)
        if retry is not None and now < retry.at:
            problem = trouble or retry.problem
            problems.append(Problem(problem.reason, f"{problem.message} Trying again at {timestamp(retry.at)}."))
            continue
        try:
            first = await deps.masters.client(target.endpoint, target.token).start_load(
                path, bandwidth=spec.preload.bandwidth)
        except (NotFound, InvalidArgument) as exc:
            problem = Problem(Reason.PRELOAD_FAILED,
                              f"Cannot preload {path}: {exc}. Fix spec.preload.paths (paths inside the mount).")
            state.preload_retries[path] = _backoff(deps, retry, problem, now)
            problems.append(problem)
            continue
        started = True
        if first is not None and load is None:  # shown as running from now on
            first.path = path
            loads[path] = first
        log.info("started preload of %s on %s%s", path, target.endpoint, f" ({trouble.message})" if trouble else "")
        if trouble is not None:
            state.preload_retries[path] = _backoff(deps, retry, trouble, now)
            problems.append(Problem(trouble.reason, f"{trouble.message} Loading it again."))
    if started:
        deps.masters.invalidate(target.endpoint)
    return PreloadObservation(tuple(loads.get(p) for p in spec.preload_paths()), tuple(problems), next_run)


async def _observe(deps: Deps, body: Mapping[str, Any], spec: MountSpec, state: ObjectState,
                   generation: int) -> MountObservation:
    namespace = body["metadata"]["namespace"]
    target = await master_target(deps, namespace, spec)
    if isinstance(target, Problem):
        return MountObservation(generation, MountPhase.PENDING, target)
    older = [o for o in await _other_mounts(deps, body, spec) if _older(o, body)]
    if older:
        other = older[0]
        conflict = Problem(
            Reason.PATH_CONFLICT,
            f"spec.path {spec.path} overlaps Mount {other['metadata']['name']} "
            f"({other['spec']['path']}) of cluster {spec.cluster}; choose a path outside it.",
        )
        return MountObservation(generation, MountPhase.FAILED, conflict)
    credentials = await _credentials(deps, namespace, spec)
    if isinstance(credentials, Problem):
        return MountObservation(generation, MountPhase.FAILED, credentials)

    request = build_mount_request(spec, credentials)
    fingerprint = request_fingerprint(request)
    synced_at: datetime | None = None
    preload: PreloadObservation | None = None
    try:
        report = await deps.masters.report(target.endpoint, target.token)
        mounted = mount_report(report, spec.path)
        # A mount the master cannot use (its credentials sealed with another cluster key)
        # is mounted again: the same data keeps its mount id, and its unpersisted files.
        current = mounted is not None and state.fingerprint == fingerprint and (
            mounted.mount.mount_id == state.mount_id
        ) and not mounted.mount.unusable
        if not current:
            # After an operator restart this asks again what the master may already hold:
            # the master tells whether anything changed, and only a change is a sync.
            answer = await deps.masters.client(target.endpoint, target.token).mount(request)
            state.fingerprint, state.mount_id = fingerprint, answer.mount.mount_id
            if answer.changed:
                synced_at = deps.clock()
                log.info("mounted %s at %s on %s (mount id %d)", shown_url(spec.source), spec.path, target.endpoint,
                         answer.mount.mount_id)
            deps.masters.invalidate(target.endpoint)
            mounted = mount_report(await deps.masters.report(target.endpoint, target.token, fresh=True), spec.path)
        if mounted is not None and spec.preload_paths():
            preload = await _preload(deps, target, spec, state, mounted, body)
    except StrataError as exc:
        state.fingerprint = None
        phase, problem = mount_problem(exc, spec, target.endpoint)
        return MountObservation(generation, *_store_patience(deps, state, phase, problem))
    state.store_away_since = None
    return MountObservation(generation, MountPhase.MOUNTED, None, mounted, synced_at,
                            preload=preload)


async def reconcile_mount(deps: Deps, body: Mapping[str, Any], state: ObjectState) -> Outcome:
    """Make the master's mount table hold this Mount as specified, and write its status."""
    key = ObjectKey.of(body)
    previous = body.get("status") or {}
    try:
        spec = parse_spec(MountSpec, body.get("spec") or {}, what=f"Mount {key.namespace}/{key.name}")
    except InvalidArgument as exc:
        obs = MountObservation(key.generation, MountPhase.FAILED, Problem(Reason.INVALID_SPEC, str(exc)))
    else:
        obs = await _observe(deps, body, spec, state, key.generation)
    status = mount_status(obs, previous, deps.clock())
    await write_status(deps, c.MOUNT_KIND, key, previous, status)
    notes = mount_notes(previous, status)
    message = obs.problem.message if obs.problem else "mounted"
    if obs.phase == MountPhase.MOUNTED:
        return Outcome.ok(message).telling(notes).again_in(_schedule_recheck(deps, obs.preload))
    if obs.phase == MountPhase.FAILED:
        return Outcome.stuck(message).telling(notes)
    return Outcome.waiting(message).telling(notes)


def _schedule_recheck(deps: Deps, preload: PreloadObservation | None) -> float | None:
    """With a schedule: just after its next time, or soon while a load runs (its end makes
    lastRun, and a run that is due waits for it)."""
    if preload is None or preload.next_run is None:
        return None
    if any(load is not None and not load.done for load in preload.loads):
        return deps.settings.retry_delay
    return max(SCHEDULE_RECHECK_MIN, (preload.next_run - deps.clock()).total_seconds() + SCHEDULE_RECHECK_MIN)


def _seconds_since(stamp: str, now: datetime) -> float:
    then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (now - then).total_seconds()


def _give_up_after_timeout(deps: Deps, key: ObjectKey, why: str, path: str) -> Outcome:
    """Retry while the Mount has been deleting for less than `unmount_timeout`, then let it go."""
    waited = _seconds_since(key.deleting_since, deps.clock()) if key.deleting_since else 0.0
    if waited < deps.settings.unmount_timeout:
        return Outcome.waiting(f"cannot unmount {path} yet: {why}")
    log.warning("gave up unmounting %s after %.0fs: %s", path, waited, why)
    return Outcome.ok(f"gave up unmounting {path} after {waited:.0f}s: {why}")


async def remove_mount(deps: Deps, body: Mapping[str, Any]) -> Outcome:
    """Unmount and free on delete. Done when unmounted, when there is nothing to unmount,
    or when the master stayed unreachable for `unmount_timeout` seconds."""
    key = ObjectKey.of(body)
    previous = body.get("status") or {}
    obs = MountObservation(key.generation, MountPhase.UNMOUNTING,
                           Problem(Reason.UNMOUNTING, "Unmounting and freeing cached blocks."))
    await write_status(deps, c.MOUNT_KIND, key, previous, mount_status(obs, previous, deps.clock()))
    try:
        spec = parse_spec(MountSpec, body.get("spec") or {}, what=f"Mount {key.namespace}/{key.name}")
    except InvalidArgument:
        return Outcome.ok("the spec was never valid: nothing was mounted")
    try:
        target = await master_target(deps, key.namespace, spec, ready=False)
    except KubeError as exc:
        if exc.status not in (401, 403):
            raise
        # The namespace took its grant away (a namespace being deleted removes its
        # RoleBindings too): the cluster's token cannot be read, like a master that is gone.
        return _give_up_after_timeout(deps, key, f"the cluster's token Secret cannot be read ({exc})", spec.path)
    if isinstance(target, Problem):
        return Outcome.ok(f"nothing to unmount: {target.message}")
    if any(o["spec"]["path"] == spec.path for o in await _other_mounts(deps, body, spec)):
        return Outcome.ok(f"{spec.path} belongs to another Mount; left mounted")
    try:
        await deps.masters.client(target.endpoint, target.token).unmount(spec.path, free=True)
    except NotFound:
        return Outcome.ok(f"{spec.path} was not mounted")
    except Unavailable as exc:
        return _give_up_after_timeout(deps, key, f"the master at {target.endpoint} cannot be reached ({exc})",
                                      spec.path)
    except StrataError as exc:
        log.warning("unmounting %s failed, removing the Mount anyway: %s", spec.path, exc)
        return Outcome.ok(f"unmounting {spec.path} failed: {exc}")
    deps.masters.invalidate(target.endpoint)
    return Outcome.ok(f"unmounted {spec.path} and freed its blocks")
