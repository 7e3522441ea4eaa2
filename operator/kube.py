"""The one module that talks to the Kubernetes API.

Children and status are written with server-side apply under one field manager
(`strata-operator`), so applying the same manifest twice changes nothing and fields the
operator stops setting are removed. The CSI tokens Secret, which every cluster shares, is
applied under one field manager per cluster, each owning its own key.

Requests go through the asyncio half of the `kubernetes` package (`kubernetes.aio`), so kopf's
event loop never waits on one. Of its two public ways in, the generated typed APIs and the
dynamic client, the dynamic client fits: the operator handles a handful of kinds as plain
dicts (builders make dicts, status is a dict), and the dynamic client's verbs take any kind
and give back the server's JSON, where the typed APIs would need one method per kind and verb
and turn answers into generated models. The dynamic client finds its resources by discovery
when awaited; this module never awaits it and declares the resources instead (`KINDS`: plural
and scope of each kind), so the operator starts without a discovery round-trip, makes none
per call, and needs no discovery cache file.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config
from kubernetes.aio.client.exceptions import ApiException
from kubernetes.aio.dynamic import DynamicClient, Resource

from strata.operator import constants as c

Obj = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    """What the API server calls a kind in its paths: the plural, and whether its objects
    live in a namespace."""

    plural: str
    namespaced: bool = True


# The kinds the operator reads or writes.
KINDS: Mapping[str, Kind] = {
    "ConfigMap": Kind("configmaps"),
    "Secret": Kind("secrets"),
    "Service": Kind("services"),
    "StatefulSet": Kind("statefulsets"),
    "PersistentVolumeClaim": Kind("persistentvolumeclaims"),
    "PodDisruptionBudget": Kind("poddisruptionbudgets"),
    "MutatingWebhookConfiguration": Kind("mutatingwebhookconfigurations", namespaced=False),
    "Pod": Kind("pods"),
    "Event": Kind("events"),
    c.CACHE_CLUSTER_KIND: Kind(c.CACHE_CLUSTER_PLURAL),
    c.MOUNT_KIND: Kind(c.MOUNT_PLURAL),
}
_MERGE_PATCH = "application/merge-patch+json"


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

    async def set_scheduling_gates(self, pod: Obj, gates: Sequence[Obj]) -> bool: ...


@functools.cache
def _resource(api_version: str, kind: str) -> Any:
    """The dynamic client's Resource of a kind, with its status subresource."""
    group, _, version = api_version.rpartition("/")
    known = KINDS[kind]
    status = {"kind": kind, "name": f"{known.plural}/status", "namespaced": known.namespaced}
    return Resource(  # type: ignore[no-untyped-call]
        prefix="apis" if group else "api", group=group, api_version=version, kind=kind, name=known.plural,
        namespaced=known.namespaced, subresources={"status": status})


def _as_dict(_client: DynamicClient, data: Obj | None) -> Obj:
    """Answers stay the server's JSON (the dynamic client would wrap them)."""
    return data or {}


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return f"{exc.status} {exc.reason}"


class Kube:
    """KubeAPI over the `kubernetes.aio` dynamic client."""

    def __init__(self, api_client: k8s.ApiClient, *, timeout: float = 30.0) -> None:
        self._api = api_client
        # Never awaited, so it discovers nothing (see the module docstring). The package's
        # functions carry no type hints: the client is Any here, answers are Obj at this boundary.
        self._dynamic: Any = DynamicClient(api_client)  # type: ignore[no-untyped-call]
        # Every request: answers as dicts, and no request waits longer than `timeout` seconds.
        self._options: Obj = {"serializer": _as_dict, "_request_timeout": timeout}

    @classmethod
    async def from_environment(cls) -> Kube:
        """In-cluster service account if there is one, else the local kubeconfig: $KUBECONFIG
        (read now, where the package reads it once at import) or ~/.kube/config."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except k8s_config.ConfigException:
            await k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
        return cls(k8s.ApiClient(configuration))

    async def close(self) -> None:
        """Close the connection pool."""
        await self._api.close()  # type: ignore[no-untyped-call]

    async def _call(self, request: Awaitable[Obj]) -> Obj:
        try:
            return await request
        except ApiException as exc:
            raise KubeError(exc.status or 0, _message(exc)) from None

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        resource = _resource(api_version, kind)
        try:
            return await self._call(self._dynamic.get(resource, name=name, namespace=namespace, **self._options))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, api_version: str, kind: str, namespace: str) -> list[Obj]:
        resource = _resource(api_version, kind)
        result = await self._call(self._dynamic.get(resource, namespace=namespace, **self._options))
        return list(result.get("items", []))

    async def apply(self, manifest: Obj, manager: str = c.FIELD_MANAGER) -> Obj:
        return await self._apply(_resource(manifest["apiVersion"], manifest["kind"]), manifest, manager)

    async def create(self, manifest: Obj) -> Obj | None:
        resource, namespace = _resource(manifest["apiVersion"], manifest["kind"]), manifest["metadata"].get("namespace")
        try:
            return await self._call(self._dynamic.create(resource, body=manifest, namespace=namespace, **self._options))
        except KubeError as exc:
            if exc.status == 409:
                return None
            raise

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        """Delete the object (gone already is fine)."""
        resource = _resource(api_version, kind)
        try:
            await self._call(self._dynamic.delete(resource, name=name, namespace=namespace, **self._options))
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def drop_finalizer(self, obj: Obj, finalizer: str) -> None:
        """Take `finalizer` off the object, keeping the others; the resourceVersion makes a
        concurrent change fail instead of being overwritten. Gone already is fine."""
        meta = obj["metadata"]
        patch = {"metadata": {"finalizers": [f for f in meta.get("finalizers", []) if f != finalizer],
                              "resourceVersion": meta["resourceVersion"]}}
        resource = _resource(obj["apiVersion"], obj["kind"])
        try:
            await self._call(self._dynamic.patch(resource, body=patch, name=meta["name"],
                                                 namespace=meta.get("namespace"), content_type=_MERGE_PATCH,
                                                 **self._options))
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def set_scheduling_gates(self, pod: Obj, gates: Sequence[Obj]) -> bool:
        """Set a pod's scheduling gates (Kubernetes lets them only be removed); the
        resourceVersion makes a concurrent change fail instead of being overwritten. False
        when the pod is gone or changed meanwhile (read it again)."""
        meta = pod["metadata"]
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "spec": {"schedulingGates": list(gates)}}
        try:
            await self._call(self._dynamic.patch(_resource("v1", "Pod"), body=patch, name=meta["name"],
                                                 namespace=meta["namespace"], content_type=_MERGE_PATCH,
                                                 **self._options))
        except KubeError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def apply_status(self, api_version: str, kind: str, namespace: str, name: str, status: Obj) -> None:
        body = {"apiVersion": api_version, "kind": kind,
                "metadata": {"name": name, "namespace": namespace}, "status": status}
        await self._apply(_resource(api_version, kind).subresources["status"], body)

    async def _apply(self, resource: Any, body: Obj, manager: str = c.FIELD_MANAGER) -> Obj:
        meta = body["metadata"]
        return await self._call(self._dynamic.server_side_apply(
            resource, body=body, name=meta["name"], namespace=meta.get("namespace"),
            field_manager=manager, force_conflicts=True, **self._options))
