"""Reconcile a CacheCluster: master, then workers, then status.

Each step applies its children (server-side apply: running it twice changes nothing) and
returns "not ready yet" instead of waiting; the next run, from a retry or the timer, goes on.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import replace
from collections.abc import Mapping, Sequence
from typing import Any

from strata.contract.constants import data_token_key
from strata.contract.errors import InvalidArgument, StrataError
from strata.contract.proto import strata_pb2 as pb
from strata.operator import constants as c
from strata.operator.builders import build_master_children, build_worker_children
from strata.operator.builders.common import (
    csi_tokens,
    journal_name,
    kept_token_key,
    kept_tokens,
    master_endpoint,
    master_name,
    worker_name,
    worker_pod_names,
)
from strata.operator.constants import ClusterPhase, Reason
from strata.operator.kube import KubeError
from strata.operator.models import CacheClusterSpec, Cluster, ClusterTokens, ObjectRef, parse_spec
from strata.operator.reconcile.common import (
    Deps,
    ObjectKey,
    Outcome,
    read_secret_tokens,
    secret_data,
    write_status,
)
from strata.operator.settings import OperatorSettings
from strata.operator.status import (
    ClusterObservation,
    Problem,
    cluster_notes,
    cluster_status,
    decommissioned_workers,
    journal_claim_problem,
)

log = logging.getLogger(__name__)

# HTTP statuses for an apply the API server will refuse again until someone changes something.
_REFUSED = (400, 403, 422)


def _ready_replicas(statefulset: Mapping[str, Any] | None) -> int:
    if statefulset is None:
        return 0
    return int((statefulset.get("status") or {}).get("readyReplicas") or 0)


def rollout_left(statefulset: Mapping[str, Any] | None) -> str | None:
    """What keeps a StatefulSet's pods from all being of its current spec (a rolling update
    under way, pods of a scale-in still terminating), or None when they are."""
    if statefulset is None:
        return "not created yet"
    name = (statefulset.get("metadata") or {}).get("name", "")
    generation = int((statefulset.get("metadata") or {}).get("generation") or 0)
    status = statefulset.get("status") or {}
    wanted = _replicas(statefulset)
    if int(status.get("observedGeneration") or 0) < generation:
        return f"{name}: the StatefulSet controller has not yet taken generation {generation}"
    updated = int(status.get("updatedReplicas") or 0)
    if status.get("currentRevision") != status.get("updateRevision") or updated < wanted:
        return f"{name}: {updated}/{wanted} pods are of the current revision"
    leaving = int(status.get("replicas") or 0) - wanted
    if leaving > 0:
        return f"{name}: {leaving} pod(s) of a scale-in still terminating"
    return None


def _rollout(statefulsets: Sequence[Mapping[str, Any] | None]) -> Problem | None:
    left = [why for why in map(rollout_left, statefulsets) if why is not None]
    return Problem(Reason.ROLLING_OUT, "Rolling out: " + "; ".join(left) + ".") if left else None


def _replicas(statefulset: Mapping[str, Any] | None) -> int:
    if statefulset is None:
        return 0
    return int((statefulset.get("spec") or {}).get("replicas") or 0)


def _with_workers(cluster: Cluster, replicas: int) -> Cluster:
    worker = cluster.spec.worker.model_copy(update={"replicas": replicas})
    return Cluster(cluster.ref, cluster.generation, cluster.spec.model_copy(update={"worker": worker}))


_TOKEN_KEYS = (c.TOKEN_KEY, c.DATA_TOKEN_KEY, c.INTERNAL_TOKEN_KEY)


async def _kept_tokens(deps: Deps, namespace: str, name: str) -> dict[str, str]:
    """The copy of the cluster's tokens the operator keeps in its own namespace, by key."""
    settings = deps.settings
    if not settings.kept_tokens_secret:
        return {}
    kept = await deps.kube.get("v1", "Secret", settings.namespace, settings.kept_tokens_secret)
    data = secret_data(kept) if kept else {}
    return {key: data[k] for key in _TOKEN_KEYS if (k := kept_token_key(namespace, name, key)) in data}


