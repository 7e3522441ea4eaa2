"""The locality webhook as the API server calls it: an AdmissionReview over HTTPS to kopf's
webhook server at /locality (the chart's path), answered by the registered handler with a
JSON patch, and the operator's /metrics. The Mounts and CacheClusters come from an
in-memory API stand-in (tests/unit/operator/conftest.py)."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import functools
import json
import socket
import ssl
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonpatch
import kopf
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kopf._cogs.structs import references  # the webhook plumbing kopf.operator() sets up
from kopf._core.engines import admission as kopf_admission
from kopf._core.engines import indexing
from kopf._core.reactor import inventory

from strata.operator.handlers import register
from strata.operator.handlers.admission import HANDLER_ID, webhook_server
from strata.operator.kube import KubeError, Obj
from strata.operator.locality import APPLIED_ANNOTATION
from strata.operator.warmup import WARM_GATE
from strata.operator.master import Masters
from strata.operator.reconcile import Deps
from strata.operator.settings import MetricsSettings, OperatorSettings, WebhookSettings
from tests.unit.operator.conftest import FakeKube, cluster_body, mount_body

PODS = references.Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True,
                           verbs=["create", "get"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tls.crt / tls.key for 127.0.0.1 signed by a CA (ca.crt), as the chart's Secret holds."""
    folder = tmp_path_factory.mktemp("webhook-tls")
    now = dt.datetime.now(dt.UTC)

    def cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, signer: ec.EllipticCurvePrivateKey,
             ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            import ipaddress
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert("strata-webhook-ca", ca_key, "strata-webhook-ca", ca_key, ca=True)
    (folder / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "tls.crt").write_bytes(
        cert("strata-webhook", key, "strata-webhook-ca", ca_key, ca=False).public_bytes(serialization.Encoding.PEM))
    (folder / "tls.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return folder


class SlowKube(FakeKube):
    """An API server that takes longer than the webhook may wait."""

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        await asyncio.sleep(5)
        return None


class RefusingKube(FakeKube):
    def __init__(self, status: int) -> None:
        super().__init__()
        self.status = status
        self.gets = 0

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        self.gets += 1
        raise KubeError(self.status, f"refused with {self.status}")


def data_world() -> FakeKube:
    """Namespace ns: CacheCluster demo; Mount data with blocks on n1 (3Gi) and n2 (1Gi)."""
    kube = FakeKube()
    kube.put(cluster_body())
    m = kube.put(mount_body("data"))
    m["status"] = {"phase": "Mounted", "cache": {"nodes": [{"node": "n1", "bytes": "3Gi"},
                                                           {"node": "n2", "bytes": "1Gi"}]}}
    return kube


def strata_pod(mount: str = "data", annotations: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "reader-", "namespace": "ns", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "app", "image": "busybox"}],
                 "volumes": [{"name": "data", "csi": {"driver": "csi.strata.dev",
                                                      "volumeAttributes": {"mount": mount}}}]},
    }


def plain_pod() -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"containers": [{"name": "app", "image": "nginx"}], "volumes": [{"name": "t", "emptyDir": {}}]}}


def review_request(pod: Obj, operation: str = "CREATE") -> Obj:
    return {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "0d4c-review", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ns", "operation": operation, "userInfo": {"username": "system:serviceaccount:ns:rs"},
            "object": pod, "oldObject": None, "dryRun": False,
        },
    }


class Webhook:
    """The operator's registry behind kopf's own admission entry point."""

    def __init__(self, kube: FakeKube, settings: WebhookSettings, metrics: MetricsSettings | None = None) -> None:
        self.registry = kopf.OperatorRegistry()
        register(self.registry, OperatorSettings(), settings, metrics or MetricsSettings())
        insights = references.Insights()
        insights.webhook_resources.add(PODS)
        deps = Deps(kube=kube, masters=Masters(timeout=1, report_ttl=0), settings=OperatorSettings())
        self.fn = functools.partial(
            kopf_admission.serve_admission_request, settings=kopf.OperatorSettings(), registry=self.registry,
            insights=insights, memories=inventory.ResourceMemories(), memobase=kopf.Memo(deps=deps),
            indices=indexing.OperatorIndexers().indices)

    async def admit(self, pod: Obj, operation: str = "CREATE") -> Obj:
        response: Obj = await self.fn(review_request(pod, operation), webhook=HANDLER_ID)
        return dict(response["response"])


def patched(pod: Obj, response: Obj) -> Obj:
    """The pod as the API server stores it after applying the webhook's JSON patch."""
    if "patch" not in response:
        return pod
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    return dict(jsonpatch.apply_patch(pod, ops))


