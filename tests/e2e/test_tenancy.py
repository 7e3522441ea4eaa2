"""Tenancy and least privilege on a shared cluster, as installed by the Helm chart: a Mount
is used from another namespace only when its own namespace grants it, and the operator and
the CSI node plugin can read no Secret they do not need.

Written against shared/DESIGN.md ("Trust"), not against the operator's code.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kit import Cluster, wait_until
from test_strata import (  # noqa: F401 - module fixtures used by the tests below
    Obj,
    _finished,
    _reader_pod,
    dataset,
    ready_cluster,
    s3,
    s3_mount,
    strata,
)

MOUNTED_TIMEOUT = 120.0


@pytest.fixture
def guest(cluster: Cluster) -> Iterator[str]:
    """A second fresh namespace: the one that asks for another namespace's Mount."""
    name = f"guest-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "strata.dev/e2e=true")
    wait_until(lambda: cluster.get_or_none("serviceaccount", "default", name), timeout=30,
               what=f"the default ServiceAccount in {name}")
    yield name
    if not os.environ.get("STRATA_E2E_KEEP"):
        cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def _mounted(cluster: Cluster, namespace: str, name: str = "data") -> None:
    wait_until(lambda: cluster.get("mount", name, namespace).get("status", {}).get("phase") == "Mounted",
               timeout=MOUNTED_TIMEOUT, what=f"Mount {name} phase Mounted",
               diagnose=lambda: json.dumps(cluster.get("mount", name, namespace).get("status"), indent=1))


def _foreign_reader(name: str, owner: str, paths: list[str]) -> Obj:
    """A reader pod whose volume names the Mount `data` of namespace `owner`."""
    pod = _reader_pod(name, paths)
    pod["spec"]["volumes"][0]["csi"]["volumeAttributes"] = {"mount": "data", "namespace": owner}
    return pod


def _mount_events(cluster: Cluster, namespace: str, pod: str) -> list[str]:
    events = cluster.items("events", namespace)
    return [e.get("message", "") for e in events
            if e.get("involvedObject", {}).get("name") == pod and e.get("reason") == "FailedMount"]


def test_a_mount_is_used_from_another_namespace_only_when_granted(
    strata: Cluster, namespace: str, guest: str, s3: dict[str, str], dataset: dict[str, bytes]
) -> None:
    ready_cluster(strata, namespace)
    strata.apply(s3_mount(s3), namespace)
    _mounted(strata, namespace)

    # Not granted: the volume is refused, and the pod's events say what to do.
    strata.apply(_foreign_reader("refused", namespace, sorted(dataset)), guest)
    messages = wait_until(lambda: _mount_events(strata, guest, "refused"), timeout=120,
                          what="a FailedMount event on the refused pod",
                          diagnose=lambda: strata.describe_pods(guest))
    text = "\n".join(messages)
    assert f"Mount {namespace}/data may not be used from namespace {guest}" in text, text
    assert "spec.allowedNamespaces" in text, text
    pod = strata.get("pod", "refused", guest)
    assert pod["status"]["phase"] == "Pending", pod["status"]
    strata.kubectl("delete", "pod", "refused", "-n", guest, "--wait=false")

    # Granted by the owning namespace: the same volume shows the store's bytes.
    strata.kubectl("patch", "mounts.strata.dev", "data", "-n", namespace, "--type=merge",
                   "-p", json.dumps({"spec": {"allowedNamespaces": [guest]}}))
    strata.apply(_foreign_reader("granted", namespace, sorted(dataset)), guest)
    pod = _finished(strata, guest, "granted")
    out = json.loads(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    for key, body in dataset.items():
        assert out[key] == hashlib.sha256(body).hexdigest(), key


# -- least privilege -----------------------------------------------------------------------
OPERATOR = "system:serviceaccount:strata-system:strata-operator"
CSI_NODE = "system:serviceaccount:strata-system:strata-csi-node"


def _can(cluster: Cluster, who: str, *args: str) -> bool:
    proc = cluster.kubectl_result("auth", "can-i", *args, f"--as={who}")
    return proc.stdout.strip() == "yes"


def test_no_component_reads_an_unrelated_secret(strata: Cluster, guest: str) -> None:
    """A fresh namespace that granted nothing: neither the operator nor the CSI node plugin
    may read, list or change its Secrets (nor any namespace's, cluster-wide)."""
    strata.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "unrelated"},
                  "stringData": {"password": "hunter2"}}, guest)
    for who in (OPERATOR, CSI_NODE):
        for verb in ("get", "list", "watch", "patch", "create"):
            assert not _can(strata, who, verb, "secrets/unrelated" if verb in ("get", "patch") else "secrets",
                            "-n", guest), (who, verb)
            assert not _can(strata, who, verb, "secrets", "--all-namespaces"), (who, verb)
    # What they do need stays granted: the CSI tokens Secret of the release namespace.
    assert _can(strata, CSI_NODE, "get", "secrets/strata-csi-tokens", "-n", "strata-system")
    assert not _can(strata, CSI_NODE, "get", "secrets/strata-webhook-tls", "-n", "strata-system")


