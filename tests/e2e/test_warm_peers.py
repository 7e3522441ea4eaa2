"""A preloaded dataset read by pods on the workers' own nodes is served from the cache, not
fetched from the store again: a worker that misses a block another worker holds copies it
from that worker. Store bytes are summed from every worker's /metrics."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kit import Cluster, wait_until
from test_strata import (  # noqa: F401 - the module's fixtures (strata, s3) come with it
    _big_file,
    _bucket,
    _finished,
    _reader_pod,
    _worker_metrics,
    _worker_pods,
    cache_cluster,
    s3,
    s3_mount,
    strata,
    wait_ready,
)

Obj = dict[str, Any]


def _summed(cluster: Cluster, namespace: str, name: str) -> float:
    return sum(_worker_metrics(cluster, namespace, pod).get(name, 0) for pod in _worker_pods(cluster, namespace))


def _read_on(cluster: Cluster, namespace: str, names: list[str], nodes: list[str], files: dict[str, bytes]) -> None:
    """Reader pods, one per name, on the given nodes, all at once; each checks every file."""
    for name, node in zip(names, nodes, strict=True):
        pod = _reader_pod(name, sorted(files), {"strata.dev/locality": "disabled"})
        pod["spec"]["nodeName"] = node
        cluster.apply(pod, namespace)
    for name in names:
        out = json.loads(_finished(cluster, namespace, name)["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
        for key, body in files.items():
            assert out[key] == hashlib.sha256(body).hexdigest(), (name, key)


def preloaded_dataset(cluster: Cluster, namespace: str, s3: dict[str, str], name: str,
                      tiers: list[Obj] | None = None) -> dict[str, bytes]:
    """16 files of 2 MiB (1 MiB blocks) in bucket `e2e-<name>`, mounted with a preload on a
    cluster of 3 workers (the fixture's tiers unless `tiers` are given) once all of them
    serve, so each holds its share, and once the preload has cached the whole dataset; the
    files by key."""
    files = {f"{name}/part-{i:02d}.bin": _big_file(2 << 20, f"{name}{i}") for i in range(16)}
    _bucket(s3, f"e2e-{name}", files)
    secret, mount = s3_mount(s3, bucket=f"e2e-{name}")
    mount["spec"]["preload"] = {"onCreate": True}
    cc = cache_cluster(workers=3)
    if tiers is not None:
        cc["spec"]["tiers"] = tiers
    cluster.apply(cc, namespace)
    wait_ready(cluster, namespace)
    cluster.apply([secret, mount], namespace)

    def preloaded() -> Obj | None:
        m = cluster.get("mount", "data", namespace)
        status = m.get("status") or {}
        done = status.get("preload", {}).get("phase") == "Succeeded"
        return m if done and status.get("cache", {}).get("cachedPercentage") == 100 else None

    wait_until(preloaded, timeout=300, what="the preload to succeed with the whole dataset cached",
               diagnose=lambda: json.dumps(cluster.get("mount", "data", namespace).get("status"), indent=1))
    return files


def test_pods_on_every_worker_node_read_a_preloaded_dataset_with_no_store_bytes(
    strata: Cluster, namespace: str, s3: dict[str, str]  # noqa: F811
) -> None:
    files = preloaded_dataset(strata, namespace, s3, "warm")
    size = sum(map(len, files.values()))
    loaded = _summed(strata, namespace, "strata_worker_ufs_bytes_read")
    assert loaded >= size, f"the preload read {loaded} bytes of a {size}-byte dataset"
    nodes = sorted({p["spec"]["nodeName"] for p in _worker_pods(strata, namespace)})
    assert len(nodes) >= 2, f"the workers run on {nodes}: the test needs them on two nodes or more"
    # Two readers on each worker's node at once, each reading through its node's worker,
    # which holds only part of the dataset.
    _read_on(strata, namespace, [f"reader-{i}" for i in range(2 * len(nodes))], nodes * 2, files)
    assert _summed(strata, namespace, "strata_worker_ufs_bytes_read") == loaded, "the warm dataset was fetched again"
    copied = _summed(strata, namespace, "strata_worker_peer_bytes_read")
    # Each node's worker copies at most the part it did not hold after the preload, once.
    assert 0 < copied <= size * (len(nodes) - 1), f"{copied} bytes copied between workers for a {size}-byte dataset"
    print(f"\n{len(nodes)} worker nodes, dataset {size >> 20} MiB: store bytes after the preload 0, "
          f"copied between workers {copied / 2**20:.1f} MiB")
