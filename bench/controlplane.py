"""The control plane at scale (issue 15, workload 4): many Mounts of one CacheCluster applied
at once, on the e2e suite's cluster of real kubelets with the chart installed.

    python -P bench/controlplane.py [--mounts 200] [--rest 60] [--name NAME]

As root (the harness runs kubelets and containerd), after `make e2e-tools e2e-images`.
Measures:
- time from one `kubectl apply` of N Mounts (and their Secret) until every one is Mounted,
  with the time until the first and the median one;
- the operator's CPU seconds meanwhile (its processes on this host, all replicas), in all and
  per Mount;
- at rest, after all are Mounted: writes to the Mounts and the CacheCluster per minute (a
  watch counts every new resourceVersion; the target is ~0: status is written only when it
  changes) and the operator's CPU.

The store is moto on the API server's address (pods reach it), a prefix per Mount with one
small object. Results go to results/controlplane-NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
E2E = REPO / "tests" / "e2e"
sys.path.insert(0, str(E2E))
sys.path.insert(0, str(BENCH))

import boto3  # noqa: E402

import conftest as e2e  # noqa: E402  (the suite's harness start and stop)
from kit import Cluster, find_tool, load_fixture, make_namespace, pod_ready, wait_until  # noqa: E402
from results import write_result  # noqa: E402

RELEASE, RELEASE_NS, NAMESPACE, BUCKET = "strata", "strata-system", "cp-bench", "cp-bench"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ALL_MOUNTED_TIMEOUT = 1800.0


def operator_cpu() -> float:
    """CPU seconds used so far by the operator's processes on this host (every replica)."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"strata-operator" not in (proc / "cmdline").read_bytes():
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLOCK_TICKS


def start_store(host: str) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    moto = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", host, "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return moto, f"http://{host}:{port}"


def mounts(count: int, endpoint: str) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-creds"},
                                      "stringData": {"key": "bench", "secret": "bench-secret"}}]
    for i in range(count):
        objects.append({"apiVersion": "strata.dev/v1alpha1", "kind": "Mount", "metadata": {"name": f"m-{i:04d}"},
                        "spec": {"cluster": "demo", "path": f"/m-{i:04d}", "source": f"s3://{BUCKET}/m-{i:04d}",
                                 "options": {"endpoint_url": endpoint},
                                 "credentials": {"secretRef": {"name": "s3-creds"}}}})
    return objects


def phases(cluster: Cluster) -> dict[str, str]:
    return {m["metadata"]["name"]: (m.get("status") or {}).get("phase", "")
            for m in cluster.items("mounts", NAMESPACE)}


