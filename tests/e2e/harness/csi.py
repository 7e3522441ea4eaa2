"""Calling a CSI node plugin as kubelet does (NodePublishVolume /
NodeUnpublishVolume on the plugin's unix socket).

The Python stubs are generated once per harness from csi.proto of the CSI spec
module that csi-test pins (it is in the Go module cache after build.sh ran).
"""

from __future__ import annotations

import glob
import importlib
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

_lock = threading.Lock()
_modules: tuple[ModuleType, ModuleType] | None = None


class CsiError(RuntimeError):
    pass


def _gomodcache() -> Path:
    env = os.environ.get("GOMODCACHE")
    if env:
        return Path(env)
    gopath = os.environ.get("GOPATH", str(Path.home() / "go")).split(os.pathsep)[0]
    return Path(gopath) / "pkg" / "mod"


def find_csi_proto() -> Path:
    found = sorted(glob.glob(str(_gomodcache() / "github.com/container-storage-interface/spec@v1.*/csi.proto")))
    if not found:
        raise CsiError(
            f"csi.proto not found under {_gomodcache()}: run tests/e2e/tools/build.sh "
            "(it downloads the CSI spec module) or set GOMODCACHE"
        )
    return Path(found[-1])


def stubs(out_dir: Path) -> tuple[ModuleType, ModuleType]:
    """(csi_pb2, csi_pb2_grpc), generated into out_dir on first use."""
    global _modules
    with _lock:
        if _modules is None:
            proto = find_csi_proto()
            out_dir.mkdir(parents=True, exist_ok=True)
            if not (out_dir / "csi_pb2_grpc.py").exists():
                proc = subprocess.run(
                    [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto.parent}",
                     f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", str(proto)],
                    capture_output=True, text=True,
                )
                if proc.returncode != 0:
                    raise CsiError(f"protoc failed on {proto}: {proc.stderr.strip()}")
            sys.path.insert(0, str(out_dir))
            _modules = (importlib.import_module("csi_pb2"), importlib.import_module("csi_pb2_grpc"))
        return _modules


class NodeClient:
    """NodePublishVolume / NodeUnpublishVolume against one plugin socket."""

    def __init__(self, socket: Path, stub_dir: Path) -> None:
        import grpc

        self.pb, pb_grpc = stubs(stub_dir)
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.node = pb_grpc.NodeStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def publish(
        self,
        *,
        volume_id: str,
        target_path: str,
        readonly: bool,
        fs_type: str,
        context: dict[str, str],
        secrets: dict[str, str],
        timeout: float = 60.0,
    ) -> None:
        pb = self.pb
        capability = pb.VolumeCapability(
            mount=pb.VolumeCapability.MountVolume(fs_type=fs_type),
            access_mode=pb.VolumeCapability.AccessMode(mode=pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER),
        )
        request: Any = pb.NodePublishVolumeRequest(
            volume_id=volume_id, target_path=target_path, volume_capability=capability,
            readonly=readonly, volume_context=context, secrets=secrets,
        )
        self.node.NodePublishVolume(request, timeout=timeout)

    def unpublish(self, *, volume_id: str, target_path: str, timeout: float = 60.0) -> None:
        self.node.NodeUnpublishVolume(
            self.pb.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target_path), timeout=timeout
        )
