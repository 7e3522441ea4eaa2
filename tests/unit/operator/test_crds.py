"""The CRDs: structural schemas with a description everywhere, defaults that match the
operator's models, and validation (schema + CEL rules) that refuses what it should.

The validation here plays the API server's part (OpenAPI schema, then every
x-kubernetes-validations rule with `self`/`oldSelf`); the e2e suite applies the same CRDs to
a real kube-apiserver.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml

from strata.operator.models import CacheClusterSpec, MountSpec

ROOT = Path(__file__).resolve().parents[3]
CRDS = ROOT / "crds"


def load_crd(name: str) -> dict[str, Any]:
    docs = list(yaml.safe_load_all((CRDS / name).read_text()))
    assert len(docs) == 1
    return docs[0]  # type: ignore[no-any-return]


def schema_of(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


CLUSTER = load_crd("cacheclusters.strata.dev.yaml")
MOUNT = load_crd("mounts.strata.dev.yaml")


def walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    nodes = [(path or "<root>", schema)]
    for key, sub in schema.get("properties", {}).items():
        nodes += walk(sub, f"{path}.{key}")
    if "items" in schema:
        nodes += walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        nodes += walk(schema["additionalProperties"], f"{path}{{}}")
    return nodes


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Default missing fields like the API server: a default fills an absent field, and the
    filled value is defaulted in turn."""
    if isinstance(value, dict) and "properties" in schema:
        out = dict(value)
        for key, sub in schema["properties"].items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = apply_defaults(sub, out[key])
        return out
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], v) for v in value]
    return value


class Invalid(Exception):
    pass


_CEL = celpy.Environment()


