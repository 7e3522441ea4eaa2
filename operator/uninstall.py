"""`strata-operator uninstall`: delete every Mount and CacheCluster the operator manages and
wait until they are gone, so an uninstall ends.

The chart runs it as a pre-delete hook, while the operator still runs: Mounts go first (each
unmounts and frees its blocks while its master is there), then CacheClusters (their masters,
workers and Services go with them). Without it, `helm uninstall` removes the operator and
every object it manages then waits forever on the operator's finalizer, and so does deleting
the CRDs. Whatever is left after `timeout` (the operator is not running, or cannot finish)
has the finalizer taken off, and the API server deletes it at once; the cache only holds
copies, so nothing of the stores' data is lost either way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from strata.operator import constants as c
from strata.operator.kube import Obj

log = logging.getLogger(__name__)

# The kinds in the order they are deleted.
KINDS = (c.MOUNT_KIND, c.CACHE_CLUSTER_KIND)
POLL = 1.0  # seconds between looks while waiting


class Deleter(Protocol):
    """What the uninstall needs from the API server."""

    async def list(self, api_version: str, kind: str, namespace: str) -> list[Obj]: ...

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None: ...

    async def drop_finalizer(self, obj: Obj, finalizer: str) -> None: ...


async def _objects(kube: Deleter, kind: str, namespaces: Sequence[str]) -> list[Obj]:
    found: list[Obj] = []
    for namespace in namespaces or [""]:  # "": every namespace
        found += await kube.list(c.API_VERSION, kind, namespace)
    return found


def _name(obj: Obj) -> str:
    return f"{obj['kind']} {obj['metadata']['namespace']}/{obj['metadata']['name']}"


async def uninstall(kube: Deleter, namespaces: Sequence[str], timeout: float, poll: float = POLL) -> list[str]:
    """Delete each kind in turn and wait (up to `timeout` in all) for its objects to be gone;
    return the names of those whose finalizer had to be dropped."""
    deadline = time.monotonic() + timeout
    dropped: list[str] = []
    for kind in KINDS:
        for obj in await _objects(kube, kind, namespaces):
            if not obj["metadata"].get("deletionTimestamp"):
                log.info("deleting %s", _name(obj))
                await kube.delete(c.API_VERSION, kind, obj["metadata"]["namespace"], obj["metadata"]["name"])
        while (left := await _objects(kube, kind, namespaces)) and time.monotonic() < deadline:
            await asyncio.sleep(poll)
        for obj in left:
            log.warning("%s still waits for the operator after %.0fs: dropping its finalizer", _name(obj), timeout)
            await kube.drop_finalizer(obj, c.FINALIZER)
            dropped.append(_name(obj))
    return dropped
