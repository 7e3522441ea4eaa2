"""Check the pods held by the warm-up gate (strata.operator.warmup): how much of each one's
data its cluster's cache holds, start a load of that data when none is running, and take the
gate off once the data is warm or the pod waited its timeout.

One check of a pod costs a read of each Mount it names and of the pod (once per check, shared
by the pods of a check), the cluster's Report (shared by every pod and Mount of that master
for `report_ttl`), and at most one load per pod and path in the pod's life.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from strata.contract.errors import InvalidArgument, NotFound, StrataError
from strata.operator import constants as c
from strata.operator.kube import KubeError
from strata.operator.locality import MountRef
from strata.operator.models import MountSpec, parse_spec
from strata.operator.reconcile.common import Deps
from strata.operator.reconcile.mount import master_target, mount_report
from strata.operator.status import Note, Problem
from strata.operator.warmup import (
    GatedPod,
    Warmth,
    WarmVolume,
    data_path,
    gates_without_warm,
    needs_load,
    release_event,
    release_of,
    warmth_of,
)

log = logging.getLogger(__name__)

# Event reasons on a pod the gate released.
WARMED_UP = "WarmedUp"
WARM_UP_TIMED_OUT = "WarmUpTimedOut"


@dataclass
class WarmState:
    """What the checks remember between rounds: the paths each gated pod (by uid) had loaded."""

    started: dict[str, set[str]] = field(default_factory=dict)

    def keep_only(self, uids: set[str]) -> None:
        """Forget pods no longer gated (released, or deleted while gated)."""
        for uid in [u for u in self.started if u not in uids]:
            del self.started[uid]


async def _mount(deps: Deps, ref: MountRef, read: dict[MountRef, Any]) -> Any:
    if ref not in read:
        read[ref] = await deps.kube.get(c.API_VERSION, c.MOUNT_KIND, ref.namespace, ref.name)
    return read[ref]


async def _warmth(deps: Deps, pod: GatedPod, volume: WarmVolume, state: WarmState,
                  read: dict[MountRef, Any]) -> Warmth:
    """How warm one volume's data is; starts its load when there is none to wait for."""
    body = await _mount(deps, volume.ref, read)
    where = f"Mount {volume.ref}"
    if body is None:
        return Warmth(volume, where, problem=f"{where} does not exist")
    try:
        spec = parse_spec(MountSpec, body.get("spec") or {}, what=where)
    except InvalidArgument as exc:
        return Warmth(volume, where, problem=str(exc))
    if volume.ref.namespace != pod.namespace and pod.namespace not in spec.allowed_namespaces:
        return Warmth(volume, where, problem=f"{where} does not grant namespace {pod.namespace} its use")
    path = data_path(spec.path, volume.subpath)
    target = await master_target(deps, volume.ref.namespace, spec)
    if isinstance(target, Problem):
        return Warmth(volume, path, problem=target.message)
    try:
        mounted = mount_report(await deps.masters.report(target.endpoint, target.token), spec.path)
        if mounted is None:
            return Warmth(volume, path, problem=f"{where} is not mounted yet")
        load = next((load for load in mounted.loads if load.path == path), None)
        started = state.started.setdefault(pod.uid, set())
        if needs_load(load, path in started):
            # The gate's load fetches from the same store as the preload: its bandwidth too.
            await deps.masters.client(target.endpoint, target.token).start_load(path, bandwidth=spec.preload.bandwidth)
            started.add(path)
            deps.masters.invalidate(target.endpoint)
            log.info("pod %s/%s waits for %s: started loading it", pod.namespace, pod.name, path)
    except (NotFound, InvalidArgument) as exc:
        return Warmth(volume, path, problem=f"cannot load it: {exc}")
    except StrataError as exc:
        return Warmth(volume, path, problem=f"the master at {target.endpoint} did not answer: {exc}")
    return warmth_of(volume, path, load)


async def _release(deps: Deps, pod: GatedPod) -> bool:
    """Take the warm-up gate off the pod (keeping others' gates); False if it is gone."""
    for _ in range(3):  # a pod changed between read and patch is read again
        body = await deps.kube.get("v1", "Pod", pod.namespace, pod.name)
        if body is None or (body.get("metadata") or {}).get("uid") != pod.uid:
            return False
        if await deps.kube.set_scheduling_gates(body, gates_without_warm(body)):
            return True
    return False


async def check_pod(deps: Deps, pod: GatedPod, state: WarmState, read: dict[MountRef, Any]) -> Note | None:
    """Check one gated pod; release it when its data is warm or its time is up, and post an
    Event on it that says why (the Note returned)."""
    warmths = []
    for volume in pod.volumes:
        try:
            warmths.append(await _warmth(deps, pod, volume, state, read))
        except KubeError as exc:  # e.g. a Mount the operator may not read: the timeout still counts
            warmths.append(Warmth(volume, f"Mount {volume.ref}", problem=f"cannot read it: {exc}"))
    release = release_of(pod, warmths, deps.clock())
    if release is None:
        return None
    if not await _release(deps, pod):
        return None
    log.info("released pod %s/%s (%s): %s", pod.namespace, pod.name, release.reason, release.message)
    if release.reason == "warm":
        note = Note("Normal", WARMED_UP, release.message)
    else:
        note = Note("Warning", WARM_UP_TIMED_OUT, release.message)
    try:
        await deps.kube.create(release_event(pod, note.type, note.reason, note.message, deps.clock()))
    except KubeError as exc:  # the pod is released all the same
        log.warning("cannot post the Event on pod %s/%s: %s", pod.namespace, pod.name, exc)
    return note


async def check_gated_pods(deps: Deps, pods: Sequence[GatedPod], state: WarmState) -> list[tuple[GatedPod, Note]]:
    """One round over the gated pods: the Events posted on those released. A pod whose
    check fails is checked again next round (and released at its timeout all the same)."""
    state.keep_only({pod.uid for pod in pods})
    read: dict[MountRef, Any] = {}
    notes: list[tuple[GatedPod, Note]] = []
    for pod in pods:
        try:
            note = await check_pod(deps, pod, state, read)
        except (KubeError, StrataError) as exc:
            log.warning("cannot check the warm-up of pod %s/%s: %s", pod.namespace, pod.name, exc)
            continue
        if note is not None:
            notes.append((pod, note))
    return notes

