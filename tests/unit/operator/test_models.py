"""Spec parsing, defaults, and readable errors."""

from __future__ import annotations

import pytest

from strata.contract.errors import InvalidArgument
from strata.contract.proto import strata_pb2 as pb
from strata.operator.builders.mount import build_mount_request, request_fingerprint
from strata.operator.models import CacheClusterSpec, MountSpec, parse_spec, paths_overlap


def test_cluster_defaults() -> None:
    spec = CacheClusterSpec.model_validate({})
    assert spec.block_size == 16 << 20
    assert (spec.master.replicas, spec.worker.replicas) == (1, 2)
    assert [(t.medium, t.quota) for t in spec.tiers] == [("MEM", 1 << 30)]
    assert spec.cache_policy.eviction == "LRU" and spec.cache_policy.low_watermark == 0.8
    assert spec.short_circuit and spec.locality == "Preferred" and spec.image == ""


def test_cluster_errors_name_the_field_and_value() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_spec(CacheClusterSpec, {"blockSize": "big", "tiers": [{"medium": "SSD", "quota": "1Gi",
                                                                     "volume": {}}]}, what="CacheCluster ns/demo")
    text = str(info.value)
    assert text.startswith("CacheCluster ns/demo: invalid spec: ")
    assert "blockSize" in text and "'big' is not a size" in text
    assert "tiers.0.volume: tier volume: set exactly one of hostPath, ephemeral or emptyDir" in text
    assert "Value error" not in text


@pytest.mark.parametrize(
    ("tiers", "message"),
    [([{"medium": "MEM", "quota": "1Gi"}, {"medium": "MEM", "quota": "1Gi"}], "at most one tier"),
     ([{"medium": "HDD", "quota": "1Gi"}, {"medium": "SSD", "quota": "1Gi"}], "fastest first"),
     ([{"medium": "MEM", "quota": "0"}], "greater than 0"),
     ([{"medium": "SSD", "quota": "1Gi", "volume": {"hostPath": {"path": "rel"}}}], "must be absolute")],
)
def test_bad_tiers(tiers: list[dict[str, object]], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_spec(CacheClusterSpec, {"tiers": tiers}, what="CacheCluster ns/demo")


def test_mount_durations_and_preload_paths() -> None:
    spec = MountSpec.model_validate({"cluster": "demo", "path": "/d/x", "source": "s3://b/x", "ttl": "1h30m",
                                     "metadataSync": {"interval": "-1"}, "preload": {"paths": ["/train", "a/b"]}})
    assert spec.ttl == 5400 and spec.metadata_sync.interval == -1
    assert spec.preload_paths() == ("/d/x/train", "/d/x/a/b")
    whole = spec.model_copy(update={"preload": spec.preload.model_copy(update={"on_create": True})})
    assert whole.preload_paths() == ("/d/x",)
    assert MountSpec.model_validate({"cluster": "d", "path": "/a", "source": "file:///nfs"}).ttl == 0


@pytest.mark.parametrize(("spec", "message"), [
    ({"source": "ftp://x"}, "scheme 'ftp' is not supported"),
    ({"metadataSync": {"interval": "-5s"}}, "use -1 for never"),
    ({"path": "/a/../b"}, "absolute and normalised"),
])
def test_bad_mounts(spec: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_spec(MountSpec, {"cluster": "d", "path": "/a", "source": "s3://b", **spec}, what="Mount ns/a")


def test_paths_overlap() -> None:
    assert paths_overlap("/a", "/a") and paths_overlap("/a", "/a/b") and paths_overlap("/a/b", "/a")
    assert not paths_overlap("/a", "/ab") and not paths_overlap("/a/b", "/a/c")


def test_mount_request_and_fingerprint() -> None:
    spec = MountSpec.model_validate({"cluster": "d", "path": "/a", "source": "s3://b", "writeType": "THROUGH"})
    request = build_mount_request(spec, {"secret": "x"})
    assert request.options.write_type == pb.THROUGH and request.options.read_type == pb.READ_TYPE_UNSPECIFIED
    assert request.options.read_only and request.options.metadata_sync_interval == 30
    same = request_fingerprint(build_mount_request(spec, {"secret": "x"}))
    assert request_fingerprint(request) == same
    assert request_fingerprint(build_mount_request(spec, {"secret": "y"})) != same
    assert "x" not in same
