"""Builders against golden YAML. A changed golden file is a reviewed change:
rewrite them with STRATA_UPDATE_GOLDEN=1 and read the diff."""

from __future__ import annotations

import base64
import os
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from strata.cacheserver.worker.uploads import STAGING_FOLDER
from strata.contract.config import ServerConfig
from strata.operator import builders
from strata.operator import constants as c
from strata.operator.builders.common import (
    approximate_quantity,
    format_quantity,
    master_endpoint,
)
from strata.operator.models import CacheClusterSpec, Cluster, ClusterTokens, ObjectRef
from strata.operator.settings import OperatorSettings

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("STRATA_UPDATE_GOLDEN") == "1"
SETTINGS = OperatorSettings(server_image="strata-server:test")
TOKEN = ClusterTokens(admin="s3cr3t-token", data="d4t4-token", internal="1ntern4l-token")
REF = ObjectRef("strata.dev/v1alpha1", "CacheCluster", "demo", "team-a", "0b1c-uid")

FULL_SPEC = {
    "blockSize": "16Mi",
    "master": {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
    "worker": {
        "replicas": 3,
        "nodeSelector": {"node.kubernetes.io/instance-type": "i3.xlarge"},
        "tolerations": [{"key": "cache", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "tiers": [
        {"medium": "MEM", "quota": "1Gi"},
        {"medium": "SSD", "quota": "100Gi", "volume": {"hostPath": {"path": "/mnt/nvme/strata"}}},
        {"medium": "HDD", "quota": "1Ti", "volume": {"ephemeral": {"storageClassName": "local-hdd"}}},
    ],
    "cachePolicy": {"eviction": "LRFU", "readaheadBlocks": 4},
}


def make_cluster(spec: dict[str, Any]) -> Cluster:
    return Cluster(REF, 1, CacheClusterSpec.model_validate(spec))


class _Dumper(yaml.SafeDumper):
    """Readable goldens: block style for multi-line strings, no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def check_golden(name: str, manifests: list[dict[str, Any]]) -> None:
    text = yaml.dump_all(manifests, Dumper=_Dumper, sort_keys=False)
    path = GOLDEN / name
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"golden file {path} missing; run with STRATA_UPDATE_GOLDEN=1 to write it")
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from golden; review, then STRATA_UPDATE_GOLDEN=1"


def all_children(cluster: Cluster) -> list[dict[str, Any]]:
    return builders.build_master_children(cluster, SETTINGS, TOKEN) + builders.build_worker_children(
        cluster, SETTINGS, TOKEN
    )


def test_defaults_golden() -> None:
    check_golden("cluster-defaults.yaml", all_children(make_cluster({})))


def test_full_spec_golden() -> None:
    check_golden("cluster-full.yaml", all_children(make_cluster(FULL_SPEC)))


def test_builders_are_deterministic() -> None:
    cluster = make_cluster(FULL_SPEC)
    assert all_children(cluster) == all_children(cluster)


def test_every_child_is_owned_and_labelled() -> None:
    for child in all_children(make_cluster(FULL_SPEC)):
        meta = child["metadata"]
        assert meta["namespace"] == "team-a"
        (owner,) = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "strata.dev/v1alpha1", "kind": "CacheCluster", "name": "demo",
            "uid": "0b1c-uid", "controller": True, "blockOwnerDeletion": True,
        }
        assert meta["labels"]["app.kubernetes.io/instance"] == "demo"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "strata-operator"


def test_config_map_is_the_server_config() -> None:
    cm = builders.build_config_map(make_cluster(FULL_SPEC), SETTINGS)
    config = ServerConfig.model_validate(yaml.safe_load(cm["data"]["strata.yaml"]))
    assert config.master_address == "demo-master-0.demo-master.team-a.svc:19998"
    assert [(t.medium, t.quota, [str(d) for d in t.dirs]) for t in config.tiers] == [
        ("MEM", 2**30, ["/var/lib/strata/tiers/mem"]),
        ("SSD", 100 * 2**30, ["/var/lib/strata/tiers/ssd"]),
        ("HDD", 2**40, ["/var/lib/strata/tiers/hdd"]),
    ]
    assert config.cache_policy.eviction == "LRFU"
    assert config.cache_policy.readahead_blocks == 4


def test_tier_volumes_match_their_media() -> None:
    sts = builders.build_worker_statefulset(make_cluster(FULL_SPEC), SETTINGS, TOKEN)
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tier-mem"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    assert volumes["tier-ssd"]["hostPath"] == {"path": "/mnt/nvme/strata", "type": "DirectoryOrCreate"}
    claim = volumes["tier-hdd"]["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim["storageClassName"] == "local-hdd"
    assert claim["resources"]["requests"]["storage"] == "1Ti"
    assert volumes["short-circuit"]["hostPath"]["path"] == "/var/run/strata/team-a/demo"
    scratch = make_cluster({"tiers": [{"medium": "SSD", "quota": "10G", "volume": {"emptyDir": {}}}]})
    volume, mount = _mounted(builders.build_worker_statefulset(scratch, SETTINGS, TOKEN), "/var/lib/strata/tiers/ssd")
    assert volume == {"name": "tier-ssd", "emptyDir": {"sizeLimit": "10G"}} and "subPathExpr" not in mount


def test_a_disk_tier_with_no_volume_is_a_node_folder_of_each_worker_that_outlives_its_pod() -> None:
    """A rolling update or a replaced worker pod finds its blocks again on the node."""
    default_ssd = make_cluster({"tiers": [{"medium": "SSD", "quota": "10G"}, {"medium": "HDD", "quota": "1Ti"}]})
    sts = builders.build_worker_statefulset(default_ssd, SETTINGS, TOKEN)
    for medium in ("ssd", "hdd"):
        volume, mount = _mounted(sts, f"/var/lib/strata/tiers/{medium}")
        assert volume == {"name": f"tier-{medium}",
                          "hostPath": {"path": f"/var/lib/strata/cache/{medium}", "type": "DirectoryOrCreate"}}
        assert mount["subPathExpr"] == "$(STRATA_POD_NAMESPACE)/$(STRATA_POD_NAME)"
    assert {"/var/lib/strata/tiers/ssd", "/var/lib/strata/tiers/hdd", c.STAGING_DIR} <= set(_chowned(sts))
    moved = OperatorSettings(server_image="strata-server:test", node_cache_root="/mnt/nvme/strata-cache")
    volume, _ = _mounted(builders.build_worker_statefulset(default_ssd, moved, TOKEN), "/var/lib/strata/tiers/ssd")
    assert volume["hostPath"]["path"] == "/mnt/nvme/strata-cache/ssd"
    with pytest.raises(ValueError, match="STRATA_OPERATOR_NODE_CACHE_ROOT must be an absolute"):
        OperatorSettings(server_image="strata-server:test", node_cache_root="cache/../x")


def _pod(sts: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = sts["spec"]["template"]["spec"]
    return pod


def _mounted(sts: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The volume mounted at `path` in the server container, and its mount."""
    pod = _pod(sts)
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == path]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return volume, mount


def _chowned(sts: dict[str, Any]) -> list[str]:
    return [d for init in _pod(sts).get("initContainers", []) for d in init["command"][2:]]


def test_the_journal_is_on_a_claim_of_the_default_class_unless_the_spec_says_otherwise() -> None:
    cluster = make_cluster({})
    claim = builders.build_journal_claim(cluster)
    assert claim is not None and claim["metadata"]["name"] == "demo-journal"
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "CacheCluster"
    children = builders.build_master_children(cluster, SETTINGS, TOKEN)
    assert [c["kind"] for c in children][-2:] == ["PersistentVolumeClaim", "StatefulSet"]  # the claim first
    sts = builders.build_master_statefulset(cluster, SETTINGS, TOKEN)
    volume, mount = _mounted(sts, "/var/lib/strata/journal")
    assert volume["persistentVolumeClaim"] == {"claimName": "demo-journal"} and "subPathExpr" not in mount
    assert "volumeClaimTemplates" not in sts["spec"] and _chowned(sts) == []

    named = make_cluster({"master": {"journal": {"volume": {"persistentVolumeClaim": {
        "storageClassName": "fast", "size": "5Gi"}}}}})
    claim = builders.build_journal_claim(named)
    assert claim is not None and claim["spec"]["storageClassName"] == "fast"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"


def test_a_journal_on_a_node_folder_or_an_emptydir_has_no_claim() -> None:
    on_node = make_cluster({"master": {"journal": {"volume": {"hostPath": {"path": "/var/lib/strata-journal"}}}}})
    assert builders.build_journal_claim(on_node) is None
    assert "PersistentVolumeClaim" not in [c["kind"] for c in builders.build_master_children(on_node, SETTINGS, TOKEN)]
    sts = builders.build_master_statefulset(on_node, SETTINGS, TOKEN)
    volume, mount = _mounted(sts, "/var/lib/strata/journal")
    assert volume["hostPath"] == {"path": "/var/lib/strata-journal", "type": "DirectoryOrCreate"}
    assert mount["subPathExpr"] == "$(STRATA_POD_NAMESPACE)/$(STRATA_POD_NAME)"
    assert _chowned(sts) == ["/var/lib/strata/journal"]

    scratch = make_cluster({"master": {"journal": {"volume": {"emptyDir": {}}}}})
    assert builders.build_journal_claim(scratch) is None
    volume, _ = _mounted(builders.build_master_statefulset(scratch, SETTINGS, TOKEN), "/var/lib/strata/journal")
    assert volume == {"name": "journal", "emptyDir": {}}


def test_the_worker_staging_folder_outlives_what_the_blocks_of_its_writes_outlive() -> None:
    assert c.STAGING_DIR == str(PurePosixPath(c.DATA_DIR) / STAGING_FOLDER)
    # MEM alone, or disk tiers that live as long as the pod: an emptyDir of its own, which
    # survives a restart of the container.
    for tiers in ([{"medium": "MEM", "quota": "1Gi"}],
                  [{"medium": "SSD", "quota": "1Gi", "volume": {"emptyDir": {}}},
                   {"medium": "HDD", "quota": "1Ti", "volume": {"ephemeral": {}}}]):
        sts = builders.build_worker_statefulset(make_cluster({"tiers": tiers}), SETTINGS, TOKEN)
        volume, mount = _mounted(sts, c.STAGING_DIR)
        assert volume == {"name": "staging", "emptyDir": {}} and "subPathExpr" not in mount
    # A hostPath disk tier outlives the pod: the staging folder is beside its folder on the node.
    tiers = [{"medium": "SSD", "quota": "1Gi", "volume": {"emptyDir": {}}},
             {"medium": "HDD", "quota": "1Ti", "volume": {"hostPath": {"path": "/hdd"}}}]
    sts = builders.build_worker_statefulset(make_cluster({"tiers": tiers}), SETTINGS, TOKEN)
    volume, mount = _mounted(sts, c.STAGING_DIR)
    assert volume["name"] == "tier-hdd" and volume["hostPath"]["path"] == "/hdd"
    assert mount["subPathExpr"] == "$(STRATA_POD_NAMESPACE)/$(STRATA_POD_NAME)-staging"
    assert c.STAGING_DIR in _chowned(sts)


def test_short_circuit_off_has_no_host_socket_dir() -> None:
    sts = builders.build_worker_statefulset(make_cluster({"shortCircuit": False}), SETTINGS, TOKEN)
    names = [v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]]
    assert "short-circuit" not in names


def test_config_change_changes_the_pod_template_hash() -> None:
    a = builders.build_worker_statefulset(make_cluster({}), SETTINGS, TOKEN)
    b = builders.build_worker_statefulset(make_cluster({"blockSize": "8Mi"}), SETTINGS, TOKEN)
    c = builders.build_worker_statefulset(make_cluster({"worker": {"replicas": 5}}), SETTINGS, TOKEN)
    d = builders.build_worker_statefulset(make_cluster({}), SETTINGS, ClusterTokens("s3cr3t-token", "d4t4-token", "new"))
    key = "strata.dev/config-hash"
    ha, hb, hc, hd = (s["spec"]["template"]["metadata"]["annotations"][key] for s in (a, b, c, d))
    assert ha != hb
    assert ha == hc  # scaling does not restart pods
    assert ha != hd  # a new token restarts them, so servers read it


def test_user_anti_affinity_replaces_the_default_spread() -> None:
    mine = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}
    sts = builders.build_worker_statefulset(make_cluster({"worker": {"affinity": mine}}), SETTINGS, TOKEN)
    assert sts["spec"]["template"]["spec"]["affinity"] == mine
    sts = builders.build_worker_statefulset(make_cluster({}), SETTINGS, TOKEN)
    spread = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"


def test_image_defaults_to_the_operator_setting() -> None:
    sts = builders.build_master_statefulset(make_cluster({}), SETTINGS, TOKEN)
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "strata-server:test"
    sts = builders.build_master_statefulset(make_cluster({"image": "mine:1"}), SETTINGS, TOKEN)
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "mine:1"


def test_auth_secret_holds_the_given_tokens() -> None:
    secret = builders.build_auth_secret(make_cluster({}), ClusterTokens("abc", "def", "ghi"))
    assert {k: base64.b64decode(v) for k, v in secret["data"].items()} == {
        "token": b"abc", "dataToken": b"def", "internalToken": b"ghi"}


def test_local_sources_reach_the_servers_config() -> None:
    closed = ServerConfig.model_validate(yaml.safe_load(builders.build_config_map(make_cluster({}), SETTINGS)["data"]["strata.yaml"]))
    assert closed.local_sources.allowed_roots == ()
    opened = make_cluster({"localSources": {"allowedRoots": ["/nfs/logs"]}})
    config = ServerConfig.model_validate(yaml.safe_load(builders.build_config_map(opened, SETTINGS)["data"]["strata.yaml"]))
    assert config.local_sources.allowed_roots == ("/nfs/logs",)


def test_master_endpoint_with_and_without_cluster_domain() -> None:
    assert master_endpoint("demo", "ns") == "demo-master-0.demo-master.ns.svc:19998"
    assert master_endpoint("demo", "ns", "cluster.local") == "demo-master-0.demo-master.ns.svc.cluster.local:19998"


@pytest.mark.parametrize(
    ("n", "exact", "approx"),
    [(0, "0", "0"), (1023, "1023", "1023"), (2**30, "1Gi", "1Gi"), (10**9, "1G", "953.7Mi"),
     (3 * 2**40, "3Ti", "3Ti"), (int(3.25 * 2**30), "3328Mi", "3.2Gi"), (1500, "1500", "1.5Ki")],
)
def test_quantities(n: int, exact: str, approx: str) -> None:
    assert format_quantity(n) == exact
    assert approximate_quantity(n) == approx
