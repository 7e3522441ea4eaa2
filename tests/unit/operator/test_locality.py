"""Locality decisions: which Mounts a pod uses and the affinity it gets (pure logic)."""

from __future__ import annotations

from typing import Any

import pytest

from strata.operator.locality import (
    APPLIED_ANNOTATION,
    LOCALITY_ANNOTATION,
    MAX_PREFERRED_NODES,
    WORKER_WEIGHT,
    MountRef,
    Source,
    cached_bytes_by_node,
    decide,
    mounts_of,
    node_weights,
)

Obj = dict[str, Any]
HOST = "kubernetes.io/hostname"


def strata_volume(name: str, mount: str, **attributes: str) -> Obj:
    return {"name": name, "csi": {"driver": "csi.strata.dev", "readOnly": True,
                                  "volumeAttributes": {"mount": mount, **attributes}}}


def pod(*volumes: Obj, annotations: dict[str, str] | None = None, affinity: Obj | None = None) -> Obj:
    spec: Obj = {"containers": [{"name": "app", "image": "busybox"}], "volumes": list(volumes)}
    if affinity is not None:
        spec["affinity"] = affinity
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "reader", "namespace": "team", "annotations": annotations or {}}, "spec": spec}


def mount(name: str = "data", cluster: str = "demo", nodes: dict[str, str] | None = None, namespace: str = "team") -> Obj:
    body: Obj = {"metadata": {"name": name, "namespace": namespace},
                 "spec": {"cluster": cluster, "path": f"/{name}", "source": "s3://b"}}
    if nodes is not None:
        body["status"] = {"phase": "Mounted",
                          "cache": {"nodes": [{"node": n, "bytes": b} for n, b in nodes.items()]}}
    return body


def cluster(name: str = "demo", locality: str | None = None) -> Obj:
    return {"metadata": {"name": name, "namespace": "team"},
            "spec": {} if locality is None else {"locality": locality}}


def source(m: Obj | None, c: Obj | None, name: str = "data", namespace: str = "team") -> Source:
    return Source(MountRef(namespace, name), m, c)


def preferred_nodes(affinity: Obj) -> list[tuple[str, int]]:
    terms = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    out = []
    for term in terms:
        (expr,) = term["preference"]["matchExpressions"]
        assert expr["key"] == HOST and expr["operator"] == "In"
        (node,) = expr["values"]
        out.append((node, term["weight"]))
    return out


def worker_selector(term: Obj) -> tuple[list[str], dict[str, str], list[str]]:
    selector = term["labelSelector"]
    (instances,) = selector["matchExpressions"]
    assert instances["key"] == "app.kubernetes.io/instance" and instances["operator"] == "In"
    assert term["topologyKey"] == HOST
    return term["namespaces"], selector["matchLabels"], instances["values"]


# -- which volumes count ------------------------------------------------------------------

def test_only_strata_csi_volumes_naming_a_mount_count() -> None:
    p = pod(
        {"name": "scratch", "emptyDir": {}},
        {"name": "other", "csi": {"driver": "other.csi.io", "volumeAttributes": {"mount": "x"}}},
        {"name": "no-mount", "csi": {"driver": "csi.strata.dev", "volumeAttributes": {"masterAddress": "m:1"}}},
        {"name": "claim", "persistentVolumeClaim": {"claimName": "data"}},
        strata_volume("a", "data"),
        strata_volume("b", "data"),                        # the same Mount twice: once
        strata_volume("c", "logs", namespace="shared"),    # a Mount in another namespace
    )
    assert mounts_of(p) == [MountRef("team", "data"), MountRef("shared", "logs")]
    assert mounts_of(pod()) == []
    assert mounts_of({"metadata": {}, "spec": {}}) == []


def test_a_pod_without_strata_volumes_is_left_alone() -> None:
    decision = decide(pod({"name": "scratch", "emptyDir": {}}), [])
    assert decision.affinity is None and decision.notes == ()


# -- preferred ---------------------------------------------------------------------------

