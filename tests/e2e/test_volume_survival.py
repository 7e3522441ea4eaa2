"""A pod's Strata volume survives the CSI node plugin (issue 13), on real kubelets: a reader pod
streams a large file through the volume in a loop and checksums every pass while, in turn,
the node plugin pod on its node is deleted, the chart is upgraded to a new server image
(the node plugin rolls), and the serving `strata fuse` process is SIGKILLed. After each:
zero read errors, every pass equal to the store's bytes, the reader never restarted; the
longest stall the reader saw in each case is printed.

The mounts outlive the plugin's container because their keepers are children of the node's
fuse-holder pod (cacheserver/fuse/keeperhost.py), which the upgrade does not replace.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3  # type: ignore[import-untyped]
import pytest

from harness.hostside import RUN
from kit import Cluster, find_tool, pod_ready, python_pod, wait_until
from test_strata import (  # noqa: F401 - module fixtures used by the tests below
    RELEASE,
    RELEASE_NS,
    Obj,
    cache_cluster,
    chart_args,
    s3,
    strata,
    wait_ready,
)

BUCKET = "e2e-survival"
SIZE = 48 << 20
NEXT_TAG = "e2e-next"
PLUGIN = "app.kubernetes.io/component=csi-node"
HOLDER = "app.kubernetes.io/component=fuse-holder"
# Whole passes the reader must make after each case once the plugin is back.
PASSES_AFTER = 3
CASE_TIMEOUT = 300.0

# Reads PATH in a loop (page cache dropped before each pass, so every byte comes through the
# FUSE server), checks each pass's SHA-256, and keeps a tally in /tmp/tally.json: passes,
# mismatches, errors, the longest wait for one read call overall and since /tmp/reset last
# appeared. Ends (exit 0, the tally in the termination message) when /tmp/stop appears.
READER = r"""
import hashlib, json, os, sys, time
path, expected = sys.argv[1:3]
tally = {"passes": 0, "mismatches": 0, "errors": [], "max_stall": 0.0, "case_stall": 0.0}
last = time.monotonic()
def tick():
    global last
    now = time.monotonic()
    tally["max_stall"] = max(tally["max_stall"], now - last)
    tally["case_stall"] = max(tally["case_stall"], now - last)
    last = now
def save():
    with open("/tmp/tally.json.new", "w") as f:
        json.dump(tally, f)
    os.replace("/tmp/tally.json.new", "/tmp/tally.json")
save()
while not os.path.exists("/tmp/stop"):
    if os.path.exists("/tmp/reset"):
        tally["case_stall"] = 0.0
        os.remove("/tmp/reset")
    try:
        fd = os.open(path, os.O_RDONLY)
        tick()
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            digest = hashlib.sha256()
            while True:
                chunk = os.read(fd, 1 << 20)
                tick()
                if not chunk:
                    break
                digest.update(chunk)
        finally:
            os.close(fd)
        if digest.hexdigest() == expected:
            tally["passes"] += 1
        else:
            tally["mismatches"] += 1
    except OSError as exc:
        tally["errors"].append([exc.errno, str(exc), time.time()])
        print("read error:", exc, flush=True)
        time.sleep(1)
    save()
    if tally["passes"] % 20 == 1:
        print(json.dumps(tally), flush=True)