def check_rules(schema: dict[str, Any], new: Any, old: Any = None, path: str = "") -> None:
    """Evaluate every CEL rule on the nodes present in `new`; transition rules (oldSelf)
    only where `old` has the node, as the API server does."""
    for rule in schema.get("x-kubernetes-validations", []):
        uses_old = "oldSelf" in rule["rule"]
        if uses_old and old is None:
            continue
        activation = {"self": celpy.json_to_cel(new)}
        if uses_old:
            activation["oldSelf"] = celpy.json_to_cel(old)
        result = _CEL.program(_CEL.compile(rule["rule"])).evaluate(activation)
        if result is not True and not (isinstance(result, celpy.celtypes.BoolType) and result):
            raise Invalid(f"{path or '<root>'}: {rule['message']}")
    if isinstance(new, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in new:
                sub_old = old.get(key) if isinstance(old, dict) else None
                check_rules(sub, new[key], sub_old, f"{path}.{key}")
    if isinstance(new, list) and "items" in schema:
        for i, item in enumerate(new):
            check_rules(schema["items"], item, None, f"{path}[{i}]")


def admit(crd: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    """Default, then validate an object as the API server would; return the stored object."""
    schema = schema_of(crd)
    stored = apply_defaults(schema, obj)
    try:
        jsonschema.Draft4Validator(schema).validate(stored)
    except jsonschema.ValidationError as exc:
        raise Invalid(f"{'.'.join(str(p) for p in exc.absolute_path)}: {exc.message}") from exc
    check_rules(schema, stored, apply_defaults(schema, old) if old else None)
    return stored


def cluster(spec: dict[str, Any], name: str = "demo") -> dict[str, Any]:
    return {"apiVersion": "strata.dev/v1alpha1", "kind": "CacheCluster", "metadata": {"name": name}, "spec": spec}


def mount(**spec: Any) -> dict[str, Any]:
    body = {"cluster": "demo", "path": "/datasets/a", "source": "s3://bucket/a", **spec}
    return {"apiVersion": "strata.dev/v1alpha1", "kind": "Mount", "metadata": {"name": "a"}, "spec": body}


# -- structure ----------------------------------------------------------------------------

@pytest.mark.parametrize("crd", [CLUSTER, MOUNT], ids=["CacheCluster", "Mount"])
def test_every_field_has_a_type_and_a_description(crd: dict[str, Any]) -> None:
    nodes = walk(schema_of(crd))
    assert len(nodes) > 40
    untyped = [p for p, n in nodes if "type" not in n]
    assert untyped == []
    # metadata may carry nothing but its type (the API server refuses more).
    assert schema_of(crd)["properties"]["metadata"] == {"type": "object"}
    undocumented = [p for p, n in nodes
                    if not n.get("description") and not p.endswith(("[]", "{}")) and p != ".metadata"]
    assert undocumented == []


@pytest.mark.parametrize("crd", [CLUSTER, MOUNT], ids=["CacheCluster", "Mount"])
def test_structural_rules(crd: dict[str, Any]) -> None:
    for path, node in walk(schema_of(crd)):
        # A node lists properties or additionalProperties, never both; open objects say so.
        assert not ("properties" in node and "additionalProperties" in node), path
        if node["type"] == "object" and "properties" not in node and "additionalProperties" not in node:
            assert node.get("x-kubernetes-preserve-unknown-fields") or path == ".metadata", path
    (version,) = crd["spec"]["versions"]
    assert version["subresources"]["status"] == {}
    assert crd["spec"]["names"]["categories"] == ["strata"]


def test_every_cel_rule_compiles() -> None:
    rules = [
        r["rule"]
        for crd in (CLUSTER, MOUNT)
        for _, node in walk(schema_of(crd))
        for r in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) >= 12
    for rule in rules:
        _CEL.compile(rule)


def test_scale_subresource_points_at_worker_replicas() -> None:
    (version,) = CLUSTER["spec"]["versions"]
    scale = version["subresources"]["scale"]
    assert scale["specReplicasPath"] == ".spec.worker.replicas"
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == ["Master", "Workers", "Capacity", "Used", "Hit Ratio", "Phase", "Age"]
    (mversion,) = MOUNT["spec"]["versions"]
    assert [c["name"] for c in mversion["additionalPrinterColumns"]] == [
        "Cluster", "Path", "Source", "Cached", "Phase", "Age"
    ]


# -- defaults agree with the models -------------------------------------------------------

def test_cluster_defaults_equal_model_defaults() -> None:
    stored = admit(CLUSTER, cluster({}))
    assert CacheClusterSpec.model_validate(stored["spec"]) == CacheClusterSpec.model_validate({})
    assert stored["spec"]["tiers"] == [{"medium": "MEM", "quota": "1Gi"}]
    assert stored["spec"]["worker"]["replicas"] == 2


def test_mount_defaults_equal_model_defaults() -> None:
    bare = mount()
    stored = admit(MOUNT, bare)
    assert MountSpec.model_validate(stored["spec"]) == MountSpec.model_validate(bare["spec"])
    assert stored["spec"]["metadataSync"] == {"interval": "30s"}


# -- validation: accepted --------------------------------------------------------------------

def test_full_cluster_is_accepted() -> None:
    spec = {
        "blockSize": "8Mi",
        "worker": {"replicas": 3},
        "tiers": [
            {"medium": "MEM", "quota": "2Gi"},
            {"medium": "SSD", "quota": "100Gi", "volume": {"hostPath": {"path": "/mnt/nvme"}}},
            {"medium": "HDD", "quota": "1Ti", "volume": {"ephemeral": {"storageClassName": "hdd"}}},
        ],
        "cachePolicy": {"eviction": "LRFU", "highWatermark": 0.9, "lowWatermark": 0.7},
        "locality": "Required",
    }
    stored = admit(CLUSTER, cluster(spec))
    parsed = CacheClusterSpec.model_validate(stored["spec"])
    assert [t.medium for t in parsed.tiers] == ["MEM", "SSD", "HDD"]


def test_ssd_only_and_mount_update_of_mutable_fields_are_accepted() -> None:
    admit(CLUSTER, cluster({"tiers": [{"medium": "SSD", "quota": "10G"}]}))
    old = mount()
    admit(MOUNT, mount(source="s3://other/a", options={"region": "eu"}), old=old)


# -- validation: refused, with a message a person understands -------------------------------

@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"tiers": [{"medium": "MEM", "quota": "1Gi"}, {"medium": "MEM", "quota": "2Gi"}]}, "at most one tier"),
        ({"tiers": [{"medium": "SSD", "quota": "1Gi"}, {"medium": "MEM", "quota": "2Gi"}]}, "fastest first"),
        ({"tiers": [{"medium": "HDD", "quota": "1Gi"}, {"medium": "SSD", "quota": "2Gi"}]}, "fastest first"),
        ({"tiers": [{"medium": "MEM", "quota": "0Gi"}]}, "greater than 0"),
        ({"tiers": [{"medium": "MEM", "quota": "lots"}]}, "does not match"),
        ({"tiers": [{"medium": "SSD", "quota": "1Gi", "volume": {}}]}, "exactly one of hostPath, ephemeral or emptyDir"),
        ({"tiers": [{"medium": "MEM", "quota": "1Gi", "volume": {"ephemeral": {}}}]}, "remove its volume"),
        ({"tiers": []}, "non-empty"),
        ({"cachePolicy": {"highWatermark": 0.5, "lowWatermark": 0.6}}, "must be below"),
        ({"master": {"replicas": 2}}, "maximum"),
        ({"worker": {"replicas": -1}}, "minimum"),
        ({"blockSize": "0"}, "greater than 0"),
        ({"locality": "Sometimes"}, "is not one of"),
        ({"master": {"journal": {"volume": {}}}}, "exactly one of persistentVolumeClaim, hostPath or emptyDir"),
        ({"master": {"journal": {"volume": {"emptyDir": {}, "hostPath": {"path": "/j"}}}}}, "exactly one of"),
        ({"master": {"journal": {}}}, "volume"),
        ({"master": {"journal": {"volume": {"hostPath": {"path": "j"}}}}}, "does not match"),
        ({"master": {"journal": {"volume": {"persistentVolumeClaim": {"size": "0Gi"}}}}}, "greater than 0"),
        ({"master": {"journal": {"volume": {"persistentVolumeClaim": {"storageClassName": ""}}}}}, "non-empty"),
    ],
)
def test_bad_cluster_is_refused(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(Invalid, match=message):
        admit(CLUSTER, cluster(spec))


JOURNALS = {
    "claim": {"persistentVolumeClaim": {}},
    "fast-claim": {"persistentVolumeClaim": {"storageClassName": "fast", "size": "2Gi"}},
    "node": {"hostPath": {"path": "/var/lib/j"}},
    "other-node-folder": {"hostPath": {"path": "/var/lib/k"}},
    "scratch": {"emptyDir": {}},
}


def _with_journal(volume: dict[str, Any] | None) -> dict[str, Any]:
    return cluster({"master": {"journal": {"volume": volume}}} if volume is not None else {})


@pytest.mark.parametrize(("before", "after"), [
    ("claim", "node"), ("claim", "scratch"), ("scratch", "claim"), ("node", "other-node-folder"), ("node", None),
])
def test_a_journal_once_set_keeps_its_volume(before: str, after: str | None) -> None:
    """A change would start the master on a new, empty journal: it forgets the files not in
    the store yet."""
    with pytest.raises(Invalid, match="spec.master.journal: once set"):
        admit(CLUSTER, _with_journal(JOURNALS[after] if after else None), old=_with_journal(JOURNALS[before]))


@pytest.mark.parametrize(("before", "after"), [(None, "scratch"), (None, "fast-claim"), ("claim", "fast-claim"),
                                                ("node", "node")])
def test_a_journal_may_be_set_once_and_its_claim_named(before: str | None, after: str) -> None:
    """A cluster made without it may set it (e.g. a StorageClass, when there is no default);
    the claim's fields are the API server's to refuse (a bound claim's class cannot change)."""
    stored = admit(CLUSTER, _with_journal(JOURNALS[after]), old=_with_journal(JOURNALS[before] if before else None))
    CacheClusterSpec.model_validate(stored["spec"])


def test_the_default_journal_is_left_unset_and_parses_to_a_claim() -> None:
    stored = admit(CLUSTER, cluster({}))
    assert "journal" not in stored["spec"]["master"]
    claim = CacheClusterSpec.model_validate(stored["spec"]).master.journal.volume.persistent_volume_claim
    assert claim is not None and claim.storage_class_name is None and claim.size == 1 << 30
    stored = admit(CLUSTER, _with_journal({"persistentVolumeClaim": {}}))
    assert stored["spec"]["master"]["journal"]["volume"]["persistentVolumeClaim"] == {"size": "1Gi"}


def test_long_cluster_name_is_refused() -> None:
    with pytest.raises(Invalid, match="at most 45 characters"):
        admit(CLUSTER, cluster({}, name="x" * 46))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"path": "datasets/a"}, "absolute, normalised"),
        ({"path": "/datasets/a/"}, "absolute, normalised"),
        ({"path": "/datasets//a"}, "absolute, normalised"),
        ({"path": "/datasets/../a"}, "absolute, normalised"),
        ({"path": "/"}, "absolute, normalised"),
        ({"source": "ftp://host/a"}, "one of the schemes"),
        ({"source": "bucket/a"}, "one of the schemes"),
        ({"metadataSync": {"interval": "soon"}}, "does not match"),
        ({"ttl": "1 day"}, "does not match"),
        ({"preload": {"paths": ["../etc"]}}, "stay inside the mount"),
        ({"preload": {"schedule": "daily"}}, "does not match"),
        ({"preload": {"schedule": "0 3 * *"}}, "does not match"),
        ({"preload": {"bandwidth": "fast"}}, "does not match"),
        ({"readType": "SOMETIMES"}, "is not one of"),
    ],
)
def test_bad_mount_is_refused(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(Invalid, match=message):
        admit(MOUNT, mount(**spec))


@pytest.mark.parametrize("field", ["cluster", "path"])
def test_mount_cluster_and_path_are_immutable(field: str) -> None:
    old = mount()
    changed = mount(**{field: "other" if field == "cluster" else "/datasets/b"})
    with pytest.raises(Invalid, match=f"spec.{field} cannot be changed"):
        admit(MOUNT, changed, old=old)
    admit(MOUNT, changed)  # the same object is fine as a new Mount


def test_schema_and_model_refuse_the_same_mount_paths() -> None:
    for path in ["/a", "/a/b.c", "/datasets/x-1", "a", "/a/", "/a//b", "/a/./b", "/.."]:
        try:
            admit(MOUNT, mount(path=path))
            schema_ok = True
        except Invalid:
            schema_ok = False
        try:
            MountSpec.model_validate({"cluster": "d", "path": path, "source": "s3://b"})
            model_ok = True
        except ValueError:
            model_ok = False
        assert schema_ok == model_ok, path


def test_strings_and_lists_under_cel_rules_are_bounded() -> None:
    """The API server estimates each rule's cost from the largest value it may see, and
    refuses a CRD whose rules could cost too much: bound every input of a rule."""
    for crd in (CLUSTER, MOUNT):
        for path, node in walk(schema_of(crd)):
            if not node.get("x-kubernetes-validations") or path == "<root>":
                continue
            if node["type"] == "string":
                assert "maxLength" in node or "enum" in node, path
            if node["type"] == "array":
                assert "maxItems" in node, path
            if path.endswith("[]"):
                parent = dict(walk(schema_of(crd)))[path[:-2]]
                assert "maxItems" in parent, path


@pytest.mark.parametrize("crd", [CLUSTER, MOUNT], ids=["CacheCluster", "Mount"])
def test_defaults_pass_their_own_schema(crd: dict[str, Any]) -> None:
    """The API server validates each default as written, before nested defaults apply."""
    for path, node in walk(schema_of(crd)):
        if "default" in node:
            jsonschema.Draft4Validator(node).validate(node["default"])
            check_rules(node, node["default"], None, path)


@pytest.mark.parametrize("crd", [CLUSTER, MOUNT], ids=["CacheCluster", "Mount"])
def test_an_object_not_yet_observed_has_a_generation_no_object_has(crd: dict[str, Any]) -> None:
    """kstatus reads an object without status as Current; the status default makes its
    observedGeneration -1, which no metadata.generation (1 and up) matches: InProgress until
    the operator's first status write (checked with kstatus itself in tests/e2e/test_crds.py)."""
    status = schema_of(crd)["properties"]["status"]
    filled = apply_defaults(schema_of(crd), {"metadata": {"generation": 1}, "spec": {}})
    assert filled["status"] == {"observedGeneration": -1}
    jsonschema.validate(filled["status"], status)


def test_a_preload_schedule_and_bandwidth_are_accepted_and_parse() -> None:
    spec = admit(MOUNT, mount(preload={"paths": ["/train"], "schedule": "*/15 3-5 * * 1-5", "bandwidth": "50Mi"}))["spec"]
    parsed = MountSpec.model_validate(spec)
    assert parsed.preload.schedule is not None and parsed.preload.schedule.text == "*/15 3-5 * * 1-5"
    assert parsed.preload.bandwidth == 50 << 20
