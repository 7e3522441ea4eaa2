"""What the kubelet cluster changes on this machine, recorded before and undone after.

Before anything starts, `HostSide.take()` writes a record (RECORD) of the sysctls kubelet,
kube-proxy and the CNI bridge change, which nft tables and host folders existed, and where
the run keeps its state. `restore()` undoes all of it: it ends the run's processes (also the
containerd shims and containers, which outlive their parents), unmounts what the run
mounted, removes its cgroups, links and nft tables, writes the sysctls back and removes the
folders it made. A record found at start belongs to a run that was killed: its leftovers
are cleaned with the values *that* run recorded, before this run records anew.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUN = Path("/run/strata-e2e-k")  # sockets, mount-namespace files, the record
RECORD = RUN / "host.json"
LINK_PREFIX = "strata-k"  # every link the cluster makes: strata-k0 and each node's bridge
CGROUP_ROOT = "strata-e2e-k"  # under every cgroup hierarchy; each node's kubelet cgroupRoot
CGROUP_FS = Path("/sys/fs/cgroup")
NFT_TABLES = (("ip", "kube-proxy"), ("ip6", "kube-proxy"))
# kubelet sets the vm.* and kernel.* ones at start (it cannot be told not to), the bridge
# plugin ip_forward, kube-proxy route_localnet and the conntrack limits.
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.ipv6.conf.all.forwarding",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)
# Folders the nodes' mount namespaces bind their own copies over (so three kubelets on one
# machine see the layout one kubelet expects); made here when missing, removed after.
BIND_TARGETS = (
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/netns",
    "/run/containerd",
    "/run/strata",  # the workers' short-circuit sockets: a node's own, as on a real node
)


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls() -> dict[str, str]:
    out = {}
    for name in SYSCTLS:
        try:
            out[name] = _sysctl_path(name).read_text().strip()
        except OSError:
            pass  # not on this kernel, or its module is not loaded
    return out


def _nft_tables() -> set[tuple[str, str]]:
    proc = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
    tables = set()
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "table":
            tables.add((parts[1], parts[2]))
    return tables


def _mounts_under(prefixes: tuple[str, ...]) -> list[str]:
    """Mount points at or below any of `prefixes`, deepest first."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
            points.append(point)
    return sorted(set(points), key=len, reverse=True)


def _pids_referring_to(needles: tuple[str, ...]) -> list[int]:
    """Processes whose command line names one of `needles` (the run's own paths)."""
    pids = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(n in cmdline for n in needles):
            pids.append(int(entry.name))
    return pids


def _cgroup_dirs() -> list[Path]:
    """Every cgroup folder of the run, deepest first, over all hierarchies."""
    dirs: list[Path] = []
    if not CGROUP_FS.is_dir():
        return dirs
    for hierarchy in CGROUP_FS.iterdir():
        root = hierarchy / CGROUP_ROOT
        if root.is_dir():
            dirs.extend(p for p in root.rglob("*") if p.is_dir())
            dirs.append(root)
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def _cgroup_pids() -> set[int]:
    pids: set[int] = set()
    for d in _cgroup_dirs():
        try:
            pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        except (OSError, ValueError):
            pass
    return pids


def _kill(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def make_cgroup(name: str) -> None:
    """<hierarchy>/strata-e2e-k/<name> in every hierarchy (kubelet wants its cgroupRoot
    to exist). cpuset children start empty in cgroup v1: copy the parent's cpus and mems."""
    for hierarchy in CGROUP_FS.iterdir():
        if not (hierarchy / "cgroup.procs").exists():
            continue
        parent = hierarchy
        for part in (CGROUP_ROOT, name):
            child = parent / part
            child.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (child / knob).exists() and not (child / knob).read_text().strip():
                    (child / knob).write_text((parent / knob).read_text())
            parent = child


@dataclass
class HostSide:
    state: Path
    record: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what a restore could not undo

    def take(self) -> None:
        """Clean a killed run's leftovers, then record this machine as it is."""
        RUN.mkdir(parents=True, exist_ok=True)
        if RECORD.exists():
            try:
                old = json.loads(RECORD.read_text())
            except ValueError:
                old = {}
            HostSide(state=Path(old.get("state", self.state)), record=old).restore()
            RUN.mkdir(parents=True, exist_ok=True)
        self.record = {
            "state": str(self.state),
            "sysctls": read_sysctls(),
            "nft_tables": sorted(list(t) for t in _nft_tables()),
            "made_dirs": [],
            "pid": os.getpid(),
            "started": time.time(),
        }
        for target in BIND_TARGETS:
            if not os.path.lexists(target):
                Path(target).mkdir(parents=True)
                self.record["made_dirs"].append(target)
        self._save()

    def _save(self) -> None:
        tmp = RECORD.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record, indent=1))
        tmp.replace(RECORD)

    def restore(self, keep_state: bool = False) -> list[str]:
        """Undo everything the run did; never raises. Returns what could not be undone."""
        # The nodes' processes name their folders; not the state folder itself, which
        # the command line of whatever started the run may name too.
        needles = (str(RUN) + "/", str(self.state / "nodes") + "/")
        for _ in range(3):  # a shim may start a process while we kill; go round again
            pids = set(_pids_referring_to(needles)) | _cgroup_pids()
            if not pids:
                break
            _kill(pids)
            time.sleep(0.5)
        for point in _mounts_under((str(RUN), str(self.state))):
            self._run(["umount", "-l", point])
        for d in _cgroup_dirs():
            try:
                d.rmdir()
            except OSError as exc:
                self.notes.append(f"cgroup {d}: {exc}")
        for link in self._links():
            self._run(["ip", "link", "del", link])
        before = {tuple(t) for t in self.record.get("nft_tables", [])}
        for family, table in NFT_TABLES:
            if (family, table) not in before and (family, table) in _nft_tables():
                self._run(["nft", "delete", "table", family, table])
        for name, value in self.record.get("sysctls", {}).items():
            try:
                if _sysctl_path(name).read_text().strip() != value:
                    _sysctl_path(name).write_text(value)
            except OSError as exc:
                self.notes.append(f"sysctl {name}={value}: {exc}")
        for made in reversed(self.record.get("made_dirs", [])):
            try:
                os.rmdir(made)
            except OSError as exc:
                self.notes.append(f"{made}: {exc}")
        if not keep_state:
            self._run(["rm", "-rf", "--one-file-system", str(self.state)])
        self._run(["rm", "-rf", "--one-file-system", str(RUN)])
        return self.notes

    @staticmethod
    def _links() -> list[str]:
        proc = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
        names = []
        for line in proc.stdout.splitlines():
            name = line.split(":", 2)[1].strip().split("@")[0]
            if name.startswith(LINK_PREFIX):
                names.append(name)
        return names

    def _run(self, argv: list[str]) -> None:
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            self.notes.append(f"`{' '.join(argv)}`: {proc.stderr.strip()}")
