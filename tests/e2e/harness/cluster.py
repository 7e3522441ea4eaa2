"""The test cluster:  a control plane, N nodes (tests/e2e/harness/node.py),
kube-proxy and CoreDNS, with the images of tests/e2e/images/build.sh in every node's
containerd.

Addresses (defaults; STRATA_E2E_K_CIDR and STRATA_E2E_K_SERVICE_CIDR move them):
  10.250.0.1       the API server (and moto in the tests), on the link strata-k0 (a bridge without ports)
  10.250.0.11+i    node i's InternalIP (kubelet), on strata-k0 too
  10.250.(i+1)/24  pods of node i, on its bridge strata-kb<i+1> (made by the CNI plugin)
  10.97.0.0/16     Service ClusterIPs (kube-proxy, nftables mode); 10.97.0.10 is DNS
Pods route only the pod range and the Service range to their bridge: nothing they send
leaves the machine. Everything runs as processes of this harness, and everything it changed
on the host is undone on exit (harness/hostside.py), also after a killed run, at the next
start.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness import addons, binaries, chart, imagestore
from harness.controlplane import ControlPlane
from harness.hostside import LINK_PREFIX, HostSide
from harness.kubeconfig import write_kubeconfig
from harness.node import Node, private_ns_dir, wait_nodes_ready
from harness.processes import take_lock, free_port, spawn, stop, tail, wait_for

LOCK = Path("/run/lock/strata-e2e-kubelet.lock")
DUMMY = f"{LINK_PREFIX}0"
ZONES = ("zone-a", "zone-b", "zone-c")
NODE_BINARIES = ("kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "ctr", "kubectl")
IMAGES = ("base", "server", "operator", "pause", "coredns", "csi-registrar")
IMAGES_SCRIPT = Path(__file__).resolve().parents[1] / "images" / "build.sh"


def images_dir() -> Path:
    env = os.environ.get("STRATA_E2E_IMAGES")
    return Path(env) if env else Path.home() / ".cache" / "strata" / "e2e-images"


def image_archives() -> list[Path]:
    """The newest archive of each image; FileNotFoundError naming what is missing."""
    found, missing = [], []
    for name in IMAGES:
        candidates = sorted(images_dir().glob(f"{name}-*.tar"), key=lambda p: p.stat().st_mtime)
        if candidates:
            found.append(candidates[-1])
        else:
            missing.append(name)
    if missing:
        raise FileNotFoundError(f"images not built: {', '.join(missing)} (in {images_dir()}): run {IMAGES_SCRIPT}")
    return found


@dataclass
class Cluster:
    state: Path
    nodes: int = 3
    keep_state: bool = False
    cidr: ipaddress.IPv4Network = field(
        default_factory=lambda: ipaddress.IPv4Network(os.environ.get("STRATA_E2E_K_CIDR", "10.250.0.0/16")))
    service_cidr: ipaddress.IPv4Network = field(
        default_factory=lambda: ipaddress.IPv4Network(os.environ.get("STRATA_E2E_K_SERVICE_CIDR", "10.97.0.0/16")))
    control_plane: ControlPlane | None = None
    members: list[Node] = field(default_factory=list)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    host: HostSide | None = None
    timings: dict[str, float] = field(default_factory=dict)
    _lock_fd: int | None = None
    _template: Path = Path()

    @property
    def api_ip(self) -> str:
        return str(self.cidr.network_address + 1)

    @property
    def kubernetes_service_ip(self) -> str:
        return str(self.service_cidr.network_address + 1)

    @property
    def dns_ip(self) -> str:
        return str(self.service_cidr.network_address + 10)

    @property
    def kubeconfig(self) -> Path:
        assert self.control_plane is not None
        return self.control_plane.kubeconfig

    def kubectl(self) -> list[str]:
        return [str(binaries.require("kubectl")), f"--kubeconfig={self.kubeconfig}"]

    def _mark(self, name: str, t0: float) -> None:
        self.timings[name] = round(time.monotonic() - t0, 2)

    # -- up -----------------------------------------------------------------------------
    def up(self) -> None:
        """Start everything; on any failure undo what was started and raise."""
        t0 = time.monotonic()
        missing = binaries.missing(binaries.CONTROL_PLANE + NODE_BINARIES)
        if missing:
            raise FileNotFoundError(f"not built: {', '.join(missing)} (in {binaries.bin_dir()}): run {binaries.BUILD_SCRIPT}")
        archives = image_archives()
        self._take_lock()
        try:
            self.state = self.state.resolve()
            self.state.mkdir(parents=True, exist_ok=True)
            self.host = HostSide(self.state)
            self.host.take()
            self._mark("host_recorded", t0)
            self._template, made = imagestore.template(archives)
            self.timings["images_template_made"] = round(made, 2)
            self._mark("images_ready", t0)
            names = [f"node-{i + 1}" for i in range(self.nodes)]
            self._network(names)
            cp = self.control_plane = ControlPlane(
                self.state, bind_ip=self.api_ip, service_cidr=str(self.service_cidr),
                kubernetes_service_ip=self.kubernetes_service_ip, nodes=tuple(names),
            )
            cp.start()
            self._mark("apiserver_ready", t0)
            assert cp.pki is not None
            routes = (str(self.cidr), str(self.service_cidr))
            for i, name in enumerate(names):
                subnet = list(self.cidr.subnets(new_prefix=24))[i + 1]
                self.members.append(Node(
                    name=name, index=i, zone=ZONES[i % len(ZONES)], ip=self._node_ip(i),
                    pod_cidr=str(subnet), gateway=str(subnet.network_address + 1), bridge=f"{LINK_PREFIX}b{i + 1}",
                    root=self.state / "nodes" / name, server=cp.server, ca=cp.pki.ca.cert,
                    cert=cp.pki.nodes[name], cluster_dns=self.dns_ip, routes=routes,
                ))
            private_ns_dir()
            for node in self.members:
                node.make_mount_namespace()
            # Copies in threads; processes only from this thread: a child's parent-death
            # signal fires when the *thread* that started it ends.
            with ThreadPoolExecutor(max_workers=len(self.members)) as pool:
                list(pool.map(lambda n: imagestore.copy_root(self._template, n.containerd_root), self.members))
            self._mark("node_images_copied", t0)
            for node in self.members:
                node.start_containerd()
            for node in self.members:
                node.wait_containerd()
                node.start_kubelet()
            self._mark("nodes_started", t0)
            self._start_kube_proxy()
            wait_nodes_ready(self.kubectl(), names, timeout=120, diagnose=self._diagnose_nodes)
            self._mark("nodes_ready", t0)
            self._apply(addons.storage(names, self.state / "volumes") + addons.coredns(self.dns_ip))
            self._wait_dns()
            wait_for(lambda: self._kubectl_ok("get", "serviceaccount", "default", "-n", "default"),
                     timeout=60, what="the default ServiceAccount")
            self._mark("ready", t0)
        except BaseException:
            self.down()
            raise

    def _node_ip(self, index: int) -> str:
        return str(self.cidr.network_address + 11 + index)

    def _network(self, names: list[str]) -> None:
        """A link holding the API server's and the nodes' addresses (bridges for pods come
        from the CNI plugin with each node's first pod). A bridge without ports, as this
        kernel may have no dummy driver."""
        cmds = [["ip", "link", "add", DUMMY, "type", "bridge"],
                ["ip", "addr", "add", f"{self.api_ip}/32", "dev", DUMMY]]
        cmds += [["ip", "addr", "add", f"{self._node_ip(i)}/32", "dev", DUMMY] for i in range(len(names))]
        cmds.append(["ip", "link", "set", DUMMY, "up"])
        for argv in cmds:
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"`{' '.join(argv)}` failed: {proc.stderr.strip()}")

    def _start_kube_proxy(self) -> None:
        cp = self.control_plane
        assert cp is not None and cp.pki is not None
        kubeconfig = write_kubeconfig(self.state / "kube-proxy.kubeconfig", server=cp.server, ca=cp.pki.ca.cert,
                                      user=cp.pki.kube_proxy, name="system:kube-proxy")
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "nftables",
            "clusterCIDR": str(self.cidr),
            # One kube-proxy for all nodes: they share this machine's network namespace.
            "hostnameOverride": self.members[0].name,
            "bindAddress": "127.0.0.1",
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "nodePortAddresses": [f"{self.api_ip}/32"],
            # Pods of one node share a bridge: without br_netfilter a reply to a pod on the
            # same bridge would skip the host's conntrack, so masquerade Service traffic.
            "nftables": {"masqueradeAll": True, "syncPeriod": "30s", "minSyncPeriod": "0s"},
            # Leave the host's conntrack settings alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s",
                          "udpTimeout": "0s", "udpStreamTimeout": "0s"},
        }
        path = self.state / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self.procs["kube-proxy"] = spawn([str(binaries.require("kube-proxy")), f"--config={path}", "--v=1"],
                                         self.state / "logs" / "kube-proxy.log")

    def _apply(self, objects: list[dict[str, Any]]) -> None:
        proc = subprocess.run([*self.kubectl(), "apply", "--server-side", "-f", "-"],
                              input=yaml.safe_dump_all(objects), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl apply failed: {proc.stderr.strip()}")

    def _kubectl_ok(self, *args: str) -> bool:
        return subprocess.run([*self.kubectl(), *args], capture_output=True).returncode == 0

    def _wait_dns(self) -> None:
        wait_for(lambda: self._kubectl_ok("rollout", "status", "deployment/coredns", "-n", "kube-system", "--timeout=5s"),
                 timeout=120, what="CoreDNS to be ready",
                 diagnose=lambda: subprocess.run([*self.kubectl(), "describe", "pods", "-n", "kube-system"],
                                                 capture_output=True, text=True).stdout[-3000:])

    def _diagnose_nodes(self) -> str:
        return "\n".join(f"{n.name} kubelet:\n{tail(n.log('kubelet'))}\n{n.name} containerd:\n{tail(n.log('containerd'))}"
                         for n in self.members)

    # -- down ---------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Stop everything and undo what it changed on the host; never raises."""
        notes: list[str] = []
        for name in reversed(list(self.procs)):
            stop(self.procs.pop(name), grace=5.0)
        for node in self.members:
            node.stop()
        if self.control_plane is not None:
            self.control_plane.stop()
        if self.host is not None:
            notes = self.host.restore(keep_state=self.keep_state)
            self.host = None
        self._release_lock()
        return notes

    def check_alive(self) -> list[str]:
        dead = [n for n, p in self.procs.items() if p.poll() is not None]
        for node in self.members:
            dead += node.check_alive()
        if self.control_plane is not None:
            dead += self.control_plane.check_alive()
        return dead

    def _take_lock(self) -> None:
        self._lock_fd = take_lock(LOCK, "the cluster's links, cgroups and folders")

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def describe(self) -> dict[str, Any]:
        cp = self.control_plane
        assert cp is not None
        return {
            "kind": "kubelet",
            "kubeconfig": str(cp.kubeconfig),
            "server": cp.server,
            "state": str(self.state),
            "nodes": {n.name: {"ip": n.ip, "zone": n.zone, "root": str(n.root), "pod_cidr": n.pod_cidr,
                               "mount_ns": str(n.mount_ns), "logs": str(n.root / "logs"),
                               "kubelet_dir": str(n.root / "kubelet")} for n in self.members},
            "pod_cidr": str(self.cidr),
            "service_cidr": str(self.service_cidr),
            "logs": str(self.state / "logs"),
            # The chart with the images every node has (imported, never pulled).
            "helm_args": list(chart.LOCAL_IMAGE_VALUES),
            "timings": self.timings,
            "pid": os.getpid(),
        }


def default_state() -> Path:
    env = os.environ.get("STRATA_E2E_STATE")
    return Path(env) if env else Path(tempfile.mkdtemp(prefix="strata-e2e-"))
