"""Kubernetes probes (httpGet, tcpSocket, exec, grpc) run from the agent."""

from __future__ import annotations

import http.client
import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

Obj = dict[str, Any]


def resolve_port(port: int | str, container: Obj) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports", []):
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"probe port {port!r} names no port of container {container['name']!r}")


def run_probe(
    probe: Obj,
    *,
    pod_ip: str,
    container: Obj,
    exec_prefix: Sequence[str],
    env: Mapping[str, str],
) -> bool:
    """True when the probe succeeds once. exec probes run inside the
    container's namespaces through `exec_prefix` (an nsenter command line)."""
    timeout = float(probe.get("timeoutSeconds", 1))
    try:
        if "httpGet" in probe:
            action = probe["httpGet"]
            host = action.get("host") or pod_ip
            port = resolve_port(action["port"], container)
            conn_cls = http.client.HTTPSConnection if action.get("scheme") == "HTTPS" else http.client.HTTPConnection
            kwargs: dict[str, Any] = {"timeout": timeout}
            if conn_cls is http.client.HTTPSConnection:
                import ssl

                kwargs["context"] = ssl._create_unverified_context()  # kubelet skips verification too
            conn = conn_cls(host, port, **kwargs)
            try:
                headers = {h["name"]: h["value"] for h in action.get("httpHeaders", [])}
                conn.request("GET", action.get("path", "/"), headers=headers)
                status = conn.getresponse().status
            finally:
                conn.close()
            return 200 <= status < 400
        if "tcpSocket" in probe:
            action = probe["tcpSocket"]
            port = resolve_port(action["port"], container)
            with socket.create_connection((action.get("host") or pod_ip, port), timeout=timeout):
                return True
        if "exec" in probe:
            proc = subprocess.run(
                [*exec_prefix, *probe["exec"]["command"]],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=max(timeout, 1.0),
            )
            return proc.returncode == 0
        if "grpc" in probe:
            return _grpc_health(pod_ip, int(probe["grpc"]["port"]), probe["grpc"].get("service", ""), timeout)
    except (OSError, ValueError, subprocess.TimeoutExpired, http.client.HTTPException, ImportError):
        # ImportError: grpc probes need the grpcio-health-checking package.
        return False
    return False


def _grpc_health(ip: str, port: int, service: str, timeout: float) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped,import-not-found,unused-ignore]

    with grpc.insecure_channel(f"{ip}:{port}") as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError:
            return False
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)
