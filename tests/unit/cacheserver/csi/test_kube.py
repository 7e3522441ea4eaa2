"""What a Mount volume shows, read from Kubernetes objects (given without an API server)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from strata.cacheserver.csi.kube import ApiReader, KubeResolver
from strata.contract.errors import FailedPrecondition, NotFound, PermissionDenied

API = "/apis/strata.dev/v1alpha1/namespaces/team"
TOKENS = "strata-system/strata-csi-tokens"
TOKENS_PATH = "/api/v1/namespaces/strata-system/secrets/strata-csi-tokens"


class Objects:
    """An ObjectReader over a dict of REST paths."""

    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        self.objects = objects
        self.read: list[str] = []

    def get(self, path: str) -> dict[str, Any] | None:
        self.read.append(path)
        return self.objects.get(path)


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
    reader = Objects(objects())
    source = KubeResolver(reader, TOKENS).resolve("team", "data", {}, "team")
    assert (source.master, source.token, source.path, source.read_only) == (
        "demo-master-0.demo-master.team.svc:19998", "s3cret", "/datasets/x", True)
    assert "s3cret" not in repr(source)


def test_a_volume_never_gets_the_admin_token() -> None:
    found = objects()
    source = KubeResolver(Objects(found), TOKENS).resolve("team", "data", {}, "team")
    assert source.token == "s3cret"
    # nodePublishSecretRef to the cluster's Secret: its data token, not its admin one.
    source = KubeResolver(Objects(found), TOKENS).resolve("team", "data", {"token": "the-admin-token", "dataToken": "s3cret"}, "team")
    assert source.token == "s3cret"
    # The plugin reads no other Secret: not the cluster's own, which holds the admin token.
    assert all("/secrets/demo-auth" not in p for p in Objects(found).read)


def test_a_token_in_the_volume_secrets_is_used_without_reading_the_secret() -> None:
    reader = Objects(objects(token=None))
    source = KubeResolver(reader, TOKENS).resolve("team", "data", {"token": "from-node-publish-secret"}, "team")
    assert source.token == "from-node-publish-secret"
    assert not any("/secrets/" in p for p in reader.read)


def test_another_namespace_uses_a_mount_only_when_granted() -> None:
    found = objects()
    with pytest.raises(PermissionDenied) as refused:
        KubeResolver(Objects(found), TOKENS).resolve("team", "data", {}, "guest")
    message = str(refused.value)
    assert "Mount team/data may not be used from namespace guest" in message
    assert "spec.allowedNamespaces" in message and "kubectl patch mounts.strata.dev data -n team" in message
    found[f"{API}/mounts/data"]["spec"]["allowedNamespaces"] = ["other", "guest"]
    assert KubeResolver(Objects(found), TOKENS).resolve("team", "data", {}, "guest").token == "s3cret"
    with pytest.raises(PermissionDenied, match="namespace stranger"):
        KubeResolver(Objects(found), TOKENS).resolve("team", "data", {}, "stranger")


def test_a_missing_mount_is_not_found() -> None:
    with pytest.raises(NotFound, match="Mount team/other does not exist"):
        KubeResolver(Objects(objects()), TOKENS).resolve("team", "other", {}, "team")


def test_a_mount_that_is_not_mounted_yet_says_why_and_what_to_wait_for() -> None:
    with pytest.raises(FailedPrecondition, match="Failed: bucket e2e does not exist.*phase is Mounted"):
        KubeResolver(Objects(objects(phase="Failed")), TOKENS).resolve("team", "data", {}, "team")


def test_a_cluster_without_a_master_endpoint_is_not_ready() -> None:
    with pytest.raises(FailedPrecondition, match="no master endpoint"):
        KubeResolver(Objects(objects(endpoint="")), TOKENS).resolve("team", "data", {}, "team")


def test_a_missing_cluster_or_secret_is_not_found() -> None:
    found = objects()
    del found[f"{API}/cacheclusters/demo"]
    with pytest.raises(NotFound, match="CacheCluster team/demo"):
        KubeResolver(Objects(found), TOKENS).resolve("team", "data", {}, "team")
    with pytest.raises(FailedPrecondition, match="no data token of CacheCluster team/demo .key team.demo"):
        KubeResolver(Objects(objects(token=None)), TOKENS).resolve("team", "data", {}, "team")
    with pytest.raises(NotFound, match="Secret strata-system/strata-csi-tokens"):
        KubeResolver(Objects({k: v for k, v in objects().items() if k != TOKENS_PATH}), TOKENS).resolve(
            "team", "data", {}, "team")
    with pytest.raises(FailedPrecondition, match="--tokens-secret"):
        KubeResolver(Objects(objects())).resolve("team", "data", {}, "team")


def test_without_api_access_a_mount_volume_fails_with_advice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    reader = ApiReader(kubeconfig=str(tmp_path / "no-such-kubeconfig"))
    with pytest.raises(FailedPrecondition, match="masterAddress"):
        KubeResolver(reader, TOKENS).resolve("team", "data", {}, "team")
