"""The one module that talks to the Kubernetes API.

Children and status are written with server-side apply under one field manager
(`strata-operator`), so applying the same manifest twice changes nothing and fields the
operator stops setting are removed. The CSI tokens Secret, which every cluster shares, is
applied under one field manager per cluster, each owning its own key. The `kubernetes` client is synchronous; each call runs
in a worker thread so kopf's event loop keeps going.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, Protocol

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from strata.operator import constants as c

Obj = dict[str, Any]

# kind -> plural, for the kinds the operator reads or writes.
PLURALS: Mapping[str, str] = {
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "Service": "services",
    "StatefulSet": "statefulsets",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    c.CACHE_CLUSTER_KIND: c.CACHE_CLUSTER_PLURAL,
    c.MOUNT_KIND: c.MOUNT_PLURAL,
}
_APPLY = "application/apply-patch+yaml"


class KubeError(Exception):
    """The API server refused a request; `status` is the HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class KubeAPI(Protocol):
    """What the reconcile steps need from the API server."""

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None: ...

    async def list(self, api_version: str, kind: str, namespace: str) -> list[Obj]: ...

    async def apply(self, manifest: Obj, manager: str = c.FIELD_MANAGER) -> Obj: ...

    async def create(self, manifest: Obj) -> Obj | None:
        """Create the object; None when it exists already (someone else made it first)."""
        ...

    async def apply_status(self, api_version: str, kind: str, namespace: str, name: str, status: Obj) -> None: ...


def resource_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """REST path of an object (or of its collection when name is None); namespace "" for a
    cluster-scoped kind."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[kind]}" if namespace else f"{base}/{PLURALS[kind]}"
    return f"{path}/{name}" if name is not None else path


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return f"{exc.status} {exc.reason}"


class Kube:
    """KubeAPI over the `kubernetes` client."""

    def __init__(self, api_client: k8s.ApiClient, *, timeout: float = 30.0) -> None:
        self._api = api_client
        self._timeout = timeout

    @classmethod
    def from_environment(cls) -> Kube:
        """In-cluster service account if there is one, else the local kubeconfig."""
        try:
            k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
        except ConfigException:
            k8s_config.load_kube_config()  # type: ignore[no-untyped-call]
        return cls(k8s.ApiClient())

    def _call(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
              body: Obj | None = None, content_type: str | None = None) -> Obj:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        _, url, headers, payload, _ = self._api.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(method, url, header_params=headers, body=payload,
                                          _request_timeout=self._timeout)
            data = response.read()  # type: ignore[no-untyped-call]
        except ApiException as exc:
            raise KubeError(exc.status or 0, _message(exc)) from None
        if not 200 <= response.status < 300:
            raise KubeError(response.status, _message(ApiException(http_resp=response.response)))
        return json.loads(data) if data else {}

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            return await asyncio.to_thread(self._call, "GET", resource_path(api_version, kind, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, api_version: str, kind: str, namespace: str) -> list[Obj]:
        result = await asyncio.to_thread(self._call, "GET", resource_path(api_version, kind, namespace))
        return list(result.get("items", []))

    async def apply(self, manifest: Obj, manager: str = c.FIELD_MANAGER) -> Obj:
        meta = manifest["metadata"]
        path = resource_path(manifest["apiVersion"], manifest["kind"], meta.get("namespace", ""), meta["name"])
        return await self._apply(path, manifest, manager)

    async def create(self, manifest: Obj) -> Obj | None:
        path = resource_path(manifest["apiVersion"], manifest["kind"], manifest["metadata"].get("namespace", ""))
        try:
            return await asyncio.to_thread(self._call, "POST", path, body=manifest)
        except KubeError as exc:
            if exc.status == 409:
                return None
            raise

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        """Delete the object (gone already is fine)."""
        try:
            await asyncio.to_thread(self._call, "DELETE", resource_path(api_version, kind, namespace, name))
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def drop_finalizer(self, obj: Obj, finalizer: str) -> None:
        """Take `finalizer` off the object, keeping the others; the resourceVersion makes a
        concurrent change fail instead of being overwritten. Gone already is fine."""
        meta = obj["metadata"]
        patch = {"metadata": {"finalizers": [f for f in meta.get("finalizers", []) if f != finalizer],
                              "resourceVersion": meta["resourceVersion"]}}
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])
        try:
            await asyncio.to_thread(self._call, "PATCH", path, body=patch, content_type="application/merge-patch+json")
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def apply_status(self, api_version: str, kind: str, namespace: str, name: str, status: Obj) -> None:
        body = {"apiVersion": api_version, "kind": kind,
                "metadata": {"name": name, "namespace": namespace}, "status": status}
        await self._apply(resource_path(api_version, kind, namespace, name) + "/status", body)

    async def _apply(self, path: str, body: Obj, manager: str = c.FIELD_MANAGER) -> Obj:
        query = [("fieldManager", manager), ("force", "true")]
        return await asyncio.to_thread(self._call, "PATCH", path, query=query, body=body, content_type=_APPLY)
