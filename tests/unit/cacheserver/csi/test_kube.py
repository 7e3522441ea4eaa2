"""What a Mount volume shows, read from Kubernetes objects (given without an API server), and
the reader that gets them through the `kubernetes` client from a local API-server stand-in."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from apiserver import ApiServer, api_server, kubeconfig
from csiobjects import PathObjects

from strata.cacheserver.csi.kube import ApiReader, KubeResolver
from strata.contract.errors import FailedPrecondition, NotFound, PermissionDenied, Unavailable

API = "/apis/strata.dev/v1alpha1/namespaces/team"
TOKENS = "strata-system/strata-csi-tokens"
TOKENS_PATH = "/api/v1/namespaces/strata-system/secrets/strata-csi-tokens"


def objects(*, phase: str = "Mounted", endpoint: str = "demo-master-0.demo-master.team.svc:19998",
            token: str | None = "s3cret", read_only: bool = True) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {
        f"{API}/mounts/data": {"spec": {"cluster": "demo", "path": "/datasets/x", "readOnly": read_only},
                               "status": {"phase": phase, "conditions": [
                                   {"type": "Ready", "status": "False", "message": "bucket e2e does not exist"}]}},
        f"{API}/cacheclusters/demo": {"status": {"master": {"endpoint": endpoint}}},
    }
    # Another cluster's token is there too; the plugin picks this cluster's by its key.
    shared = {"team.other": base64.b64encode(b"not-this-one").decode()}
    if token is not None:
        shared["team.demo"] = base64.b64encode(token.encode()).decode()
    found[TOKENS_PATH] = {"data": shared}
    return found


def test_a_mounted_mount_gives_master_token_and_path() -> None:
    reader = PathObjects(objects())
    source = KubeResolver(reader, TOKENS).resolve("team", "data", {}, "team")
    assert (source.master, source.token, source.path, source.read_only) == (
        "demo-master-0.demo-master.team.svc:19998", "s3cret", "/datasets/x", True)
    assert "s3cret" not in repr(source)


def test_a_volume_never_gets_the_admin_token() -> None:
    reader = PathObjects(objects())
    source = KubeResolver(reader, TOKENS).resolve("team", "data", {}, "team")
    assert source.token == "s3cret"
    # nodePublishSecretRef to the cluster's Secret: its data token, not its admin one.
    source = KubeResolver(reader, TOKENS).resolve("team", "data", {"token": "the-admin-token", "dataToken": "s3cret"}, "team")
    assert source.token == "s3cret"
    # The plugin reads no other Secret: not the cluster's own, which holds the admin token.
    assert TOKENS_PATH in reader.read and all("/secrets/demo-auth" not in p for p in reader.read)


def test_a_token_in_the_volume_secrets_is_used_without_reading_the_secret() -> None:
    reader = PathObjects(objects(token=None))
    source = KubeResolver(reader, TOKENS).resolve("team", "data", {"token": "from-node-publish-secret"}, "team")
    assert source.token == "from-node-publish-secret"
    assert not any("/secrets/" in p for p in reader.read)


def test_another_namespace_uses_a_mount_only_when_granted() -> None:
    found = objects()
    with pytest.raises(PermissionDenied) as refused:
        KubeResolver(PathObjects(found), TOKENS).resolve("team", "data", {}, "guest")
    message = str(refused.value)
    assert "Mount team/data may not be used from namespace guest" in message
    assert "spec.allowedNamespaces" in message and "kubectl patch mounts.strata.dev data -n team" in message
    # No list yet: the patch makes it (appending to a missing list is refused with 422).
    assert """-p '[{"op": "add", "path": "/spec/allowedNamespaces", "value": ["guest"]}]'""" in message
    found[f"{API}/mounts/data"]["spec"]["allowedNamespaces"] = ["other"]
    with pytest.raises(PermissionDenied) as refused:
        KubeResolver(PathObjects(found), TOKENS).resolve("team", "data", {}, "guest")
    # A list: the patch appends to it (a grant made meanwhile stays).
    assert """-p '[{"op": "add", "path": "/spec/allowedNamespaces/-", "value": "guest"}]'""" in str(refused.value)
    found[f"{API}/mounts/data"]["spec"]["allowedNamespaces"] = ["other", "guest"]
    assert KubeResolver(PathObjects(found), TOKENS).resolve("team", "data", {}, "guest").token == "s3cret"
    with pytest.raises(PermissionDenied, match="namespace stranger"):
        KubeResolver(PathObjects(found), TOKENS).resolve("team", "data", {}, "stranger")


def test_a_missing_mount_is_not_found() -> None:
    with pytest.raises(NotFound, match="Mount team/other does not exist"):
        KubeResolver(PathObjects(objects()), TOKENS).resolve("team", "other", {}, "team")


def test_a_mount_that_is_not_mounted_yet_says_why_and_what_to_wait_for() -> None:
    with pytest.raises(FailedPrecondition, match="Failed: bucket e2e does not exist.*phase is Mounted"):
        KubeResolver(PathObjects(objects(phase="Failed")), TOKENS).resolve("team", "data", {}, "team")


def test_a_cluster_without_a_master_endpoint_is_not_ready() -> None:
    with pytest.raises(FailedPrecondition, match="no master endpoint"):
        KubeResolver(PathObjects(objects(endpoint="")), TOKENS).resolve("team", "data", {}, "team")


def test_a_missing_cluster_or_secret_is_not_found() -> None:
    found = objects()
    del found[f"{API}/cacheclusters/demo"]
    with pytest.raises(NotFound, match="CacheCluster team/demo"):
        KubeResolver(PathObjects(found), TOKENS).resolve("team", "data", {}, "team")
    with pytest.raises(FailedPrecondition, match="no data token of CacheCluster team/demo .key team.demo"):
        KubeResolver(PathObjects(objects(token=None)), TOKENS).resolve("team", "data", {}, "team")
    with pytest.raises(NotFound, match="Secret strata-system/strata-csi-tokens"):
        KubeResolver(PathObjects({k: v for k, v in objects().items() if k != TOKENS_PATH}), TOKENS).resolve(
            "team", "data", {}, "team")
    with pytest.raises(FailedPrecondition, match="--tokens-secret"):
        KubeResolver(PathObjects(objects())).resolve("team", "data", {}, "team")


def test_without_api_access_a_mount_volume_fails_with_advice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    reader = ApiReader(kubeconfig=str(tmp_path / "no-such-kubeconfig"))
    with pytest.raises(FailedPrecondition, match="masterAddress"):
        KubeResolver(reader, TOKENS).resolve("team", "data", {}, "team")


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with api_server() as seen:
        yield seen


@pytest.fixture
def reader(server: ApiServer, tmp_path: Path) -> ApiReader:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig(server.url, "csi-token")))
    return ApiReader(kubeconfig=str(path), timeout=5)


def test_the_api_reader_reads_mounts_clusters_and_the_tokens_secret(server: ApiServer, reader: ApiReader) -> None:
    for path, obj in objects().items():
        server.answer("GET", path, 200, obj)
    source = KubeResolver(reader, TOKENS).resolve("team", "data", {}, "team")
    assert (source.master, source.token, source.path) == (
        "demo-master-0.demo-master.team.svc:19998", "s3cret", "/datasets/x")
    assert [(r.method, r.path) for r in server.requests] == [
        ("GET", f"{API}/mounts/data"), ("GET", f"{API}/cacheclusters/demo"), ("GET", TOKENS_PATH)]
    assert {r.auth for r in server.requests} == {"Bearer csi-token"}


def test_the_api_reader_maps_the_servers_refusals(server: ApiServer, reader: ApiReader) -> None:
    server.answer("GET", f"{API}/mounts/gone", 404, {"kind": "Status", "message": "not found"})
    assert reader.strata_object("mounts", "team", "gone") is None
    server.answer("GET", TOKENS_PATH, 403, {"kind": "Status", "message": "forbidden"})
    with pytest.raises(PermissionDenied, match=f"may not read {TOKENS_PATH} .403 Forbidden.: grant its ServiceAccount"):
        reader.secret("strata-system", "strata-csi-tokens")
    server.answer("GET", f"{API}/cacheclusters/demo", 401, {"kind": "Status", "message": "who"})
    with pytest.raises(PermissionDenied, match="may not read .*/cacheclusters/demo .401 Unauthorized."):
        reader.strata_object("cacheclusters", "team", "demo")
    server.answer("GET", f"{API}/mounts/data", 500, {"kind": "Status", "message": "etcd"})
    with pytest.raises(Unavailable, match="answered 500 Internal Server Error for .*/mounts/data"):
        reader.strata_object("mounts", "team", "data")


def test_an_unreachable_api_server_is_unavailable(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig(url, "csi-token")))
    with pytest.raises(Unavailable, match="cannot be reached for .*/mounts/data"):
        ApiReader(kubeconfig=str(path), timeout=2).strata_object("mounts", "team", "data")


def test_the_api_reader_is_configured_on_first_read(server: ApiServer, tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    reader = ApiReader(kubeconfig=str(path), timeout=5)  # no kubeconfig there yet: starting is fine
    path.write_text(yaml.safe_dump(kubeconfig(server.url, "later")))
    server.answer("GET", f"{API}/mounts/data", 200, {"spec": {}})
    assert reader.strata_object("mounts", "team", "data") == {"spec": {}}
    assert [r.auth for r in server.requests] == ["Bearer later"]
