"""The example manifests pass the CRDs' validation and parse into the operator's specs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from strata.operator.models import CacheClusterSpec, MountSpec
from tests.unit.operator.test_crds import CLUSTER, MOUNT, admit

EXAMPLES = Path(__file__).resolve().parents[3] / "manifests" / "examples"


def docs() -> list[dict[str, Any]]:
    return [d for f in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def test_examples_are_valid() -> None:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in docs():
        by_kind.setdefault(doc["kind"], []).append(doc)
    (cluster,) = by_kind["CacheCluster"]
    (mount,) = by_kind["Mount"]
    spec = CacheClusterSpec.model_validate(admit(CLUSTER, cluster)["spec"])
    assert [t.medium for t in spec.tiers] == ["MEM", "SSD"]
    mspec = MountSpec.model_validate(admit(MOUNT, mount)["spec"])
    assert mspec.cluster == cluster["metadata"]["name"]
    secrets = {s["metadata"]["name"] for s in by_kind["Secret"]}
    assert mspec.credentials is not None and mspec.credentials.secret_ref.name in secrets
    # Every CSI volume names the example Mount.
    pods = [by_kind["Pod"][0]["spec"], by_kind["Deployment"][0]["spec"]["template"]["spec"]]
    for pod in pods:
        (volume,) = pod["volumes"]
        assert volume["csi"]["driver"] == "csi.strata.dev"
        assert volume["csi"]["volumeAttributes"] == {"mount": mount["metadata"]["name"]}
