"""The harness' pure parts, without a cluster: image commands from
Dockerfiles, kubelet-style env, and the per-pod hosts file."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import images
from harness.podenv import EnvError, container_env, expand
from harness.services import endpoints_by_service, render_hosts


def test_dockerfile_entrypoint_and_cmd_combine_like_a_runtime(tmp_path: Path) -> None:
    df = tmp_path / "Dockerfile"
    df.write_text(
        'FROM python:3.11 AS build\nENTRYPOINT ["nope"]\n'
        'FROM python:3.11-slim\nENV PATH=/opt/venv/bin:$PATH STRATA_LOG_LEVEL=info\nWORKDIR /var/lib\nWORKDIR strata\n'
        'ENTRYPOINT ["strata"]\nCMD ["--help"]\n'
    )
    cfg = images.parse_dockerfile(df)
    assert cfg.entrypoint == ("strata",) and cfg.cmd == ("--help",)
    assert dict(cfg.env) == {"STRATA_LOG_LEVEL": "info"}  # PATH points into the image: dropped
    assert cfg.workdir == "/var/lib/strata"
    assert images.container_argv(cfg, None, None) == ["strata", "--help"]
    assert images.container_argv(cfg, None, ["master"]) == ["strata", "master"]
    assert images.container_argv(cfg, ["python"], ["-V"]) == ["python", "-V"]


@pytest.mark.parametrize(
    ("image", "kind"),
    [
        ("ghcr.io/acme/strata-server:0.1.0", "strata-server"),
        ("localhost:5000/strata-operator@sha256:abc", "strata-operator"),
        ("strata-server", "strata-server"),
        ("busybox:1.36", None),
        ("ghcr.io/acme/not-strata-server-x:1", None),
    ],
)
def test_project_images_are_recognised(image: str, kind: str | None) -> None:
    assert images.project_image(image) == kind


def test_env_resolution_order_and_expansion() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"}}, "spec": {"nodeName": "n1"},
           "status": {"podIP": "10.0.0.5"}}
    store = {("ConfigMap", "cm"): {"data": {"K": "from-cm", "X": "x"}},
             ("Secret", "s"): {"data": {"pw": "c2VjcmV0"}}}
    container = {
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['a']"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
            {"name": "URL", "value": "http://$(IP):80/$(UNKNOWN)/$$(IP)"},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k", "optional": True}}},
        ],
    }
    env = container_env(pod, container, lambda k, n: store.get((k, n)), base={"BASE": "1"}, node_capacity={})
    assert env == {"BASE": "1", "CM_K": "from-cm", "CM_X": "x", "IP": "10.0.0.5", "LABEL": "b",
                   "PW": "secret", "URL": "http://10.0.0.5:80/$(UNKNOWN)/$(IP)"}
    with pytest.raises(EnvError, match="Secret 'gone' not found"):
        container_env(pod, {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k"}}}]},
                      lambda k, n: None, base={}, node_capacity={})
    assert expand("$(A)$(B)", {"A": "1"}) == "1$(B)"


def test_hosts_file_lists_cluster_names() -> None:
    services = [
        {"metadata": {"namespace": "ns", "name": "web"}, "spec": {"clusterIP": "10.96.0.7"}},
        {"metadata": {"namespace": "ns", "name": "db"}, "spec": {"clusterIP": "None"}},
        {"metadata": {"namespace": "other", "name": "api"}, "spec": {"clusterIP": "10.96.0.9"}},
    ]
    slices = [{
        "metadata": {"namespace": "ns", "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4", "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.244.1.3"], "hostname": "db-0", "conditions": {"ready": True}},
                      {"addresses": ["10.244.2.3"], "hostname": "db-1", "conditions": {"ready": False}}],
    }]
    text = render_hosts(pod_ip="10.244.1.9", hostname="db-2", subdomain="db", namespace="ns",
                        services=services, endpoints=endpoints_by_service(slices))
    lines = {tuple(line.split()) for line in text.splitlines()}
    assert ("10.244.1.9", "db-2.db.ns.svc.cluster.local", "db-2.db.ns.svc", "db-2") in lines
    assert ("10.96.0.7", "web.ns.svc.cluster.local", "web.ns.svc", "web.ns", "web") in lines
    assert ("10.96.0.9", "api.other.svc.cluster.local", "api.other.svc") in lines  # no short names across namespaces
    assert ("10.244.1.3", "db.ns.svc.cluster.local", "db.ns.svc", "db.ns", "db") in lines
    assert ("10.244.1.3", "db-0.db.ns.svc.cluster.local", "db-0.db.ns.svc", "db-0.db.ns", "db-0.db") in lines
    assert not any("10.244.2.3" in line for line in text.splitlines()), "not-ready endpoints are not published"
