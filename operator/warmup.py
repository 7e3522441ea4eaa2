"""The warm-up gate of pods that read Strata volumes. Pure: bodies and load progress in,
decisions out, no I/O.

A Strata CSI volume with the attribute `warmPercent` (a number above 0, at most 100) asks
that its pod start warm. The locality webhook then adds the scheduling gate `strata.dev/warm`
to the pod when it is created, so Kubernetes does not schedule it. The operator loads the
volume's data (the Mount's path, or its `subPath` below it) when no load of it is running,
and removes the gate once the cache holds at least that percentage of the data of every
such volume of the pod; or, whatever is cached, once `warmTimeout` (a duration such as
`90s` or `10m`, default 10m; the shortest of the pod's volumes counts) has passed since the
pod was created, with a Warning Event that says how warm each volume got and why.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from strata.contract import csi
from strata.contract.errors import InvalidArgument
from strata.contract.proto import strata_pb2 as pb
from strata.contract.units import format_size, parse_duration
from strata.operator import constants as c
from strata.operator.locality import MountRef, pod_namespace

Obj = dict[str, Any]

# The scheduling gate the webhook adds and the operator removes.
WARM_GATE: Final = f"{c.GROUP}/warm"
# Seconds a gated pod waits at most when its volume names no `warmTimeout`.
DEFAULT_WARM_TIMEOUT: Final = 600.0
# The longest `warmTimeout` taken: a pod is never held longer than a day.
MAX_WARM_TIMEOUT: Final = 86400.0
# Who an Event about a released pod says posted it, and the longest message it carries.
EVENT_SOURCE: Final = "strata-operator"
EVENT_MESSAGE_MAX: Final = 1024


@dataclass(frozen=True)
class WarmVolume:
    """One volume of a pod that asks to start warm: its Mount, the folder below the Mount's
    path it shows ("" for all of it), the percentage to wait for, and the longest wait."""

    ref: MountRef
    subpath: str
    percent: float
    timeout: float


def _percent(value: Any) -> float:
    try:
        percent = float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{csi.ATTR_WARM_PERCENT} {value!r} is not a number; write e.g. \"90\"") from None
    if not 0 < percent <= 100:
        raise InvalidArgument(f"{csi.ATTR_WARM_PERCENT} {value!r} must be above 0 and at most 100")
    return percent


def _timeout(value: Any) -> float:
    if value is None or value == "":
        return DEFAULT_WARM_TIMEOUT
    seconds = parse_duration(str(value), what=csi.ATTR_WARM_TIMEOUT)
    if not 0 < seconds <= MAX_WARM_TIMEOUT:
        raise InvalidArgument(f"{csi.ATTR_WARM_TIMEOUT} {value!r} must be above 0 and at most "
                              f"{MAX_WARM_TIMEOUT:.0f}s (a day)")
    return seconds


def _subpath(value: Any) -> str:
    text = str(value or "").strip("/")
    if not text:
        return ""
    rel = posixpath.normpath("/" + text).lstrip("/")
    if rel != text or rel.startswith(".."):
        raise InvalidArgument(f"{csi.ATTR_SUBPATH} {value!r} is not a plain folder below the Mount's path")
    return rel


def warm_volumes(pod: Mapping[str, Any]) -> tuple[list[WarmVolume], list[str]]:
    """The pod's Strata volumes that ask to start warm, and a note for each one whose warm-up
    attributes cannot be read (that volume then does not hold the pod)."""
    volumes: list[WarmVolume] = []
    notes: list[str] = []
    for volume in (pod.get("spec") or {}).get("volumes") or ():
        source = volume.get("csi") or {}
        attributes = source.get("volumeAttributes") or {}
        name = attributes.get(csi.ATTR_MOUNT)
        if source.get("driver") != csi.DRIVER_NAME or not name or csi.ATTR_WARM_PERCENT not in attributes:
            continue
        ref = MountRef(str(attributes.get(csi.ATTR_NAMESPACE) or pod_namespace(pod)), str(name))
        try:
            volumes.append(WarmVolume(ref, _subpath(attributes.get(csi.ATTR_SUBPATH)),
                                      _percent(attributes[csi.ATTR_WARM_PERCENT]),
                                      _timeout(attributes.get(csi.ATTR_WARM_TIMEOUT))))
        except InvalidArgument as exc:
            notes.append(f"volume {volume.get('name')!r}: {exc}; it does not hold the pod until warm")
    return volumes, notes


def scheduling_gates(pod: Mapping[str, Any]) -> list[Obj]:
    return [dict(g) for g in (pod.get("spec") or {}).get("schedulingGates") or ()]


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod carries the warm-up gate."""
    return any(g.get("name") == WARM_GATE for g in scheduling_gates(pod))


def gates_with_warm(pod: Mapping[str, Any]) -> list[Obj] | None:
    """The pod's scheduling gates with the warm-up gate added; None when it has it already."""
    gates = scheduling_gates(pod)
    if any(g.get("name") == WARM_GATE for g in gates):
        return None
    return [*gates, {"name": WARM_GATE}]


