"""Typed specs of CacheCluster and Mount, parsed once from an object's body.

Defaults here equal the defaults in the CRD schemas (a unit test holds them together), so a
body the API server defaulted and a bare body parse to the same spec. The cache policy is the
server's own model (`CachePolicySettings`), so operator and servers read it the same way.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from strata.contract.config import CachePolicySettings, Medium, ServerConfig, TierSettings
from strata.contract.constants import DEFAULT_BLOCK_SIZE
from strata.contract.errors import InvalidArgument
from strata.contract.modes import ReadType, WriteType
from strata.contract.units import parse_duration, parse_size
from strata.operator.cron import Schedule

_M = TypeVar("_M", bound=BaseModel)
Locality = Literal["Preferred", "Required", "Disabled"]

# URL schemes a Mount may use: stores the server image's fsspec can open.
SOURCE_SCHEMES: tuple[str, ...] = (
    "s3", "s3a", "gs", "gcs", "abfs", "az", "hdfs", "webhdfs", "file", "http", "https", "memory",
)
# Schemes that read the servers' own files: allowed under spec.localSources.allowedRoots only.
LOCAL_SOURCE_SCHEMES: tuple[str, ...] = ("file", "local")
DEFAULT_MEM_QUOTA = "1Gi"
DEFAULT_JOURNAL_SIZE = "1Gi"


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


def _size(value: Any, what: str) -> int:
    return parse_size(value, what=what)


class PodSettings(_Spec):
    """Scheduling and resources of one StatefulSet's pods (master or worker)."""

    replicas: int = Field(ge=0)
    resources: dict[str, Any] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: dict[str, Any] = Field(default_factory=dict)


