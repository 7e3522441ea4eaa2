"""`strata-operator uninstall` against an in-memory stand-in of the API server's deletion rules (an
object with finalizers is only marked deleted; it goes when the last finalizer is taken
off). The e2e suite runs it as the chart's pre-delete hook on a real cluster."""

from __future__ import annotations


from strata.operator import constants as c
from strata.operator.kube import Obj
from strata.operator.uninstall import uninstall


class Objects:
    """Mounts and CacheClusters with the API server's finalizer rules; `operator` says whether
    an operator is running (it finishes each deleted object by taking its finalizer off)."""

    def __init__(self, operator: bool) -> None:
        self.operator = operator
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.deleted: list[str] = []  # kinds in the order deletes arrived

    def add(self, kind: str, namespace: str, name: str, finalizers: list[str] | None = None) -> None:
        self.objects[(kind, namespace, name)] = {
            "apiVersion": c.API_VERSION, "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1",
                         "finalizers": [c.FINALIZER] if finalizers is None else finalizers}}

    def _settle(self) -> None:
        for key, obj in list(self.objects.items()):
            meta = obj["metadata"]
            if meta.get("deletionTimestamp") and self.operator:
                meta["finalizers"] = [f for f in meta["finalizers"] if f != c.FINALIZER]
            if meta.get("deletionTimestamp") and not meta["finalizers"]:
                del self.objects[key]

    async def list(self, api_version: str, kind: str, namespace: str) -> list[Obj]:
        self._settle()
        return [o for (k, ns, _), o in self.objects.items() if k == kind and namespace in ("", ns)]

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        self.deleted.append(kind)
        self.objects[(kind, namespace, name)]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"

    async def drop_finalizer(self, obj: Obj, finalizer: str) -> None:
        meta = self.objects[(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])]["metadata"]
        meta["finalizers"] = [f for f in meta["finalizers"] if f != finalizer]
        self._settle()


def _world(operator: bool) -> Objects:
    world = Objects(operator)
    for ns in ("a", "b"):
        world.add(c.CACHE_CLUSTER_KIND, ns, "demo")
        world.add(c.MOUNT_KIND, ns, "data")
    return world


async def test_with_the_operator_running_everything_goes_mounts_first() -> None:
    world = _world(operator=True)
    assert await uninstall(world, [], timeout=5, poll=0.01) == []
    assert world.objects == {}
    assert world.deleted == [c.MOUNT_KIND] * 2 + [c.CACHE_CLUSTER_KIND] * 2


async def test_without_the_operator_it_ends_by_dropping_the_finalizer_and_keeps_others() -> None:
    world = _world(operator=False)
    world.add(c.MOUNT_KIND, "a", "held", finalizers=[c.FINALIZER, "example.com/keep"])
    dropped = await uninstall(world, [], timeout=0.05, poll=0.01)
    assert sorted(dropped) == ["CacheCluster a/demo", "CacheCluster b/demo", "Mount a/data", "Mount a/held",
                               "Mount b/data"]
    # Someone else's finalizer is theirs to take off: that object stays, marked deleted.
    assert list(world.objects) == [(c.MOUNT_KIND, "a", "held")]
    assert world.objects[(c.MOUNT_KIND, "a", "held")]["metadata"]["finalizers"] == ["example.com/keep"]


async def test_only_the_given_namespaces() -> None:
    world = _world(operator=True)
    world.add(c.MOUNT_KIND, "other", "x")

    async def list_in(api_version: str, kind: str, namespace: str) -> list[Obj]:
        assert namespace in ("a", "b"), namespace
        return await Objects.list(world, api_version, kind, namespace)

    world.list = list_in  # type: ignore[method-assign]
    await uninstall(world, ["a", "b"], timeout=5, poll=0.01)
    assert list(world.objects) == [(c.MOUNT_KIND, "other", "x")]
