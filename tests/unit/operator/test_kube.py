"""The Kubernetes client module through the real `kubernetes.aio` client against a local HTTP
server that answers like an API server: what goes over the wire (paths, methods, server-side
apply with our field manager, merge patches, credentials) and how errors come back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml
from apiserver import ApiServer, api_server, kubeconfig
from kubernetes.aio import client as k8s

from strata.operator.kube import Kube, KubeError

APPLY = "application/apply-patch+yaml"


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with api_server() as seen:
        yield seen


@pytest.fixture
async def kube(server: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Kube]:
    """Configured as the operator configures itself outside a cluster: from $KUBECONFIG."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig(server.url, "sa-token")))
    monkeypatch.setenv("KUBECONFIG", str(path))
    kube = await Kube.from_environment()
    yield kube
    await kube.close()


async def test_apply_is_server_side_apply_with_our_field_manager(kube: Kube, server: ApiServer) -> None:
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "demo-config", "namespace": "ns"},
                "data": {"strata.yaml": "blockSize: 1\n"}}
    assert await kube.apply(manifest) == manifest
    (req,) = server.requests
    assert req.method == "PATCH" and req.path == "/api/v1/namespaces/ns/configmaps/demo-config"
    assert req.content_type == APPLY
    assert req.query == {"fieldManager": "strata-operator", "force": "true"}
    assert req.auth == "Bearer sa-token"
    assert req.body == manifest


async def test_apply_under_another_manager_and_of_a_cluster_scoped_kind(kube: Kube, server: ApiServer) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tokens", "namespace": "home"}}
    await kube.apply(secret, manager="strata-operator/team.demo")
    webhook = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
               "metadata": {"name": "strata-locality"}, "webhooks": []}
    await kube.apply(webhook)
    first, second = server.requests
    assert first.path == "/api/v1/namespaces/home/secrets/tokens"
    assert first.query == {"fieldManager": "strata-operator/team.demo", "force": "true"}
    assert second.path == "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/strata-locality"
    assert (second.method, second.content_type, second.body) == ("PATCH", APPLY, webhook)


async def test_status_goes_to_the_status_subresource(kube: Kube, server: ApiServer) -> None:
    await kube.apply_status("strata.dev/v1alpha1", "CacheCluster", "ns", "demo", {"phase": "Ready"})
    (req,) = server.requests
    assert req.method == "PATCH" and req.path == "/apis/strata.dev/v1alpha1/namespaces/ns/cacheclusters/demo/status"
    assert req.content_type == APPLY and req.query == {"fieldManager": "strata-operator", "force": "true"}
    assert req.body == {"apiVersion": "strata.dev/v1alpha1", "kind": "CacheCluster",
                        "metadata": {"name": "demo", "namespace": "ns"}, "status": {"phase": "Ready"}}


async def test_get_missing_is_none_and_errors_carry_the_servers_message(kube: Kube, server: ApiServer) -> None:
    server.answer("GET", "/api/v1/namespaces/ns/secrets/nope", 404,
                  {"kind": "Status", "message": 'secrets "nope" not found'})
    assert await kube.get("v1", "Secret", "ns", "nope") is None
    sts = "/apis/apps/v1/namespaces/ns/statefulsets/demo-master"
    server.answer("PATCH", sts, 422, {"kind": "Status", "message": "spec.selector: field is immutable"})
    with pytest.raises(KubeError, match="field is immutable") as info:
        await kube.apply({"apiVersion": "apps/v1", "kind": "StatefulSet",
                          "metadata": {"name": "demo-master", "namespace": "ns"}})
    assert info.value.status == 422
    server.answer("GET", "/api/v1/namespaces/ns/secrets/demo-auth", 403,
                  {"kind": "Status", "message": "forbidden here"})
    with pytest.raises(KubeError, match="^forbidden here$") as info:
        await kube.get("v1", "Secret", "ns", "demo-auth")
    assert info.value.status == 403


