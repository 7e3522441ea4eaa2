"""`kubectl strata`: the `strata` commands a person runs against a CacheCluster, with the
cluster found from the kubeconfig.

    kubectl strata [-n NS] [--context CTX] [-c CLUSTER] status | load PATH | free PATH |
                   pin PATH | unpin PATH | blocks PATH

It reads the CacheCluster (the only one of the namespace when `-c` is not given), takes the
admin token from its `<cluster>-auth` Secret, and reaches the master through a port-forward
the Kubernetes API server makes (no Service, port or token to pass by hand). The commands
are the `strata` CLI's own (`strata.cacheserver.cli`), given the forwarded address and the
token; `status` adds the CacheCluster's and its Mounts' status from Kubernetes.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import logging
import select
import socket
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strata.contract import constants
from strata.contract.errors import FailedPrecondition, NotFound, PermissionDenied, StrataError, Unavailable
from . import cli

log = logging.getLogger(__name__)

# Bytes one relay read moves between the local connection and the port-forward.
RELAY_CHUNK = 64 * 1024
# Seconds the API server has to answer a request of the plugin.
KUBE_TIMEOUT = 15


@dataclass(frozen=True)
class Target:
    """Where a CacheCluster's master is, as its status names it, and its admin token."""

    namespace: str
    cluster: str
    pod: str
    port: int
    token: str


def master_pod(endpoint: str) -> tuple[str, int]:
    """The master's pod name and port from `status.master.endpoint`
    (`<pod>.<service>.<namespace>.svc[.<domain>]:<port>`)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise FailedPrecondition(f"the CacheCluster's status.master.endpoint {endpoint!r} is not HOST:PORT")
    return host.split(".", 1)[0], int(port)


def pick_cluster(clusters: Sequence[Mapping[str, Any]], namespace: str, name: str | None) -> Mapping[str, Any]:
    """The CacheCluster `name`, or the only one of the namespace."""
    if name is not None:
        for cluster in clusters:
            if cluster["metadata"]["name"] == name:
                return cluster
        raise NotFound(f"no CacheCluster {name!r} in namespace {namespace}")
    if len(clusters) == 1:
        return clusters[0]
    names = ", ".join(sorted(c["metadata"]["name"] for c in clusters))
    if not clusters:
        raise NotFound(f"no CacheCluster in namespace {namespace}; pick a namespace with -n")
    raise FailedPrecondition(f"namespace {namespace} has CacheClusters {names}: pick one with -c NAME")


def status_lines(cluster: Mapping[str, Any], mounts: Sequence[Mapping[str, Any]]) -> list[str]:
    """The CacheCluster and its Mounts as Kubernetes has them: a few lines and a table."""
    status = cluster.get("status") or {}
    name = cluster["metadata"]["name"]
    capacity = status.get("capacity") or {}
    cache = status.get("cache") or {}
    lines = [
        f"CacheCluster {cluster['metadata']['namespace']}/{name}: {status.get('phase', 'Unknown')}, "
        f"master {'ready' if (status.get('master') or {}).get('ready') else 'not ready'}, "
        f"workers {(status.get('workers') or {}).get('summary', '-')}, "
        f"capacity {capacity.get('total', '-')} (used {capacity.get('used', '-')}), "
        f"hit ratio {cache.get('hitRatio', '-')}",
    ]
    for condition in status.get("conditions") or []:
        if condition.get("type") in ("Ready", "Stalled", "Reconciling") and condition.get("status") == "True":
            lines.append(f"  {condition['type']}: {condition.get('reason', '')}: {condition.get('message', '')}")
    own = [m for m in mounts if (m.get("spec") or {}).get("cluster") == name]
    rows = [("MOUNT", "PATH", "SOURCE", "PHASE", "CACHED", "MESSAGE")]
    for mount in sorted(own, key=lambda m: m["spec"].get("path", "")):
        mstatus = mount.get("status") or {}
        failed = [c.get("message", "") for c in mstatus.get("conditions") or []
                  if c.get("type") == "Stalled" and c.get("status") == "True"]
        rows.append((mount["metadata"]["name"], mount["spec"].get("path", ""), mount["spec"].get("source", ""),
                     mstatus.get("phase", "Unknown"), str((mstatus.get("cache") or {}).get("cachedBytes", "-")),
                     failed[0] if failed else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines.append("")
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return lines


class Kube:
    """The plugin's Kubernetes calls, with the kubeconfig's credentials (`kubernetes` client)."""

    def __init__(self, context: str | None) -> None:
        from kubernetes import client, config

        try:
            config.load_kube_config(context=context)  # type: ignore[no-untyped-call]
            contexts, active = config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
        except config.ConfigException as exc:
            raise FailedPrecondition(f"cannot use the kubeconfig: {exc}") from None
        chosen = next((c for c in contexts if c["name"] == context), active) if context else active
        self.namespace: str = (chosen or {}).get("context", {}).get("namespace") or "default"
        self._core = client.CoreV1Api()
        self._custom = client.CustomObjectsApi()

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, **kwargs, _request_timeout=KUBE_TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                raise NotFound(f"{what}: not found") from None
            if exc.status in (401, 403):
                raise PermissionDenied(f"{what}: the API server refused ({exc.status} {exc.reason})") from None
            raise Unavailable(f"{what}: the API server answered {exc.status} {exc.reason}") from None
        except OSError as exc:
            raise Unavailable(f"{what}: cannot reach the API server: {exc}") from None

    def objects(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        found = self._call(f"list {plural} in {namespace}", self._custom.list_namespaced_custom_object,
                           constants.GROUP, constants.VERSION, namespace, plural)
        return list(found.get("items", []))

    def secret_value(self, namespace: str, name: str, key: str) -> str:
        secret = self._call(f"read Secret {namespace}/{name}", self._core.read_namespaced_secret, name, namespace)
        value = (secret.data or {}).get(key)
        if not value:
            raise NotFound(f"Secret {namespace}/{name} has no key {key!r}")
        return base64.b64decode(value).decode()

    def forward(self, namespace: str, pod: str, port: int) -> socket.socket:
        """A connection to `port` of the pod, through the API server's port-forward."""
        from kubernetes.stream import portforward

        forwarded = self._call(f"port-forward to pod {namespace}/{pod}", portforward,
                               self._core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(port))
        sock: socket.socket = forwarded.socket(port)
        sock.setblocking(True)
        return sock