# -- the webhook's own key -------------------------------------------------------------------
def _webhook_tls(cluster: Cluster, namespace: str, release: str) -> Obj:
    return wait_until(lambda: cluster.get_or_none("secret", f"{release}-webhook-tls", namespace),
                      timeout=120, what=f"the webhook certificate Secret of release {release}",
                      diagnose=lambda: cluster.describe_pods(namespace))


def _trusted(cluster: Cluster, release: str, secret: Obj) -> bool:
    config = cluster.get("mutatingwebhookconfiguration", f"{release}-locality")
    return bool(config["webhooks"][0]["clientConfig"].get("caBundle") == secret["data"]["ca.crt"])


def _webhook_warnings(cluster: Cluster, namespace: str) -> str:
    """Admission warnings for a pod whose Strata volume names a Mount that does not exist
    (server-side dry run: the webhook is called, nothing is made)."""
    pod = _reader_pod("dry-run", ["README"])
    pod["spec"]["volumes"][0]["csi"]["volumeAttributes"] = {"mount": "nope"}
    proc = cluster.kubectl_result("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(pod))
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_each_install_makes_its_own_webhook_key_and_the_webhook_answers(
    strata: Cluster, namespace: str, chart_dir: Path
) -> None:
    secret = _webhook_tls(strata, "strata-system", "strata")
    wait_until(lambda: _trusted(strata, "strata", secret), timeout=60, what="the caBundle to trust the operator's CA")
    # The API server reaches the webhook over TLS with that CA: its warning comes back.
    text = wait_until(lambda: (w := _webhook_warnings(strata, namespace)) and "Mount " in w and w, timeout=60,
                      what="an admission warning from the locality webhook")
    assert f"Mount {namespace}/nope does not exist" in text, text

    # Another install (its own release and namespace, watching only that namespace): its own key.
    other = f"strata-two-{uuid.uuid4().hex[:4]}"
    extra = shlex.split(os.environ.get("STRATA_E2E_HELM_ARGS", "")) or list((strata.harness or {}).get("helm_args", []))
    try:
        strata.run("helm", "install", "strata-two", str(chart_dir), "-n", other, "--create-namespace",
                   "--set", "csi.enabled=false", "--set", "operator.replicas=1",
                   "--set", "operator.watchAllNamespaces=false", *extra, timeout=120)
        second = _webhook_tls(strata, other, "strata-two")
        wait_until(lambda: _trusted(strata, "strata-two", second), timeout=60,
                   what="the second install's caBundle to trust its CA")
        assert second["data"]["tls.key"] != secret["data"]["tls.key"]
        assert second["data"]["ca.crt"] != secret["data"]["ca.crt"]
    finally:
        strata.run("helm", "uninstall", "strata-two", "-n", other, "--wait", check=False, timeout=300)
        strata.kubectl("delete", "namespace", other, "--wait=false", "--ignore-not-found", check=False)


# -- the recorded grant table ------------------------------------------------------------------
# Grants a run may not exercise, and why: kopf posts an Event only when a handler warns; the
# webhook certificate is replaced (patched) only a month before it expires (both are in the
# unit tests' recorded table, tests/unit/chart/test_rbac.py).
# Grants a run of this module may not use: Events, the webhook certificate's renewal, and the
# pods a job holds until its data is warm (read and ungated by the operator only when a pod asks
# for it: tests/e2e/test_warm_gate.py uses them).
NOT_ALWAYS_EXERCISED = {("create", "", "events", ""), ("patch", "", "secrets", "strata-webhook-tls"),
                        ("get", "", "pods", ""), ("patch", "", "pods", "")}
Grant = tuple[str, str, str, str]  # verb, group, resource, resourceName ("" any)


@pytest.fixture(scope="module", autouse=True)
def module_started() -> datetime:
    """When this module began, before its release is installed (autouse: set up first): the
    audit log before that is of other modules, whose release's uninstall takes RBAC away
    under a still running operator."""
    return datetime.now(UTC)


def _audited(cluster: Cluster, since: datetime) -> list[Obj]:
    state = (cluster.harness or {}).get("state")
    if not state:
        pytest.skip("the API server's audit log is the harness' (logs/audit.log); none on this cluster")
    path = Path(str(state)) / "logs" / "audit.log"
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in events if datetime.fromisoformat(e["requestReceivedTimestamp"]) >= since]