@pytest.fixture
def settings(certs: Path) -> WebhookSettings:
    return WebhookSettings(enabled=True, port=free_port(), cert_dir=certs, lookup_timeout=0.5)


# -- registration ------------------------------------------------------------------------

def test_the_handler_is_registered_for_pod_creation_only_when_enabled(settings: WebhookSettings) -> None:
    on = Webhook(FakeKube(), settings).registry._webhooks.get_all_handlers()
    (handler,) = on
    assert handler.id == HANDLER_ID == "locality"  # kopf serves /locality: the chart's path
    assert handler.selector is not None and handler.selector.any_name == "pods"
    assert list(handler.operations or []) == ["CREATE"]
    off = Webhook(FakeKube(), WebhookSettings(enabled=False)).registry._webhooks.get_all_handlers()
    assert list(off) == []


def test_the_server_needs_the_certificate(settings: WebhookSettings, tmp_path: Path) -> None:
    server = webhook_server(settings)
    assert server.port == settings.port
    assert server.certfile == str(settings.cert_dir / "tls.crt")
    assert server.pkeyfile == str(settings.cert_dir / "tls.key")
    with pytest.raises(kopf.PermanentError, match=r"tls.crt is missing.*STRATA_OPERATOR_WEBHOOK_ENABLED=false"):
        webhook_server(WebhookSettings(enabled=True, cert_dir=tmp_path))


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_OPERATOR_WEBHOOK_ENABLED", "true")
    monkeypatch.setenv("STRATA_OPERATOR_WEBHOOK_PORT", "10250")
    monkeypatch.setenv("STRATA_OPERATOR_WEBHOOK_CERT_DIR", "/tls")
    monkeypatch.setenv("STRATA_OPERATOR_METRICS_PORT", "8081")
    settings = WebhookSettings()
    assert (settings.enabled, settings.port, settings.cert_dir) == (True, 10250, Path("/tls"))
    assert MetricsSettings().port == 8081


# -- admission ---------------------------------------------------------------------------

async def test_a_strata_pod_gets_affinity_to_its_data(settings: WebhookSettings) -> None:
    pod = strata_pod()
    response = await Webhook(data_world(), settings).admit(pod)
    assert response["allowed"] is True and response["uid"] == "0d4c-review"
    after = patched(pod, response)
    assert after["metadata"]["annotations"][APPLIED_ANNOTATION] == "Preferred"
    prefs = after["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [(t["preference"]["matchExpressions"][0]["values"], t["weight"]) for t in prefs] == [
        (["n1"], 100), (["n2"], 33)]
    assert after["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert after["spec"]["containers"] == pod["spec"]["containers"]


async def test_required_cluster_gives_a_hard_requirement(settings: WebhookSettings) -> None:
    kube = data_world()
    kube.obj("CacheCluster", "demo")["spec"]["locality"] = "Required"
    pod = strata_pod()
    after = patched(pod, await Webhook(kube, settings).admit(pod))
    terms = after["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1", "n2"]}]}]}
    assert after["metadata"]["annotations"][APPLIED_ANNOTATION] == "Required"


async def test_a_pod_without_strata_volumes_is_never_touched(settings: WebhookSettings) -> None:
    kube = RefusingKube(500)
    response = await Webhook(kube, settings).admit(plain_pod())
    assert response["allowed"] is True
    assert "patch" not in response and "warnings" not in response
    assert kube.gets == 0  # not even an API read


@pytest.mark.parametrize("kube", [RefusingKube(500), SlowKube()], ids=["api-error", "api-too-slow"])
async def test_a_failing_lookup_admits_the_pod_unchanged(settings: WebhookSettings, kube: FakeKube) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await Webhook(kube, settings).admit(strata_pod())
    assert response["allowed"] is True and "patch" not in response and "status" not in response
    assert loop.time() - started < 2  # the lookup budget (0.5 s), not the API server's pace


async def test_a_mount_the_operator_may_not_read_is_a_warning(settings: WebhookSettings) -> None:
    response = await Webhook(RefusingKube(403), settings).admit(strata_pod())
    assert response["allowed"] is True and "patch" not in response
    assert response["warnings"] == ["Mount ns/data does not exist: no locality for its volume"]