def test_preferred_weights_nodes_by_cached_bytes_and_prefers_worker_nodes() -> None:
    nodes = {"n1": "8Gi", "n2": "2Gi", "n3": "1.5Mi"}
    decision = decide(pod(strata_volume("d", "data")), [source(mount(nodes=nodes), cluster())])
    assert decision.mode == "Preferred"
    affinity = decision.affinity
    assert affinity is not None
    assert preferred_nodes(affinity) == [("n1", 100), ("n2", 25), ("n3", 1)]  # never 0: the API refuses it
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity["nodeAffinity"]
    (term,) = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["weight"] == WORKER_WEIGHT
    namespaces, labels, instances = worker_selector(term["podAffinityTerm"])
    assert namespaces == ["team"] and instances == ["demo"]
    assert labels == {"app.kubernetes.io/name": "strata", "app.kubernetes.io/component": "worker"}
    assert decision.nodes == ("n1", "n2", "n3")


def test_nothing_cached_yet_prefers_the_clusters_worker_nodes() -> None:
    for m in (mount(), mount(nodes={})):
        affinity = decide(pod(strata_volume("d", "data")), [source(m, cluster())]).affinity
        assert affinity is not None
        assert "nodeAffinity" not in affinity
        (term,) = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert worker_selector(term["podAffinityTerm"])[2] == ["demo"]


