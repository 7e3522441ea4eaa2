"""charts/strata rendered by helm: lint, what users rely on in the manifests, and that the
chart and the code agree (CLI flags, settings, webhook path and port, CSI socket layout)."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from strata.cacheserver.cli import build_parser
from strata.contract import csi
from strata.operator.handlers.admission import HANDLER_ID, WEBHOOK_NAME
from strata.operator.cli import build_parser as operator_parser
from strata.operator.settings import MetricsSettings, OperatorSettings, WebhookSettings
from tests.unit.chart.conftest import CHART, NAMESPACE, Obj, Render, kinds, one, render_text, run_helm

APP_VERSION = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


def container(pod_owner: Obj, name: str) -> Obj:
    spec = pod_owner["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == name)


def env_of(c: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def volume(pod_owner: Obj, name: str) -> Obj:
    return next(v for v in pod_owner["spec"]["template"]["spec"]["volumes"] if v["name"] == name)


def mount_of(c: Obj, name: str) -> Obj:
    return next(m for m in c["volumeMounts"] if m["name"] == name)


def port_of(c: Obj, name: str) -> int:
    return int(next(p["containerPort"] for p in c["ports"] if p["name"] == name))


# -- the chart as a package ----------------------------------------------------------------

def test_helm_lint_is_clean(helm: str) -> None:
    for values in ([], ["--set", "operator.watchAllNamespaces=false", "--set", "webhook.certificate.mode=certManager"]):
        proc = run_helm(helm, "lint", "--strict", str(CHART), "--kube-version", "1.34.0", *values)
        assert "0 chart(s) failed" in proc.stdout, proc.stdout


def test_every_value_is_documented() -> None:
    """Each value in values.yaml has a `# --` comment. A documented block (resources:,
    objectSelector:) is one value; an undocumented block (operator:) is a group whose keys
    need their own comments."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented: list[str] = []
    skip_below: int | None = None  # inside a documented block: its keys are its content
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z]\w*):(.*)$", line)
        if not match:
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3)
        if skip_below is not None and indent > skip_below:
            continue
        skip_below = None
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# --"):
            j -= 1
        documented = j >= 0 and lines[j].strip().startswith("# --")
        is_block = rest.strip() == "" and i + 1 < len(lines) and lines[i + 1].startswith(" " * (indent + 2))
        if documented and is_block:
            skip_below = indent
        elif not documented and not is_block:
            undocumented.append(key)
    assert not undocumented, f"values without a `# --` comment: {undocumented}"


def test_the_schema_refuses_mistakes(helm: str) -> None:
    for bad in ("operator.replica=2", "webhook.certificate.mode=selfsigned", "csi.kubeletDir=var/lib",
                "image.pullPolicy=Sometimes", "webhook.timeoutSeconds=60", "csi.passthrough.room=lots",
                "csi.passthrough.dir=relative/copies"):
        proc = run_helm(helm, "template", "strata", str(CHART), "--kube-version", "1.34.0", "--set", bad, check=False)
        assert proc.returncode != 0 and "values don't meet the specifications of the schema" in proc.stderr, bad


def test_crds_are_kept_once() -> None:
    """The CRDs are the chart's crds/ folder (Helm installs it, users apply it); /crds, which
    the tests, the CRD reference and the models' checks read, is a link to it, not a copy."""
    repo_crds = CHART.parents[1] / "crds"
    assert repo_crds.is_symlink() and repo_crds.resolve() == (CHART / "crds").resolve(), \
        "crds/ must be the link charts/strata/crds (ln -s charts/strata/crds crds), not a copy"
    assert sorted(p.name for p in (CHART / "crds").glob("*.yaml")) == [
        "cacheclusters.strata.dev.yaml", "kopf-peering.yaml", "mounts.strata.dev.yaml"]


# -- the operator -------------------------------------------------------------------------

