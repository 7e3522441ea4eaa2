"""Locality of pods that read Strata volumes. Pure: bodies in, affinity out, no I/O.

A pod that uses a Strata volume (an inline `csi` volume of driver csi.strata.dev with
`volumeAttributes.mount`) is placed next to its data: preferred node affinity to the nodes
whose workers hold the Mount's cached blocks, weighted by bytes per node (Mount status
`cache.nodes`), plus a preferred pod affinity to the nodes running the cluster's workers,
which is all there is to go on while nothing is cached yet. `Required` (CacheCluster
`spec.locality`, or the pod annotation `strata.dev/locality: required`) turns that into a
hard requirement: the data nodes if any hold data, else the worker nodes. `Disabled` leaves
the pod alone. The pod's own affinity is kept: our terms are added to it.

PersistentVolumeClaims are not followed: their PV is cluster-scoped (a cluster-wide read
for every pod admission) and is often bound only after the pod is admitted
(WaitForFirstConsumer), when the pod's affinity can no longer change.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

from strata.contract import csi
from strata.contract.errors import InvalidArgument
from strata.contract.units import parse_size
from strata.operator import constants as c

Obj = dict[str, Any]
Mode = Literal["Preferred", "Required", "Disabled"]

# Pod annotation a user sets: required | preferred | disabled (wins over the cluster's setting).
LOCALITY_ANNOTATION: Final = f"{c.GROUP}/locality"
# Set on pods this webhook placed, with the mode used; a pod carrying it is never changed again.
APPLIED_ANNOTATION: Final = f"{c.GROUP}/locality-applied"
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
# Preferred terms name at most this many nodes (those holding the most data): the scheduler
# scores every term for every node, and a pod spec should stay small.
MAX_PREFERRED_NODES: Final = 16
# Node weights run 1..100 by cached bytes. Worker nodes get one pod-affinity term of this
# weight: scored by another scheduler plugin, it ranks worker nodes over the rest without
# outweighing the user's own pod-affinity preferences.
WORKER_WEIGHT: Final = 50

_MODES: Final[Mapping[str, Mode]] = {"preferred": "Preferred", "required": "Required", "disabled": "Disabled"}


@dataclass(frozen=True, order=True)
class MountRef:
    """A Mount a pod's volume names."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Source:
    """One Mount a pod uses, as read from the API: its body and its cluster's (None: absent)."""

    ref: MountRef
    mount: Mapping[str, Any] | None
    cluster: Mapping[str, Any] | None


@dataclass(frozen=True)
class Decision:
    """What to do with a pod: the affinity to set (None: leave the pod alone), the mode that
    made it, and notes for the person creating the pod (admission warnings)."""

    affinity: Obj | None = None
    mode: Mode = "Disabled"
    nodes: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())


def pod_namespace(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("namespace") or "")


def mounts_of(pod: Mapping[str, Any]) -> list[MountRef]:
    """The Mounts named by the pod's Strata CSI volumes, each once, in volume order. A volume
    may name a Mount in another namespace (`volumeAttributes.namespace`)."""
    refs: list[MountRef] = []
    for volume in (pod.get("spec") or {}).get("volumes") or ():
        source = volume.get("csi") or {}
        attributes = source.get("volumeAttributes") or {}
        name = attributes.get(csi.ATTR_MOUNT)
        if source.get("driver") != csi.DRIVER_NAME or not name:
            continue
        ref = MountRef(str(attributes.get(csi.ATTR_NAMESPACE) or pod_namespace(pod)), str(name))
        if ref not in refs:
            refs.append(ref)
    return refs


def cluster_of(mount: Mapping[str, Any]) -> str | None:
    """The CacheCluster a Mount body names (spec.cluster), if any."""
    name = (mount.get("spec") or {}).get("cluster")
    return str(name) if name else None