def gates_without_warm(pod: Mapping[str, Any]) -> list[Obj]:
    """The pod's other scheduling gates (someone else's), in their order."""
    return [g for g in scheduling_gates(pod) if g.get("name") != WARM_GATE]


def gate_for(pod: Mapping[str, Any]) -> tuple[list[Obj] | None, list[str]]:
    """The scheduling gates to give a pod being created (None: leave them as they are), and
    notes for the person creating it."""
    volumes, notes = warm_volumes(pod)
    if not volumes:
        return None, notes
    if (pod.get("spec") or {}).get("nodeName"):
        return None, [*notes, f"the pod names its node (spec.nodeName): the {WARM_GATE} gate cannot hold it, "
                              "so it may start before its data is cached"]
    return gates_with_warm(pod), notes


def data_path(mount_path: str, subpath: str) -> str:
    """The namespace path a volume shows: the Mount's path, or the folder below it."""
    return posixpath.join(mount_path, subpath) if subpath else mount_path


@dataclass(frozen=True)
class GatedPod:
    """A pod held by the warm-up gate, as much of it as the checks need."""

    namespace: str
    name: str
    uid: str
    created: datetime | None
    volumes: tuple[WarmVolume, ...]

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> GatedPod:
        meta = pod.get("metadata") or {}
        stamp = meta.get("creationTimestamp")
        created = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")) if stamp else None
        return cls(str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or ""),
                   created, tuple(warm_volumes(pod)[0]))

    def reference(self) -> Obj:
        """The pod as an Event's involvedObject names it."""
        return {"apiVersion": "v1", "kind": "Pod", "namespace": self.namespace, "name": self.name, "uid": self.uid}


@dataclass(frozen=True)
class Warmth:
    """How much of one volume's data the cache holds: bytes cached of the bytes to load
    (`known` once the load has listed them), or why that is not known."""

    volume: WarmVolume
    path: str
    cached: int = 0
    total: int = 0
    known: bool = False
    problem: str = ""

    @property
    def percent(self) -> float:
        if not self.known:
            return 0.0
        return 100.0 if self.total == 0 else 100.0 * min(self.cached, self.total) / self.total

    @property
    def warm(self) -> bool:
        return self.known and not self.problem and self.percent >= self.volume.percent

    def __str__(self) -> str:
        if not self.known:
            return f"{self.path}: not known yet ({self.problem or 'its load has not listed the data'})"
        shown = (f"{self.path}: {self.percent:.1f}% of {format_size(self.total)} cached "
                 f"(wanted {self.volume.percent:g}%)")
        return f"{shown}, {self.problem}" if self.problem else shown


def warmth_of(volume: WarmVolume, path: str, load: pb.LoadProgress | None) -> Warmth:
    """A volume's warmth from the master's load of its path (None: there is none yet)."""
    if load is None:
        return Warmth(volume, path, problem="no load of it yet")
    if load.error:
        return Warmth(volume, path, load.bytes_cached, load.bytes_total, True, f"its load failed: {load.error}")
    return Warmth(volume, path, load.bytes_cached, load.bytes_total, load.done or load.bytes_total > 0)


def needs_load(load: pb.LoadProgress | None, started_here: bool) -> bool:
    """Whether to start a load of a gated volume's path: there is none, or the last one ended
    failed or short of whole and this pod has not started one yet (once per pod and path, so
    data larger than the cache is not loaded again and again)."""
    if load is None:
        return True
    if not load.done or started_here:
        return False
    return bool(load.error) or load.bytes_cached < load.bytes_total


@dataclass(frozen=True)
class Release:
    """Why a gated pod is released now: its data is warm, or it waited its timeout."""

    reason: Literal["warm", "timeout"]
    message: str


def release_of(pod: GatedPod, warmths: Sequence[Warmth], now: datetime) -> Release | None:
    """Release a gated pod when each of its warm volumes is warm, or once the shortest of their
    timeouts has passed since it was created; None: keep holding it."""
    shown = "; ".join(str(w) for w in warmths)
    if all(w.warm for w in warmths):
        return Release("warm", f"The data of its Strata volumes is cached: {shown or 'nothing asked'}.")
    timeout = min((v.timeout for v in pod.volumes), default=0.0)
    waited = (now - pod.created).total_seconds() if pod.created is not None else timeout
    if waited >= timeout:
        return Release("timeout", f"Started after waiting {waited:.0f}s ({csi.ATTR_WARM_TIMEOUT} {timeout:g}s) "
                                  f"for data that is not warm: {shown}.")
    return None


def release_event(pod: GatedPod, type_: str, reason: str, message: str, now: datetime) -> Obj:
    """The Event (core v1) that tells a released pod's owner why it was released."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{pod.name}.{reason.lower()}-{int(now.timestamp())}", "namespace": pod.namespace},
        "involvedObject": pod.reference(),
        "type": type_, "reason": reason, "message": message[:EVENT_MESSAGE_MAX],
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        "source": {"component": EVENT_SOURCE}, "reportingComponent": EVENT_SOURCE,
    }