def test_operator_deployment(render: Render) -> None:
    objs = render()
    deployment = one(objs, "Deployment", "strata-operator")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"  # the e2e suite finds it so
    operator = container(deployment, "operator")
    assert operator["image"] == f"ghcr.io/strata-dev/strata-operator:{APP_VERSION}"
    # The arguments are what `strata-operator run` accepts.
    args = operator_parser().parse_args(operator["args"])
    assert args.command == "run" and args.all_namespaces and not args.namespace and not args.standalone
    peering = one(objs, "ClusterKopfPeering")
    assert args.peering == peering["metadata"]["name"] == "strata"
    # Liveness probe on kopf's liveness endpoint.
    health = port_of(operator, "health")
    assert args.liveness == f"http://0.0.0.0:{health}/healthz"
    probe = operator["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and probe["port"] == "health"
    # Non-root, nothing writable but the webhook certificate it makes (in memory).
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert operator["securityContext"]["readOnlyRootFilesystem"] is True
    assert [v["name"] for v in pod["spec"].get("volumes", []) if "emptyDir" in v] == ["webhook-tls"]
    assert pod["spec"]["serviceAccountName"] == one(objs, "ServiceAccount", "strata-operator")["metadata"]["name"]


def test_operator_settings_from_the_chart_are_real_settings(render: Render) -> None:
    env = env_of(container(one(render(), "Deployment", "strata-operator"), "operator"))
    known = {(str(model.model_config.get("env_prefix", "")) + field).upper()
             for model in (OperatorSettings, WebhookSettings, MetricsSettings) for field in model.model_fields}
    unknown = {k for k in env if k.startswith("STRATA_") and k not in known}
    assert not unknown, f"the chart sets settings the operator does not have: {unknown}"
    assert env["STRATA_OPERATOR_SERVER_IMAGE"] == f"ghcr.io/strata-dev/strata-server:{APP_VERSION}"
    assert OperatorSettings(server_image=env["STRATA_OPERATOR_SERVER_IMAGE"],
                            image_pull_policy=env["STRATA_OPERATOR_IMAGE_PULL_POLICY"],
                            reconcile_interval=env["STRATA_OPERATOR_RECONCILE_INTERVAL"])


def test_images_follow_the_values(render: Render) -> None:
    objs = render({"image.repository": "registry.example:5000/team/", "image.tag": "1.2.3"})
    operator = container(one(objs, "Deployment"), "operator")
    assert operator["image"] == "registry.example:5000/team/strata-operator:1.2.3"
    assert env_of(operator)["STRATA_OPERATOR_SERVER_IMAGE"] == "registry.example:5000/team/strata-server:1.2.3"
    assert container(one(objs, "DaemonSet", "strata-csi-node"), "node-plugin")["image"] == \
        "registry.example:5000/team/strata-server:1.2.3"
    assert container(one(objs, "DaemonSet", "strata-fuse-holder"), "fuse-holder")["image"] == \
        "registry.example:5000/team/strata-server:1.2.3"


def test_namespaced_mode(render: Render) -> None:
    objs = render({"operator.watchAllNamespaces": "false", "operator.watchNamespaces": "{team-a,team-b}"})
    args = operator_parser().parse_args(container(one(objs, "Deployment"), "operator")["args"])
    assert not args.all_namespaces and args.namespace == ["team-a", "team-b"]
    peerings = [o for o in objs if o["kind"] == "KopfPeering"]
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    assert {p["metadata"]["name"] for p in peerings} == {args.peering}
    assert "ClusterKopfPeering" not in kinds(objs)
    roles = [o for o in objs if o["kind"] == "Role"]
    assert sorted((r["metadata"]["namespace"], r["metadata"]["name"]) for r in roles) == [
        (NAMESPACE, "strata-csi-node-tokens"), (NAMESPACE, "strata-operator-self"),
        ("team-a", "strata-csi-node"), ("team-a", "strata-operator"), ("team-a", "strata-uninstall"),
        ("team-b", "strata-csi-node"), ("team-b", "strata-operator"), ("team-b", "strata-uninstall")]
    # Only the read-only discovery and node rules and the patch of the webhook's own
    # configuration are bound cluster-wide; the tenant role (Secrets) is bound in the watched
    # namespaces only.
    bound = {b["roleRef"]["name"] for b in objs if b["kind"] == "ClusterRoleBinding"}
    cluster_roles = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] in bound}
    assert sorted(cluster_roles) == ["strata-operator-discovery", "strata-operator-nodes", "strata-operator-webhook"]
    for name in ("strata-operator-discovery", "strata-operator-nodes"):
        assert all(set(rule["verbs"]) <= {"list", "watch"} for rule in cluster_roles[name]["rules"])
    assert cluster_roles["strata-operator-webhook"]["rules"] == [{
        "apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
        "resourceNames": ["strata-locality"], "verbs": ["patch"]}]
    tenant = [(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in objs
              if b["kind"] == "RoleBinding" and b["roleRef"]["kind"] == "ClusterRole"]
    assert sorted(tenant) == [("team-a", "strata-tenant"), ("team-b", "strata-tenant")]
    # Default: the release namespace.
    objs = render({"operator.watchAllNamespaces": "false"})
    assert operator_parser().parse_args(container(one(objs, "Deployment"), "operator")["args"]).namespace == [NAMESPACE]


def test_names_fit_63_characters(render: Render) -> None:
    release = "a-very-long-release-name-for-strata-cache-deployments"  # 53, helm's limit
    objs = render(release=release)
    for obj in objs:
        assert len(obj["metadata"]["name"]) <= 63, obj["metadata"]["name"]
    assert one(objs, "Deployment")["metadata"]["name"].endswith("-operator")
    objs = render({"fullnameOverride": "x" * 63})
    assert {len(o["metadata"]["name"]) for o in objs if o["kind"] != "CSIDriver"} <= set(range(64))
    assert one(objs, "Service", "x" * 55 + "-webhook")


def test_labels_and_selectors(render: Render) -> None:
    objs = render()
    for obj in objs:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "strata" and labels["app.kubernetes.io/instance"] == "strata"
        assert labels["helm.sh/chart"] == "strata-0.1.0", obj["metadata"]["name"]
    for workload in (o for o in objs if o["kind"] in ("Deployment", "DaemonSet")):
        selector = workload["spec"]["selector"]["matchLabels"]
        # Selectors hold no version or chart label, which change on upgrade (selectors are immutable).
        assert not {"helm.sh/chart", "app.kubernetes.io/version"} & set(selector)
        assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()


# -- metrics ------------------------------------------------------------------------------

def test_metrics_service_reaches_the_operators_metrics_port(render: Render) -> None:
    objs = render()
    operator = container(one(objs, "Deployment"), "operator")
    service = one(objs, "Service", "strata-operator-metrics")
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "metrics"
    assert int(env_of(operator)["STRATA_OPERATOR_METRICS_PORT"]) == port_of(operator, "metrics") == port["port"]
    assert service["spec"]["selector"].items() <= one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    objs = render({"metrics.enabled": "false"})
    assert env_of(container(one(objs, "Deployment"), "operator"))["STRATA_OPERATOR_METRICS_PORT"] == "0"
    assert not [o for o in objs if o["metadata"]["name"] == "strata-operator-metrics"]


# -- the webhook --------------------------------------------------------------------------

def test_webhook_configuration_matches_the_operator(render: Render) -> None:
    objs = render()
    config = one(objs, "MutatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert WebhookSettings().lookup_timeout < hook["timeoutSeconds"] <= 10
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    excluded = hook["namespaceSelector"]["matchExpressions"][0]
    assert excluded["key"] == "kubernetes.io/metadata.name" and excluded["operator"] == "NotIn"
    assert {"kube-system", NAMESPACE} <= set(excluded["values"])
    assert hook["objectSelector"]["matchExpressions"] == [
        {"key": "app.kubernetes.io/managed-by", "operator": "NotIn", "values": ["strata-operator"]}]
    # Service reference (the API server reaches it at the ready pods' addresses), kopf's path.
    ref = hook["clientConfig"]["service"]
    assert "url" not in hook["clientConfig"]
    assert ref["path"] == f"/{HANDLER_ID}" and ref["namespace"] == NAMESPACE
    service = one(objs, "Service", ref["name"])
    (port,) = service["spec"]["ports"]
    assert port["port"] == ref["port"] == 443 and port["targetPort"] == "webhook"
    deployment = one(objs, "Deployment")
    operator = container(deployment, "operator")
    env = env_of(operator)
    assert env["STRATA_OPERATOR_WEBHOOK_ENABLED"] == "true"
    assert int(env["STRATA_OPERATOR_WEBHOOK_PORT"]) == port_of(operator, "webhook")
    assert operator["readinessProbe"]["tcpSocket"]["port"] == "webhook"
    # The operator makes the certificate and writes it where it serves it from; the settings
    # the chart gives name the Secret, Service and configuration it renders.
    mount = mount_of(operator, "webhook-tls")
    assert mount["mountPath"] == env["STRATA_OPERATOR_WEBHOOK_CERT_DIR"] and not mount["readOnly"]
    assert "emptyDir" in volume(deployment, "webhook-tls")
    settings = WebhookSettings(**{k.removeprefix("STRATA_OPERATOR_WEBHOOK_").lower(): v for k, v in env.items()
                                  if k.startswith("STRATA_OPERATOR_WEBHOOK_")})
    assert settings.certificate == "operator" and settings.service == ref["name"]
    assert settings.configuration == one(objs, "MutatingWebhookConfiguration")["metadata"]["name"]
    assert hook["name"] == WEBHOOK_NAME


def test_nothing_secret_is_rendered_for_the_webhook(render: Render, helm: str) -> None:
    """The key is made by the operator in the cluster: no Secret, no caBundle, no key in the
    rendered manifests, so every install has its own."""
    objs = render()
    assert "Secret" not in kinds(objs)
    hook = one(objs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert "caBundle" not in hook["clientConfig"]
    assert "PRIVATE KEY" not in render_text(helm)
    assert render_text(helm) == render_text(helm)  # nothing generated at render time


def test_webhook_certificate_from_cert_manager(render: Render) -> None:
    objs = render({"webhook.certificate.mode": "certManager"})
    assert "Secret" not in kinds(objs)
    config = one(objs, "MutatingWebhookConfiguration")
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    certificate = one(objs, "Certificate")
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
        f"{NAMESPACE}/{certificate['metadata']['name']}"
    assert certificate["spec"]["secretName"] == "strata-webhook-tls"
    assert f"strata-webhook.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    issuer = one(objs, "Issuer")
    assert issuer["spec"] == {"selfSigned": {}} and certificate["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    objs = render({"webhook.certificate.mode": "certManager", "webhook.certificate.certManager.issuerRef.kind": "ClusterIssuer",
                   "webhook.certificate.certManager.issuerRef.name": "corp-ca"})
    assert "Issuer" not in kinds(objs)
    assert one(objs, "Certificate")["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "corp-ca"}


def test_webhook_disabled(render: Render) -> None:
    objs = render({"webhook.enabled": "false"})
    assert not {"MutatingWebhookConfiguration", "Secret"} & set(kinds(objs))
    operator = container(one(objs, "Deployment"), "operator")
    assert env_of(operator)["STRATA_OPERATOR_WEBHOOK_ENABLED"] == "false"
    assert operator["readinessProbe"]["httpGet"]["port"] == "health"
    assert "volumeMounts" not in operator


# -- the CSI driver -----------------------------------------------------------------------

def test_csi_driver_object(render: Render) -> None:
    driver = one(render(), "CSIDriver")
    assert driver["metadata"]["name"] == csi.DRIVER_NAME
    spec = driver["spec"]
    assert spec["podInfoOnMount"] is True and spec["attachRequired"] is False
    assert spec["volumeLifecycleModes"] == ["Persistent", "Ephemeral"]


@pytest.mark.parametrize("kubelet", ["/var/lib/kubelet", "/var/snap/microk8s/common/var/lib/kubelet/"])
def test_csi_node_plugin_layout(render: Render, kubelet: str) -> None:
    """Socket where the registrar and kubelet expect it, pods' folders shared both ways."""
    daemonset = one(render({"csi.kubeletDir": kubelet}), "DaemonSet", "strata-csi-node")
    root = kubelet.rstrip("/")
    plugin, registrar = container(daemonset, "node-plugin"), container(daemonset, "node-driver-registrar")
    assert plugin["image"] == f"ghcr.io/strata-dev/strata-server:{APP_VERSION}"
    args = build_parser().parse_args(plugin["args"])
    assert args.node_id == "$(STRATA_NODE_NAME)"
    assert env_of(plugin)["STRATA_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    socket_dir = mount_of(plugin, "plugin-dir")["mountPath"]
    assert args.endpoint == f"unix://{socket_dir}/csi.sock"
    host_dir = volume(daemonset, "plugin-dir")["hostPath"]["path"]
    assert host_dir == f"{root}/plugins/{csi.DRIVER_NAME}"
    assert f"--kubelet-registration-path={host_dir}/csi.sock" in registrar["args"]
    assert f"--csi-address={mount_of(registrar, 'plugin-dir')['mountPath']}/csi.sock" in registrar["args"]
    assert volume(daemonset, "registration-dir")["hostPath"]["path"] == f"{root}/plugins_registry"
    assert mount_of(registrar, "registration-dir")["mountPath"] == "/registration"
    pods = mount_of(plugin, "pods-dir")
    assert pods["mountPath"] == volume(daemonset, "pods-dir")["hostPath"]["path"] == f"{root}/pods"
    assert pods["mountPropagation"] == "Bidirectional"
    assert plugin["securityContext"]["privileged"] is True
    assert registrar["image"].startswith("registry.k8s.io/sig-storage/csi-node-driver-registrar:")
    assert daemonset["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists"}]


@pytest.mark.parametrize("kubelet", ["/var/lib/kubelet", "/var/snap/microk8s/common/var/lib/kubelet/"])
def test_the_fuse_holder_keeps_the_node_plugins_mounts(render: Render, kubelet: str) -> None:
    """The node plugin hands its mounts to the node's holder, which sees them (the pods
    folder from the host, at the same path) and shares the keepers' state folder; an upgrade
    never replaces the holder (it would end every volume of the node); it has no token."""
    objs = render({"csi.kubeletDir": kubelet})
    root = kubelet.rstrip("/")
    node = one(objs, "DaemonSet", "strata-csi-node")
    plugin = container(node, "node-plugin")
    daemonset = one(objs, "DaemonSet", "strata-fuse-holder")
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    assert spec["tolerations"] == node["spec"]["template"]["spec"]["tolerations"]
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "fuse-holder"
    assert node["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "csi-node"
    holder = container(daemonset, "fuse-holder")
    assert holder["securityContext"]["privileged"] is True
    args = build_parser().parse_args(holder["args"])
    assert args.command == "fuse-holder"
    assert str(args.socket) == env_of(plugin)["STRATA_FUSE_HOLDER"]
    state = env_of(plugin)["STRATA_FUSE_STATE_DIR"]
    assert env_of(holder)["STRATA_FUSE_STATE_DIR"] == state and args.socket.parent.as_posix() == state
    for workload, c in ((node, plugin), (daemonset, holder)):
        assert mount_of(c, "fuse-state")["mountPath"] == state
        assert volume(workload, "fuse-state")["hostPath"] == {"path": state, "type": "DirectoryOrCreate"}
    pods = mount_of(holder, "pods-dir")
    assert pods["mountPath"] == mount_of(plugin, "pods-dir")["mountPath"] == f"{root}/pods"
    assert volume(daemonset, "pods-dir")["hostPath"]["path"] == f"{root}/pods"
    assert pods["mountPropagation"] == "HostToContainer"
    assert float(env_of(plugin)["STRATA_FUSE_RESUME_TIMEOUT"]) >= 60


def test_the_node_plugin_keeps_local_copies_for_passthrough_on_a_host_folder_unless_turned_off(
        render: Render) -> None:
    """Read-only volumes that ask for passthrough get copies in a node folder (a hostPath, not
    the tmpfs of the FUSE state), with the room the values give; room "" leaves it out."""
    node = one(render({"csi.passthrough.dir": "/mnt/nvme/copies", "csi.passthrough.room": "50Gi"}),
               "DaemonSet", "strata-csi-node")
    plugin = container(node, "node-plugin")
    args = build_parser().parse_args(plugin["args"])
    assert args.passthrough == "/mnt/nvme/copies:50Gi"
    assert mount_of(plugin, "fuse-copies")["mountPath"] == "/mnt/nvme/copies"
    assert volume(node, "fuse-copies")["hostPath"] == {"path": "/mnt/nvme/copies", "type": "DirectoryOrCreate"}
    assert build_parser().parse_args(container(one(render({}), "DaemonSet", "strata-csi-node"), "node-plugin")[
        "args"]).passthrough  # on by default
    off = container(one(render({"csi.passthrough.room": ""}), "DaemonSet", "strata-csi-node"), "node-plugin")
    assert build_parser().parse_args(off["args"]).passthrough is None
    assert "fuse-copies" not in [m["name"] for m in off["volumeMounts"]]


def test_csi_disabled(render: Render) -> None:
    objs = render({"csi.enabled": "false"})
    assert not {"CSIDriver", "DaemonSet"} & set(kinds(objs))
    assert not [o for o in objs if "csi" in o["metadata"]["name"]]


# -- notes --------------------------------------------------------------------------------

def test_notes_say_how_crds_are_upgraded() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert "never upgrades" in notes and "kubectl apply --server-side -f strata/crds/" in notes
    readme = (CHART / "README.md").read_text()
    assert "## Upgrading, and the CRDs" in readme and "never upgrades" in readme.replace("**", "")


def test_render_output_is_plain_yaml(helm: str, tmp_path: Path) -> None:
    """Every document parses and has apiVersion, kind and a name."""
    text = render_text(helm, {"operator.watchAllNamespaces": "false", "webhook.certificate.mode": "certManager"})
    for doc in yaml.safe_load_all(text):
        if doc:
            assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], doc