def _used(events: list[Obj], user: str) -> set[Grant]:
    """What the account asked for: (verb, group, resource, name); an apply that created the
    object (201) was authorized as a create too."""
    used: set[Grant] = set()
    for event in events:
        # A watch is logged when its response starts (it completes when the watch ends).
        if event.get("user", {}).get("username") != user or event.get("stage") not in ("ResponseComplete",
                                                                                        "ResponseStarted"):
            continue
        ref = event.get("objectRef") or {}
        if not ref.get("resource"):
            continue  # discovery (/api, /apis): allowed to every authenticated user
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        verb, name = event["verb"], ref.get("name", "")
        used.add((verb, ref.get("apiGroup", ""), resource, name))
        if verb == "patch" and (event.get("responseStatus") or {}).get("code") == 201:
            used.add(("create", ref.get("apiGroup", ""), resource, name))
    return used


def _granted(cluster: Cluster, account: str) -> set[Grant]:
    """Every (verb, group, resource, resourceName) the chart's roles bound to the account give."""
    namespace, name = account.split(":")[2:]
    roles = {("ClusterRole", "", r["metadata"]["name"]): r for r in cluster.items("clusterroles")}
    roles |= {("Role", r["metadata"]["namespace"], r["metadata"]["name"]): r for r in cluster.items("roles")}
    out: set[Grant] = set()
    for binding in cluster.items("clusterrolebindings") + cluster.items("rolebindings"):
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == name and s.get("namespace") == namespace
                   for s in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        role = roles[(ref["kind"], binding["metadata"].get("namespace", "") if ref["kind"] == "Role" else "", ref["name"])]
        for rule in role.get("rules") or []:
            for verb in rule["verbs"]:
                for group in rule.get("apiGroups", []):
                    for resource in rule.get("resources", []):
                        out |= {(verb, group, resource, n) for n in rule.get("resourceNames") or [""]}
    return out


def _gone_or_going(cluster: Cluster, namespace: str) -> bool:
    found = cluster.get_or_none("namespace", namespace)
    return found is None or found.get("status", {}).get("phase") == "Terminating"


def _covers(grant: Grant, request: Grant) -> bool:
    return grant[:3] == request[:3] and grant[3] in ("", request[3])


def test_the_chart_grants_exactly_what_the_components_asked_for(strata: Cluster, module_started: datetime) -> None:
    """From the API server's audit log of this module's run (a cluster, a Mount, pods reading
    it from two namespaces, the webhook, a second install): every request of the operator
    and the CSI node plugin was allowed, and every grant the chart gives them was used."""
    events = _audited(strata, module_started)
    refused = [e for e in events if (e.get("responseStatus") or {}).get("code") == 403
               and e["user"]["username"] in (OPERATOR, CSI_NODE)]
    # The log spans the whole run: in a namespace deleted since (by a test's teardown), the
    # deletion itself takes the operator's grant away and refuses new objects (Events), which
    # the operator's finalizers expect (see test_strata's namespace deletion test).
    deleted = {ns for ns in {(e.get("objectRef") or {}).get("namespace") for e in refused} - {None}
               if _gone_or_going(strata, ns)}
    refused = [(e["user"]["username"], e["verb"], e.get("requestURI")) for e in refused
               if (e.get("objectRef") or {}).get("namespace") not in deleted]
    assert not refused, refused
    table = []
    for account in (OPERATOR, CSI_NODE):
        used, granted = _used(events, account), _granted(strata, account)
        unused = sorted(g for g in granted - NOT_ALWAYS_EXERCISED
                        if not any(_covers(g, u) for u in used)
                        # a named grant is used by a request for that name
                        and not (g[3] and g[:3] + (g[3],) in used))
        table += [f"{account.split(':')[-1]:16} {g[0]:6} {g[1] or 'core':28} {g[2]:32} {g[3] or '*':24} "
                  f"{'used' if any(_covers(g, u) for u in used) else 'not exercised'}" for g in sorted(granted)]
        assert not unused, f"{account} is granted {unused}, which it never asked for"
    print("\nrecorded API grant table (account, verb, group, resource, name, use):\n" + "\n".join(table))
