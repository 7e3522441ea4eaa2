"""An ObjectReader of the CSI plugin over a dict of REST paths, recording the paths it read:
the Kubernetes objects a test gives the plugin without an API server."""

from __future__ import annotations

from typing import Any

from strata.cacheserver.csi.kube import secret_path, strata_path


class PathObjects:
    def __init__(self, objects: dict[str, dict[str, Any]] | None = None) -> None:
        self.objects: dict[str, dict[str, Any]] = {} if objects is None else objects
        self.read: list[str] = []

    def strata_object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(strata_path(plural, namespace, name))

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(secret_path(namespace, name))

    def get(self, path: str) -> dict[str, Any] | None:
        self.read.append(path)
        return self.objects.get(path)
