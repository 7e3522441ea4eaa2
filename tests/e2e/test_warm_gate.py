"""Jobs start warm: a pod whose Strata volume asks for it (`warmPercent`) is held by the
scheduling gate strata.dev/warm until the cache holds that share of the volume's data, then
released by the operator; a pod whose data cannot get warm starts at its `warmTimeout`, with
a Warning Event. The store sits behind a proxy that slows (or stops) its answers, so the
warm-up takes a while and the test watches it; the cached share is the master's Report of
the Mount (`strata report --json` in the master's container), read while the pod is held
and right after it is scheduled."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime
from typing import Any
from urllib.parse import urlparse

from storeproxy import StoreProxy

from kit import Cluster, python_pod, wait_until
from test_strata import (  # noqa: F401 - the module's fixtures (strata, s3) come with it
    _big_file,
    _bucket,
    _master_report,
    cache_cluster,
    s3,
    s3_mount,
    strata,
    wait_ready,
)

Obj = dict[str, Any]
GATE = "strata.dev/warm"


def _gated_reader(name: str, files: dict[str, bytes], **attributes: str) -> Obj:
    """A pod that reads every file of the `data` Mount and reports their sha256; its volume
    asks to start warm with `attributes`."""
    script = ("import hashlib, json\n"
              "out = {p: hashlib.sha256(open('/data/' + p, 'rb').read()).hexdigest() for p in %r}\n"
              "open('/dev/termination-log', 'w').write(json.dumps(out))\n" % sorted(files))
    pod = python_pod(name, script)
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data", "readOnly": True}]
    pod["spec"]["volumes"] = [{"name": "data", "csi": {"driver": "csi.strata.dev", "readOnly": True,
                                                      "volumeAttributes": {"mount": "data", **attributes}}}]
    return pod


def _cached_percent(cluster: Cluster, namespace: str, size: int) -> float:
    """How much of the dataset the cache holds now, as the master reports it."""
    mounts = _master_report(cluster, namespace).get("mounts", [])
    cached = sum(int(m.get("cachedBytes", 0)) for m in mounts if m.get("mount", {}).get("path") == "/data")
    return 100.0 * cached / size


def _scheduled(pod: Obj) -> bool:
    return bool(pod["spec"].get("nodeName"))


def _stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _scheduled_after(pod: Obj) -> float:
    """Seconds from the pod's creation to the scheduler's placing it (PodScheduled)."""
    cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled" and c["status"] == "True")
    return (_stamp(cond["lastTransitionTime"]) - _stamp(pod["metadata"]["creationTimestamp"])).total_seconds()


def _pod_events(cluster: Cluster, namespace: str, pod: str) -> list[Obj]:
    return [e for e in cluster.items("events", namespace)
            if e.get("involvedObject", {}).get("kind") == "Pod" and e["involvedObject"].get("name") == pod]


def _mounted_behind(cluster: Cluster, namespace: str, s3: dict[str, str], proxy: StoreProxy, bucket: str) -> None:
    secret, mount = s3_mount({**s3, "endpoint": proxy.endpoint_url}, bucket=bucket)
    cluster.apply([cache_cluster(workers=2), secret, mount], namespace)
    wait_ready(cluster, namespace)
    wait_until(lambda: cluster.get("mount", "data", namespace).get("status", {}).get("phase") == "Mounted",
               timeout=120, what="Mount data phase Mounted")


def _proxy(s3: dict[str, str]) -> StoreProxy:
    store = urlparse(s3["endpoint"])
    return StoreProxy(target_port=int(store.port or 80), target_host=str(store.hostname), host=str(store.hostname))


def test_a_gated_pod_starts_only_once_its_data_is_warm(strata: Cluster, namespace: str, s3: dict[str, str]) -> None:  # noqa: F811
    files = {f"set/part-{i:02d}.bin": _big_file(1 << 20, f"gate{i}") for i in range(24)}  # one 1Mi block each
    size = sum(map(len, files.values()))
    _bucket(s3, "e2e-gate", files)
    proxy = _proxy(s3)
    try:
        _mounted_behind(strata, namespace, s3, proxy, "e2e-gate")
        assert _cached_percent(strata, namespace, size) == 0
        with proxy.slowed(1.0):  # each store answer waits 1 s: the warm-up takes a while
            strata.apply(_gated_reader("job", files, warmPercent="60", warmTimeout="10m"), namespace)
            pod = strata.get("pod", "job", namespace)
            assert {"name": GATE} in (pod["spec"].get("schedulingGates") or []), pod["spec"].get("schedulingGates")
            held: list[float] = []
            started = time.monotonic()
            while not _scheduled(pod := strata.get("pod", "job", namespace)):
                assert time.monotonic() - started < 300, f"the pod is still held; cached while held: {held}"
                held.append(_cached_percent(strata, namespace, size))
                time.sleep(0.5)
            at_start = _cached_percent(strata, namespace, size)
        assert held and min(held) < 60, f"the pod was never held while its data was cold: {held}"
        assert at_start >= 60, f"the pod was scheduled with {at_start:.1f}% of its data cached (wanted 60%)"
        assert not any(g["name"] == GATE for g in pod["spec"].get("schedulingGates") or [])
        wait_until(lambda: strata.get("pod", "job", namespace)["status"].get("phase") in ("Succeeded", "Failed"),
                   timeout=180, what="the job to finish", diagnose=lambda: strata.describe_pods(namespace))
        done = strata.get("pod", "job", namespace)
        state = done["status"]["containerStatuses"][0]["state"]["terminated"]
        assert state["exitCode"] == 0, state
        out = json.loads(state["message"])
        assert all(out[k] == hashlib.sha256(v).hexdigest() for k, v in files.items())
        warmed = [e for e in _pod_events(strata, namespace, "job") if e["reason"] == "WarmedUp"]
        assert warmed and warmed[0]["type"] == "Normal" and "(wanted 60%)" in warmed[0]["message"], warmed
        print(f"\nheld {len(held)} checks over {_scheduled_after(done):.1f}s while {min(held):.1f}..{max(held):.1f}% "
              f"was cached; scheduled with {at_start:.1f}% cached (wanted 60%)")
    finally:
        proxy.stop()


def test_a_pod_whose_data_cannot_get_warm_starts_at_its_timeout_with_a_warning(
    strata: Cluster, namespace: str, s3: dict[str, str]  # noqa: F811
) -> None:
    files = {f"set/part-{i:02d}.bin": _big_file(1 << 20, f"cold{i}") for i in range(4)}
    _bucket(s3, "e2e-cold", files)
    proxy = _proxy(s3)
    try:
        _mounted_behind(strata, namespace, s3, proxy, "e2e-cold")
        with proxy.hanging():  # the store stops answering: nothing can be loaded
            pod = python_pod("job", "print('started')")
            pod["spec"]["volumes"] = [{"name": "data", "csi": {"driver": "csi.strata.dev", "readOnly": True,
                                                              "volumeAttributes": {"mount": "data", "warmPercent": "100",
                                                                                   "warmTimeout": "20s"}}}]
            strata.apply(pod, namespace)
            assert {"name": GATE} in (strata.get("pod", "job", namespace)["spec"].get("schedulingGates") or [])
            pod = wait_until(lambda: (p := strata.get("pod", "job", namespace)) and _scheduled(p) and p,
                             timeout=120, what="the pod to be released at its timeout",
                             diagnose=lambda: json.dumps(strata.get("pod", "job", namespace), indent=1))
        waited = _scheduled_after(pod)
        assert 20 <= waited <= 60, f"scheduled {waited:.1f}s after its creation (warmTimeout 20s)"
        events = wait_until(lambda: [e for e in _pod_events(strata, namespace, "job") if e["reason"] == "WarmUpTimedOut"],
                            timeout=30, what="the pod's WarmUpTimedOut Event")
        assert events[0]["type"] == "Warning" and "warmTimeout 20s" in events[0]["message"], events
        print(f"\nreleased {waited:.1f}s after creation (warmTimeout 20s): {events[0]['message']}")
    finally:
        proxy.stop()