def changed_fields(before: Any, after: Any, prefix: str = "") -> list[str]:
    """Dotted names of the leaves that differ between two status objects."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in sorted(set(before) | set(after)):
            found += changed_fields(before.get(key), after.get(key), f"{prefix}.{key}" if prefix else key)
        return found
    return [] if before == after else [prefix or "(whole)"]


def count_writes(cluster: Cluster, seconds: float) -> tuple[dict[str, int], dict[str, int]]:
    """Writes to the Mounts and the CacheCluster seen by a watch for `seconds` (each event is
    a new resourceVersion), and how often each status field was among the changes."""
    kubectl = find_tool("kubectl")
    assert kubectl is not None
    kinds = ("mounts", "cacheclusters")
    last = {kind: {o["metadata"]["name"]: o.get("status") for o in cluster.items(kind, NAMESPACE)} for kind in kinds}
    watchers = {kind: subprocess.Popen([kubectl, "get", kind, "-n", NAMESPACE, "--watch-only", "-o", "json"],
                                       stdout=subprocess.PIPE, text=True, env=cluster.env()) for kind in kinds}
    time.sleep(seconds)
    counts: dict[str, int] = {}
    fields: dict[str, int] = {}
    decoder = json.JSONDecoder()
    for kind, proc in watchers.items():
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        counts[kind], at = 0, 0
        while rest := out[at:].lstrip():  # a stream of JSON objects, one per event
            event, at = decoder.raw_decode(out, len(out) - len(rest))
            counts[kind] += 1
            name = event["metadata"]["name"]
            for field in changed_fields(last[kind].get(name), event.get("status")) or ["(metadata or spec)"]:
                fields[f"{kind}: {field}"] = fields.get(f"{kind}: {field}", 0) + 1
            last[kind][name] = event.get("status")
    return counts, fields


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="strata-cp-bench-"))
    os.environ.setdefault("STRATA_E2E_PYTHON_IMAGE", "localhost/python:3.11")
    harness, info, _ = e2e._start_harness(tmp)
    cluster = Cluster(kubeconfig=Path(str(info["kubeconfig"])), harness=info)
    moto = None
    try:
        cluster.run("helm", "upgrade", "--install", RELEASE, str(REPO / "charts" / "strata"), "-n", RELEASE_NS,
                    "--create-namespace", *[str(a) for a in info.get("helm_args", [])], timeout=180)
        wait_until(lambda: cluster.items("pods", RELEASE_NS) and all(pod_ready(p) for p in cluster.items("pods", RELEASE_NS)),
                   timeout=300, what="the release's pods to be Ready")
        host = urlparse(str(info["server"])).hostname or "127.0.0.1"
        moto, endpoint = start_store(host)
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                          aws_secret_access_key="bench-secret")
        wait_until(lambda: s3.create_bucket(Bucket=BUCKET), timeout=30, what="moto to answer")
        for i in range(args.mounts):
            s3.put_object(Bucket=BUCKET, Key=f"m-{i:04d}/part-0.bin", Body=b"x" * 1024)
        make_namespace(cluster, NAMESPACE)
        (cc,) = load_fixture("strata", "cachecluster.yaml")
        cc["spec"]["worker"]["replicas"] = 1
        cluster.apply(cc, NAMESPACE)
        wait_until(lambda: (cluster.get("cachecluster", "demo", NAMESPACE).get("status") or {}).get("phase") == "Ready",
                   timeout=600, what="CacheCluster demo to be Ready", interval=2.0)
        time.sleep(10)  # let the operator settle before its CPU is counted

        cpu_before = operator_cpu()
        started = time.monotonic()
        cluster.apply(mounts(args.mounts, endpoint), NAMESPACE)
        mounted_at: dict[str, float] = {}
        while len(mounted_at) < args.mounts:
            now = time.monotonic()
            for name, phase in phases(cluster).items():
                if phase == "Mounted" and name not in mounted_at:
                    mounted_at[name] = now - started
            if now - started > ALL_MOUNTED_TIMEOUT:
                raise TimeoutError(f"{len(mounted_at)} of {args.mounts} Mounts were Mounted after "
                                   f"{ALL_MOUNTED_TIMEOUT:.0f}s")
            time.sleep(1.0)
        all_mounted = max(mounted_at.values())
        cpu_apply = operator_cpu() - cpu_before

        time.sleep(args.settle)  # the last status writes of the burst land
        cpu_rest_before = operator_cpu()
        writes, fields = count_writes(cluster, args.rest)
        cpu_rest = operator_cpu() - cpu_rest_before
        return {
            "mounts": args.mounts,
            "first_mounted_s": round(min(mounted_at.values()), 1),
            "median_mounted_s": round(statistics.median(mounted_at.values()), 1),
            "all_mounted_s": round(all_mounted, 1),
            "operator_cpu_s": round(cpu_apply, 1),
            "operator_cpu_ms_per_mount": round(1000 * cpu_apply / args.mounts, 1),
            "settle_seconds": args.settle,
            "rest_seconds": args.rest,
            "rest_changed_fields": dict(sorted(fields.items(), key=lambda kv: -kv[1])),
            "rest_writes_per_minute": {k: round(v * 60 / args.rest, 1) for k, v in writes.items()},
            "rest_operator_cpu_s_per_minute": round(cpu_rest * 60 / args.rest, 2),
            "load_average": os.getloadavg()[0],
        }
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=300s", check=False)
        cluster.run("helm", "uninstall", RELEASE, "-n", RELEASE_NS, "--wait", check=False, timeout=300)
        if moto is not None:
            moto.terminate()
            moto.wait(timeout=10)
        e2e._stop_harness(harness)


def report(result: dict[str, Any]) -> str:
    writes = result["rest_writes_per_minute"]
    verdict = "PASS" if max(writes.values()) < 1 else "MISS"
    return "\n".join([
        f"# Control plane: {result['mounts']} Mounts of one CacheCluster applied at once",
        "",
        "| measure | value |",
        "|---|---|",
        f"| first / median / last Mount Mounted after | {result['first_mounted_s']} / {result['median_mounted_s']} / "
        f"{result['all_mounted_s']} s |",
        f"| operator CPU until all were Mounted | {result['operator_cpu_s']} s "
        f"({result['operator_cpu_ms_per_mount']} ms per Mount) |",
        f"| writes per minute at rest ({result['rest_seconds']} s watched) | Mounts {writes['mounts']}, "
        f"CacheCluster {writes['cacheclusters']} (target ~0: **{verdict}**) |",
        f"| operator CPU at rest | {result['rest_operator_cpu_s_per_minute']} s per minute |",
        "",
        f"Rest watched from {result['settle_seconds']:.0f} s after the last Mount was Mounted. Status fields "
        "changed by the writes at rest: "
        + (", ".join(f"{k} ({v})" for k, v in result["rest_changed_fields"].items()) or "none") + ".",
        "",
        f"1-minute load average at the end: {result['load_average']:.1f} (2 CPUs).",
        "",
    ])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mounts", type=int, default=200)
    p.add_argument("--settle", type=float, default=60.0, help="seconds from the last Mounted to the watch at rest")
    p.add_argument("--rest", type=float, default=60.0, help="seconds to watch for writes at rest")
    p.add_argument("--name", default="run")
    args = p.parse_args()
    result = run(args)
    text = report(result)
    write_result(BENCH / "results" / f"controlplane-{args.name}", result, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
