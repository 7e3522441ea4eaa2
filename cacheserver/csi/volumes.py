"""What a CSI volume shows: from its attributes (or StorageClass parameters) and secrets to a
Strata cluster (master, token) and a namespace path.

Two ways to name the data:

- A Mount: `{mount: NAME}`, optionally `namespace: NS` (default: the pod's namespace, which
  kubelet passes when the CSIDriver has `podInfoOnMount: true`, or the PVC's for provisioned
  volumes) and `subPath: dir/below`. The Mount's cluster, path and token are found by a
  MountResolver (kube.py reads them from the Kubernetes API). A Mount of another namespace
  is used only when that namespace granted the pod's one (the Mount's
  `spec.allowedNamespaces`).
- A cluster directly: `{masterAddress: HOST:PORT, path: /datasets/x}` with the cluster token
  in the volume's secrets under `token` (nodePublishSecretRef); optional `readOnly: "true"`,
  `writeType`, `subPath`. This needs no Kubernetes API access at all.

Either way `passthrough: "true"` asks that the kernel read large files from local copies on
the node (a read-only volume; fuse/localcopies.py): for datasets of large files, at the
cost of an open answered by the FUSE process for each file (a dataset of small files opens
faster without it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from strata.contract import csi as c
from strata.contract.errors import InvalidArgument
from strata.contract.modes import WriteType
from ..common.paths import join, normalize
from .proto import csi_pb2 as csi

Mode = csi.VolumeCapability.AccessMode
READ_ONLY_MODES = frozenset({Mode.SINGLE_NODE_READER_ONLY, Mode.MULTI_NODE_READER_ONLY})


@dataclass(frozen=True)
class VolumeSource:
    master: str
    token: str = field(repr=False)
    path: str                # namespace path shown at the target
    read_only: bool = False  # the data may not be changed (a read-only Mount)
    write_type: str = ""     # "" = the Strata mount's
    name: str = ""           # how messages name the volume's data
    passthrough: bool = False  # large files read by the kernel from local copies (read-only volumes)


class MountResolver(Protocol):
    """Finds the cluster, token and path of the Mount `namespace/name` for a volume of a pod
    (or claim) in namespace `requester`; raises NotFound, FailedPrecondition (not ready yet),
    PermissionDenied (e.g. `requester` is not granted the Mount) or Unavailable."""

    def resolve(self, namespace: str, name: str, secrets: Mapping[str, str], requester: str) -> VolumeSource: ...


def mount_namespace(attributes: Mapping[str, str]) -> str:
    namespace = attributes.get(c.ATTR_NAMESPACE) or attributes.get(c.POD_NAMESPACE) or attributes.get(c.PVC_NAMESPACE)
    if not namespace:
        raise InvalidArgument(
            f"the volume names Mount {attributes.get(c.ATTR_MOUNT)!r} but not its namespace: set "
            f"podInfoOnMount: true on the CSIDriver {c.DRIVER_NAME}, or add the attribute `namespace`")
    return namespace


def requester_namespace(attributes: Mapping[str, str]) -> str:
    """The namespace of the pod (or claim) the volume is for, which must be granted the Mount."""
    namespace = attributes.get(c.POD_NAMESPACE) or attributes.get(c.PVC_NAMESPACE)
    if not namespace:
        raise InvalidArgument(
            f"the volume names Mount {attributes.get(c.ATTR_MOUNT)!r} but kubelet did not say which namespace "
            f"asks for it: set podInfoOnMount: true on the CSIDriver {c.DRIVER_NAME}")
    return namespace


def check_write_type(value: str) -> str:
    if value and value not in WriteType.__members__:
        raise InvalidArgument(f"writeType {value!r} is not one of {', '.join(WriteType)}")
    return value


def check_flag(attributes: Mapping[str, str], key: str) -> bool:
    """A volume attribute that is "true" or "false" (absent: false)."""
    value = attributes.get(key, "")
    if value.lower() not in ("", "true", "false"):
        raise InvalidArgument(f"{key} {value!r}: write \"true\" or \"false\"")
    return value.lower() == "true"


def with_subpath(source: VolumeSource, subpath: str) -> VolumeSource:
    if not subpath:
        return source
    rel = normalize("/" + subpath, what=f"subPath {subpath!r}").lstrip("/")
    return replace(source, path=join(source.path, rel), name=f"{source.name} subPath {rel}")


def volume_token(secrets: Mapping[str, str]) -> str | None:
    """The token a volume's secrets give it: the data credential when the Secret holds one
    (`<cluster>-auth` holds the admin one too, under `token`, which a volume never uses)."""
    return secrets.get(c.SECRET_DATA_TOKEN) or (None if c.SECRET_DATA_TOKEN in secrets else secrets.get(c.SECRET_TOKEN))


def source_of(attributes: Mapping[str, str], secrets: Mapping[str, str], resolver: MountResolver) -> VolumeSource:
    """The data a volume with these attributes and secrets shows (see the module docstring)."""
    if attributes.get(c.ATTR_MOUNT):
        source = resolver.resolve(mount_namespace(attributes), attributes[c.ATTR_MOUNT], secrets,
                                  requester_namespace(attributes))
    elif attributes.get(c.ATTR_MASTER):
        master = attributes[c.ATTR_MASTER]
        path = attributes.get(c.ATTR_PATH)
        if not path:
            raise InvalidArgument(f"the volume names master {master} but no `{c.ATTR_PATH}` to show; add one")
        token = volume_token(secrets)
        if not token:
            raise InvalidArgument(f"the volume names master {master} but its secrets hold no `{c.SECRET_DATA_TOKEN}` "
                                  f"(or `{c.SECRET_TOKEN}`): set nodePublishSecretRef to a Secret with the cluster's "
                                  "data token")
        source = VolumeSource(master=master, token=token, path=normalize(path, what=c.ATTR_PATH),
                              read_only=check_flag(attributes, c.ATTR_READ_ONLY),
                              name=f"{path} on {master}")
    else:
        keys = sorted(k for k in attributes if not k.startswith(c.RESERVED_PREFIX))
        raise InvalidArgument(
            f"the volume attributes must name a Mount (`{c.ATTR_MOUNT}: NAME`) or a cluster "
            f"(`{c.ATTR_MASTER}` and `{c.ATTR_PATH}`); got {keys or 'none'}")
    write_type = check_write_type(attributes.get(c.ATTR_WRITE_TYPE, ""))
    if write_type:
        source = replace(source, write_type=write_type)
    if check_flag(attributes, c.ATTR_PASSTHROUGH):
        source = replace(source, passthrough=True)
    return with_subpath(source, attributes.get(c.ATTR_SUBPATH, ""))


def capability_problem(capability: csi.VolumeCapability) -> str | None:
    """Why a capability cannot be served, or None."""
    if capability.HasField("block"):
        return "Strata volumes are file systems: block access is not supported (use volumeMode: Filesystem)"
    if not capability.HasField("mount"):
        return "the volume capability sets no access type (mount)"
    if capability.access_mode.mode == Mode.UNKNOWN:
        return "the volume capability sets no access mode"
    return None


def check_capabilities(capabilities: list[csi.VolumeCapability]) -> None:
    if not capabilities:
        raise InvalidArgument("volume capabilities are missing")
    for capability in capabilities:
        problem = capability_problem(capability)
        if problem:
            raise InvalidArgument(problem)


def wants_read_only(capability: csi.VolumeCapability) -> bool:
    return capability.access_mode.mode in READ_ONLY_MODES


def volume_id_for(name: str) -> str:
    """The id CreateVolume gives the volume `name`: the same name, the same id."""
    return c.VOLUME_ID_PREFIX + hashlib.sha256(name.encode()).hexdigest()[:32]


def volume_context(parameters: Mapping[str, str]) -> dict[str, str]:
    """The attributes a provisioned volume keeps: the parameters, with the PVC's namespace
    made explicit and the provisioner's own keys left out."""
    context = {k: v for k, v in parameters.items() if not k.startswith(c.RESERVED_PREFIX)}
    if context.get(c.ATTR_MOUNT):
        context[c.ATTR_NAMESPACE] = mount_namespace(parameters)
    return context
