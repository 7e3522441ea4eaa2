"""Pod networking: one bridge in the root namespace, one network namespace per
pod (veth pair to the bridge), and a local route for Service ClusterIPs.

Addresses (defaults; STRATA_E2E_POD_CIDR moves them):
  10.244.0.1/16    the bridge; the API server listens here so pods reach it
  10.244.0.10+i    node i's own namespace (hostNetwork pods of that node)
  10.244.(i+1).x   pods of node i
  10.96.0.0/16     Service ClusterIPs: routed to `lo` in the root namespace,
                   where the agent's userspace proxy accepts them

The /16 lives only on the bridge. Pods get no default route and a resolv.conf
pointing at 127.0.0.1 inside their own namespace, so nothing they send can leave
the machine: traffic goes to loopback, to the bridge, or to another namespace.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "strata-"  # every netns and link the harness makes starts with this
BRIDGE = "strata-br0"
NETNS_DIR = Path("/run/netns")


class NetworkError(RuntimeError):
    """A namespace, link or address could not be set up."""


def run_ip(args: Iterable[str], *, stdin: str | None = None, check: bool = True) -> str:
    """Run `ip` with args; raise NetworkError with its stderr on failure."""
    argv = ["ip", *args]
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True)
    if check and proc.returncode != 0:
        detail = proc.stderr.strip() or proc.stdout.strip()
        raise NetworkError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): {detail}")
    return proc.stdout


def netns_name(key: str) -> str:
    """A stable, short netns name for a pod uid or node name."""
    return PREFIX + hashlib.sha1(key.encode()).hexdigest()[:10]


@dataclass
class Network:
    """The bridge and address plan; allocates pod addresses per node."""

    pod_cidr: ipaddress.IPv4Network = field(
        default_factory=lambda: ipaddress.IPv4Network(
            os.environ.get("STRATA_E2E_POD_CIDR", "10.244.0.0/16")
        )
    )
    service_cidr: ipaddress.IPv4Network = field(
        default_factory=lambda: ipaddress.IPv4Network(
            os.environ.get("STRATA_E2E_SERVICE_CIDR", "10.96.0.0/16")
        )
    )
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _used: dict[int, set[str]] = field(default_factory=dict)

    @property
    def gateway(self) -> str:
        return str(self.pod_cidr.network_address + 1)

    def node_ip(self, index: int) -> str:
        return str(self.pod_cidr.network_address + 10 + index)

    @property
    def kubernetes_service_ip(self) -> str:
        return str(self.service_cidr.network_address + 1)

    # -- root namespace -------------------------------------------------
    def create(self) -> None:
        """Remove leftovers of an earlier run, then make the bridge and routes."""
        self.destroy()
        run_ip(["link", "add", BRIDGE, "type", "bridge"])
        run_ip(["addr", "add", f"{self.gateway}/{self.pod_cidr.prefixlen}", "dev", BRIDGE])
        run_ip(["link", "set", BRIDGE, "up"])
        run_ip(["route", "add", "local", str(self.service_cidr), "dev", "lo"])

    def destroy(self) -> None:
        """Delete every namespace and link this harness makes (idempotent)."""
        if NETNS_DIR.is_dir():
            for entry in NETNS_DIR.iterdir():
                if entry.name.startswith(PREFIX):
                    run_ip(["netns", "del", entry.name], check=False)
        run_ip(["link", "del", BRIDGE], check=False)
        run_ip(["route", "del", "local", str(self.service_cidr), "dev", "lo"], check=False)

    # -- addresses --------------------------------------------------------
    def allocate(self, node_index: int) -> str:
        """A free pod address in node `node_index`'s /24."""
        base = self.pod_cidr.network_address + 256 * (node_index + 1)
        with self._lock:
            used = self._used.setdefault(node_index, set())
            for host in range(2, 255):
                ip = str(base + host)
                if ip not in used:
                    used.add(ip)
                    return ip
        raise NetworkError(f"node {node_index} has no free pod address left (253 in use)")

    def release(self, ip: str) -> None:
        with self._lock:
            for used in self._used.values():
                used.discard(ip)

    # -- namespaces -------------------------------------------------------
    def add_namespace(self, name: str, ip: str) -> None:
        """Make netns `name` with eth0=ip on the bridge, lo up and a route to
        the Service range via the bridge. No default route."""
        host_if = "v" + name[len(PREFIX):]  # 11 chars, under IFNAMSIZ
        run_ip(["netns", "add", name])
        try:
            run_ip(["link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", name])
            run_ip(["link", "set", host_if, "master", BRIDGE, "up"])
            run_ip(
                ["-n", name, "-batch", "-"],
                stdin="\n".join(
                    [
                        f"addr add {ip}/{self.pod_cidr.prefixlen} dev eth0",
                        "link set lo up",
                        "link set eth0 up",
                        f"route add {self.service_cidr} via {self.gateway}",
                    ]
                )
                + "\n",
            )
        except NetworkError:
            self.remove_namespace(name)
            raise

    def remove_namespace(self, name: str) -> None:
        """Delete netns `name`; its veth pair goes with it."""
        run_ip(["netns", "del", name], check=False)
        run_ip(["link", "del", "v" + name[len(PREFIX):]], check=False)


def netns_path(name: str) -> Path:
    return NETNS_DIR / name