class HostPathVolume(_Spec):
    path: str

    @field_validator("path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"hostPath.path must be absolute, got {v!r}")
        return v


class ClaimVolume(_Spec):
    """A PersistentVolumeClaim the operator makes (`<cluster>-journal`, owned by the
    CacheCluster): it outlives the master's pod, and on most clusters its node."""

    # None: the cluster's default StorageClass.
    storage_class_name: str | None = Field(None, alias="storageClassName", min_length=1)
    # Bytes. The journal is small (the mount table, the files written through Strata and not
    # in the store yet, pins): 1Gi is the smallest size many provisioners hand out.
    size: int = Field(parse_size(DEFAULT_JOURNAL_SIZE), gt=0)

    @field_validator("size", mode="before")
    @classmethod
    def _size(cls, v: Any) -> int:
        return _size(v, "journal size")


class EmptyDirVolume(_Spec):
    """An emptyDir: kept while the pod lives, lost when it is replaced."""


class JournalVolume(_Spec):
    persistent_volume_claim: ClaimVolume | None = Field(None, alias="persistentVolumeClaim")
    host_path: HostPathVolume | None = Field(None, alias="hostPath")
    empty_dir: EmptyDirVolume | None = Field(None, alias="emptyDir")

    @model_validator(mode="after")
    def _one(self) -> JournalVolume:
        if sum(v is not None for v in (self.persistent_volume_claim, self.host_path, self.empty_dir)) != 1:
            raise ValueError("journal volume: set exactly one of persistentVolumeClaim, hostPath or emptyDir")
        return self


class JournalSpec(_Spec):
    """Where the master keeps its journal: the mount table, the files written through Strata
    and not in the store yet (MUST_CACHE, pending ASYNC_THROUGH uploads), pins. Default: a
    claim of the default StorageClass, which outlives the master's pod."""

    volume: JournalVolume = JournalVolume.model_validate({"persistentVolumeClaim": {}})


class MasterSpec(PodSettings):
    # One master: it keeps the mount table and block locations in memory (no standby yet).
    replicas: int = Field(1, ge=1, le=1)
    journal: JournalSpec = JournalSpec.model_validate({})


class WorkerSpec(PodSettings):
    # Two workers: cached blocks survive one worker's restart or a node drain.
    replicas: int = Field(2, ge=0)


class EphemeralVolume(_Spec):
    # None: the cluster's default StorageClass.
    storage_class_name: str | None = Field(None, alias="storageClassName")


class TierVolume(_Spec):
    """Where an SSD or HDD tier keeps its blocks. Unset: a folder of the node
    (OperatorSettings.node_cache_root), which outlives the worker's pod."""

    host_path: HostPathVolume | None = Field(None, alias="hostPath")
    ephemeral: EphemeralVolume | None = None
    empty_dir: EmptyDirVolume | None = Field(None, alias="emptyDir")

    @model_validator(mode="after")
    def _one(self) -> TierVolume:
        if sum(v is not None for v in (self.host_path, self.ephemeral, self.empty_dir)) != 1:
            raise ValueError("tier volume: set exactly one of hostPath, ephemeral or emptyDir")
        return self


class TierSpec(_Spec):
    medium: Medium
    quota: int = Field(gt=0)
    volume: TierVolume | None = None

    @field_validator("quota", mode="before")
    @classmethod
    def _quota(cls, v: Any) -> int:
        return _size(v, "tier quota")

    @model_validator(mode="after")
    def _mem_volume(self) -> TierSpec:
        if self.medium == "MEM" and self.volume is not None:
            raise ValueError("a MEM tier is always an in-memory emptyDir; remove its volume")
        return self


class LocalSourcesSpec(_Spec):
    """Folders of the servers' hosts that file:// Mounts may name. None by default: the
    owner of the cluster opens that door, folder by folder."""

    allowed_roots: tuple[str, ...] = Field((), alias="allowedRoots")

    @field_validator("allowed_roots")
    @classmethod
    def _roots(cls, roots: tuple[str, ...]) -> tuple[str, ...]:
        for root in roots:
            if not root.startswith("/") or posixpath.normpath(root) != root:
                raise ValueError(f"localSources.allowedRoots: {root!r} must be an absolute, normalised path")
        return roots


def _default_tiers() -> tuple[TierSpec, ...]:
    return (TierSpec(medium="MEM", quota=parse_size(DEFAULT_MEM_QUOTA)),)


class CacheClusterSpec(_Spec):
    """spec of a CacheCluster."""

    # "": the server image the operator was installed with (OperatorSettings.server_image).
    image: str = ""
    block_size: int = Field(DEFAULT_BLOCK_SIZE, gt=0, alias="blockSize")
    master: MasterSpec = MasterSpec.model_validate({})
    worker: WorkerSpec = WorkerSpec.model_validate({})
    tiers: tuple[TierSpec, ...] = Field(default_factory=_default_tiers, min_length=1)
    cache_policy: CachePolicySettings = Field(CachePolicySettings.model_validate({}), alias="cachePolicy")
    short_circuit: bool = Field(True, alias="shortCircuit")
    locality: Locality = "Preferred"
    local_sources: LocalSourcesSpec = Field(LocalSourcesSpec.model_validate({}), alias="localSources")

    @field_validator("block_size", mode="before")
    @classmethod
    def _block_size(cls, v: Any) -> int:
        return _size(v, "blockSize")

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, tiers: tuple[TierSpec, ...]) -> tuple[TierSpec, ...]:
        # The servers' own rule (one tier per medium, fastest first): the two never disagree.
        try:
            ServerConfig.model_validate({"tiers": [TierSettings(medium=t.medium, quota=t.quota) for t in tiers]})
        except ValidationError as exc:
            raise ValueError("; ".join(_message(e["msg"]).removeprefix("tiers: ") for e in exc.errors())) from None
        return tiers


class SecretRef(_Spec):
    name: str


class Credentials(_Spec):
    secret_ref: SecretRef = Field(alias="secretRef")


class MetadataSync(_Spec):
    # Seconds; 0 = check the store on every access, -1 = never. 30 s: listings stay fresh
    # enough for batch jobs without a store request per file open.
    interval: float = 30.0

    @field_validator("interval", mode="before")
    @classmethod
    def _interval(cls, v: Any) -> float:
        seconds = parse_duration(v, what="metadataSync.interval")
        if seconds < 0 and seconds != -1:
            raise ValueError(f"metadataSync.interval: use -1 for never, got {v!r}")
        return seconds