async def _ensure_tokens(deps: Deps, cluster: Cluster) -> ClusterTokens:
    """The cluster's tokens: those its Secret holds; those it lost (someone deleted
    `<cluster>-auth`) from the operator's kept copy, so the servers keep their tokens and
    every published volume its data token; new ones for keys known nowhere (a new cluster)."""
    namespace, name = cluster.ref.namespace, cluster.ref.name
    held = await read_secret_tokens(deps, namespace, name)
    if any(key not in held for key in _TOKEN_KEYS):
        kept = await _kept_tokens(deps, namespace, name)
        if kept and held:
            log.warning("the Secret of %s/%s lost tokens; the kept copies are put back", namespace, name)
        held = {**kept, **held}

    def token(key: str) -> str:
        return held.get(key) or secrets.token_urlsafe(32)

    return ClusterTokens(admin=token(c.TOKEN_KEY), data=token(c.DATA_TOKEN_KEY), internal=token(c.INTERNAL_TOKEN_KEY))


async def _ensure_master(deps: Deps, cluster: Cluster) -> ClusterTokens:
    """Apply config, token Secret, master Service and StatefulSet; return the tokens."""
    tokens = await _ensure_tokens(deps, cluster)
    await _share_tokens(deps, cluster.ref.namespace, cluster.ref.name, tokens)
    for manifest in build_master_children(cluster, deps.settings, tokens):
        await deps.kube.apply(manifest)
    return tokens


async def _share_tokens(deps: Deps, namespace: str, name: str, tokens: ClusterTokens | None) -> None:
    """Put the cluster's data token in the CSI tokens Secret, where the node plugin reads it
    and nowhere else, and all its tokens in the operator's kept copy (None: take them out),
    each under this cluster's own field manager. The kept copy is written first: tokens the
    servers get are always recoverable."""
    settings = deps.settings
    if settings.kept_tokens_secret:
        shared = kept_tokens(settings.namespace, settings.kept_tokens_secret)
        data = None if tokens is None else {
            kept_token_key(namespace, name, key): value
            for key, value in ((c.TOKEN_KEY, tokens.admin), (c.DATA_TOKEN_KEY, tokens.data),
                               (c.INTERNAL_TOKEN_KEY, tokens.internal))}
        await deps.kube.apply(shared.entry(namespace, name, data), manager=shared.manager(namespace, name))
    if settings.csi_tokens_secret:
        shared = csi_tokens(settings.namespace, settings.csi_tokens_secret)
        data = None if tokens is None else {data_token_key(namespace, name): tokens.data}
        await deps.kube.apply(shared.entry(namespace, name, data), manager=shared.manager(namespace, name))