def requested_mode(pod: Mapping[str, Any]) -> tuple[Mode | None, str | None]:
    """The pod's own locality (annotation), and a note when its value is not understood."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(LOCALITY_ANNOTATION)
    if value is None:
        return None, None
    mode = _MODES.get(str(value).strip().lower())
    if mode is None:
        return None, (f"annotation {LOCALITY_ANNOTATION}={value!r} is not one of "
                      f"{', '.join(_MODES)}; using the CacheCluster's spec.locality")
    return mode, None


def cluster_mode(cluster: Mapping[str, Any]) -> Mode:
    value = (cluster.get("spec") or {}).get("locality") or "Preferred"
    return cast(Mode, value) if value in _MODES.values() else "Preferred"


def cached_bytes_by_node(mount: Mapping[str, Any]) -> dict[str, int]:
    """Mount status cache.nodes as {node: bytes}; entries that cannot be read are skipped."""
    out: dict[str, int] = {}
    for entry in ((mount.get("status") or {}).get("cache") or {}).get("nodes") or ():
        node = entry.get("node")
        try:
            size = parse_size(entry.get("bytes", 0), what="cache.nodes[].bytes")
        except InvalidArgument:
            continue
        if node and size > 0:
            out[str(node)] = out.get(str(node), 0) + size
    return out


def node_weights(by_node: Mapping[str, int], limit: int = MAX_PREFERRED_NODES) -> list[tuple[str, int]]:
    """The nodes holding the most bytes, with weights 1..100 in proportion to their bytes."""
    ranked = sorted(by_node.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    if not ranked:
        return []
    top = ranked[0][1]
    return [(node, max(1, round(100 * size / top))) for node, size in ranked]


def worker_terms(clusters: Iterable[tuple[str, str]]) -> list[Obj]:
    """Pod-affinity terms matching the worker pods of the given (namespace, cluster)s: one
    term per namespace, so any of the clusters' workers satisfies it."""
    by_namespace: dict[str, list[str]] = {}
    for namespace, name in clusters:
        names = by_namespace.setdefault(namespace, [])
        if name not in names:
            names.append(name)
    return [
        {
            "topologyKey": HOSTNAME_LABEL,
            "namespaces": [namespace],
            "labelSelector": {
                "matchLabels": {c.LABEL_NAME: c.APP_NAME, c.LABEL_COMPONENT: c.COMPONENT_WORKER},
                "matchExpressions": [{"key": c.LABEL_INSTANCE, "operator": "In", "values": sorted(names)}],
            },
        }
        for namespace, names in sorted(by_namespace.items())
    ]


def _hostname_in(nodes: Sequence[str]) -> Obj:
    return {"key": HOSTNAME_LABEL, "operator": "In", "values": list(nodes)}


def merge_affinity(
    existing: Mapping[str, Any] | None,
    *,
    preferred_nodes: Sequence[tuple[str, int]] = (),
    required_nodes: Sequence[str] = (),
    preferred_workers: Sequence[Obj] = (),
    required_workers: Sequence[Obj] = (),
) -> Obj:
    """The pod's affinity with our terms added. A required node list is ANDed into each of
    the pod's own nodeSelectorTerms (terms are ORed), so both must hold."""
    affinity: Obj = copy.deepcopy(dict(existing or {}))
    if preferred_nodes or required_nodes:
        node = affinity.setdefault("nodeAffinity", {})
        if preferred_nodes:
            node.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).extend(
                {"weight": weight, "preference": {"matchExpressions": [_hostname_in([name])]}}
                for name, weight in preferred_nodes
            )
        if required_nodes:
            required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
            terms = required.get("nodeSelectorTerms") or [{}]
            for term in terms:
                term.setdefault("matchExpressions", []).append(_hostname_in(required_nodes))
            required["nodeSelectorTerms"] = terms
    if preferred_workers or required_workers:
        pod = affinity.setdefault("podAffinity", {})
        if preferred_workers:
            pod.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).extend(
                {"weight": WORKER_WEIGHT, "podAffinityTerm": term} for term in preferred_workers
            )
        if required_workers:
            pod.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).extend(required_workers)
    return affinity


def decide(pod: Mapping[str, Any], sources: Sequence[Source]) -> Decision:
    """The affinity for a pod, given the Mounts its Strata volumes name (see module doc)."""
    if not sources:
        return Decision()
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if APPLIED_ANNOTATION in annotations:
        return Decision(notes=(f"already placed by Strata ({APPLIED_ANNOTATION}); left unchanged",))
    requested, note = requested_mode(pod)
    notes = [note] if note else []
    if requested == "Disabled":
        return Decision(notes=tuple(notes))

    modes: list[Mode] = []
    clusters: list[tuple[str, str]] = []
    by_node: dict[str, int] = {}
    for source in sources:
        if source.mount is None:
            notes.append(f"Mount {source.ref} does not exist: no locality for its volume")
            continue
        if source.cluster is None:
            notes.append(f"CacheCluster {cluster_of(source.mount) or '(none)'} of Mount {source.ref} does not "
                         "exist: no locality for its volume")
            continue
        wanted = requested or cluster_mode(source.cluster)
        if wanted == "Disabled":
            continue
        modes.append(wanted)
        clusters.append((source.ref.namespace, str(cluster_of(source.mount))))
        for node, size in cached_bytes_by_node(source.mount).items():
            by_node[node] = by_node.get(node, 0) + size
    if not modes:
        return Decision(notes=tuple(notes))

    mode: Mode = "Required" if "Required" in modes else "Preferred"
    existing = (pod.get("spec") or {}).get("affinity")
    preferred = node_weights(by_node)
    workers = worker_terms(clusters)
    data_nodes = sorted(by_node)
    if mode == "Required" and data_nodes:
        affinity = merge_affinity(existing, preferred_nodes=preferred, required_nodes=data_nodes)
        return Decision(affinity, mode, tuple(data_nodes), tuple(notes))
    if mode == "Required":
        return Decision(merge_affinity(existing, required_workers=workers), mode, (), tuple(notes))
    affinity = merge_affinity(existing, preferred_nodes=preferred, preferred_workers=workers)
    return Decision(affinity, mode, tuple(name for name, _ in preferred), tuple(notes))
