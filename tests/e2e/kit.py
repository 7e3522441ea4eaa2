"""Helpers for the e2e tests: kubectl, the API, waiting with deadlines.

Cluster-agnostic on purpose: everything goes through a kubeconfig (kubectl,
helm), never through the harness, so the same tests run on kind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.processes import wait_for

Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SERVER_IMAGE = os.environ.get("STRATA_E2E_SERVER_IMAGE", "localhost/strata-server:e2e")


def python_image() -> str:
    """The image of test pods: STRATA_E2E_PYTHON_IMAGE (any image with python3), else ours."""
    return os.environ.get("STRATA_E2E_PYTHON_IMAGE") or SERVER_IMAGE
wait_until = wait_for  # one polling helper for the harness and the tests


class CommandError(RuntimeError):
    def __init__(self, argv: Sequence[str], proc: subprocess.CompletedProcess[str]) -> None:
        self.returncode, self.stdout, self.stderr = proc.returncode, proc.stdout, proc.stderr
        super().__init__(f"`{' '.join(argv)}` exited {proc.returncode}:\n{proc.stderr.strip() or proc.stdout.strip()}")


def find_tool(name: str) -> str | None:
    """A tool from the e2e build folder, else from PATH."""
    folder = Path(os.environ.get("STRATA_E2E_BIN") or Path.home() / ".cache" / "strata" / "e2e-bin")
    candidate = folder / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


@dataclass
class Cluster:
    """A cluster reached through a kubeconfig."""

    kubeconfig: Path
    harness: dict[str, Any] | None = None  # the harness' description, when it runs one

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def run(self, tool: str, *args: str, input: str | None = None, check: bool = True, timeout: float = 120) -> str:
        path = find_tool(tool)
        if path is None:
            raise FileNotFoundError(f"{tool} not found: run tests/e2e/tools/build.sh or put it on PATH")
        argv = [path, *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, env=self.env(), timeout=timeout)
        if check and proc.returncode != 0:
            raise CommandError(argv, proc)
        return proc.stdout

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.run("kubectl", *args, input=input, check=check)

    def kubectl_result(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        path = find_tool("kubectl")
        assert path is not None
        return subprocess.run([path, *args], input=input, capture_output=True, text=True, env=self.env(), timeout=120)

    def apply(self, objects: Obj | list[Obj], namespace: str | None = None) -> str:
        docs = objects if isinstance(objects, list) else [objects]
        args = ["apply", "--server-side", "--force-conflicts", "-f", "-"]
        if namespace:
            args += ["-n", namespace]
        return self.kubectl(*args, input=yaml.safe_dump_all(docs))

    def get(self, kind: str, name: str | None = None, namespace: str | None = None) -> Obj:
        args = ["get", kind] + ([name] if name else []) + ["-o", "json"]
        if namespace:
            args += ["-n", namespace]
        result: Obj = json.loads(self.kubectl(*args))
        return result

    def get_or_none(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        args = ["get", kind, name, "-o", "json", "--ignore-not-found"] + (["-n", namespace] if namespace else [])
        out = self.kubectl(*args)
        return json.loads(out) if out.strip() else None

    def items(self, kind: str, namespace: str | None = None, selector: str | None = None) -> list[Obj]:
        args = ["get", kind, "-o", "json"] + (["-n", namespace] if namespace else ["-A"])
        if selector:
            args += ["-l", selector]
        items: list[Obj] = json.loads(self.kubectl(*args))["items"]
        return items

    def describe_pods(self, namespace: str) -> str:
        """Pod phases, conditions and container states, for failure messages."""
        lines = []
        for pod in self.items("pods", namespace):
            st = pod.get("status", {})
            conds = ",".join(f"{c['type']}={c['status']}" for c in st.get("conditions", []))
            states = "; ".join(f"{c['name']}:{json.dumps(c.get('state'))}" for c in st.get("containerStatuses", []))
            lines.append(f"{pod['metadata']['name']} node={pod['spec'].get('nodeName')} phase={st.get('phase')} "
                         f"ip={st.get('podIP')} [{conds}] {states}")
            if not pod_ready(pod):
                lines.extend(self.container_logs(pod))
        events = self.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)
        return "pods:\n  " + "\n  ".join(lines) + "\nevents:\n" + events[-3000:]

    def container_logs(self, pod: Obj, lines: int = 15) -> list[str]:
        """The last lines each container printed (`kubectl logs`)."""
        out = []
        for c in pod["spec"].get("containers", []):
            text = self.kubectl("logs", "-n", pod["metadata"]["namespace"], pod["metadata"]["name"],
                                "-c", c["name"], f"--tail={lines}", check=False)
            out += [f"    {c['name']}| {line}" for line in text.splitlines()[-lines:]]
        return out


# The chart's tenant ClusterRole and operator account (release `strata` in `strata-system`).
TENANT_ROLE = "strata-tenant"
TENANT_BINDING = "strata-operator"
OPERATOR_ACCOUNT = "strata-system:strata-operator"


def make_namespace(cluster: Cluster, name: str) -> None:
    """A fresh namespace for a test, granted to the chart's operator as the owner of a
    namespace that runs CacheClusters does (its clusters' token Secrets, its Mounts'
    credentials), with its default ServiceAccount made."""
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "strata.dev/e2e=true")
    cluster.kubectl("create", "rolebinding", TENANT_BINDING, "-n", name, f"--clusterrole={TENANT_ROLE}",
                    f"--serviceaccount={OPERATOR_ACCOUNT}")
    wait_until(lambda: cluster.get_or_none("serviceaccount", "default", name), timeout=30,
               what=f"the default ServiceAccount in {name}")


def pod_ready(pod: Obj | None) -> bool:
    if not pod:
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def condition(obj: Obj | None, kind: str) -> Obj | None:
    for c in (obj or {}).get("status", {}).get("conditions", []):
        if c.get("type") == kind:
            return dict(c)
    return None


def load_fixture(*parts: str) -> list[Obj]:
    """The YAML documents of tests/e2e/fixtures/<parts...>."""
    return [d for d in yaml.safe_load_all((FIXTURES.joinpath(*parts)).read_text()) if d]


def python_pod(
    name: str,
    script: str,
    *,
    labels: dict[str, str] | None = None,
    restart: str = "Never",
    ports: Sequence[int] = (),
    readiness_port: int | None = None,
    affinity: Obj | None = None,
) -> Obj:
    """A pod that runs a Python script."""
    container: Obj = {
        "name": "main",
        "image": python_image(),
        "command": ["python3", "-c", script],
        "ports": [{"containerPort": p} for p in ports],
    }
    if readiness_port:
        container["readinessProbe"] = {"tcpSocket": {"port": readiness_port}, "periodSeconds": 1}
    spec: Obj = {"restartPolicy": restart, "containers": [container], "terminationGracePeriodSeconds": 5}
    if affinity:
        spec["affinity"] = affinity
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}}, "spec": spec}
