"""Pods are containers a kubelet runs: `kubectl logs` shows what they print, `kubectl exec`
runs a command inside them, a memory limit is enforced by the kernel.

These hold on any real cluster (kind included).
"""

from __future__ import annotations

import json

import pytest

from kit import Cluster, python_pod, wait_until

pytestmark = pytest.mark.smoke


def running(cluster: Cluster, namespace: str, name: str) -> None:
    cluster.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", namespace, "--timeout=120s")


def test_kubectl_logs_and_exec_reach_the_container(cluster: Cluster, namespace: str) -> None:
    script = "import sys, time\nprint('hello from', sys.argv, flush=True)\ntime.sleep(3600)\n"
    pod = python_pod("talker", script)
    cluster.apply(pod, namespace)
    running(cluster, namespace, "talker")
    wait_until(lambda: "hello from" in cluster.kubectl("logs", "talker", "-n", namespace),
               timeout=30, what="the pod's output in `kubectl logs`")
    # A file written inside the container is there for the next exec, and nowhere else.
    cluster.kubectl("exec", "talker", "-n", namespace, "--", "sh", "-c", "echo inside > /tmp/mark")
    out = cluster.kubectl("exec", "talker", "-n", namespace, "--", "python3", "-c",
                            "import json, os; print(json.dumps({'mark': open('/tmp/mark').read(), "
                            "'pid1': open('/proc/1/cmdline').read().split(chr(0))[0], 'uid': os.getuid()}))")
    info = json.loads(out)
    assert info["mark"] == "inside\n"
    assert info["pid1"] in ("python3", "/pause"), info  # the container's own PID namespace
    proc = cluster.kubectl_result("exec", "talker", "-n", namespace, "--", "sh", "-c", "exit 7")
    assert proc.returncode == 7, "the exit status of the command comes back through exec"


def test_memory_limit_is_enforced_by_the_kernel(cluster: Cluster, namespace: str) -> None:
    """Allocating past the limit kills the container (OOMKilled), allocating under it does not."""
    script = ("import sys\nchunks = []\nfor i in range(int(sys.argv[1])):\n"
              "    chunks.append(bytearray(16 << 20))\n    print(i, flush=True)\n")
    for name, chunks in (("under", 4), ("over", 16)):
        pod = python_pod(name, script)
        pod["spec"]["containers"][0]["command"] += [str(chunks)]
        pod["spec"]["containers"][0]["resources"] = {"limits": {"memory": "128Mi"}, "requests": {"memory": "128Mi"}}
        cluster.apply(pod, namespace)

    def terminated(name: str) -> dict[str, object] | None:
        st = cluster.get("pod", name, namespace)["status"].get("containerStatuses", [{}])[0]
        t = st.get("state", {}).get("terminated")
        return dict(t) if t else None

    under = wait_until(lambda: terminated("under"), timeout=120, what="pod under to finish",
                       diagnose=lambda: cluster.describe_pods(namespace))
    over = wait_until(lambda: terminated("over"), timeout=120, what="pod over to finish",
                      diagnose=lambda: cluster.describe_pods(namespace))
    assert under["exitCode"] == 0, under
    assert over["reason"] == "OOMKilled" and over["exitCode"] == 137, over
