"""The plugin's endpoint and lifecycle."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from strata.cacheserver.csi.proto import csi_pb2 as csi
from strata.cacheserver.csi.proto import csi_pb2_grpc as csi_grpc
from strata.cacheserver.csi.publisher import Publisher
from strata.cacheserver.csi.server import serve, socket_path
from strata.contract.errors import InvalidArgument

from .conftest import Mounts


@pytest.mark.parametrize("endpoint", ["unix:///csi/csi.sock", "unix:/csi/csi.sock", "/csi/csi.sock"])
def test_endpoints_name_a_socket_file(endpoint: str) -> None:
    assert socket_path(endpoint) == Path("/csi/csi.sock")


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:1", "unix://csi.sock"])
def test_other_endpoints_are_refused(endpoint: str) -> None:
    with pytest.raises(InvalidArgument, match="unix:///"):
        socket_path(endpoint)


async def test_serves_until_stopped_replacing_a_stale_socket(tmp_path: Path) -> None:
    sock = tmp_path / "csi.sock"
    sock.write_text("left by a crashed plugin")
    stop = asyncio.Event()
    task = asyncio.create_task(serve(sock, "node-a", Publisher(tmp_path / "state"), Mounts(), stop))
    async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
        stub = csi_grpc.IdentityStub(channel)
        info = await asyncio.wait_for(stub.GetPluginInfo(csi.GetPluginInfoRequest(), wait_for_ready=True), 10)
        assert info.name == "csi.strata.dev"
    assert sock.stat().st_mode & 0o777 == 0o660
    stop.set()
    await asyncio.wait_for(task, 10)
    assert not sock.exists()