def target_of(kube: Kube, namespace: str, name: str | None) -> tuple[Target, Mapping[str, Any]]:
    cluster = pick_cluster(kube.objects(namespace, constants.CACHE_CLUSTER_PLURAL), namespace, name)
    cluster_name = cluster["metadata"]["name"]
    endpoint = ((cluster.get("status") or {}).get("master") or {}).get("endpoint")
    if not endpoint:
        raise FailedPrecondition(f"CacheCluster {namespace}/{cluster_name} has no master endpoint in its status yet")
    pod, port = master_pod(endpoint)
    token = kube.secret_value(namespace, constants.auth_secret_name(cluster_name), constants.SECRET_ADMIN_TOKEN_KEY)
    return Target(namespace, cluster_name, pod, port, token), cluster


def relay(a: socket.socket, b: socket.socket) -> None:
    """Move bytes both ways between two connections until either side ends; closes both."""
    try:
        while True:
            ready, _, _ = select.select([a, b], [], [])
            for source in ready:
                data = source.recv(RELAY_CHUNK)
                if not data:
                    return
                (b if source is a else a).sendall(data)
    except OSError as exc:
        log.debug("relay ended: %s", exc)
    finally:
        for sock in (a, b):
            with contextlib.suppress(OSError):
                sock.close()


@contextlib.contextmanager
def forwarded(kube: Kube, target: Target) -> Iterator[str]:
    """HOST:PORT on 127.0.0.1 whose connections reach the master's port, each through a
    port-forward of its own, while the block runs."""
    listener = socket.create_server(("127.0.0.1", 0))
    stopped = threading.Event()

    def accept() -> None:
        while not stopped.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                remote = kube.forward(target.namespace, target.pod, target.port)
            except StrataError as exc:
                log.warning("%s", exc)
                conn.close()
                continue
            threading.Thread(target=relay, args=(conn, remote), daemon=True, name="kubectl-strata relay").start()

    thread = threading.Thread(target=accept, daemon=True, name="kubectl-strata forward")
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stopped.set()
        listener.close()


# The `strata` CLI command each plugin command runs (PATH appended).
COMMANDS = {
    "load": (["fs", "load"], "load a file or directory into the cache"),
    "free": (["fs", "free"], "free a path's cached blocks"),
    "pin": (["fs", "pin"], "never evict a path's blocks"),
    "unpin": (["fs", "unpin"], "let a path's blocks be evicted again"),
    "blocks": (["fs", "stat"], "show a file's blocks and the workers holding each"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl strata", description="Strata cache commands on a CacheCluster found from the kubeconfig.")
    parser.add_argument("-n", "--namespace", default=None, help="namespace of the CacheCluster (default: the context's)")
    parser.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
    parser.add_argument("-c", "--cluster", default=None, help="CacheCluster name (default: the namespace's only one)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("status", help="the cluster, its workers and tiers, and its Mounts in one view")
    for name, (_, text) in COMMANDS.items():
        sub.add_parser(name, help=text, description=text).add_argument("path")
    return parser


def run(args: argparse.Namespace, kube: Kube) -> int:
    namespace = args.namespace or kube.namespace
    target, cluster = target_of(kube, namespace, args.cluster)
    with forwarded(kube, target) as address:
        base = ["--master", address, f"--token={target.token}"]  # a token may start with "-"
        if args.command == "status":
            print("\n".join(status_lines(cluster, kube.objects(namespace, constants.MOUNT_PLURAL))))
            print()
            return cli.main([*base, "report"])
        command, _ = COMMANDS[args.command]
        return cli.main([*base, *command, args.path])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="kubectl-strata: %(message)s")
    try:
        return run(args, Kube(args.context))
    except StrataError as exc:
        print(f"kubectl strata: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
