"""The Kubernetes client module against a local HTTP server that answers like an API server:
what goes over the wire (paths, server-side apply, field manager) and how errors come back."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client as k8s

from strata.operator.kube import Kube, KubeError, resource_path


@dataclass
class Seen:
    requests: list[dict[str, Any]] = field(default_factory=list)
    answers: dict[tuple[str, str], tuple[int, dict[str, Any]]] = field(default_factory=dict)


def serve(seen: Seen) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            path, _, query = self.path.partition("?")
            seen.requests.append({"method": self.command, "path": path, "query": query,
                                  "content_type": self.headers.get("Content-Type"),
                                  "auth": self.headers.get("Authorization"),
                                  "body": json.loads(body) if body else None})
            status, payload = seen.answers.get((self.command, path), (200, json.loads(body) if body else {}))
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = _answer  # noqa: N815

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    return server


@pytest.fixture
def api() -> Iterator[tuple[Kube, Seen]]:
    seen = Seen()
    server = serve(seen)
    config = k8s.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    config.api_key = {"BearerToken": "sa-token"}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    api_client = k8s.ApiClient(config)
    yield Kube(api_client, timeout=5), seen
    api_client.close()
    server.shutdown()
    server.server_close()


def test_paths() -> None:
    assert resource_path("v1", "Secret", "ns", "a") == "/api/v1/namespaces/ns/secrets/a"
    assert resource_path("apps/v1", "StatefulSet", "ns", "a") == "/apis/apps/v1/namespaces/ns/statefulsets/a"
    assert resource_path("strata.dev/v1alpha1", "Mount", "ns") == "/apis/strata.dev/v1alpha1/namespaces/ns/mounts"


async def test_apply_is_server_side_apply_with_our_field_manager(api: tuple[Kube, Seen]) -> None:
    kube, seen = api
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "demo-config", "namespace": "ns"},
                "data": {"strata.yaml": "blockSize: 1\n"}}
    assert await kube.apply(manifest) == manifest
    (req,) = seen.requests
    assert req["method"] == "PATCH" and req["path"] == "/api/v1/namespaces/ns/configmaps/demo-config"
    assert req["content_type"] == "application/apply-patch+yaml"
    assert req["query"] == "fieldManager=strata-operator&force=true"
    assert req["auth"] == "Bearer sa-token"
    assert req["body"] == manifest


async def test_status_goes_to_the_status_subresource(api: tuple[Kube, Seen]) -> None:
    kube, seen = api
    await kube.apply_status("strata.dev/v1alpha1", "CacheCluster", "ns", "demo", {"phase": "Ready"})
    (req,) = seen.requests
    assert req["path"] == "/apis/strata.dev/v1alpha1/namespaces/ns/cacheclusters/demo/status"
    assert req["body"] == {"apiVersion": "strata.dev/v1alpha1", "kind": "CacheCluster",
                           "metadata": {"name": "demo", "namespace": "ns"}, "status": {"phase": "Ready"}}


async def test_get_missing_is_none_and_errors_carry_the_servers_message(api: tuple[Kube, Seen]) -> None:
    kube, seen = api
    path = "/api/v1/namespaces/ns/secrets/nope"
    seen.answers[("GET", path)] = (404, {"kind": "Status", "message": 'secrets "nope" not found'})
    assert await kube.get("v1", "Secret", "ns", "nope") is None
    sts = "/apis/apps/v1/namespaces/ns/statefulsets/demo-master"
    seen.answers[("PATCH", sts)] = (422, {"kind": "Status", "message": "spec.selector: field is immutable"})
    with pytest.raises(KubeError, match="field is immutable") as info:
        await kube.apply({"apiVersion": "apps/v1", "kind": "StatefulSet",
                          "metadata": {"name": "demo-master", "namespace": "ns"}})
    assert info.value.status == 422


async def test_list_returns_items(api: tuple[Kube, Seen]) -> None:
    kube, seen = api
    path = "/apis/strata.dev/v1alpha1/namespaces/ns/mounts"
    seen.answers[("GET", path)] = (200, {"items": [{"metadata": {"name": "a"}}]})
    assert await kube.list("strata.dev/v1alpha1", "Mount", "ns") == [{"metadata": {"name": "a"}}]
