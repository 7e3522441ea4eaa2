"""Service discovery for pods: per-pod /etc/hosts content, and a userspace
proxy for ClusterIPs (kube-proxy's old "userspace" mode).

The hosts file lists what cluster DNS would answer: `<svc>.<ns>.svc` and
`<svc>.<ns>.svc.cluster.local` (the ClusterIP, or each ready endpoint for a
headless Service), `<hostname>.<svc>.<ns>.svc[.cluster.local]` for endpoints
that carry a hostname (StatefulSet pods), and the short names `<svc>` and
`<svc>.<ns>` for Services in the pod's own namespace. Names outside the cluster
are not resolvable (the pod's resolver points at a closed port on its own
loopback), so pods cannot send traffic off the machine by name.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
DOMAIN = "cluster.local"


@dataclass(frozen=True)
class Endpoint:
    ip: str
    hostname: str | None
    ready: bool
    ports: tuple[tuple[str, int, str], ...]  # (name, port, protocol)


def endpoints_by_service(slices: Iterable[Obj]) -> dict[tuple[str, str], list[Endpoint]]:
    """EndpointSlices grouped by (namespace, service name)."""
    out: dict[tuple[str, str], list[Endpoint]] = defaultdict(list)
    for s in slices:
        meta = s["metadata"]
        svc = meta.get("labels", {}).get("kubernetes.io/service-name")
        if not svc or s.get("addressType", "IPv4") != "IPv4":
            continue
        ports = tuple((p.get("name", ""), int(p["port"]), p.get("protocol", "TCP")) for p in s.get("ports") or [] if "port" in p)
        for ep in s.get("endpoints") or []:
            ready = ep.get("conditions", {}).get("ready", True) is not False
            for ip in ep.get("addresses", []):
                out[(meta["namespace"], svc)].append(Endpoint(ip, ep.get("hostname"), ready, ports))
    return out


def render_hosts(
    *,
    pod_ip: str,
    hostname: str,
    subdomain: str | None,
    namespace: str,
    services: Iterable[Obj],
    endpoints: dict[tuple[str, str], list[Endpoint]],
) -> str:
    """The /etc/hosts of one pod."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    own = [hostname]
    if subdomain:
        own = [f"{hostname}.{subdomain}.{namespace}.svc.{DOMAIN}", f"{hostname}.{subdomain}.{namespace}.svc", hostname]
    lines.append(f"{pod_ip}\t{' '.join(own)}")

    def names(base: str, ns: str) -> list[str]:
        full = [f"{base}.{ns}.svc.{DOMAIN}", f"{base}.{ns}.svc"]
        if ns == namespace:
            full += [f"{base}.{ns}", base]  # what the search path would find
        return full

    for svc in sorted(services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])):
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        cluster_ip = svc.get("spec", {}).get("clusterIP")
        eps = endpoints.get((ns, name), [])
        if svc.get("spec", {}).get("type") == "ExternalName":
            continue
        if cluster_ip and cluster_ip != "None":
            lines.append(f"{cluster_ip}\t{' '.join(names(name, ns))}")
        else:
            for ep in eps:
                if ep.ready:
                    lines.append(f"{ep.ip}\t{' '.join(names(name, ns))}")
        for ep in eps:
            if ep.hostname and ep.ready:
                lines.append(f"{ep.ip}\t{' '.join(names(f'{ep.hostname}.{name}', ns))}")
    return "\n".join(lines) + "\n"


def resolv_conf(namespace: str) -> str:
    """Search domains as in a cluster; the nameserver is the pod's own closed
    loopback port, so lookups not answered by /etc/hosts fail at once."""
    return (
        f"search {namespace}.svc.{DOMAIN} svc.{DOMAIN} {DOMAIN}\n"
        "nameserver 127.0.0.1\noptions ndots:5 timeout:1 attempts:1\n"
    )


class ServiceProxy:
    """Accepts connections on each ClusterIP:port (TCP) and relays them to a
    ready endpoint's IP and target port, round robin."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="service-proxy", daemon=True)
        self.servers: dict[tuple[str, int], asyncio.base_events.Server] = {}
        self.targets: dict[tuple[str, int], list[tuple[str, int]]] = {}
        self.counter = itertools.count()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        async def close() -> None:
            for server in self.servers.values():
                server.close()
            self.servers.clear()

        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)

    def sync(self, services: Iterable[Obj], endpoints: dict[tuple[str, str], list[Endpoint]]) -> None:
        targets: dict[tuple[str, int], list[tuple[str, int]]] = {}
        for svc in services:
            spec = svc.get("spec", {})
            ip = spec.get("clusterIP")
            if not ip or ip == "None":
                continue
            eps = [e for e in endpoints.get((svc["metadata"]["namespace"], svc["metadata"]["name"]), []) if e.ready]
            for port in spec.get("ports", []):
                if port.get("protocol", "TCP") != "TCP":
                    continue
                name = port.get("name", "")
                dest: list[tuple[str, int]] = []
                for ep in eps:
                    for pname, pnum, proto in ep.ports:
                        if pname == name and proto == "TCP":
                            dest.append((ep.ip, pnum))
                targets[(ip, int(port["port"]))] = dest
        asyncio.run_coroutine_threadsafe(self._apply(targets), self.loop).result(timeout=10)

    async def _apply(self, targets: dict[tuple[str, int], list[tuple[str, int]]]) -> None:
        self.targets = targets
        for key in list(self.servers):
            if key not in targets:
                self.servers.pop(key).close()
        for key in targets:
            if key not in self.servers:
                try:
                    self.servers[key] = await asyncio.start_server(
                        functools.partial(self._relay, key), host=key[0], port=key[1]
                    )
                except OSError:
                    continue  # retried on the next sync

    async def _relay(self, key: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dests = self.targets.get(key) or []
        if not dests:
            writer.close()
            return
        ip, port = dests[next(self.counter) % len(dests)]
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout=5)
        except (OSError, asyncio.TimeoutError):
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                try:
                    dst.close()
                except OSError:
                    pass

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
