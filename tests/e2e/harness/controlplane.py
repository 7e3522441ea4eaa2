"""etcd, kube-apiserver, kube-controller-manager and kube-scheduler as local
processes, with certificates, kubeconfigs and a /readyz wait."""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import binaries
from harness.kubeconfig import write_kubeconfig
from harness.pki import Pki, make_pki
from harness.processes import free_port, spawn, stop, tail, wait_for

READY_TIMEOUT = 60.0
# The namespace whose ServiceAccounts' requests the API server audits (the chart's release).
AUDITED_NAMESPACE = "strata-system"


@dataclass
class ControlPlane:
    """A single-node Kubernetes control plane in `state`.

    `bind_ip` is where the API server listens: the pod bridge's address, so the
    test process, the nodes' and the pods' namespaces all reach it.
    """

    state: Path
    bind_ip: str = "127.0.0.1"
    service_cidr: str = "10.96.0.0/16"
    kubernetes_service_ip: str = "10.96.0.1"
    nodes: tuple[str, ...] = ()  # names of the kubelets to issue client certificates for
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    pki: Pki | None = None
    port: int = 0
    kubeconfig: Path = Path()

    @property
    def server(self) -> str:
        return f"https://{self.bind_ip}:{self.port}"

    def log(self, name: str) -> Path:
        return self.state / "logs" / f"{name}.log"

    def start(self) -> None:
        """Start all four components; return once /readyz says ok."""
        missing = binaries.missing()
        if missing:
            raise FileNotFoundError(
                f"control-plane binaries not built: {', '.join(missing)} (looked in "
                f"{binaries.bin_dir()}); run {binaries.BUILD_SCRIPT}"
            )
        self.state.mkdir(parents=True, exist_ok=True)
        pki = self.pki = make_pki(
            self.state / "pki",
            apiserver_ips=(self.bind_ip, "127.0.0.1", self.kubernetes_service_ip),
            nodes=self.nodes,
        )
        self.port = free_port(self.bind_ip)
        self.kubeconfig = write_kubeconfig(
            self.state / "kubeconfig", server=self.server, ca=pki.ca.cert, user=pki.admin, name="admin"
        )
        self._start_etcd()
        self._start_apiserver()
        self.wait_ready()
        kcm = write_kubeconfig(
            self.state / "controller-manager.kubeconfig", server=self.server, ca=pki.ca.cert,
            user=pki.controller_manager, name="system:kube-controller-manager",
        )
        sched = write_kubeconfig(
            self.state / "scheduler.kubeconfig", server=self.server, ca=pki.ca.cert,
            user=pki.scheduler, name="system:kube-scheduler",
        )
        self.procs["kube-controller-manager"] = spawn(
            [
                str(binaries.require("kube-controller-manager")),
                f"--kubeconfig={kcm}",
                f"--authentication-kubeconfig={kcm}",
                f"--authorization-kubeconfig={kcm}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.sa_private}",
                f"--root-ca-file={pki.ca.cert}",
                f"--cluster-signing-cert-file={pki.ca.cert}",
                f"--cluster-signing-key-file={pki.ca.key}",
                f"--service-cluster-ip-range={self.service_cidr}",
                "--controllers=*",
                # Pods of a node whose agent stopped are evicted within a minute.
                "--node-monitor-grace-period=40s",
                "--concurrent-statefulset-syncs=5",
                "--v=1",
            ],
            self.log("kube-controller-manager"),
        )
        self.procs["kube-scheduler"] = spawn(
            [
                str(binaries.require("kube-scheduler")),
                f"--kubeconfig={sched}",
                f"--authentication-kubeconfig={sched}",
                f"--authorization-kubeconfig={sched}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--leader-elect=false",
                "--v=1",
            ],
            self.log("kube-scheduler"),
        )

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self.procs["etcd"] = spawn(
            [
                str(binaries.require("etcd")),
                "--name=e2e",
                f"--data-dir={self.state / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=e2e=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",  # throwaway data: fsync only slows tests
                "--log-level=warn",
            ],
            self.log("etcd"),
        )

    def _audit_policy(self) -> Path:
        """Every request of the ServiceAccounts in AUDITED_NAMESPACE (the chart's operator and
        CSI node plugin), at Metadata level (who, verb, resource, name; no bodies): the API
        calls the tests compare with the chart's RBAC. Nothing else is logged."""
        path = self.state / "audit-policy.yaml"
        path.write_text(json.dumps({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata", "userGroups": [f"system:serviceaccounts:{AUDITED_NAMESPACE}"]},
                      {"level": "None"}],
        }))
        return path

    def _start_apiserver(self) -> None:
        pki = self.pki
        assert pki is not None
        self.procs["kube-apiserver"] = spawn(
            [
                str(binaries.require("kube-apiserver")),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={self.bind_ip}",
                f"--advertise-address={self.bind_ip}",
                f"--secure-port={self.port}",
                f"--tls-cert-file={pki.apiserver.cert}",
                f"--tls-private-key-file={pki.apiserver.key}",
                f"--client-ca-file={pki.ca.cert}",
                f"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_public}",
                f"--service-account-signing-key-file={pki.sa_private}",
                f"--service-cluster-ip-range={self.service_cidr}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",  # on top of the defaults (webhooks included)
                "--allow-privileged=true",
                # Webhooks and aggregated APIs are called at endpoint (pod) IPs,
                # which the API server reaches over the bridge; ClusterIPs need
                # the agent's proxy, which the API server does not need then.
                "--enable-aggregator-routing=true",
                # `kubectl logs/exec` go to a kubelet at its node's InternalIP (node
                # names resolve nowhere), as this client.
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--kubelet-client-certificate={pki.kubelet_client.cert}",
                f"--kubelet-client-key={pki.kubelet_client.key}",
                "--profiling=false",
                f"--audit-policy-file={self._audit_policy()}",
                f"--audit-log-path={self.log('audit')}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",  # a request is in the file once answered
                "--v=1",
            ],
            self.log("kube-apiserver"),
        )

    def ssl_context(self) -> ssl.SSLContext:
        pki = self.pki
        assert pki is not None
        ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
        ctx.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))
        return ctx

    def get(self, path: str) -> tuple[int, str]:
        """An admin GET against the API server: (status, body)."""
        conn = http.client.HTTPSConnection(self.bind_ip, self.port, context=self.ssl_context(), timeout=5)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode(errors="replace")
        finally:
            conn.close()

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        def ready() -> bool:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode} during startup:\n{tail(self.log(name))}"
                    )
            status, body = self.get("/readyz")
            return status == 200 and body.strip() == "ok"

        started = time.monotonic()
        wait_for(
            ready, timeout=timeout, what=f"kube-apiserver /readyz at {self.server}",
            interval=0.2, diagnose=lambda: tail(self.log("kube-apiserver")),
        )
        self.ready_seconds = time.monotonic() - started

    def check_alive(self) -> list[str]:
        """Names of components that have exited."""
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def stop(self) -> None:
        """Stop in reverse start order; never raises."""
        for name in reversed(list(self.procs)):
            stop(self.procs[name], grace=5.0)
        self.procs.clear()
