"""Warm-up on a schedule, bounded: a Mount whose preload has `schedule: "* * * * *"` and a
bandwidth loads at each minute, status.preload tells lastRun and nextRun, a run after one
object changed in the store fetches only that object, and no load is faster than the limit
by more than 10% (the master's own start and end of each load, `strata report --json`)."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

import boto3
import pytest

from kit import Cluster, wait_until
from test_strata import (  # noqa: F401 - the module's fixtures (strata, s3) come with it
    _bucket,
    _master_report,
    _worker_metrics,
    _worker_pods,
    cache_cluster,
    s3,
    s3_mount,
    strata,
    wait_ready,
)

MiB = 1 << 20
LIMIT = 2 * MiB  # bytes a second; the e2e cluster's blocks are 1 MiB


def _files(version: str) -> dict[str, bytes]:
    return {f"set/part-{i}.bin": hashlib.sha256(f"{version}{i}".encode()).digest() * (2 * MiB // 32 + 1000 * i)
            for i in range(6)}


def _stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _run(cluster: Cluster, namespace: str) -> dict[str, Any]:
    preload = (cluster.get("mount", "data", namespace).get("status") or {}).get("preload") or {}
    return dict(preload, **{"lastRun": preload.get("lastRun") or {}})


def _finished_run_after(cluster: Cluster, namespace: str, start: str | None, timeout: float) -> dict[str, Any]:
    """status.preload once a run that started after `start` (None: any) has succeeded (the
    first load may fail when the master is ready before any worker registered: the operator
    loads again, with a backoff or at the next scheduled time)."""
    def ended() -> dict[str, Any] | None:
        preload = _run(cluster, namespace)
        run = preload["lastRun"]
        later = run.get("start") and (start is None or _stamp(run["start"]) > _stamp(start))
        return preload if later and run.get("result") == "Succeeded" else None
    found: dict[str, Any] = wait_until(ended, timeout=timeout, what=f"a preload run after {start} to succeed",
                                       diagnose=lambda: str(_run(cluster, namespace)))
    return found


def _load_rate(cluster: Cluster, namespace: str) -> tuple[int, float]:
    """The master's last load of /data: bytes fetched and bytes a second over its run."""
    mounts = _master_report(cluster, namespace).get("mounts", [])
    load = next(x for m in mounts for x in m.get("loads", []) if x.get("path") == "/data")
    seconds = (int(load["finishedUnixMs"]) - int(load["startedUnixMs"])) / 1000
    fetched = int(load.get("bytesFetched", 0))
    return fetched, fetched / seconds


def _store_bytes(cluster: Cluster, namespace: str) -> float:
    return sum(_worker_metrics(cluster, namespace, pod).get("strata_worker_ufs_bytes_read", 0.0)
               for pod in _worker_pods(cluster, namespace))


@pytest.mark.timeout(900)
def test_a_scheduled_preload_runs_each_minute_fetches_only_what_changed_within_its_bandwidth(
        strata: Cluster, namespace: str, s3: dict[str, str]) -> None:
    bucket = f"sched-{namespace[-5:]}"
    files = _files("v1")
    total = sum(map(len, files.values()))
    _bucket(s3, bucket, files)
    secret, mount = s3_mount(s3, bucket=bucket)
    mount["spec"]["preload"] = {"onCreate": True, "schedule": "* * * * *", "bandwidth": "2Mi"}
    strata.apply([cache_cluster(workers=2), secret, mount], namespace)
    wait_ready(strata, namespace)

    # The first load: everything, at the limit.
    first = _finished_run_after(strata, namespace, None, timeout=300)
    assert first["lastRun"]["bytesFetched"] == total, first
    fetched, rate = _load_rate(strata, namespace)
    print(f"first run: {fetched} bytes at {rate / MiB:.2f} MiB/s (limit {LIMIT / MiB:.0f} MiB/s)")
    assert fetched == total and rate <= 1.1 * LIMIT
    assert _stamp(first["nextRun"]).second == 0 and _stamp(first["nextRun"]) > _stamp(first["lastRun"]["start"])

    # The next minute's run: nothing changed, nothing fetched; it starts at its time.
    second = _finished_run_after(strata, namespace, first["lastRun"]["start"], timeout=150)
    started = _stamp(second["lastRun"]["start"])
    assert started.second <= 10, f"the run due at {started:%H:%M}:00 started at {started:%H:%M:%S}"
    assert second["lastRun"]["bytesFetched"] == 0, second
    assert _stamp(second["nextRun"]).second == 0 and _stamp(second["nextRun"]) > started
    assert _store_bytes(strata, namespace) == total

    # One object changes in the store: the next run fetches that object only.
    changed = {"set/part-3.bin": hashlib.sha256(b"v2").digest() * (MiB // 32 + 77)}
    boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1", aws_access_key_id=s3["key"],
                 aws_secret_access_key=s3["secret"]).put_object(Bucket=bucket, Key="set/part-3.bin",
                                                                Body=changed["set/part-3.bin"])
    third = _finished_run_after(strata, namespace, second["lastRun"]["start"], timeout=150)
    if third["lastRun"]["bytesFetched"] == 0:  # the object changed while that run was listing
        third = _finished_run_after(strata, namespace, third["lastRun"]["start"], timeout=150)
    fetched, rate = _load_rate(strata, namespace)
    print(f"run after one change: {third['lastRun']['bytesFetched']} bytes fetched "
          f"(the changed object: {len(changed['set/part-3.bin'])})")
    assert third["lastRun"]["bytesFetched"] == len(changed["set/part-3.bin"]), third
    assert rate <= 1.1 * LIMIT
    assert _store_bytes(strata, namespace) == total + len(changed["set/part-3.bin"])
