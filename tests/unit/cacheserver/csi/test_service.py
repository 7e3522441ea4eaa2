"""The Identity, Node and Controller services over their Unix socket: what kubelet, the
external-provisioner and csi-sanity ask, and the errors they get. Publishing real volumes
is in tests/integration/test_csi.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from strata.cacheserver.csi.proto import csi_pb2 as csi
from strata.cacheserver.csi.volumes import VolumeSource, volume_id_for
from strata.contract import csi as c

from .conftest import Plugin

Mode = csi.VolumeCapability.AccessMode


def capability(*, block: bool = False) -> csi.VolumeCapability:
    cap = csi.VolumeCapability(access_mode=Mode(mode=Mode.SINGLE_NODE_WRITER))
    (cap.block if block else cap.mount).SetInParent()
    return cap


async def status_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


async def test_identity_names_the_driver_and_its_services(plugin: Plugin) -> None:
    info = await plugin.identity.GetPluginInfo(csi.GetPluginInfoRequest())
    assert info.name == c.DRIVER_NAME and info.vendor_version
    caps = await plugin.identity.GetPluginCapabilities(csi.GetPluginCapabilitiesRequest())
    services = {cap.service.type for cap in caps.capabilities}
    Service = csi.PluginCapability.Service
    assert services == {Service.CONTROLLER_SERVICE, Service.VOLUME_ACCESSIBILITY_CONSTRAINTS}
    assert (await plugin.identity.Probe(csi.ProbeRequest())).ready.value


async def test_node_info_carries_the_topology_key(plugin: Plugin) -> None:
    info = await plugin.node.NodeGetInfo(csi.NodeGetInfoRequest())
    assert info.node_id == "node-a"
    assert dict(info.accessible_topology.segments) == {c.TOPOLOGY_KEY: "node-a"}
    caps = await plugin.node.NodeGetCapabilities(csi.NodeGetCapabilitiesRequest())
    RPC = csi.NodeServiceCapability.RPC
    assert {cap.rpc.type for cap in caps.capabilities} == {RPC.GET_VOLUME_STATS, RPC.VOLUME_CONDITION}


async def test_staging_is_not_offered(plugin: Plugin) -> None:
    stage = plugin.channel.unary_unary("/csi.v1.Node/NodeStageVolume", request_serializer=lambda m: b"",
                                       response_deserializer=lambda b: b)
    code, _ = await status_of(stage(b""))
    assert code == grpc.StatusCode.UNIMPLEMENTED


def publish_request(tmp_path: Path, **fields: Any) -> csi.NodePublishVolumeRequest:
    defaults: dict[str, Any] = dict(volume_id="vol-1", target_path=str(tmp_path / "pod" / "mount"),
                                    volume_capability=capability(),
                                    volume_context={c.ATTR_MOUNT: "data", c.POD_NAMESPACE: "team"})
    defaults.update(fields)
    return csi.NodePublishVolumeRequest(**{k: v for k, v in defaults.items() if v is not None})


@pytest.mark.parametrize(("fields", "code", "message"), [
    ({"volume_id": None}, grpc.StatusCode.INVALID_ARGUMENT, "volume_id"),
    ({"target_path": None}, grpc.StatusCode.INVALID_ARGUMENT, "target_path"),
    ({"volume_capability": None}, grpc.StatusCode.INVALID_ARGUMENT, "volume_capability"),
    ({"volume_capability": capability(block=True)}, grpc.StatusCode.INVALID_ARGUMENT, "block"),
    ({"volume_context": {c.ATTR_MOUNT: "data"}}, grpc.StatusCode.INVALID_ARGUMENT, "podInfoOnMount"),
    ({"volume_context": {c.ATTR_MOUNT: "nope", c.POD_NAMESPACE: "team"}}, grpc.StatusCode.NOT_FOUND, "team/nope"),
    ({"volume_context": {c.ATTR_MASTER: "127.0.0.1:1", c.ATTR_PATH: "/x"}}, grpc.StatusCode.INVALID_ARGUMENT, "token"),
])
async def test_publish_refuses_bad_requests_with_the_matching_code(plugin: Plugin, tmp_path: Path, fields: dict[str, Any],
                                                                   code: grpc.StatusCode, message: str) -> None:
    got, details = await status_of(plugin.node.NodePublishVolume(publish_request(tmp_path, **fields)))
    assert got == code and message in details, details
    assert not (tmp_path / "pod" / "mount").exists()


async def test_publish_passes_on_the_masters_error(plugin: Plugin, tmp_path: Path) -> None:
    plugin.mounts.mounts[("team", "data")] = VolumeSource(master="127.0.0.1:1", token="t", path="/x", name="Mount team/data")
    code, details = await status_of(plugin.node.NodePublishVolume(publish_request(tmp_path)))
    assert code == grpc.StatusCode.UNAVAILABLE and "127.0.0.1:1" in details
    assert plugin.publisher.records() == []


async def test_publish_of_another_namespaces_mount_needs_its_grant(plugin: Plugin, tmp_path: Path) -> None:
    plugin.mounts.mounts[("team", "data")] = VolumeSource(master="127.0.0.1:1", token="t", path="/x", name="Mount team/data")
    foreign = {c.ATTR_MOUNT: "data", c.ATTR_NAMESPACE: "team", c.POD_NAMESPACE: "guest"}
    code, details = await status_of(plugin.node.NodePublishVolume(publish_request(tmp_path, volume_context=foreign)))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "Mount team/data may not be used from namespace guest" in details and "allowedNamespaces" in details
    plugin.mounts.grants[("team", "data")] = ("guest",)
    code, details = await status_of(plugin.node.NodePublishVolume(publish_request(tmp_path, volume_context=foreign)))
    assert code == grpc.StatusCode.UNAVAILABLE  # granted: on to the master (which is not there)
    # A volume the controller made names its claim's namespace, which was checked then.
    made = {c.ATTR_MOUNT: "data", c.ATTR_NAMESPACE: "team"}
    await status_of(plugin.node.NodePublishVolume(publish_request(tmp_path, volume_id="strata-1", volume_context=made)))
    assert plugin.mounts.requesters[-1] == "team"
    code, details = await status_of(plugin.node.NodePublishVolume(publish_request(tmp_path, volume_context=made)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "podInfoOnMount" in details


async def test_unpublish_of_an_unknown_target_succeeds_and_removes_it(plugin: Plugin, tmp_path: Path) -> None:
    target = tmp_path / "pod" / "mount"
    target.mkdir(parents=True)
    request = csi.NodeUnpublishVolumeRequest(volume_id="vol-1", target_path=str(target))
    await plugin.node.NodeUnpublishVolume(request)
    assert not target.exists()
    await plugin.node.NodeUnpublishVolume(request)  # idempotent
    for missing in (csi.NodeUnpublishVolumeRequest(volume_id="v"), csi.NodeUnpublishVolumeRequest(target_path="/t")):
        code, _ = await status_of(plugin.node.NodeUnpublishVolume(missing))
        assert code == grpc.StatusCode.INVALID_ARGUMENT


async def test_stats_of_a_volume_not_published_here_is_not_found(plugin: Plugin, tmp_path: Path) -> None:
    code, _ = await status_of(plugin.node.NodeGetVolumeStats(
        csi.NodeGetVolumeStatsRequest(volume_id="vol-1", volume_path=str(tmp_path))))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await status_of(plugin.node.NodeGetVolumeStats(csi.NodeGetVolumeStatsRequest(volume_id="vol-1")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def create_request(**fields: Any) -> csi.CreateVolumeRequest:
    defaults: dict[str, Any] = dict(name="pvc-1", volume_capabilities=[capability()],
                                    parameters={c.ATTR_MASTER: "127.0.0.1:1", c.ATTR_PATH: "/data"})
    defaults.update(fields)
    return csi.CreateVolumeRequest(**defaults)


async def test_controller_creates_volumes_that_refer_to_existing_data(plugin: Plugin) -> None:
    caps = await plugin.controller.ControllerGetCapabilities(csi.ControllerGetCapabilitiesRequest())
    RPC = csi.ControllerServiceCapability.RPC
    assert [cap.rpc.type for cap in caps.capabilities] == [RPC.CREATE_DELETE_VOLUME]
    first = await plugin.controller.CreateVolume(create_request())
    again = await plugin.controller.CreateVolume(create_request())
    assert first.volume.volume_id == again.volume.volume_id == volume_id_for("pvc-1")
    assert first.volume.capacity_bytes == 0  # the data's size is not the volume's business
    assert dict(first.volume.volume_context) == {c.ATTR_MASTER: "127.0.0.1:1", c.ATTR_PATH: "/data"}
    await plugin.controller.DeleteVolume(csi.DeleteVolumeRequest(volume_id=first.volume.volume_id))
    await plugin.controller.DeleteVolume(csi.DeleteVolumeRequest(volume_id="not-ours"))


@pytest.mark.parametrize(("request_", "code", "message"), [
    (create_request(name=""), grpc.StatusCode.INVALID_ARGUMENT, "name"),
    (create_request(volume_capabilities=[]), grpc.StatusCode.INVALID_ARGUMENT, "capabilities"),
    (create_request(volume_capabilities=[capability(block=True)]), grpc.StatusCode.INVALID_ARGUMENT, "block"),
    (create_request(parameters={}), grpc.StatusCode.INVALID_ARGUMENT, "must name a Mount"),
    (create_request(parameters={c.ATTR_MOUNT: "nope", c.PVC_NAMESPACE: "team"}), grpc.StatusCode.NOT_FOUND, "team/nope"),
    (create_request(volume_content_source=csi.VolumeContentSource(
        snapshot=csi.VolumeContentSource.SnapshotSource(snapshot_id="s"))), grpc.StatusCode.INVALID_ARGUMENT, "snapshots"),
])
async def test_create_refuses_what_it_cannot_make(plugin: Plugin, request_: csi.CreateVolumeRequest,
                                                  code: grpc.StatusCode, message: str) -> None:
    got, details = await status_of(plugin.controller.CreateVolume(request_))
    assert got == code and message in details, details


async def test_validate_confirms_file_system_access_of_known_volumes(plugin: Plugin) -> None:
    ok = await plugin.controller.ValidateVolumeCapabilities(csi.ValidateVolumeCapabilitiesRequest(
        volume_id=volume_id_for("pvc-1"), volume_capabilities=[capability()]))
    assert list(ok.confirmed.volume_capabilities) == [capability()]
    block = await plugin.controller.ValidateVolumeCapabilities(csi.ValidateVolumeCapabilitiesRequest(
        volume_id=volume_id_for("pvc-1"), volume_capabilities=[capability(block=True)]))
    assert not block.HasField("confirmed") and "block" in block.message
    code, _ = await status_of(plugin.controller.ValidateVolumeCapabilities(csi.ValidateVolumeCapabilitiesRequest(
        volume_id="fake-vol-id-123", volume_capabilities=[capability()])))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await status_of(plugin.controller.ValidateVolumeCapabilities(csi.ValidateVolumeCapabilitiesRequest(
        volume_id=volume_id_for("pvc-1"), volume_context={c.ATTR_MOUNT: "nope", c.ATTR_NAMESPACE: "team"},
        volume_capabilities=[capability()])))
    assert code == grpc.StatusCode.NOT_FOUND
    for missing in (csi.ValidateVolumeCapabilitiesRequest(volume_capabilities=[capability()]),
                    csi.ValidateVolumeCapabilitiesRequest(volume_id="strata-x")):
        code, _ = await status_of(plugin.controller.ValidateVolumeCapabilities(missing))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