def test_the_pods_own_affinity_is_kept() -> None:
    own = {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 7, "preference": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}}]},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "reader"}}}]},
    }
    p = pod(strata_volume("d", "data"), affinity=own)
    affinity = decide(p, [source(mount(nodes={"n1": "1Gi"}), cluster())]).affinity
    assert affinity is not None
    prefs = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert prefs[0] == own["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert prefs[1]["weight"] == 100
    assert affinity["podAntiAffinity"] == own["podAntiAffinity"]
    assert p["spec"]["affinity"] == own  # the input is not changed


def test_many_nodes_name_only_those_with_the_most_data() -> None:
    nodes = {f"n{i:02d}": f"{i + 1}Mi" for i in range(40)}
    affinity = decide(pod(strata_volume("d", "data")), [source(mount(nodes=nodes), cluster())]).affinity
    assert affinity is not None
    named = preferred_nodes(affinity)
    assert len(named) == MAX_PREFERRED_NODES
    assert named[0] == ("n39", 100)
    assert {n for n, _ in named} == {f"n{i:02d}" for i in range(40 - MAX_PREFERRED_NODES, 40)}


def test_two_mounts_of_two_clusters_add_up() -> None:
    p = pod(strata_volume("a", "data"), strata_volume("b", "logs"))
    sources = [
        source(mount("data", "demo", nodes={"n1": "1Gi", "n2": "3Gi"}), cluster("demo")),
        source(mount("logs", "other", nodes={"n1": "3Gi"}), cluster("other"), name="logs"),
    ]
    affinity = decide(p, sources).affinity
    assert affinity is not None
    assert preferred_nodes(affinity) == [("n1", 100), ("n2", 75)]
    (term,) = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert worker_selector(term["podAffinityTerm"])[2] == ["demo", "other"]


def test_a_mount_in_another_namespace_selects_workers_there() -> None:
    p = pod(strata_volume("d", "logs", namespace="shared"))
    affinity = decide(p, [source(mount("logs", namespace="shared"), cluster(), name="logs", namespace="shared")]).affinity
    assert affinity is not None
    (term,) = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert worker_selector(term["podAffinityTerm"])[0] == ["shared"]


# -- required ----------------------------------------------------------------------------

def test_required_cluster_makes_the_data_nodes_a_hard_requirement() -> None:
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n9"]}]},
    ]}}}
    p = pod(strata_volume("d", "data"), affinity=own)
    decision = decide(p, [source(mount(nodes={"n2": "1Gi", "n1": "4Gi"}), cluster(locality="Required"))])
    assert decision.mode == "Required" and decision.nodes == ("n1", "n2")
    affinity = decision.affinity
    assert affinity is not None
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    ours = {"key": HOST, "operator": "In", "values": ["n1", "n2"]}
    # Each of the pod's terms (ORed) now also needs a data node (ANDed inside the term).
    assert terms[0]["matchExpressions"] == [{"key": "zone", "operator": "In", "values": ["a"]}, ours]
    assert terms[1]["matchFields"] == own["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][1]["matchFields"]
    assert terms[1]["matchExpressions"] == [ours]
    assert preferred_nodes(affinity) == [("n1", 100), ("n2", 25)]  # the best data node first


def test_required_without_cached_data_requires_a_worker_node() -> None:
    decision = decide(pod(strata_volume("d", "data")), [source(mount(), cluster(locality="Required"))])
    affinity = decision.affinity
    assert decision.mode == "Required" and affinity is not None
    assert "nodeAffinity" not in affinity
    (term,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert worker_selector(term)[2] == ["demo"]


def test_required_with_no_own_terms_gets_one_term() -> None:
    p = pod(strata_volume("d", "data"))
    affinity = decide(p, [source(mount(nodes={"n1": "1Gi"}), cluster(locality="Required"))]).affinity
    assert affinity is not None
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": HOST, "operator": "In", "values": ["n1"]}]}]}


# -- modes, annotations, missing objects ---------------------------------------------------------

@pytest.mark.parametrize(("annotation", "cluster_locality", "expected"), [
    ("required", None, "Required"),
    ("Required", "Preferred", "Required"),
    ("preferred", "Required", "Preferred"),
    ("disabled", "Required", None),
    ("required", "Disabled", "Required"),  # the pod's explicit wish wins
    (None, "Disabled", None),
    (None, "Required", "Required"),
    (None, None, "Preferred"),
])
def test_the_pod_annotation_wins_over_the_cluster(annotation: str | None, cluster_locality: str | None,
                                                  expected: str | None) -> None:
    annotations = {LOCALITY_ANNOTATION: annotation} if annotation else {}
    p = pod(strata_volume("d", "data"), annotations=annotations)
    decision = decide(p, [source(mount(nodes={"n1": "1Gi"}), cluster(locality=cluster_locality))])
    assert (decision.mode if decision.affinity is not None else None) == expected


def test_an_unknown_annotation_value_is_reported_and_ignored() -> None:
    p = pod(strata_volume("d", "data"), annotations={LOCALITY_ANNOTATION: "always"})
    decision = decide(p, [source(mount(), cluster(locality="Required"))])
    assert decision.mode == "Required"
    (note,) = decision.notes
    assert "'always'" in note and "required" in note and "spec.locality" in note


def test_missing_mounts_and_clusters_are_noted_and_the_rest_still_count() -> None:
    p = pod(strata_volume("a", "gone"), strata_volume("b", "orphan"), strata_volume("c", "data"))
    sources = [
        source(None, None, name="gone"),
        source(mount("orphan", cluster="nowhere"), None, name="orphan"),
        source(mount(nodes={"n1": "1Gi"}), cluster()),
    ]
    decision = decide(p, sources)
    assert decision.affinity is not None and preferred_nodes(decision.affinity) == [("n1", 100)]
    assert decision.notes == (
        "Mount team/gone does not exist: no locality for its volume",
        "CacheCluster nowhere of Mount team/orphan does not exist: no locality for its volume",
    )
    assert decide(p, sources[:2]).affinity is None


def test_a_pod_already_placed_is_not_changed_again() -> None:
    p = pod(strata_volume("d", "data"), annotations={APPLIED_ANNOTATION: "Preferred"})
    assert decide(p, [source(mount(nodes={"n1": "1Gi"}), cluster())]).affinity is None


def test_cache_nodes_are_read_from_status_quantities() -> None:
    m = mount(nodes={"n1": "1.5Gi", "n2": "0", "n3": "garbage"})
    m["status"]["cache"]["nodes"].append({"bytes": "1Gi"})  # no node name
    assert cached_bytes_by_node(m) == {"n1": 3 * 2**29}
    assert cached_bytes_by_node({}) == {}
    assert node_weights({}) == []
    assert node_weights({"b": 10, "a": 10, "c": 1000}) == [("c", 100), ("a", 1), ("b", 1)]
