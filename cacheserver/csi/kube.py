"""The one module of the CSI plugin that talks to the Kubernetes API: it finds what a Mount
volume shows.

For the Mount NAME in namespace NS it reads
- the Mount (`strata.dev/v1alpha1`): `spec.cluster`, `spec.path`, `spec.readOnly`,
  `spec.allowedNamespaces` (a pod of another namespace than NS may use it only when listed:
  the grant is the owning namespace's) and `status.phase`, which must be Mounted;
- its CacheCluster (same namespace): `status.master.endpoint`, the master's HOST:PORT;
- the token: from the volume's secrets (`dataToken`, else `token`, e.g. nodePublishSecretRef to
  `<cluster>-auth`) when given, else from the CSI tokens Secret the operator keeps in its own
  namespace (`--tokens-secret NAMESPACE/NAME`), key `<namespace>.<cluster>`: the data
  credential. A volume never gets the admin credential (`<cluster>-auth`'s key `token`).

The plugin's ServiceAccount needs get on mounts.strata.dev and cacheclusters.strata.dev, and
get on that one Secret (no other: it reads no Secret of any tenant namespace). Reads go
through an `ObjectReader`, so tests give it objects without an API server.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from strata.contract import constants
from strata.contract import csi as c
from strata.contract.errors import FailedPrecondition, NotFound, PermissionDenied, Unavailable
from .volumes import VolumeSource, volume_token

Obj = dict[str, Any]


class ObjectReader(Protocol):
    """Reads of the API server; None when the object does not exist (404)."""

    def strata_object(self, plural: str, namespace: str, name: str) -> Obj | None:
        """A Mount or CacheCluster (`strata.dev/v1alpha1`) by its plural."""
        ...

    def secret(self, namespace: str, name: str) -> Obj | None: ...


def strata_path(plural: str, namespace: str, name: str) -> str:
    return f"/apis/{constants.API_VERSION}/namespaces/{namespace}/{plural}/{name}"


def secret_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/secrets/{name}"


def configuration(kubeconfig: str | None) -> Any:
    """The `kubernetes` client configuration of the plugin: the kubeconfig at `kubeconfig` when
    given, else the in-cluster service account, else $KUBECONFIG or ~/.kube/config."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    loaded = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=loaded)
        else:
            try:
                config.load_incluster_config(client_configuration=loaded)  # type: ignore[no-untyped-call]
            except ConfigException:
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=os.environ.get("KUBECONFIG"), client_configuration=loaded)
    except (ConfigException, OSError) as exc:
        raise FailedPrecondition(
            f"the CSI plugin has no Kubernetes API access ({exc}), which volumes naming a Mount need: "
            "run it in a pod with a ServiceAccount, pass --kubeconfig, or give the volume "
            f"`{c.ATTR_MASTER}` and `{c.ATTR_PATH}` attributes instead") from exc
    return loaded


class ApiReader:
    """ObjectReader over the `kubernetes` client's typed APIs (CustomObjectsApi for Mounts and
    CacheClusters, CoreV1Api for the Secret: no discovery), configured on first use (see
    `configuration`), so the plugin starts and serves attribute-only volumes without an API server."""

    def __init__(self, kubeconfig: str | None = None, timeout: float = 15.0) -> None:
        self._kubeconfig = kubeconfig
        self._timeout = timeout
        self._api: Any = None
        self._lock = threading.Lock()

    def _client(self) -> Any:
        with self._lock:
            if self._api is None:
                from kubernetes import client

                self._api = client.ApiClient(configuration(self._kubeconfig))
            return self._api

    def strata_object(self, plural: str, namespace: str, name: str) -> Obj | None:
        from kubernetes import client

        api = client.CustomObjectsApi(self._client())
        return self._read(strata_path(plural, namespace, name), lambda: api.get_namespaced_custom_object(
            constants.GROUP, constants.VERSION, namespace, plural, name, _request_timeout=self._timeout))

    def secret(self, namespace: str, name: str) -> Obj | None:
        from kubernetes import client

        api = self._client()
        return self._read(secret_path(namespace, name), lambda: api.sanitize_for_serialization(
            client.CoreV1Api(api).read_namespaced_secret(name, namespace, _request_timeout=self._timeout)))

    def _read(self, path: str, read: Callable[[], Any]) -> Obj | None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            answer: Obj = read()
            return answer
        except ApiException as exc:
            status, reason = exc.status or 0, exc.reason
        except (OSError, HTTPError) as exc:
            raise Unavailable(f"the Kubernetes API cannot be reached for {path}: {exc}") from exc
        if status == 404:
            return None
        if status in (401, 403):
            raise PermissionDenied(
                f"the CSI plugin may not read {path} ({status} {reason}): grant its ServiceAccount get on "
                "mounts.strata.dev, cacheclusters.strata.dev and on the CSI tokens Secret")
        raise Unavailable(f"the Kubernetes API answered {status} {reason} for {path}")


