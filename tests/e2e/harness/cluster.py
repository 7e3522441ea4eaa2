"""The whole test cluster: pod network, control plane and node agent.

Run it standing (`python -P -m harness up`, with tests/e2e on PYTHONPATH) or
let tests/e2e/conftest.py start it. Everything it makes is undone on exit,
on SIGTERM/SIGINT, and (for child processes) even when it is SIGKILLed; a
leftover bridge or namespaces from a killed run are removed at the next start.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.agent import PROVISIONER, Agent
from harness.controlplane import ControlPlane
from harness.kube import ApiError, Kube
from harness.network import Network, NetworkError
from harness.processes import take_lock, wait_for

LOCK = Path("/run/lock/strata-e2e.lock")


@dataclass
class Cluster:
    state: Path
    nodes: int = 3
    keep_state: bool = False
    network: Network = field(default_factory=Network)
    control_plane: ControlPlane | None = None
    agent: Agent | None = None
    timings: dict[str, float] = field(default_factory=dict)
    _lock_fd: int | None = None

    @property
    def kubeconfig(self) -> Path:
        assert self.control_plane is not None
        return self.control_plane.kubeconfig

    def up(self) -> None:
        """Start everything; on any failure undo what was started and raise."""
        t0 = time.monotonic()
        self._take_lock()
        try:
            self.state.mkdir(parents=True, exist_ok=True)
            (self.state / "logs").mkdir(exist_ok=True)
            try:
                self.network.create()
            except NetworkError as exc:
                raise NetworkError(f"cannot make the pod network (bridge, netns): {exc}") from exc
            self.timings["network"] = time.monotonic() - t0
            cp = self.control_plane = ControlPlane(
                self.state,
                bind_ip=self.network.gateway,
                service_cidr=str(self.network.service_cidr),
                kubernetes_service_ip=self.network.kubernetes_service_ip,
            )
            cp.start()
            self.timings["apiserver_ready"] = time.monotonic() - t0
            assert cp.pki is not None
            kube = Kube(cp.server, str(cp.pki.ca.cert), cp.pki.admin)
            self._storage_class(kube)
            self.agent = Agent(
                kube=kube, network=self.network, state=self.state,
                api_host=self.network.gateway, api_port=cp.port, nodes=self.nodes,
            )
            self.agent.start()
            wait_for(
                lambda: kube.get_or_none("/api/v1/namespaces/default/serviceaccounts/default"),
                timeout=60, what="the controller-manager to create the default ServiceAccount",
            )
            self.timings["ready"] = time.monotonic() - t0
        except BaseException:
            self.down()
            raise

    @staticmethod
    def _storage_class(kube: Kube) -> None:
        body = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": "standard", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "WaitForFirstConsumer",
        }
        try:
            kube.create("/apis/storage.k8s.io/v1/storageclasses", body)
        except ApiError as exc:
            if exc.status != 409:
                raise

    def down(self) -> None:
        """Undo everything; safe to call more than once, never raises."""
        if self.agent is not None:
            self.agent.stop()
            self.agent = None
        if self.control_plane is not None:
            self.control_plane.stop()
            self.control_plane = None
        self.network.destroy()
        if not self.keep_state:
            shutil.rmtree(self.state, ignore_errors=True)
        self._release_lock()

    def _take_lock(self) -> None:
        self._lock_fd = take_lock(LOCK, "the pod bridge")

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def describe(self) -> dict[str, Any]:
        cp = self.control_plane
        assert cp is not None and self.agent is not None
        return {
            "kubeconfig": str(cp.kubeconfig),
            "server": cp.server,
            "state": str(self.state),
            "nodes": {n.name: {"ip": n.ip, "zone": n.zone, "root": str(n.root)} for n in self.agent.nodes.values()},
            "pod_cidr": str(self.network.pod_cidr),
            "service_cidr": str(self.network.service_cidr),
            "timings": {k: round(v, 2) for k, v in self.timings.items()},
            "pid": os.getpid(),
        }


def default_state() -> Path:
    env = os.environ.get("STRATA_E2E_STATE")
    return Path(env) if env else Path(tempfile.mkdtemp(prefix="strata-e2e-"))
