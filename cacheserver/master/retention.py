"""What the workers keep: blocks freed and pinned on every live worker, written files whose
cached blocks are the only copy left alone."""

from __future__ import annotations

from strata.contract.proto import strata_pb2 as pb
from ..namespace.tree import Namespace
from ..namespace.mounts import MountTable
from ..common.paths import received
from .mounting import Mounting
from .workerlink import WorkerLink


class Retention:
    """Free and SetPinned, sent to the workers."""

    def __init__(self, *, mounts: MountTable, namespace: Namespace, mounting: Mounting, link: WorkerLink) -> None:
        self.mounts = mounts
        self.namespace = namespace
        self.mounting = mounting
        self.link = link

    def _unpersisted_refs(self, path: str) -> list[pb.BlockRef]:
        """Written files at or below `path` whose cached blocks are the only copy: a free
        or an unpin must leave them alone."""
        return [pb.BlockRef(mount_id=e.mount_id, path=p, version=e.version) for p, e in self.namespace.unpersisted_below(path)]

    async def free(self, request: pb.FreeRequest) -> pb.FreeResponse:
        path = received(request.path)
        mount, _ = self.mounts.resolve(path)
        prefix = "" if path == mount.path else path
        freed = await self.link.free_blocks(mount.mount_id, prefix, keep=self._unpersisted_refs(path))
        return pb.FreeResponse(bytes_freed=freed)

    async def set_pinned(self, request: pb.SetPinnedRequest) -> pb.SetPinnedResponse:
        path = received(request.path)
        mount, _ = self.mounts.resolve(path)
        self.namespace.set_pinned(path, request.pinned)
        self.mounting.bump_table()
        keep = [] if request.pinned else self._unpersisted_refs(path)
        await self.link.broadcast(
            "pin", "PinBlocks", pb.PinBlocksRequest(mount_id=mount.mount_id, path_prefix=path, pinned=request.pinned, keep=keep)
        )
        return pb.SetPinnedResponse()
