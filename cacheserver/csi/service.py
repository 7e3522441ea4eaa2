"""The CSI services of driver csi.strata.dev: Identity, Node and Controller.

Node: NodePublishVolume mounts a volume's data at the target path with its own FUSE process
(publisher.py); no staging. Controller: CreateVolume and DeleteVolume for StorageClasses
whose parameters name the data (a Mount, or masterAddress and path; see volumes.py), and
ValidateVolumeCapabilities. A provisioned volume only refers to data that exists already:
its capacity is unknown (0), DeleteVolume deletes nothing, and there is no controller
publishing, listing, capacity, snapshot, clone or expansion.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import metadata

import grpc
from google.protobuf import wrappers_pb2

from strata.contract import csi as c
from strata.contract.errors import InvalidArgument, NotFound
from .. import rpcutil
from .proto import csi_pb2 as csi
from .proto import csi_pb2_grpc as csi_grpc
from .publisher import Publisher, check_source
from .volumes import (
    MountResolver,
    capability_problem,
    check_capabilities,
    source_of,
    volume_context,
    volume_id_for,
    volume_token,
    wants_read_only,
)

log = logging.getLogger("strata.csi")


def _version() -> str:
    try:
        return metadata.version("strata")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def _require(value: str, what: str) -> str:
    if not value:
        raise InvalidArgument(f"{what} is missing")
    return value


class IdentityService(csi_grpc.IdentityServicer):
    @rpcutil.unary
    async def GetPluginInfo(self, request: csi.GetPluginInfoRequest,
                            context: grpc.aio.ServicerContext) -> csi.GetPluginInfoResponse:
        return csi.GetPluginInfoResponse(name=c.DRIVER_NAME, vendor_version=_version())

    @rpcutil.unary
    async def GetPluginCapabilities(self, request: csi.GetPluginCapabilitiesRequest,
                                    context: grpc.aio.ServicerContext) -> csi.GetPluginCapabilitiesResponse:
        Service = csi.PluginCapability.Service
        return csi.GetPluginCapabilitiesResponse(capabilities=[
            csi.PluginCapability(service=Service(type=Service.CONTROLLER_SERVICE)),
            csi.PluginCapability(service=Service(type=Service.VOLUME_ACCESSIBILITY_CONSTRAINTS)),
        ])

    @rpcutil.unary
    async def Probe(self, request: csi.ProbeRequest, context: grpc.aio.ServicerContext) -> csi.ProbeResponse:
        return csi.ProbeResponse(ready=wrappers_pb2.BoolValue(value=True))


class NodeService(csi_grpc.NodeServicer):
    def __init__(self, node_id: str, publisher: Publisher, resolver: MountResolver) -> None:
        self.node_id = node_id
        self.publisher = publisher
        self.resolver = resolver

    @rpcutil.unary
    async def NodePublishVolume(self, request: csi.NodePublishVolumeRequest,
                                context: grpc.aio.ServicerContext) -> csi.NodePublishVolumeResponse:
        volume_id = _require(request.volume_id, "volume_id")
        target = _require(request.target_path, "target_path")
        if not request.HasField("volume_capability"):
            raise InvalidArgument("volume_capability is missing")
        check_capabilities([request.volume_capability])
        attributes, secrets = dict(request.volume_context), dict(request.secrets)
        if (volume_id.startswith(c.VOLUME_ID_PREFIX) and c.ATTR_NAMESPACE in attributes
                and not attributes.get(c.POD_NAMESPACE)):
            # A volume CreateVolume made (kubelet names the pod's namespace whenever the
            # CSIDriver has podInfoOnMount; callers without it, e.g. csi-sanity, do not): its
            # namespace is the claim's, which was checked when it was made.
            attributes[c.PVC_NAMESPACE] = attributes[c.ATTR_NAMESPACE]
        source = await asyncio.to_thread(source_of, attributes, secrets, self.resolver)
        read_only = request.readonly or wants_read_only(request.volume_capability)
        await asyncio.to_thread(self.publisher.publish, volume_id, target, source, read_only)
        return csi.NodePublishVolumeResponse()

    @rpcutil.unary
    async def NodeUnpublishVolume(self, request: csi.NodeUnpublishVolumeRequest,
                                  context: grpc.aio.ServicerContext) -> csi.NodeUnpublishVolumeResponse:
        volume_id = _require(request.volume_id, "volume_id")
        target = _require(request.target_path, "target_path")
        await asyncio.to_thread(self.publisher.unpublish, volume_id, target)
        return csi.NodeUnpublishVolumeResponse()

    @rpcutil.unary
    async def NodeGetVolumeStats(self, request: csi.NodeGetVolumeStatsRequest,
                                 context: grpc.aio.ServicerContext) -> csi.NodeGetVolumeStatsResponse:
        volume_id = _require(request.volume_id, "volume_id")
        path = _require(request.volume_path, "volume_path")
        stats = await asyncio.to_thread(self.publisher.stats, volume_id, path)
        usage = [csi.VolumeUsage(unit=csi.VolumeUsage.BYTES, total=stats.total, used=stats.used,
                                 available=stats.available)]
        return csi.NodeGetVolumeStatsResponse(
            usage=usage, volume_condition=csi.VolumeCondition(abnormal=stats.abnormal, message=stats.message))

    @rpcutil.unary
    async def NodeGetCapabilities(self, request: csi.NodeGetCapabilitiesRequest,
                                  context: grpc.aio.ServicerContext) -> csi.NodeGetCapabilitiesResponse:
        RPC = csi.NodeServiceCapability.RPC
        return csi.NodeGetCapabilitiesResponse(capabilities=[
            csi.NodeServiceCapability(rpc=RPC(type=RPC.GET_VOLUME_STATS)),
            csi.NodeServiceCapability(rpc=RPC(type=RPC.VOLUME_CONDITION)),
        ])

    @rpcutil.unary
    async def NodeGetInfo(self, request: csi.NodeGetInfoRequest,
                          context: grpc.aio.ServicerContext) -> csi.NodeGetInfoResponse:
        return csi.NodeGetInfoResponse(
            node_id=self.node_id, max_volumes_per_node=0,
            accessible_topology=csi.Topology(segments={c.TOPOLOGY_KEY: self.node_id}))


class ControllerService(csi_grpc.ControllerServicer):
    def __init__(self, resolver: MountResolver) -> None:
        self.resolver = resolver

    def _check_exists(self, context: dict[str, str], secrets: dict[str, str]) -> None:
        """NotFound (or another error) unless the data the attributes name exists; a volume
        that names a master can only be checked with its token."""
        if context.get(c.ATTR_MOUNT) or volume_token(secrets):
            source = source_of(context, secrets, self.resolver)
            check_source(source)
        elif context.get(c.ATTR_MASTER):
            source_of(context, {c.SECRET_TOKEN: "unchecked"}, self.resolver)  # the attributes are complete
        else:
            source_of(context, secrets, self.resolver)  # raises InvalidArgument naming what is missing

    @rpcutil.unary
    async def CreateVolume(self, request: csi.CreateVolumeRequest,
                           context: grpc.aio.ServicerContext) -> csi.CreateVolumeResponse:
        name = _require(request.name, "name")
        check_capabilities(list(request.volume_capabilities))
        if request.HasField("volume_content_source"):
            raise InvalidArgument("Strata volumes show existing data: snapshots and clones as sources are not supported")
        attributes = volume_context(dict(request.parameters))
        # The claim's namespace asks for the Mount (the provisioner passes it with
        # --extra-create-metadata); without it, the check is whether the Mount exists, and
        # which pods may use the volume is NodePublishVolume's check (kubelet names them).
        asking = request.parameters.get(c.PVC_NAMESPACE) or attributes.get(c.ATTR_NAMESPACE)
        requester = {c.PVC_NAMESPACE: asking} if asking else {}
        await asyncio.to_thread(self._check_exists, {**attributes, **requester}, dict(request.secrets))
        volume = csi.Volume(volume_id=volume_id_for(name), capacity_bytes=0, volume_context=attributes)
        log.info("created volume %s (%s) for %s", volume.volume_id, attributes, name)
        return csi.CreateVolumeResponse(volume=volume)

    @rpcutil.unary
    async def DeleteVolume(self, request: csi.DeleteVolumeRequest,
                           context: grpc.aio.ServicerContext) -> csi.DeleteVolumeResponse:
        volume_id = _require(request.volume_id, "volume_id")
        log.info("deleted volume %s (its data stays where it is)", volume_id)
        return csi.DeleteVolumeResponse()

    @rpcutil.unary
    async def ValidateVolumeCapabilities(self, request: csi.ValidateVolumeCapabilitiesRequest,
                                         context: grpc.aio.ServicerContext) -> csi.ValidateVolumeCapabilitiesResponse:
        volume_id = _require(request.volume_id, "volume_id")
        capabilities = list(request.volume_capabilities)
        if not capabilities:
            raise InvalidArgument("volume_capabilities is missing")
        attributes = dict(request.volume_context)
        if attributes.get(c.ATTR_MOUNT) or attributes.get(c.ATTR_MASTER):
            # Whether the volume exists, as its Mount's own namespace sees it: which pods may
            # use it is NodePublishVolume's check.
            owner = {c.PVC_NAMESPACE: attributes[c.ATTR_NAMESPACE]} if attributes.get(c.ATTR_NAMESPACE) else {}
            await asyncio.to_thread(self._check_exists, {**owner, **attributes}, dict(request.secrets))
        elif not volume_id.startswith(c.VOLUME_ID_PREFIX):
            raise NotFound(f"volume {volume_id} is unknown: it was not made by {c.DRIVER_NAME} and its "
                           "attributes name no Mount")
        problems = [p for p in map(capability_problem, capabilities) if p]
        if problems:
            return csi.ValidateVolumeCapabilitiesResponse(message="; ".join(problems))
        confirmed = csi.ValidateVolumeCapabilitiesResponse.Confirmed(
            volume_context=attributes, volume_capabilities=capabilities, parameters=dict(request.parameters))
        return csi.ValidateVolumeCapabilitiesResponse(confirmed=confirmed)

    @rpcutil.unary
    async def ControllerGetCapabilities(self, request: csi.ControllerGetCapabilitiesRequest,
                                        context: grpc.aio.ServicerContext) -> csi.ControllerGetCapabilitiesResponse:
        RPC = csi.ControllerServiceCapability.RPC
        return csi.ControllerGetCapabilitiesResponse(capabilities=[
            csi.ControllerServiceCapability(rpc=RPC(type=RPC.CREATE_DELETE_VOLUME)),
        ])