class Preload(_Spec):
    on_create: bool = Field(False, alias="onCreate")
    # Paths inside the mount (relative to spec.path), loaded once the source is mounted.
    paths: tuple[str, ...] = ()
    # Cron (5 fields, UTC): load again at these times, after asking the store what changed.
    schedule: Schedule | None = None
    # Bytes a second every load of the preload may fetch, all workers together; 0: no limit.
    bandwidth: int = Field(0, ge=0)

    @field_validator("schedule", mode="before")
    @classmethod
    def _schedule(cls, v: Any) -> Schedule | None:
        if v is None or isinstance(v, Schedule):
            return v
        try:
            return Schedule.parse(str(v))
        except ValueError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("bandwidth", mode="before")
    @classmethod
    def _bandwidth(cls, v: Any) -> int:
        return _size(v, "bandwidth (bytes a second)")


class MountSpec(_Spec):
    """spec of a Mount."""

    cluster: str
    path: str
    source: str
    options: dict[str, str] = Field(default_factory=dict)
    credentials: Credentials | None = None
    read_only: bool = Field(True, alias="readOnly")
    metadata_sync: MetadataSync = Field(MetadataSync.model_validate({}), alias="metadataSync")
    read_type: ReadType | None = Field(None, alias="readType")
    write_type: WriteType | None = Field(None, alias="writeType")
    preload: Preload = Preload.model_validate({})
    pin: bool = False
    # Seconds; 0 = no TTL.
    ttl: float = 0.0
    # Answer from metadata older than metadataSync.interval while the store cannot be
    # reached, instead of failing reads of cached data (stale-if-error).
    stale_if_error: bool = Field(True, alias="staleIfError")
    # Namespaces (besides the Mount's own) whose pods may use it through CSI volumes; the
    # CSI node plugin refuses every other (cacheserver/csi/kube.py).
    allowed_namespaces: tuple[str, ...] = Field((), alias="allowedNamespaces")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/") or posixpath.normpath(v) != v or v == "/":
            raise ValueError(
                f"path must be absolute and normalised, not the root, e.g. /datasets/x; got {v!r}"
            )
        return v

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        scheme = urlsplit(v).scheme
        if scheme not in SOURCE_SCHEMES:
            raise ValueError(
                f"source {v!r}: scheme {scheme or '(none)'!r} is not supported; "
                f"use one of {', '.join(SOURCE_SCHEMES)}"
            )
        return v

    @field_validator("ttl", mode="before")
    @classmethod
    def _ttl(cls, v: Any) -> float:
        seconds = parse_duration(v or 0, what="ttl")
        if seconds < 0:
            raise ValueError(f"ttl must not be negative, got {v!r}")
        return seconds

    def preload_paths(self) -> tuple[str, ...]:
        """Namespace paths to load after mounting: the whole mount, or the listed sub-paths."""
        if self.preload.on_create:
            return (self.path,)
        return tuple(posixpath.join(self.path, p.lstrip("/")) for p in self.preload.paths)


@dataclass(frozen=True)
class ObjectRef:
    """Who owns a child: enough of an object's metadata for an ownerReference."""

    api_version: str
    kind: str
    name: str
    namespace: str
    uid: str


@dataclass(frozen=True)
class Cluster:
    """A parsed CacheCluster: its identity and its spec."""

    ref: ObjectRef
    generation: int
    spec: CacheClusterSpec


@dataclass(frozen=True)
class ClusterTokens:
    """The credentials of a cluster (its `<cluster>-auth` Secret): admin for the operator,
    data for volumes, internal for master and workers among themselves."""

    admin: str = field(repr=False)
    data: str = field(repr=False)
    internal: str = field(repr=False)


def parse_spec(model: type[_M], spec: Mapping[str, Any], *, what: str) -> _M:
    """Parse an object's spec, turning validation errors into one readable InvalidArgument."""
    try:
        return model.model_validate(dict(spec))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {_message(err['msg'])}"
            for err in exc.errors()
        )
        raise InvalidArgument(f"{what}: invalid spec: {problems}") from exc


def _message(msg: str) -> str:
    return msg.removeprefix("Value error, ")


def paths_overlap(a: str, b: str) -> bool:
    """True when one namespace path is the other or lies inside it."""
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")