def _status_message(obj: Obj) -> str:
    for condition in obj.get("status", {}).get("conditions", []) or []:
        if condition.get("status") != "True" and condition.get("type") == "Ready" and condition.get("message"):
            return f": {condition['message']}"
    return ""


def grant_patch(granted: object, requester: str) -> Obj:
    """The JSON patch operation that adds `requester` to a Mount whose spec.allowedNamespaces
    is `granted`: appended to the list when there is one (a concurrent grant stays), else the
    list is made (appending to a list that is not there is refused with 422)."""
    field = f"/spec/{c.MOUNT_ALLOWED_NAMESPACES}"
    if isinstance(granted, list):
        return {"op": "add", "path": f"{field}/-", "value": requester}
    return {"op": "add", "path": field, "value": [requester]}


def check_grant(namespace: str, name: str, spec: Obj, requester: str) -> None:
    """PermissionDenied unless a pod of namespace `requester` may use the Mount: its own
    namespace may, another only when the Mount's spec.allowedNamespaces lists it."""
    granted = spec.get(c.MOUNT_ALLOWED_NAMESPACES)
    if requester == namespace or requester in (granted or []):
        return
    patch = json.dumps([grant_patch(granted, requester)])
    raise PermissionDenied(
        f"Mount {namespace}/{name} may not be used from namespace {requester}: namespace {namespace} has not "
        f"granted it. To grant it, add {requester} to spec.{c.MOUNT_ALLOWED_NAMESPACES} of Mount {name} in "
        f"{namespace} (kubectl patch mounts.strata.dev {name} -n {namespace} --type=json -p '{patch}')")


class KubeResolver:
    """MountResolver reading Mounts, CacheClusters and the CSI tokens Secret (see the module
    docstring); `tokens_secret` is that Secret's NAMESPACE/NAME ("" when there is none)."""

    def __init__(self, reader: ObjectReader, tokens_secret: str = "") -> None:
        self._reader = reader
        self._tokens_secret = tokens_secret

    def resolve(self, namespace: str, name: str, secrets: Mapping[str, str], requester: str) -> VolumeSource:
        what = f"Mount {namespace}/{name}"
        mount = self._reader.strata_object(constants.MOUNT_PLURAL, namespace, name)
        if mount is None:
            raise NotFound(f"{what} does not exist: create it, or fix the volume's `{c.ATTR_MOUNT}` attribute")
        spec = mount.get("spec", {})
        check_grant(namespace, name, spec, requester)
        cluster_name, path = spec.get("cluster"), spec.get("path")
        if not cluster_name or not path:
            raise FailedPrecondition(f"{what} has no spec.cluster or spec.path")
        phase = mount.get("status", {}).get("phase")
        if phase != constants.MOUNTED_PHASE:
            raise FailedPrecondition(f"{what} is {phase or 'not reconciled yet'}{_status_message(mount)}; "
                                     f"the volume is mounted once its phase is {constants.MOUNTED_PHASE} "
                                     f"(kubectl get mounts.strata.dev -n {namespace} {name})")
        cluster = self._reader.strata_object(constants.CACHE_CLUSTER_PLURAL, namespace, cluster_name)
        if cluster is None:
            raise NotFound(f"CacheCluster {namespace}/{cluster_name} of {what} does not exist")
        endpoint = (cluster.get("status", {}).get("master") or {}).get("endpoint")
        if not endpoint:
            raise FailedPrecondition(f"CacheCluster {namespace}/{cluster_name} has no master endpoint yet "
                                     "(status.master.endpoint); wait until it is Ready")
        token = volume_token(secrets) or self._token(namespace, cluster_name)
        return VolumeSource(master=endpoint, token=token, path=path, read_only=bool(spec.get("readOnly")), name=what)

    def _token(self, namespace: str, cluster: str) -> str:
        if not self._tokens_secret:
            raise FailedPrecondition(
                f"the volume's secrets hold no `{c.SECRET_DATA_TOKEN}` for CacheCluster {namespace}/{cluster} and "
                "the plugin was started without --tokens-secret: set nodePublishSecretRef to a Secret with the "
                "cluster's data token, or run the plugin as the chart does")
        home, _, name = self._tokens_secret.partition("/")
        secret = self._reader.secret(home, name)
        if secret is None:
            raise NotFound(f"Secret {self._tokens_secret}, where the operator keeps the clusters' data tokens for "
                           "the CSI plugin, does not exist: is the operator running?")
        key = constants.data_token_key(namespace, cluster)
        encoded = (secret.get("data") or {}).get(key)
        try:
            token = base64.b64decode(encoded or "", validate=True).decode().strip()
        except (binascii.Error, UnicodeDecodeError):
            token = ""
        if not token:
            raise FailedPrecondition(f"Secret {self._tokens_secret} has no data token of CacheCluster "
                                     f"{namespace}/{cluster} (key {key}) yet; the operator adds it when it "
                                     "reconciles the cluster")
        return token
