"""manifests/install.yaml is the chart rendered by scripts/render-install.sh, and current."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.unit.chart.conftest import NAMESPACE, REPO, Obj, load_all, one

INSTALL = REPO / "manifests" / "install.yaml"
SCRIPT = REPO / "scripts" / "render-install.sh"
def render_install(helm: str, out: Path) -> str:
    proc = subprocess.run([str(SCRIPT), str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HELM": helm})
    assert proc.returncode == 0, proc.stderr
    return out.read_text()


def test_install_yaml_is_current(helm: str, tmp_path: Path) -> None:
    fresh = render_install(helm, tmp_path / "install.yaml")
    assert INSTALL.is_file(), "manifests/install.yaml is missing: run scripts/render-install.sh"
    assert INSTALL.read_text() == fresh, (
        "manifests/install.yaml is stale: run scripts/render-install.sh and commit the result")


def test_install_yaml_installs_everything(helm: str) -> None:
    objs: list[Obj] = load_all(INSTALL.read_text())
    assert objs[0] == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {
        "app.kubernetes.io/part-of": "strata", "pod-security.kubernetes.io/enforce": "privileged"}}}
    crds = sorted(o["metadata"]["name"] for o in objs if o["kind"] == "CustomResourceDefinition")
    assert crds == ["cacheclusters.strata.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev",
                    "mounts.strata.dev"]
    # CRDs come before anything that needs them.
    kinds = [o["kind"] for o in objs]
    assert max(i for i, k in enumerate(kinds) if k == "CustomResourceDefinition") < kinds.index("ClusterKopfPeering")
    for obj in objs:
        if obj["kind"] not in ("Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                               "CSIDriver", "ClusterKopfPeering", "MutatingWebhookConfiguration"):
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]
    assert one(objs, "Deployment", "strata-operator")["spec"]["replicas"] == 2
    assert one(objs, "CSIDriver")["metadata"]["name"] == "csi.strata.dev"
    # Nothing secret: the operator makes the webhook's key at install time.
    assert not [o for o in objs if o["kind"] == "Secret"]
    assert "caBundle" not in one(objs, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]
    assert "PRIVATE KEY" not in INSTALL.read_text() and "tls.key" not in INSTALL.read_text()
    # Helm hooks have no meaning in a plain file: the uninstall Job would delete everything at once.
    assert "helm.sh/hook" not in INSTALL.read_text() and "Job" not in {o["kind"] for o in objs}


def test_rendering_again_without_a_chart_change_keeps_the_file(helm: str, tmp_path: Path) -> None:
    """Nothing is generated at render time: the script leaves a current file alone, so
    re-rendering makes no diff, and replaces a stale one."""
    copy = tmp_path / "install.yaml"
    copy.write_bytes(INSTALL.read_bytes())
    assert render_install(helm, copy) == INSTALL.read_text()
    copy.write_text(INSTALL.read_text().replace("replicas: 2", "replicas: 7"))
    assert render_install(helm, copy) == INSTALL.read_text()
    assert not list(tmp_path.glob("install.yaml.*")), "the script left a temporary file"