async def _tell_master(deps: Deps, cluster: Cluster, endpoint: str, token: str,
                       report: pb.ReportResponse | None) -> tuple[Cluster, Problem | None]:
    """Tell the master which workers leave and which serve, before the worker StatefulSet
    changes size. A scale-in names the leaving workers first, so the master places no new
    blocks there; if it cannot be told, the current size stays. A worker that drains (its
    node cordoned, its pod evicted: strata.operator.drain) leaves too, until no pod of it
    drains. A scale-out, and any worker the master still holds decommissioned, names the
    workers wanted (the same names come back after a scale-in or a drain). Told again while
    pods of a scale-in still stop, and while a worker drains: a master that restarted
    meanwhile knows it too."""
    statefulset = await deps.kube.get("apps/v1", "StatefulSet", cluster.ref.namespace, worker_name(cluster.ref.name))
    current = _replicas(statefulset)
    pods = int(((statefulset or {}).get("status") or {}).get("replicas") or 0)
    desired = cluster.spec.worker.replicas
    wanted = worker_pod_names(cluster.ref.name, range(desired))
    draining = [w for w in deps.drains.draining(cluster.ref.namespace, cluster.ref.name) if w in wanted]
    leaving = worker_pod_names(cluster.ref.name, range(desired, max(current, pods))) + draining
    serving = [w for w in wanted if w not in draining]
    held = decommissioned_workers(report, serving)
    growing = statefulset is not None and desired > current
    if not (leaving or growing or held):
        return cluster, None
    try:
        await deps.masters.client(endpoint, token).decommission(leaving, serving=serving)
    except StrataError as exc:
        if desired < current:
            message = (f"Cannot tell the master at {endpoint} that workers {', '.join(leaving)} leave ({exc}); "
                       f"keeping {current} workers until it answers.")
            return _with_workers(cluster, current), Problem(Reason.DECOMMISSION_FAILED, message)
        told = f"workers {', '.join(held or serving)} serve" + (f" and {', '.join(leaving)} leave" if leaving else "")
        message = f"Cannot tell the master at {endpoint} that {told} ({exc}); telling it again until it answers."
        return cluster, Problem(Reason.DECOMMISSION_FAILED, message)
    if desired < current:
        log.info("decommissioned workers %s of %s/%s", leaving, cluster.ref.namespace, cluster.ref.name)
    if held:
        log.info("workers %s of %s/%s are wanted again: told the master", held, cluster.ref.namespace,
                 cluster.ref.name)
    return cluster, None


async def tell_master_of_drain(deps: Deps, namespace: str, name: str) -> None:
    """Tell the master of cluster `namespace/name` at once that its workers that drain now
    leave (a drain evicts the worker within a second of the cordon: the worker asks the
    master at its stop whether it leaves). The cluster's reconcile tells it again; a
    failure here is only logged."""
    draining = deps.drains.draining(namespace, name)
    if not draining:
        return
    endpoint = master_endpoint(name, namespace, deps.settings.cluster_domain)
    try:
        token = (await read_secret_tokens(deps, namespace, name)).get(c.TOKEN_KEY)
        if token is None:
            return  # no master has been given a token yet: nothing to tell
        await deps.masters.client(endpoint, token).decommission(draining)
    except (StrataError, KubeError) as exc:
        log.warning("cannot tell the master at %s that the draining workers %s leave: %s", endpoint,
                    ", ".join(draining), exc)
        return
    log.info("workers %s of %s/%s drain (node cordoned or pod evicted): told the master they leave",
             draining, namespace, name)


def secrets_grant_advice(settings: OperatorSettings, namespace: str, exc: KubeError) -> str:
    """What to do when the operator may not use Secrets in a namespace: the namespace grants it."""
    if exc.status != 403 or '"secrets"' not in str(exc) or not settings.tenant_role:
        return ""
    account = f"{settings.namespace}:{settings.service_account}"
    return (f". The operator uses Secrets only in namespaces that grant it: run kubectl create rolebinding "
            f"strata-operator -n {namespace} --clusterrole={settings.tenant_role} --serviceaccount={account} "
            f"(or list {namespace} in the chart's rbac.tenantNamespaces)")


async def _journal_waiting(deps: Deps, cluster: Cluster) -> Problem | None:
    """Why the master waits for its journal's claim, if it has one and it is not bound."""
    if cluster.spec.master.journal.volume.persistent_volume_claim is None:
        return None
    claim = await deps.kube.get("v1", "PersistentVolumeClaim", cluster.ref.namespace, journal_name(cluster.ref.name))
    return journal_claim_problem(claim)