async def test_missing_mount_and_disabled_cluster_change_nothing(settings: WebhookSettings) -> None:
    kube = data_world()
    webhook = Webhook(kube, settings)
    response = await webhook.admit(strata_pod("nope"))
    assert "patch" not in response and response["warnings"] == [
        "Mount ns/nope does not exist: no locality for its volume"]
    kube.obj("CacheCluster", "demo")["spec"]["locality"] = "Disabled"
    response = await webhook.admit(strata_pod())
    assert response["allowed"] is True and "patch" not in response


async def test_the_pod_annotation_asks_for_required(settings: WebhookSettings) -> None:
    pod = strata_pod(annotations={"strata.dev/locality": "required"})
    after = patched(pod, await Webhook(data_world(), settings).admit(pod))
    assert "requiredDuringSchedulingIgnoredDuringExecution" in after["spec"]["affinity"]["nodeAffinity"]


async def test_updates_are_not_reviewed(settings: WebhookSettings) -> None:
    response = await Webhook(data_world(), settings).admit(strata_pod(), operation="UPDATE")
    assert response["allowed"] is True and "patch" not in response


# -- over HTTPS, as the API server calls it ----------------------------------------------------------

@pytest.fixture
async def served(settings: WebhookSettings) -> AsyncIterator[Webhook]:
    webhook = Webhook(data_world(), settings)
    server = webhook_server(settings)
    configs = server(webhook.fn).__aiter__()
    await configs.__anext__()  # listening
    try:
        yield webhook
    finally:
        await configs.aclose()  # type: ignore[attr-defined]


def post(url: str, body: Obj, cafile: Path) -> Obj:
    context = ssl.create_default_context(cafile=str(cafile))
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=10) as reply:
        return dict(json.loads(reply.read()))


async def test_the_api_server_path_over_tls(served: Webhook, settings: WebhookSettings) -> None:
    pod = strata_pod()
    url = f"https://127.0.0.1:{settings.port}/{HANDLER_ID}"
    answer = await asyncio.to_thread(post, url, review_request(pod), settings.cert_dir / "ca.crt")
    assert answer["kind"] == "AdmissionReview" and answer["response"]["allowed"] is True
    after = patched(pod, answer["response"])
    assert after["metadata"]["annotations"][APPLIED_ANNOTATION] == "Preferred"


# -- metrics -------------------------------------------------------------------------------------

async def test_metrics_count_reviews(settings: WebhookSettings) -> None:
    port = free_port()
    webhook = Webhook(data_world(), settings, MetricsSettings(port=port, bind="127.0.0.1"))
    servers = {str(h.activity).rsplit(".", 1)[-1].lower(): h for h in webhook.registry._activities.get_all_handlers()
               if h.id == "metrics-server"}
    await servers["startup"].fn()
    try:
        await webhook.admit(strata_pod())
        await webhook.admit(plain_pod())
        url = f"http://127.0.0.1:{port}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
    finally:
        await servers["cleanup"].fn()
    assert 'strata_operator_locality_reviews_total{result="placed"} 1.0' in text
    assert 'strata_operator_locality_reviews_total{result="skipped"} 1.0' in text
    assert "strata_operator_locality_review_seconds_count 1.0" in text
    assert "python_info" in text


def warm_strata_pod(**attributes: str) -> Obj:
    pod = strata_pod()
    pod["spec"]["volumes"][0]["csi"]["volumeAttributes"].update(attributes)
    return pod


async def test_a_volume_asking_to_start_warm_gets_the_gate_whatever_the_lookup(settings: WebhookSettings) -> None:
    pod = warm_strata_pod(warmPercent="90")
    after = patched(pod, await Webhook(data_world(), settings).admit(pod))
    assert after["spec"]["schedulingGates"] == [{"name": WARM_GATE}]
    assert after["spec"]["affinity"]["nodeAffinity"]  # placed as before
    for kube in (RefusingKube(500), RefusingKube(403)):
        response = await Webhook(kube, settings).admit(pod)
        assert response["allowed"] is True
        assert patched(pod, response)["spec"]["schedulingGates"] == [{"name": WARM_GATE}]
    assert "schedulingGates" not in patched(strata_pod(), await Webhook(data_world(), settings).admit(strata_pod()))["spec"]


async def test_an_unreadable_warm_percentage_is_a_warning_and_no_gate(settings: WebhookSettings) -> None:
    pod = warm_strata_pod(warmPercent="most")
    response = await Webhook(data_world(), settings).admit(pod)
    assert "schedulingGates" not in patched(pod, response)["spec"]
    assert response["warnings"] == ["volume 'data': warmPercent 'most' is not a number; write e.g. \"90\"; it does "
                                    "not hold the pod until warm"]