open("/dev/termination-log", "w").write(json.dumps(tally))
"""


def _store(s3: dict[str, str]) -> bytes:
    """BUCKET with big.bin (SIZE bytes); the bytes, as the store gives them back."""
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1",
                          aws_access_key_id=s3["key"], aws_secret_access_key=s3["secret"])
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="big.bin", Body=random.Random(13).randbytes(SIZE))
    data: bytes = client.get_object(Bucket=BUCKET, Key="big.bin")["Body"].read()
    assert len(data) == SIZE
    return data


def _mount(s3: dict[str, str]) -> list[Obj]:
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-creds"},
         "stringData": {"key": s3["key"], "secret": s3["secret"]}},
        {"apiVersion": "strata.dev/v1alpha1", "kind": "Mount", "metadata": {"name": "big"},
         "spec": {"cluster": "demo", "path": "/big", "source": f"s3://{BUCKET}",
                  "options": {"endpoint_url": s3["endpoint"]}, "credentials": {"secretRef": {"name": "s3-creds"}}}},
    ]


def _reader(expected: str) -> Obj:
    pod = python_pod("reader", READER)
    main = pod["spec"]["containers"][0]
    main["command"] = ["python3", "-u", "-c", READER, "/data/big.bin", expected]
    main["volumeMounts"] = [{"name": "data", "mountPath": "/data", "readOnly": True}]
    pod["spec"]["volumes"] = [{"name": "data", "csi": {"driver": "csi.strata.dev", "readOnly": True,
                                                      "volumeAttributes": {"mount": "big"}}}]
    pod["metadata"]["annotations"] = {"strata.dev/locality": "disabled"}
    return pod


class Reader:
    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace

    def exec(self, *argv: str) -> str:
        return self.cluster.kubectl("exec", "reader", "-n", self.namespace, "--", *argv)

    def tally(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.exec("cat", "/tmp/tally.json"))
        return value

    def pod(self) -> Obj:
        return self.cluster.get("pod", "reader", self.namespace)

    def check(self, case: str) -> dict[str, Any]:
        tally = self.tally()
        pod = self.pod()
        status = pod["status"]["containerStatuses"][0]
        assert pod["status"]["phase"] == "Running" and status["restartCount"] == 0, (case, pod["status"])
        assert tally["errors"] == [] and tally["mismatches"] == 0, (case, tally)
        return tally


def _plugin_on(cluster: Cluster, node: str) -> Obj | None:
    pods = [p for p in cluster.items("pods", RELEASE_NS, selector=PLUGIN)
            if p["spec"].get("nodeName") == node and not p["metadata"].get("deletionTimestamp")]
    return pods[0] if len(pods) == 1 else None


def _new_plugin_ready(cluster: Cluster, node: str, old_uid: str) -> Obj:
    def ready() -> Obj | None:
        pod = _plugin_on(cluster, node)
        return pod if pod and pod["metadata"]["uid"] != old_uid and pod_ready(pod) else None
    found: Obj = wait_until(ready, timeout=CASE_TIMEOUT, what=f"a new CSI node plugin pod Ready on {node}",
                            diagnose=lambda: cluster.describe_pods(RELEASE_NS))
    return found


def _holders(cluster: Cluster) -> dict[str, str]:
    return {p["spec"]["nodeName"]: p["metadata"]["uid"] for p in cluster.items("pods", RELEASE_NS, selector=HOLDER)}


def _tag_images(cluster: Cluster, tag: str) -> None:
    """Every node's containerd gets the e2e images under `tag` too (a "new" image: another
    name, so every pod of the release that uses it is replaced)."""
    ctr = find_tool("ctr")
    assert ctr and cluster.harness
    for node in cluster.harness["nodes"]:
        socket = RUN / node / "containerd.sock"
        for image in ("strata-server", "strata-operator"):
            cluster.run("ctr", "--address", str(socket), "-n", "k8s.io", "images", "tag", "--force",
                        f"localhost/{image}:e2e", f"localhost/{image}:{tag}")


def _kill_server(cluster: Cluster, plugin: Obj, reader_uid: str) -> str:
    """SIGKILL the `strata fuse` serving the reader's volume, inside the plugin container."""
    script = ("import os, signal\n"
              "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
              "    try:\n"
              "        argv = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
              "    except OSError:\n"
              "        continue\n"
              f"    if b'fuse' in argv and any(b'{reader_uid}' in a for a in argv):\n"
              "        os.kill(int(pid), signal.SIGKILL)\n"
              "        print(pid)\n")
    out = cluster.kubectl("exec", plugin["metadata"]["name"], "-n", RELEASE_NS, "-c", "node-plugin", "--",
                          "python3", "-c", script).split()
    assert len(out) == 1, f"expected one strata fuse process of the reader's volume, killed {out}"
    return out[0]


class HolderLog:
    """What the fuse-holder pod of the reader's node says about the reader's mount (its
    keepers log to the holder's output): which keepers held it, how often a server took it."""

    def __init__(self, cluster: Cluster, node: str, reader_uid: str) -> None:
        pods = [p for p in cluster.items("pods", RELEASE_NS, selector=HOLDER) if p["spec"]["nodeName"] == node]
        assert len(pods) == 1, f"fuse-holder pods on {node}: {[p['metadata']['name'] for p in pods]}"
        self.cluster, self.pod, self.reader_uid = cluster, pods[0]["metadata"]["name"], reader_uid

    def lines(self, word: str) -> list[str]:
        text = self.cluster.kubectl("logs", self.pod, "-n", RELEASE_NS)
        return [line for line in text.splitlines() if word in line and self.reader_uid in line]

    def takeovers(self) -> int:
        return len(self.lines(" serves "))


