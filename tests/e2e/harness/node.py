"""One node of the kubelet cluster: a real kubelet with its own containerd.

Three nodes share this machine, so each runs in a mount namespace of its own in which
/var/lib/kubelet, /var/log/pods, /var/lib/cni, /run/containerd, /run/netns ... are bind
mounts of the node's folders: every node sees the one layout kubelet, containerd, the CNI
plugins and the chart (one `csi.kubeletDir` for all nodes) expect, and nothing a node
mounts (emptyDirs, secrets, CSI volumes under Bidirectional propagation) leaks to the host
or another node. The namespace follows the host's mounts (slave), so host paths given to
pods (hostPath volumes) are the host's. Each node has its own CNI bridge and pod range, its
own cgroup root (/strata-e2e-k/<node>) and kubelet port; all share the host's network
namespace, where one kube-proxy serves them.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness import binaries
from harness.hostside import CGROUP_ROOT, RUN, make_cgroup
from harness.kubeconfig import write_kubeconfig
from harness.pki import KeyPair
from harness.processes import free_port, spawn, stop, tail, wait_for

CNI_BIN = "/usr/lib/cni"
RUNC = "/usr/sbin/runc"
SANDBOX_IMAGE = "localhost/pause:e2e"
NS_DIR = RUN / "ns"


def _run(argv: list[str], what: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: `{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def private_ns_dir() -> None:
    """RUN/ns as a private mount: a mount namespace can be pinned to a file only there."""
    NS_DIR.mkdir(parents=True, exist_ok=True)
    mounted = any(line.split()[4] == str(NS_DIR) for line in Path("/proc/self/mountinfo").read_text().splitlines())
    if not mounted:
        _run(["mount", "--bind", str(NS_DIR), str(NS_DIR)], "pinning folder")
        _run(["mount", "--make-private", str(NS_DIR)], "pinning folder")


@dataclass
class Node:
    name: str
    index: int
    zone: str
    ip: str  # the node's InternalIP (on the link strata-k0); kubelet serves here
    pod_cidr: str
    gateway: str  # the bridge's address in pod_cidr
    bridge: str
    root: Path  # the node's folders (state/nodes/<name>)
    server: str
    ca: Path
    cert: KeyPair
    cluster_dns: str
    routes: tuple[str, ...]  # what pods route through the bridge: pods, node IPs, Services
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    kubelet_port: int = 0

    @property
    def run_dir(self) -> Path:
        return RUN / self.name

    @property
    def socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd"

    @property
    def mount_ns(self) -> Path:
        return NS_DIR / self.name

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def nsenter(self, *argv: str) -> list[str]:
        """argv run in this node's mount namespace."""
        return ["nsenter", f"--mount={self.mount_ns}", "--", *argv]

    # -- the node's own view of the machine -------------------------------------------
    def make_mount_namespace(self) -> None:
        binds = {
            "/var/lib/kubelet": self.root / "kubelet",
            "/var/log/pods": self.root / "log-pods",
            "/var/log/containers": self.root / "log-containers",
            "/var/lib/cni": self.root / "cni-state",
            "/run/netns": self.run_dir / "netns",
            "/run/containerd": self.run_dir / "run-containerd",
            "/run/strata": self.root / "run-strata",
        }
        for source in binds.values():
            source.mkdir(parents=True, exist_ok=True)
        self.mount_ns.touch()
        _run(["unshare", f"--mount={self.mount_ns}", "--propagation", "slave", "true"], f"{self.name}: mount namespace")
        script = "set -e\n" + "".join(f"mount --bind '{src}' '{dst}'\n" for dst, src in binds.items())
        # kubelet wants its root shared, so Bidirectional mounts of pods come back to it.
        script += "mount --make-rshared /var/lib/kubelet\n"
        _run(self.nsenter("sh", "-c", script), f"{self.name}: bind mounts")

    # -- containerd -------------------------------------------------------------------
    def containerd_config(self) -> Path:
        conf_dir = self.root / "cni"
        conf_dir.mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": f"strata-e2e-{self.name}",
            "plugins": [{
                "type": "bridge",
                "bridge": self.bridge,
                "isGateway": True,
                "ipMasq": False,  # nothing leaves the machine: no NAT, no default route
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": self.pod_cidr, "gateway": self.gateway}]],
                    "routes": [{"dst": r} for r in self.routes],
                },
            }],
        }
        (conf_dir / "10-bridge.conflist").write_text(json.dumps(conflist, indent=1))
        state = self.run_dir / "containerd"
        config = f"""\
version = 3
root = "{self.containerd_root}"
state = "{state}"
imports = []
disabled_plugins = ["io.containerd.internal.v1.tracing", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = "{self.socket}"

[ttrpc]
  address = "{self.run_dir / 'containerd.sock.ttrpc'}"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{SANDBOX_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # This VM may not lower oom_score_adj (no CAP_SYS_RESOURCE) and kubelet asks -998.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_BIN}"]
    conf_dir = "{conf_dir}"
    max_conf_num = 1

[plugins."io.containerd.nri.v1.nri"]
  disable = true  # its socket would be one path for all nodes

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
        path = self.root / "containerd.toml"
        path.write_text(config)
        return path

    def start_containerd(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = self.containerd_config()
        env = {"PATH": f"{binaries.bin_dir()}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        self.procs["containerd"] = spawn(
            self.nsenter(str(binaries.require("containerd")), "--config", str(config), "--log-level", "warn"),
            self.log("containerd"), env=env,
        )

    def ctr(self, *args: str) -> list[str]:
        return [str(binaries.require("ctr")), "--address", str(self.socket), "--namespace", "k8s.io", *args]

    def wait_containerd(self, timeout: float = 60) -> None:
        def up() -> bool:
            if self.procs["containerd"].poll() is not None:
                raise RuntimeError(f"{self.name}: containerd exited:\n{tail(self.log('containerd'))}")
            return subprocess.run(self.ctr("version"), capture_output=True).returncode == 0

        wait_for(up, timeout=timeout, what=f"{self.name}: containerd", diagnose=lambda: tail(self.log("containerd")))

    # -- kubelet ----------------------------------------------------------------------
    def kubelet_config(self) -> Path:
        make_cgroup(self.name)
        self.kubelet_port = free_port(self.ip)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.ca)},
            },
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{CGROUP_ROOT}/{self.name}",
            "failCgroupV1": False,
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "clusterDNS": [self.cluster_dns],
            "clusterDomain": "cluster.local",
            "resolvConf": "",  # pods of dnsPolicy Default get no name server of this machine
            # Three nodes share one disk and its memory: evict only when really short.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            # Images are imported, never pulled: never collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "nodeStatusReportFrequency": "10s",
            "volumeStatsAggPeriod": "10s",
            "shutdownGracePeriod": "0s",
            "containerLogMaxSize": "10Mi",
        }
        path = self.root / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def start_kubelet(self) -> None:
        config = self.kubelet_config()
        kubeconfig = write_kubeconfig(
            self.root / "kubelet.kubeconfig", server=self.server, ca=self.ca, user=self.cert,
            name=f"system:node:{self.name}",
        )
        env = {"PATH": f"{binaries.bin_dir()}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        self.procs["kubelet"] = spawn(
            self.nsenter(
                str(binaries.require("kubelet")),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.ip}",
                f"--node-labels=topology.kubernetes.io/zone={self.zone}",
                "--v=1",
            ),
            self.log("kubelet"), env=env,
        )

    def check_alive(self) -> list[str]:
        return [f"{self.name}/{n}" for n, p in self.procs.items() if p.poll() is not None]

    def stop(self) -> None:
        """kubelet first (it stops nothing on the way out), then containerd."""
        for name in ("kubelet", "containerd"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop(proc, grace=5.0)


def wait_nodes_ready(kubectl: list[str], names: list[str], timeout: float, diagnose: object) -> None:
    def ready() -> bool:
        out = subprocess.run([*kubectl, "get", "nodes", "-o", "json"], capture_output=True, text=True)
        if out.returncode != 0:
            return False
        items = json.loads(out.stdout)["items"]
        ok = {n["metadata"]["name"] for n in items
              if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))}
        return set(names) <= ok

    wait_for(ready, timeout=timeout, what=f"nodes {', '.join(names)} Ready",
             diagnose=diagnose if callable(diagnose) else None)


def elapsed(t0: float) -> float:
    return round(time.monotonic() - t0, 2)