async def test_get_and_list_give_the_servers_json(kube: Kube, server: ApiServer) -> None:
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "demo-worker", "namespace": "ns", "creationTimestamp": "2026-01-02T03:04:05Z"},
           "spec": {"maxUnavailable": 1}}
    server.answer("GET", "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/demo-worker", 200, pdb)
    assert await kube.get("policy/v1", "PodDisruptionBudget", "ns", "demo-worker") == pdb
    server.answer("GET", "/apis/strata.dev/v1alpha1/namespaces/ns/mounts", 200,
                  {"items": [{"metadata": {"name": "a"}}]})
    assert await kube.list("strata.dev/v1alpha1", "Mount", "ns") == [{"metadata": {"name": "a"}}]
    server.answer("GET", "/apis/strata.dev/v1alpha1/cacheclusters", 200, {"items": []})
    assert await kube.list("strata.dev/v1alpha1", "CacheCluster", "") == []  # every namespace
    assert [r.method for r in server.requests] == ["GET", "GET", "GET"]


async def test_create_posts_and_is_none_when_it_exists(kube: Kube, server: ApiServer) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "webhook-cert", "namespace": "home"},
              "data": {"tls.crt": "Y2VydA=="}}
    assert await kube.create(secret) == secret
    server.answer("POST", "/api/v1/namespaces/home/secrets", 409, {"kind": "Status", "message": "already exists"})
    assert await kube.create(secret) is None
    assert [(r.method, r.path, r.body) for r in server.requests] == [
        ("POST", "/api/v1/namespaces/home/secrets", secret)] * 2
    server.answer("POST", "/api/v1/namespaces/home/secrets", 403, {"kind": "Status", "message": "no create"})
    with pytest.raises(KubeError, match="no create"):
        await kube.create(secret)


async def test_delete_and_gone_already_is_fine(kube: Kube, server: ApiServer) -> None:
    await kube.delete("strata.dev/v1alpha1", "Mount", "team", "data")
    server.answer("DELETE", "/apis/strata.dev/v1alpha1/namespaces/team/mounts/gone", 404, {"message": "not found"})
    await kube.delete("strata.dev/v1alpha1", "Mount", "team", "gone")
    assert [(r.method, r.path) for r in server.requests] == [
        ("DELETE", "/apis/strata.dev/v1alpha1/namespaces/team/mounts/data"),
        ("DELETE", "/apis/strata.dev/v1alpha1/namespaces/team/mounts/gone")]
    server.answer("DELETE", "/apis/strata.dev/v1alpha1/namespaces/team/mounts/data", 403, {"message": "may not"})
    with pytest.raises(KubeError, match="may not"):
        await kube.delete("strata.dev/v1alpha1", "Mount", "team", "data")


async def test_drop_finalizer_is_a_merge_patch_guarded_by_the_resource_version(kube: Kube, server: ApiServer) -> None:
    obj = {"apiVersion": "strata.dev/v1alpha1", "kind": "CacheCluster",
           "metadata": {"name": "demo", "namespace": "team", "resourceVersion": "42",
                        "finalizers": ["strata.dev/finalizer", "other.example/keep"]}}
    await kube.drop_finalizer(obj, "strata.dev/finalizer")
    (req,) = server.requests
    assert (req.method, req.path) == ("PATCH", "/apis/strata.dev/v1alpha1/namespaces/team/cacheclusters/demo")
    assert req.content_type == "application/merge-patch+json" and req.query == {}
    assert req.body == {"metadata": {"finalizers": ["other.example/keep"], "resourceVersion": "42"}}
    server.answer("PATCH", req.path, 404, {"message": "gone"})
    await kube.drop_finalizer(obj, "strata.dev/finalizer")
    server.answer("PATCH", req.path, 409, {"message": "the object has been modified"})
    with pytest.raises(KubeError, match="has been modified") as info:
        await kube.drop_finalizer(obj, "strata.dev/finalizer")
    assert info.value.status == 409


async def test_a_request_gives_up_after_the_timeout_without_blocking_the_loop(server: ApiServer) -> None:
    server.hold = threading.Event()
    api_client = k8s.ApiClient(k8s.Configuration(host=server.url))
    kube = Kube(api_client, timeout=0.5)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    with pytest.raises(asyncio.TimeoutError):
        await kube.get("v1", "Secret", "ns", "slow")
    assert 0.4 < time.monotonic() - started < 3
    assert ticks >= 5  # the event loop ran on while the request waited
    ticker.cancel()
    await kube.close()
