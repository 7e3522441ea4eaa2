"""What operators look at, from the chart: the Prometheus Operator's objects (off by default,
on with monitoring.prometheusOperator), the scrape annotations, the alert rules (checked and
fired by promtool) and the dashboard ConfigMap."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

import promtool
from tests.unit.chart.conftest import CHART, Obj, Render, one

ALERTS = CHART / "files" / "alerts.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
GOLDEN = Path(__file__).parents[1] / "operator" / "golden" / "cluster-defaults.yaml"
MONITORS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels, matchExpressions with In) selects `labels`."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))


def server_pods() -> list[Obj]:
    """The pod templates of a CacheCluster's StatefulSets as the operator builds them."""
    built = [doc for doc in yaml.safe_load_all(GOLDEN.read_text()) if doc and doc["kind"] == "StatefulSet"]
    return [sts["spec"]["template"] for sts in built]


def test_nothing_for_prometheus_or_grafana_by_default(render: Render) -> None:
    objs = render()
    assert not [o for o in objs if o["kind"] in MONITORS]
    assert not [o for o in objs if o["kind"] == "ConfigMap" and "dashboard" in o["metadata"]["name"]]


def test_one_value_makes_the_monitors_and_the_rules(render: Render) -> None:
    objs = render({"monitoring.prometheusOperator": "true", "monitoring.labels.release": "prom"})
    for kind in MONITORS:
        assert one(objs, kind)["metadata"]["labels"]["release"] == "prom"
    # The ServiceMonitor reaches the operator's metrics Service, on its port.
    monitor = one(objs, "ServiceMonitor")
    service = one(objs, "Service", "strata-operator-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]
    # The PodMonitor selects the master and worker pods the operator builds, on their HTTP port.
    pods = one(objs, "PodMonitor")
    assert pods["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = pods["spec"]["podMetricsEndpoints"]
    built = server_pods()
    assert sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in built) == ["master", "worker"]
    for pod in built:
        assert matches(pods["spec"]["selector"], pod["metadata"]["labels"])
        (server,) = pod["spec"]["containers"]
        assert endpoint["port"] in [p["name"] for p in server["ports"]]
    assert not matches(pods["spec"]["selector"], one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"])
    labels = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert labels == {"strata_cluster", "strata_component"}
    # The rules are files/alerts.yaml, the plain rules file, as it is.
    assert one(objs, "PrometheusRule")["spec"] == yaml.safe_load(ALERTS.read_text())
    # No ServiceMonitor without the operator's metrics.
    objs = render({"monitoring.prometheusOperator": "true", "metrics.enabled": "false"})
    assert [o["kind"] for o in objs if o["kind"] in MONITORS] == ["PodMonitor", "PrometheusRule"]


def test_the_pod_monitor_looks_where_the_operator_watches(render: Render) -> None:
    objs = render({"monitoring.prometheusOperator": "true", "operator.watchAllNamespaces": "false",
                   "operator.watchNamespaces": "{data,jobs}"})
    assert one(objs, "PodMonitor")["spec"]["namespaceSelector"] == {"matchNames": ["data", "jobs"]}


def test_pods_carry_scrape_annotations(render: Render) -> None:
    operator = one(render({"metrics.port": "9100", "operator.podAnnotations.team": "data"}), "Deployment")
    assert operator["spec"]["template"]["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "9100", "prometheus.io/path": "/metrics", "team": "data"}
    operator = one(render({"metrics.enabled": "false"}), "Deployment")
    assert "annotations" not in operator["spec"]["template"]["metadata"]
    for pod in server_pods():
        (server,) = pod["spec"]["containers"]
        http = next(p["containerPort"] for p in server["ports"] if p["name"] == "http")
        annotations = pod["metadata"]["annotations"]
        assert (annotations["prometheus.io/scrape"], annotations["prometheus.io/port"],
                annotations["prometheus.io/path"]) == ("true", str(http), "/metrics")


def test_every_rule_is_valid_and_fired_by_its_test() -> None:
    code, said = promtool.run("check", "rules", ALERTS)
    assert code == 0, said
    code, said = promtool.run("test", "rules", "alerts_test.yaml", cwd=Path(__file__).parent)
    assert code == 0, said
    tests = yaml.safe_load((Path(__file__).parent / "alerts_test.yaml").read_text())["tests"]
    fired = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    rules = {rule["alert"] for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]}
    assert fired == rules


def test_every_alert_has_a_runbook_line() -> None:
    readme = (CHART.parents[1] / "README.md").read_text()
    section = readme.split("## Monitoring", 1)[1].split("\n## ", 1)[0]
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            assert re.search(rf"^\| `{rule['alert']}` \|", section, re.M), rule["alert"]


def test_the_dashboard_config_map(render: Render) -> None:
    objs = render({"monitoring.dashboard.enabled": "true"})
    config_map = one(objs, "ConfigMap", "strata-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "strata-system"
    assert json.loads(config_map["data"]["strata.json"]) == json.loads(DASHBOARD.read_text())
    objs = render({"monitoring.dashboard.enabled": "true", "monitoring.dashboard.namespace": "grafana"})
    assert one(objs, "ConfigMap", "strata-dashboard")["metadata"]["namespace"] == "grafana"


def relabel(rules: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str] | None:
    """Prometheus's relabeling (actions keep and replace, as files/scrape-config.yaml uses
    them) of a target's labels; None when the target is dropped."""
    labels = dict(labels)
    for rule in rules:
        value = rule.get("separator", ";").join(labels.get(name, "") for name in rule.get("source_labels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep":
            if match is None:
                return None
        elif action == "replace":
            if match is not None:
                labels[rule["target_label"]] = match.expand(rule.get("replacement", "$1").replace("$", "\\"))
        else:
            raise AssertionError(f"relabel action {action} is not emulated here")
    return labels


def discovered(pod: Obj, namespace: str = "ns", ip: str = "10.1.2.3") -> dict[str, str]:
    """The labels Kubernetes pod discovery gives a running pod."""
    meta = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": pod["metadata"]["name"],
            "__meta_kubernetes_pod_ip": ip, "__meta_kubernetes_pod_phase": "Running", "__address__": f"{ip}:80"}
    for kind, values in (("label", pod["metadata"].get("labels", {})), ("annotation", pod["metadata"].get("annotations", {}))):
        for key, value in values.items():
            meta[f"__meta_kubernetes_pod_{kind}_{re.sub(r'[^a-zA-Z0-9_]', '_', key)}"] = value
    return meta


def test_the_plain_scrape_job_finds_every_server_with_the_rules_labels(render: Render) -> None:
    rules = yaml.safe_load((CHART / "files" / "scrape-config.yaml").read_text())["relabel_configs"]
    operator = one(render(), "Deployment")["spec"]["template"]
    for pod in server_pods():
        pod["metadata"]["name"] = "demo-" + pod["metadata"]["labels"]["app.kubernetes.io/component"] + "-0"
        target = relabel(rules, discovered(pod))
        assert target is not None
        component = pod["metadata"]["labels"]["app.kubernetes.io/component"]
        port = pod["metadata"]["annotations"]["prometheus.io/port"]
        assert {k: v for k, v in target.items() if not k.startswith("__meta")} == {
            "__address__": f"10.1.2.3:{port}", "__metrics_path__": "/metrics", "namespace": "ns",
            "pod": f"demo-{component}-0", "strata_component": component,
            "strata_cluster": pod["metadata"]["labels"]["app.kubernetes.io/instance"]}
    operator["metadata"]["name"] = "strata-operator-abc"
    target = relabel(rules, discovered(operator, "strata-system"))
    assert target is not None and target["__address__"] == "10.1.2.3:8081" and target["strata_component"] == "operator"
    assert "strata_cluster" not in target
    stranger = {"metadata": {"name": "web", "labels": {"app": "web"}, "annotations": {"prometheus.io/scrape": "true"}}}
    assert relabel(rules, discovered(stranger)) is None
