"""A pod's volumes as directories on this machine.

emptyDir, configMap, secret, downwardAPI and projected volumes live under the
pod's own directory; hostPath is mapped under the node's root directory (so
two "nodes" on one machine do not share /mnt/...); PVCs (and generic ephemeral
volumes, which are PVCs too) use their bound PV's directory; CSI volumes are
published by the node plugin (see csi.py). Files are rewritten when their
source changes, like kubelet's periodic sync.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.podenv import EnvError, Lookup, field_value, file_data

Obj = dict[str, Any]

TOKEN_REFRESH = 600.0  # seconds; tokens are requested for an hour


class VolumeError(RuntimeError):
    """A volume's source is missing or not supported; the pod must wait."""


def _write_if_changed(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)


@dataclass
class PodVolumes:
    """Builds and refreshes one pod's volume directories."""

    pod: Obj
    pod_dir: Path
    node_root: Path
    lookup: Lookup
    request_token: Callable[[str, list[str], int], str]  # (serviceAccount, audiences, seconds)
    pvc_path: Callable[[str], Path | None]  # claim name -> directory of its bound PV
    csi_publish: Callable[[Obj], Path] | None = None
    paths: dict[str, Path] = field(default_factory=dict)
    _tokens: dict[str, tuple[float, str]] = field(default_factory=dict)

    def prepare(self) -> dict[str, Path]:
        """Create every volume (raises VolumeError while a source is missing)."""
        for volume in self.pod["spec"].get("volumes", []):
            self.paths[volume["name"]] = self._prepare(volume)
        return self.paths

    def refresh(self) -> None:
        """Rewrite the files of configMap/secret/projected/downwardAPI volumes."""
        for volume in self.pod["spec"].get("volumes", []):
            if {"configMap", "secret", "projected", "downwardAPI"} & volume.keys():
                try:
                    self._prepare(volume)
                except (VolumeError, EnvError):
                    pass  # keep the last good files, as kubelet does

    def _dir(self, name: str) -> Path:
        path = self.pod_dir / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _prepare(self, volume: Obj) -> Path:
        name = volume["name"]
        if "emptyDir" in volume:
            return self._dir(name)
        if "hostPath" in volume:
            return self._host_path(volume["hostPath"])
        if "configMap" in volume or "secret" in volume:
            kind = "ConfigMap" if "configMap" in volume else "Secret"
            src = volume["configMap" if kind == "ConfigMap" else "secret"]
            target = self._dir(name)
            ref = {"name": src.get("name") or src.get("secretName"), **src}
            self._project_object(target, kind, ref, src.get("defaultMode", 0o644))
            return target
        if "downwardAPI" in volume:
            target = self._dir(name)
            self._project_downward(target, volume["downwardAPI"].get("items", []), volume["downwardAPI"].get("defaultMode", 0o644))
            return target
        if "projected" in volume:
            target = self._dir(name)
            mode = volume["projected"].get("defaultMode", 0o644)
            for source in volume["projected"].get("sources", []):
                if "configMap" in source:
                    self._project_object(target, "ConfigMap", source["configMap"], mode)
                elif "secret" in source:
                    self._project_object(target, "Secret", source["secret"], mode)
                elif "downwardAPI" in source:
                    self._project_downward(target, source["downwardAPI"].get("items", []), mode)
                elif "serviceAccountToken" in source:
                    self._project_token(target, source["serviceAccountToken"], mode)
                else:
                    raise VolumeError(f"volume {name!r}: projected source {sorted(source)} not supported")
            return target
        if "persistentVolumeClaim" in volume:
            return self._claim(volume["persistentVolumeClaim"]["claimName"])
        if "ephemeral" in volume:
            return self._claim(f"{self.pod['metadata']['name']}-{name}")
        if "csi" in volume:
            if self.csi_publish is None:
                raise VolumeError(f"volume {name!r}: CSI volumes need a node plugin socket")
            return self.csi_publish(volume)
        raise VolumeError(f"volume {name!r}: type {sorted(set(volume) - {'name'})} not supported by the e2e agent")

    def _host_path(self, src: Obj) -> Path:
        path: Path = self.node_root / str(src["path"]).lstrip("/")
        kind = src.get("type", "")
        if kind in ("", "DirectoryOrCreate", "Directory"):
            if kind == "Directory" and not path.is_dir():
                raise VolumeError(f"hostPath {src['path']} ({path}) is not a directory")
            path.mkdir(parents=True, exist_ok=True)
        elif kind == "FileOrCreate":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _claim(self, claim: str) -> Path:
        path = self.pvc_path(claim)
        if path is None:
            raise VolumeError(f"PersistentVolumeClaim {claim!r} is not bound yet")
        return path

    def _project_object(self, target: Path, kind: str, ref: Obj, default_mode: int) -> None:
        obj = self.lookup(kind, ref["name"])
        if obj is None:
            if ref.get("optional"):
                return
            raise VolumeError(f"{kind} {ref['name']!r} not found")
        data = file_data(obj, kind)
        items = ref.get("items")
        if items:
            for item in items:
                if item["key"] not in data:
                    if ref.get("optional"):
                        continue
                    raise VolumeError(f"{kind} {ref['name']!r} has no key {item['key']!r}")
                _write_if_changed(target / item["path"], data[item["key"]], item.get("mode", default_mode))
        else:
            for key, value in data.items():
                _write_if_changed(target / key, value, default_mode)

    def _project_downward(self, target: Path, items: list[Obj], mode: int) -> None:
        for item in items:
            if "fieldRef" in item:
                value = field_value(self.pod, item["fieldRef"]["fieldPath"])
            else:
                raise VolumeError(f"downwardAPI item {item['path']!r}: only fieldRef is supported")
            _write_if_changed(target / item["path"], value.encode(), item.get("mode", mode))

    def _project_token(self, target: Path, src: Obj, mode: int) -> None:
        key = f"{src.get('audience', '')}/{src['path']}"
        issued, token = self._tokens.get(key, (0.0, ""))
        if time.monotonic() - issued > TOKEN_REFRESH:
            audiences = [src["audience"]] if src.get("audience") else []
            sa = self.pod["spec"].get("serviceAccountName", "default")
            token = self.request_token(sa, audiences, int(src.get("expirationSeconds", 3607)))
            self._tokens[key] = (time.monotonic(), token)
        _write_if_changed(target / src["path"], token.encode(), mode)
