"""The node agent: a kubelet (plus a local-path provisioner and a userspace
kube-proxy) for every node of the test cluster, in one process.

- registers the Nodes, keeps them Ready (Lease renewals, status heartbeats);
- runs each pod bound to them (runtime.PodRunner) and finalizes deleted pods;
- keeps every pod's /etc/hosts current and relays ClusterIP traffic;
- provisions PVs (directories under the node's root) for claims of StorageClasses
  whose provisioner is `strata.dev/e2e-local-path`, and deletes released ones;
- calls CSI node plugins for csi volumes (NodePublish/NodeUnpublish).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.csi import CsiError, NodeClient
from harness.kube import ApiError, Kube, Reflector
from harness.network import Network, netns_name
from harness.runtime import PodRunner
from harness.services import ServiceProxy, endpoints_by_service, render_hosts, resolv_conf
from harness.volumes import VolumeError

Obj = dict[str, Any]

PROVISIONER = "strata.dev/e2e-local-path"
KUBELET_VERSION = "v1.34.4"
LEASE_SECONDS = 40
RENEW_EVERY = 10.0
NODE_STATUS_EVERY = 60.0
CAPACITY = {"cpu": "8", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"}


@dataclass(frozen=True)
class NodeInfo:
    name: str
    index: int
    zone: str
    root: Path  # hostPath volumes and PVs of this node live under here
    ip: str
    netns: str  # the node's own namespace (hostNetwork pods)


def _micro_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Agent:
    def __init__(
        self,
        *,
        kube: Kube,
        network: Network,
        state: Path,
        api_host: str,
        api_port: int,
        nodes: int = 3,
        zones: tuple[str, ...] = ("zone-a", "zone-b", "zone-c"),
    ) -> None:
        self.kube, self.network, self.state = kube, network, state
        self.api_host, self.api_port = api_host, api_port
        self.stopping = threading.Event()
        self.node_capacity = dict(CAPACITY)
        self.nodes = {
            f"node-{i + 1}": NodeInfo(
                name=f"node-{i + 1}", index=i, zone=zones[i % len(zones)],
                root=state / "nodes" / f"node-{i + 1}", ip=network.node_ip(i),
                netns=netns_name(f"node/{i}"),
            )
            for i in range(nodes)
        }
        self.runners: dict[str, PodRunner] = {}
        self.lock = threading.RLock()
        self.mountpoints: list[Path] = []
        self.csi_published: dict[str, list[tuple[Path, str, str]]] = {}  # pod uid -> (socket, volume id, target)
        self.hosts_dirty = threading.Event()
        self.hosts_lock = threading.Lock()
        self.proxy = ServiceProxy()
        self.log_file = open(state / "logs" / "agent.log", "a", buffering=1)
        self.threads: list[threading.Thread] = []
        self.reflectors: dict[str, Reflector] = {}
        self._storage_classes: dict[str, str] = {}

    def log(self, message: str) -> None:
        self.log_file.write(f"{_micro_now()} {message}\n")

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        for node in self.nodes.values():
            node.root.mkdir(parents=True, exist_ok=True)
            self._share(node.root)
            self.network.add_namespace(node.netns, node.ip)
            self._register(node)
        self.proxy.start()

        def ref(path: str, cb: Callable[[Obj, bool], None], **params: str) -> Reflector:
            return Reflector(self.kube, path, cb, self.stopping, **params)

        self.reflectors = {
            "services": ref("/api/v1/services", self._on_network_change),
            "slices": ref("/apis/discovery.k8s.io/v1/endpointslices", self._on_network_change),
            "pods": ref("/api/v1/pods", self._on_pod, fieldSelector="spec.nodeName!="),
            "pvcs": ref("/api/v1/persistentvolumeclaims", self._on_claim),
            "pvs": ref("/api/v1/persistentvolumes", self._on_volume),
        }
        for r in self.reflectors.values():
            r.start()
        for target, name in ((self._heartbeat, "heartbeat"), (self._hosts_loop, "hosts")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self.threads.append(t)
        for r in self.reflectors.values():
            if not r.synced.wait(30):
                raise TimeoutError(f"agent: no initial list of {r.path} within 30s")

    def stop(self) -> None:
        """Kill every pod at once and undo mounts and namespaces; never raises."""
        self.stopping.set()
        with self.lock:
            runners = list(self.runners.values())
        for r in runners:
            r.wake.set()
        for r in runners:
            r.thread.join(timeout=15)
        self.proxy.stop()
        for node in self.nodes.values():
            os.system(f"umount -l {node.root} 2>/dev/null")
        for path in sorted(self.mountpoints, key=lambda p: -len(p.parts)):
            try:
                path.rmdir() if path.is_dir() else path.unlink()
            except OSError:
                pass
        self.log_file.close()

    @staticmethod
    def _share(path: Path) -> None:
        """Make `path` a shared mount, so mounts a CSI plugin makes below it in
        its own mount namespace show up here and in consumer pods."""
        os.system(f"mountpoint -q {path} || mount --bind {path} {path}; mount --make-shared {path}")

    # -- nodes ----------------------------------------------------------------
    def _register(self, node: NodeInfo) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node.name,
                "labels": {
                    "kubernetes.io/hostname": node.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "topology.kubernetes.io/zone": node.zone,
                    "strata.dev/e2e-node": "true",
                },
            },
            "spec": {"podCIDR": f"{self.network.pod_cidr.network_address + 256 * (node.index + 1)}/24"},
        }
        try:
            self.kube.create("/api/v1/nodes", body)
        except ApiError as exc:
            if exc.status != 409:
                raise
        self._node_status(node)
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": node.name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": node.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": _micro_now()},
        }
        try:
            self.kube.create("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", lease)
        except ApiError as exc:
            if exc.status != 409:
                raise

    def _node_status(self, node: NodeInfo) -> None:
        stamp = _now()

        def cond(kind: str, status: str, reason: str, message: str) -> Obj:
            return {"type": kind, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}

        status = {
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "e2e agent"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "e2e agent"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "e2e agent"),
                cond("Ready", "True", "KubeletReady", "strata e2e node agent is posting ready status"),
            ],
            "addresses": [{"type": "InternalIP", "address": node.ip}, {"type": "Hostname", "address": node.name}],
            "capacity": self.node_capacity,
            "allocatable": self.node_capacity,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": KUBELET_VERSION,
                "containerRuntimeVersion": "strata-e2e://1", "operatingSystem": "linux", "architecture": "amd64",
                "osImage": "strata e2e harness", "kernelVersion": os.uname().release,
                "machineID": node.name, "systemUUID": node.name, "bootID": node.name,
            },
        }
        self.kube.patch(f"/api/v1/nodes/{node.name}/status", {"status": status})

    def _heartbeat(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(RENEW_EVERY):
            for node in self.nodes.values():
                try:
                    self.kube.patch(
                        f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node.name}",
                        {"spec": {"renewTime": _micro_now(), "holderIdentity": node.name}},
                        kind="merge-patch",
                    )
                    if time.monotonic() - last_status > NODE_STATUS_EVERY:
                        self._node_status(node)
                except Exception as exc:  # noqa: BLE001 - retried on the next beat
                    self.log(f"heartbeat {node.name}: {exc!r}")
            if time.monotonic() - last_status > NODE_STATUS_EVERY:
                last_status = time.monotonic()

    # -- pods -------------------------------------------------------------------
    def _on_pod(self, pod: Obj, deleted: bool) -> None:
        node = self.nodes.get(pod["spec"].get("nodeName", ""))
        if node is None:
            return
        uid = pod["metadata"]["uid"]
        with self.lock:
            runner = self.runners.get(uid)
            if deleted:
                if runner:
                    runner.vanish()
                return
            if runner:
                runner.update(pod)
                return
            if self.stopping.is_set():
                return
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp"):
                return  # finished before this agent started
            runner = PodRunner(self, pod, node)
            self.runners[uid] = runner
        self.log(f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']} on {node.name}")
        runner.start()

    def forget(self, runner: PodRunner) -> None:
        with self.lock:
            if self.runners.get(runner.uid) is runner:
                del self.runners[runner.uid]
        self.hosts_dirty.set()

    def patch_pod_status(self, pod: Obj, status: Obj) -> None:
        meta = pod["metadata"]
        try:
            self.kube.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status", {"status": status})
        except ApiError as exc:
            if exc.status != 404:
                self.log(f"status of {meta['namespace']}/{meta['name']}: {exc}")

    def finalize_pod(self, pod: Obj) -> None:
        """Remove the pod object once its containers are gone, as kubelet does."""
        meta = pod["metadata"]
        self.kube.delete(
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
            {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
        )
        self.log(f"pod {meta['namespace']}/{meta['name']} finalized")

    def lookup(self, namespace: str, kind: str, name: str) -> Obj | None:
        plural = {"ConfigMap": "configmaps", "Secret": "secrets"}[kind]
        return self.kube.get_or_none(f"/api/v1/namespaces/{namespace}/{plural}/{name}")

    def request_token(self, pod: Obj, service_account: str, audiences: list[str], seconds: int) -> str:
        meta = pod["metadata"]
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": audiences,
                "expirationSeconds": max(600, seconds),
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
            },
        }
        try:
            result = self.kube.create(
                f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{service_account}/token", body
            )
        except ApiError as exc:
            raise VolumeError(f"service account token for {service_account!r}: {exc}") from exc
        return str(result["status"]["token"])

    def service_env(self) -> dict[str, str]:
        host, port = self.api_host, str(self.api_port)
        return {
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://{host}:{port}",
        }

    def make_mountpoint(self, path: Path, *, directory: bool) -> None:
        """Create a missing mount target on this machine (removed at stop)."""
        with self.lock:
            missing = []
            p = path if directory else path.parent
            while not p.exists():
                missing.append(p)
                p = p.parent
            for d in reversed(missing):
                d.mkdir(exist_ok=True)
                self.mountpoints.append(d)
            if not directory and not path.exists():
                path.touch()
                self.mountpoints.append(path)

    # -- names and ClusterIPs ----------------------------------------------------
    def resolv_conf(self, namespace: str) -> str:
        return resolv_conf(namespace)

    def _on_network_change(self, _obj: Obj, _deleted: bool) -> None:
        self.hosts_dirty.set()

    def write_hosts(self, runner: PodRunner) -> None:
        services = self.reflectors["services"].snapshot() if self.reflectors else []
        slices = self.reflectors["slices"].snapshot() if self.reflectors else []
        self._write_hosts(runner, services, endpoints_by_service(slices))

    def _write_hosts(self, runner: PodRunner, services: list[Obj], endpoints: Any) -> None:
        text = render_hosts(
            pod_ip=runner.ip, hostname=runner.hostname, subdomain=runner.subdomain,
            namespace=runner.namespace, services=services, endpoints=endpoints,
        )
        path = runner.hosts_file
        with self.hosts_lock:
            try:
                if path.exists() and path.read_text() == text:
                    return
                # Rewrite in place: the pod's /etc/hosts is a bind mount of this inode.
                with open(path, "w") as f:
                    f.write(text)
            except OSError:
                pass

    def _hosts_loop(self) -> None:
        while not self.stopping.is_set():
            if not self.hosts_dirty.wait(1.0):
                continue
            self.stopping.wait(0.05)  # let a burst of changes settle
            self.hosts_dirty.clear()
            services = self.reflectors["services"].snapshot()
            endpoints = endpoints_by_service(self.reflectors["slices"].snapshot())
            with self.lock:
                runners = [r for r in self.runners.values() if r.ip]
            for r in runners:
                self._write_hosts(r, services, endpoints)
            try:
                self.proxy.sync(services, endpoints)
            except Exception as exc:  # noqa: BLE001 - next change retries
                self.log(f"service proxy sync: {exc!r}")

    # -- volumes: local-path provisioner -------------------------------------------
    def _provisioner_of(self, storage_class: str) -> str:
        if storage_class not in self._storage_classes:
            sc = self.kube.get_or_none(f"/apis/storage.k8s.io/v1/storageclasses/{storage_class}")
            if sc is None:
                return ""
            self._storage_classes[storage_class] = sc.get("provisioner", "")
        return self._storage_classes[storage_class]

    def _on_claim(self, pvc: Obj, deleted: bool) -> None:
        if deleted or pvc.get("spec", {}).get("volumeName"):
            return
        meta = pvc["metadata"]
        node = self.nodes.get(meta.get("annotations", {}).get("volume.kubernetes.io/selected-node", ""))
        sc = pvc["spec"].get("storageClassName") or ""
        if node is None or not sc:
            return
        try:
            if self._provisioner_of(sc) != PROVISIONER:
                return
            name = f"pvc-{meta['uid']}"
            path = node.root / "pv" / name
            path.mkdir(parents=True, exist_ok=True)
            size = pvc["spec"].get("resources", {}).get("requests", {}).get("storage", "1Gi")
            pv = {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": pvc["spec"].get("accessModes", ["ReadWriteOnce"]),
                    "persistentVolumeReclaimPolicy": "Delete",
                    "storageClassName": sc,
                    "volumeMode": pvc["spec"].get("volumeMode", "Filesystem"),
                    "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                 "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]},
                    "hostPath": {"path": str(path), "type": "Directory"},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node.name]}]}]}},
                },
            }
            self.kube.create("/api/v1/persistentvolumes", pv)
            self.log(f"provisioned {name} for {meta['namespace']}/{meta['name']} on {node.name}")
        except ApiError as exc:
            if exc.status != 409:
                self.log(f"provisioning for {meta['namespace']}/{meta['name']}: {exc}")

    def _on_volume(self, pv: Obj, deleted: bool) -> None:
        meta = pv["metadata"]
        if deleted or meta.get("annotations", {}).get("pv.kubernetes.io/provisioned-by") != PROVISIONER:
            return
        if pv.get("status", {}).get("phase") == "Released" and pv["spec"].get("persistentVolumeReclaimPolicy") == "Delete":
            shutil.rmtree(pv["spec"]["hostPath"]["path"], ignore_errors=True)
            self.kube.delete(f"/api/v1/persistentvolumes/{meta['name']}")

    def pvc_path(self, namespace: str, claim: str) -> Path | None:
        pvc = self.kube.get_or_none(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        if pvc is None or pvc.get("status", {}).get("phase") != "Bound":
            return None
        pv = self.kube.get_or_none(f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")
        if pv is None:
            return None
        source = pv["spec"].get("hostPath") or pv["spec"].get("local")
        if source is None:
            raise VolumeError(f"PV {pv['metadata']['name']} is neither hostPath nor local")
        return Path(source["path"])

    # -- volumes: CSI ---------------------------------------------------------------
    def csi_publish(self, runner: PodRunner, volume: Obj) -> Path:
        src = volume["csi"]
        driver = src["driver"]
        meta = runner.pod["metadata"]
        socket = runner.node.root / "var/lib/kubelet/plugins" / driver / "csi.sock"
        if not socket.exists():
            raise VolumeError(f"CSI driver {driver!r} has no socket on {runner.node.name} ({socket})")
        csidriver = self.kube.get_or_none(f"/apis/storage.k8s.io/v1/csidrivers/{driver}")
        if csidriver is None:
            raise VolumeError(f"CSIDriver {driver!r} is not registered")
        modes = csidriver["spec"].get("volumeLifecycleModes", ["Persistent"])
        if "Ephemeral" not in modes:
            raise VolumeError(f"CSIDriver {driver!r} does not allow inline (Ephemeral) volumes: {modes}")
        context = dict(src.get("volumeAttributes", {}))
        if csidriver["spec"].get("podInfoOnMount"):
            context.update({
                "csi.storage.k8s.io/pod.name": meta["name"],
                "csi.storage.k8s.io/pod.namespace": meta["namespace"],
                "csi.storage.k8s.io/pod.uid": meta["uid"],
                "csi.storage.k8s.io/serviceAccount.name": runner.pod["spec"].get("serviceAccountName", "default"),
                "csi.storage.k8s.io/ephemeral": "true",
            })
        secrets: dict[str, str] = {}
        if src.get("nodePublishSecretRef"):
            secret = self.lookup(meta["namespace"], "Secret", src["nodePublishSecretRef"]["name"])
            if secret is None:
                raise VolumeError(f"nodePublishSecretRef {src['nodePublishSecretRef']['name']!r} not found")
            from harness.podenv import file_data

            secrets = {k: v.decode() for k, v in file_data(secret, "Secret").items()}
        target = f"/var/lib/kubelet/pods/{meta['uid']}/volumes/kubernetes.io~csi/{volume['name']}/mount"
        host_target = runner.node.root / target.lstrip("/")
        host_target.parent.mkdir(parents=True, exist_ok=True)
        volume_id = "csi-" + hashlib.sha256(f"{meta['uid']}/{volume['name']}".encode()).hexdigest()[:40]
        try:
            client = NodeClient(socket, self.state / "csi-stubs")
            try:
                client.publish(
                    volume_id=volume_id, target_path=target, readonly=bool(src.get("readOnly")),
                    fs_type=src.get("fsType", ""), context=context, secrets=secrets,
                )
            finally:
                client.close()
        except CsiError as exc:
            raise VolumeError(str(exc)) from exc
        except Exception as exc:  # grpc.RpcError: retried like kubelet does
            raise VolumeError(f"NodePublishVolume {volume_id} on {driver}: {exc}") from exc
        with self.lock:
            self.csi_published.setdefault(runner.uid, []).append((socket, volume_id, target))
        return host_target

    def csi_unpublish_all(self, runner: PodRunner) -> None:
        with self.lock:
            published = self.csi_published.pop(runner.uid, [])
        for socket, volume_id, target in published:
            try:
                client = NodeClient(socket, self.state / "csi-stubs")
                try:
                    client.unpublish(volume_id=volume_id, target_path=target)
                finally:
                    client.close()
            except Exception as exc:  # noqa: BLE001 - logged; teardown goes on
                self.log(f"NodeUnpublishVolume {volume_id}: {exc!r}")
                print(f"e2e agent: NodeUnpublishVolume {volume_id} failed: {exc}", file=sys.stderr)