def _case(reader: Reader, holder: HolderLog, name: str, disrupt: Callable[[], object],
          recovered: Callable[[], object], stalls: dict[str, float]) -> None:
    takeovers = holder.takeovers()
    reader.exec("touch", "/tmp/reset")
    wait_until(lambda: reader.exec("sh", "-c", "test -e /tmp/reset || echo gone").strip() == "gone", timeout=60,
               what="the reader to take the reset")
    started = time.monotonic()
    disrupt()
    recovered()
    passes = reader.tally()["passes"]
    wait_until(lambda: reader.tally()["passes"] >= passes + PASSES_AFTER, timeout=CASE_TIMEOUT,
               what=f"the reader to read on after: {name}", diagnose=lambda: json.dumps(reader.tally()))
    tally = reader.check(name)
    # A new server took the mount over from the same keeper (the holder's child, started once).
    assert holder.takeovers() > takeovers, f"{name}: no new server took the reader's mount over"
    assert len(holder.lines(" holds ")) == 1, holder.lines(" holds ")
    stalls[name] = tally["case_stall"]
    print(f"\n{name}: back in {time.monotonic() - started:.1f}s; reader: {tally['passes']} passes so far, 0 errors, "
          f"longest stall {tally['case_stall']:.2f}s", flush=True)


@pytest.mark.disruptive
def test_a_readers_volume_survives_plugin_deletion_upgrade_and_server_kill(
        strata: Cluster, namespace: str, s3: dict[str, str], chart_dir: Path) -> None:
    if not strata.harness:
        pytest.skip("re-tags images in each node's containerd (harness only)")
    data = _store(s3)
    expected = hashlib.sha256(data).hexdigest()
    cc = cache_cluster()
    cc["spec"]["image"] = "localhost/strata-server:e2e"  # the upgrade below rolls the node plugin, not the servers
    strata.apply(cc, namespace)
    wait_ready(strata, namespace)
    strata.apply(_mount(s3), namespace)
    wait_until(lambda: strata.get("mount", "big", namespace).get("status", {}).get("phase") == "Mounted",
               timeout=120, what="Mount big phase Mounted")
    strata.apply(_reader(expected), namespace)
    strata.kubectl("wait", "--for=condition=Ready", "pod/reader", "-n", namespace, "--timeout=180s")
    reader = Reader(strata, namespace)
    wait_until(lambda: reader.tally()["passes"] >= PASSES_AFTER, timeout=180, what="the reader's first passes",
               diagnose=lambda: strata.describe_pods(namespace))
    node = reader.pod()["spec"]["nodeName"]
    reader_uid = reader.pod()["metadata"]["uid"]
    holders = _holders(strata)
    assert node in holders, f"no fuse-holder pod on {node}: {holders}"
    holder = HolderLog(strata, node, reader_uid)
    assert holder.takeovers() == 1 and len(holder.lines(" holds ")) == 1, holder.lines("")
    stalls: dict[str, float] = {}
    try:
        # 1: the node plugin pod is deleted (its container ends, every process in it).
        old = _plugin_on(strata, node)
        assert old is not None
        _case(reader, holder, "plugin pod deleted",
              lambda: strata.kubectl("delete", "pod", old["metadata"]["name"], "-n", RELEASE_NS, "--wait=false"),
              lambda: _new_plugin_ready(strata, node, old["metadata"]["uid"]), stalls)

        # 2: `helm upgrade` to a new image: the node plugin rolls, the holder stays.
        _tag_images(strata, NEXT_TAG)
        old = _plugin_on(strata, node)
        assert old is not None
        def upgrade() -> None:
            strata.run("helm", "upgrade", RELEASE, str(chart_dir), "-n", RELEASE_NS, *chart_args(strata),
                       "--set", f"image.tag={NEXT_TAG}", timeout=120)

        def rolled() -> None:
            plugin = _new_plugin_ready(strata, node, old["metadata"]["uid"])
            assert plugin["spec"]["containers"][0]["image"].endswith(f":{NEXT_TAG}")
            strata.kubectl("rollout", "status", f"daemonset/{RELEASE}-csi-node", "-n", RELEASE_NS, "--timeout=300s")

        _case(reader, holder, "helm upgrade to a new image", upgrade, rolled, stalls)
        assert _holders(strata) == holders, "the upgrade replaced a fuse-holder pod"

        # 3: the serving strata fuse process is SIGKILLed (the plugin starts another).
        plugin = _plugin_on(strata, node)
        assert plugin is not None
        _case(reader, holder, "strata fuse SIGKILLed",
              lambda: print(f"killed pid {_kill_server(strata, plugin, reader_uid)}"), lambda: None, stalls)
    finally:
        print(f"\nlongest reader stall per case: {json.dumps({k: round(v, 2) for k, v in stalls.items()})}")
        if not os.environ.get("STRATA_E2E_KEEP"):
            strata.kubectl("exec", "reader", "-n", namespace, "--", "touch", "/tmp/stop", check=False)
    wait_until(lambda: reader.pod()["status"].get("phase") in ("Succeeded", "Failed"), timeout=120,
               what="the reader to finish")
    final = json.loads(reader.pod()["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    assert final["errors"] == [] and final["mismatches"] == 0 and final["passes"] >= 4 * PASSES_AFTER, final
    print(f"reader: {final['passes']} passes of {SIZE >> 20} MiB, 0 errors, longest stall {final['max_stall']:.2f}s")