async def _observe(deps: Deps, cluster: Cluster, key: ObjectKey, endpoint: str) -> ClusterObservation:
    ns, name = cluster.ref.namespace, cluster.ref.name
    base = ClusterObservation(
        generation=key.generation,
        desired_workers=cluster.spec.worker.replicas,
        endpoint=endpoint,
        worker_ids=frozenset(worker_pod_names(name, range(cluster.spec.worker.replicas))),
        draining=frozenset(deps.drains.draining(ns, name)),
    )
    try:
        tokens = await _ensure_master(deps, cluster)
        token = tokens.admin
        master = await deps.kube.get("apps/v1", "StatefulSet", ns, master_name(name))
        master_ready = _ready_replicas(master) >= 1
        if not master_ready:
            return replace(base, applied=True, master_waiting=await _journal_waiting(deps, cluster))
        report, master_error = None, None
        try:
            report = await deps.masters.report(endpoint, token, fresh=True)
        except StrataError as exc:
            master_error = str(exc)
        sized, scaling = await _tell_master(deps, cluster, endpoint, token, report)
        for manifest in build_worker_children(sized, deps.settings, tokens):
            await deps.kube.apply(manifest)
        workers = await deps.kube.get("apps/v1", "StatefulSet", ns, worker_name(name))
    except KubeError as exc:
        if exc.status not in _REFUSED:
            raise
        problem = Problem(Reason.APPLY_FAILED, f"The API server refused a child of this cluster: {exc}"
                          + secrets_grant_advice(deps.settings, ns, exc))
        return replace(base, stalled=problem)
    return replace(
        base,
        applied=True,
        master_pods_ready=True,
        master_error=master_error,
        report=report,
        workers_ready=_ready_replicas(workers),
        scaling=scaling,
        rolling=_rollout([master, workers]),
    )


async def reconcile_cluster(deps: Deps, body: Mapping[str, Any]) -> Outcome:
    """Make the cluster's children match its spec and write its status."""
    key = ObjectKey.of(body)
    previous = body.get("status") or {}
    endpoint = master_endpoint(key.name, key.namespace, deps.settings.cluster_domain)
    raw_spec = body.get("spec") or {}
    try:
        spec = parse_spec(CacheClusterSpec, raw_spec, what=f"CacheCluster {key.namespace}/{key.name}")
    except InvalidArgument as exc:
        desired = int((raw_spec.get("worker") or {}).get("replicas") or 0)
        obs = ClusterObservation(key.generation, desired, endpoint,
                                 stalled=Problem(Reason.INVALID_SPEC, str(exc)))
        status = cluster_status(key.name, obs, previous, deps.clock())
        await write_status(deps, c.CACHE_CLUSTER_KIND, key, previous, status)
        return Outcome.stuck(str(exc)).telling(cluster_notes(previous, status))
    if key.deleting_since:
        obs = ClusterObservation(key.generation, spec.worker.replicas, endpoint, terminating=True, applied=True)
        await write_status(deps, c.CACHE_CLUSTER_KIND, key,
                           previous, cluster_status(key.name, obs, previous, deps.clock()))
        await deps.masters.forget(endpoint)
        try:
            await _share_tokens(deps, key.namespace, key.name, None)
        except KubeError as exc:  # never hold up the deletion for it
            log.warning("cannot take the tokens of %s/%s out of the operator's Secrets: %s",
                        key.namespace, key.name, exc)
        return Outcome.ok("terminating: children are garbage-collected with the cluster")

    ref = ObjectRef(c.API_VERSION, c.CACHE_CLUSTER_KIND, key.name, key.namespace, key.uid)
    obs = await _observe(deps, Cluster(ref, key.generation, spec), key, endpoint)
    status = cluster_status(key.name, obs, previous, deps.clock())
    await write_status(deps, c.CACHE_CLUSTER_KIND, key, previous, status)
    notes = cluster_notes(previous, status)
    if obs.stalled is not None:
        return Outcome.stuck(obs.stalled.message).telling(notes)
    if status["phase"] == ClusterPhase.READY:
        return Outcome.ok("ready").telling(notes)
    ready = next(cond for cond in status["conditions"] if cond["type"] == c.READY)
    return Outcome.waiting(ready["message"]).telling(notes)
