"""What stays cached on a worker: pins, frees, and the sweep of blocks unused longer than
their mount's TTL. Blocks of files written into the cache and not in the store yet are the
only copy of their bytes: they stay pinned and no sweep takes them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from strata.contract.proto import strata_pb2 as pb
from ..blockrefs import key_of
from ..cache.keys import WRITTEN_VERSION_PREFIX, BlockKey
from ..cache.store import BlockStore
from ..namespace.paths import is_under
from .mounts import WorkerMounts

__all__ = ["WRITTEN_VERSION_PREFIX", "Retention"]

# How often blocks unused longer than their mount's TTL are freed (at most), and how often
# the worker checks whether a sweep is due.
TTL_SWEEP_SECONDS = 30.0
TTL_TICK_SECONDS = 0.5


def matcher(mount_id: int, prefix: str, keep: Sequence[pb.BlockRef] = ()) -> Callable[[BlockKey], bool]:
    """Blocks of a mount below a prefix, except those of the files (path, version) in `keep`."""
    kept = {(ref.path, ref.version) for ref in keep}
    return lambda key: (key.mount_id == mount_id and (not prefix or is_under(key.path, prefix))
                        and (key.path, key.version) not in kept)


def mount_matcher(mount_id: int, held: set[str] | frozenset[str] = frozenset()) -> Callable[[BlockKey], bool]:
    """Blocks of a mount, except those whose ids are in `held`."""
    return lambda key: key.mount_id == mount_id and key.block_id not in held


class Retention:
    """Pins and frees of one worker's cached blocks."""

    def __init__(self, store: BlockStore, mounts: WorkerMounts) -> None:
        self._store = store
        self._mounts = mounts

    def free(self, request: pb.FreeBlocksRequest) -> int:
        """Free the blocks the request names; the bytes freed."""
        return self._store.free(matcher(request.mount_id, request.path_prefix, request.keep))

    def pin(self, request: pb.PinBlocksRequest) -> int:
        """Pin or unpin the blocks the request names (by ref, else by mount and prefix);
        how many blocks changed."""
        if request.blocks:
            ids = {key_of(ref).block_id for ref in request.blocks}
            return self._store.set_pinned(lambda key: key.block_id in ids, request.pinned)
        return self._store.set_pinned(matcher(request.mount_id, request.path_prefix, request.keep), request.pinned)

    async def release(self, refs: list[pb.BlockRef], keep_pinned: bool) -> None:
        """Release written blocks unless they stay pinned (their file lies under a pinned
        prefix). They live on this worker, the one that took the write (no call places
        block bytes on another worker), so they are released here only."""
        if not keep_pinned:
            self.pin(pb.PinBlocksRequest(blocks=refs, pinned=False))

    def unpersisted_written(self) -> set[str]:
        """Ids of pinned blocks of files written into the cache: the only copy of a file
        not in the store yet (or pinned by a user). A TTL sweep leaves them alone."""
        return {b.key.block_id for b in self._store.blocks()
                if b.pinned and b.key.written}

    def sweep_ttl(self, now: float | None = None) -> int:
        """Free the blocks unused longer than their mount's TTL; the bytes freed."""
        freed = 0
        now = time.time() if now is None else now
        held = self.unpersisted_written()
        for view in self._mounts.views():
            ttl = view.info.options.ttl_seconds
            if ttl > 0:
                freed += self._store.free_unused_since(now - ttl, mount_matcher(view.mount_id, held))
        return freed

    async def ttl_loop(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(TTL_TICK_SECONDS)
            # Sweep at least twice per TTL, so a block outlives its TTL by at most half of it.
            ttls = [v.info.options.ttl_seconds for v in self._mounts.views() if v.info.options.ttl_seconds > 0]
            if ttls and time.monotonic() - last >= min(TTL_SWEEP_SECONDS, min(ttls) / 2):
                last = time.monotonic()
                self.sweep_ttl()
