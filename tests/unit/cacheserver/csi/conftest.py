"""The CSI plugin's services on a real Unix socket, with Mounts given by a dict (no API server)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from strata.cacheserver.csi.proto import csi_pb2_grpc as csi_grpc
from strata.cacheserver.csi.publisher import Publisher
from strata.cacheserver.csi.server import build_server
from strata.cacheserver.csi.kube import check_grant
from strata.cacheserver.csi.volumes import VolumeSource
from strata.contract.errors import NotFound


class Mounts:
    """A MountResolver over a dict: (namespace, name) -> source."""

    def __init__(self, mounts: dict[tuple[str, str], VolumeSource] | None = None) -> None:
        self.mounts = dict(mounts or {})
        self.grants: dict[tuple[str, str], tuple[str, ...]] = {}  # the Mounts' spec.allowedNamespaces
        self.requesters: list[str] = []

    def resolve(self, namespace: str, name: str, secrets: Mapping[str, str], requester: str) -> VolumeSource:
        self.requesters.append(requester)
        try:
            source = self.mounts[(namespace, name)]
        except KeyError:
            raise NotFound(f"Mount {namespace}/{name} does not exist") from None
        check_grant(namespace, name, {"allowedNamespaces": list(self.grants.get((namespace, name), ()))}, requester)
        return source


@dataclass
class Plugin:
    socket: Path
    publisher: Publisher
    mounts: Mounts
    channel: grpc.aio.Channel
    identity: csi_grpc.IdentityStub
    node: csi_grpc.NodeStub
    controller: csi_grpc.ControllerStub


@pytest.fixture
async def plugin(tmp_path: Path) -> AsyncIterator[Plugin]:
    sock = tmp_path / "plugin" / "csi.sock"
    publisher = Publisher(tmp_path / "state")
    mounts = Mounts()
    server = build_server(sock, "node-a", publisher, mounts)
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix://{sock}")
    yield Plugin(sock, publisher, mounts, channel, csi_grpc.IdentityStub(channel), csi_grpc.NodeStub(channel),
                 csi_grpc.ControllerStub(channel))
    await channel.close()
    await server.stop(grace=None)
