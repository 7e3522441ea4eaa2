"""What stays cached on a worker: pins, frees, the sweep of blocks unused longer than their
mount's TTL, and the sweep of blocks of mounts the master no longer knows (orphans). Blocks
of files written into the cache and not in the store yet are the only copy of their bytes:
they stay pinned and no sweep takes them.

Orphans: a master whose journal is lost (an emptyDir) forgets its mounts, and the operator
mounts the sources again under new ids; blocks of the old ids can never be read again (every
block is named by its mount id), yet they held capacity for good. A mount id that the master's
mount table has lacked for `orphanBlockGrace` seconds (asked afresh at each sweep) has its
blocks freed, except those holding writes never persisted: a master that answers without the
mount (started on an empty journal by mistake, its volume not attached yet) may come back with
it, and for a MUST_CACHE write those blocks are the only copy. They stay pinned and are named
in a warning. An ASYNC_THROUGH write's blocks are let go by its upload, once the master says
the file is gone or another, and are then freed with the rest."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from strata.contract.errors import StrataError
from strata.contract.proto import strata_pb2 as pb
from ..common.blockrefs import key_of
from ..common.keys import WRITTEN_VERSION_PREFIX, BlockKey
from ..cache.store import BlockStore
from ..common.paths import is_under
from .mounts import WorkerMounts

__all__ = ["WRITTEN_VERSION_PREFIX", "Retention"]

log = logging.getLogger(__name__)

# How often blocks unused longer than their mount's TTL are freed (at most), and how often
# the worker checks whether a sweep is due.
TTL_SWEEP_SECONDS = 30.0
TTL_TICK_SECONDS = 0.5
# How often the worker looks for blocks of mounts the master no longer knows (at most; half
# the grace when that is shorter). Each look asks the master for its mount table once.
ORPHAN_SWEEP_SECONDS = 30.0


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

    def __init__(self, store: BlockStore, mounts: WorkerMounts, *, orphan_grace: float = 900.0,
                 freed: Callable[[], None] = lambda: None) -> None:
        self._store = store
        self._mounts = mounts
        self._freed = freed  # told after a free (the node's data table lets its copies go)
        self._orphan_grace = orphan_grace
        # Mount ids of cached blocks, by when (time.monotonic()) a fresh mount table first
        # lacked them; an id the table has again is dropped.
        self._unknown_since: dict[int, float] = {}
        self._warned: set[int] = set()

    def free(self, request: pb.FreeBlocksRequest) -> int:
        """Free the blocks the request names; the bytes freed."""
        try:
            return self._store.free(matcher(request.mount_id, request.path_prefix, request.keep))
        finally:
            self._freed()

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

    async def sweep_orphans(self, now: float | None = None) -> int:
        """Free the blocks of mounts a fresh mount table has lacked for the orphan grace,
        except those holding writes never persisted (see the module docstring); the bytes
        freed. Nothing is judged while the master cannot be asked."""
        try:
            await self._mounts.refresh()
        except StrataError as exc:
            log.debug("orphan sweep skipped: %s", exc)
            return 0
        now = time.monotonic() if now is None else now
        known = self._mounts.known_ids()
        unknown = {b.key.mount_id for b in self._store.blocks()} - known
        self._unknown_since = {m: t for m, t in self._unknown_since.items() if m in unknown}
        self._warned &= unknown
        freed = 0
        for mount_id in sorted(unknown):
            since = self._unknown_since.setdefault(mount_id, now)
            if now - since < self._orphan_grace:
                continue
            held = self.unpersisted_written()
            gone = self._store.free(mount_matcher(mount_id, held))
            freed += gone
            if gone:
                log.info("freed %d bytes of mount id %d: the master has not known that mount for %.0fs "
                         "(orphanBlockGrace)", gone, mount_id, now - since)
            kept = [b for b in self._store.blocks() if b.key.mount_id == mount_id]
            if kept and mount_id not in self._warned:
                self._warned.add(mount_id)
                log.warning("kept %d blocks (%d bytes) of mount id %d, which the master has not known for %.0fs: "
                            "they hold writes never persisted (the master that took them lost its journal), "
                            "the only copy of their bytes", len(kept), sum(b.length for b in kept), mount_id,
                            now - since)
        return freed

    async def orphan_loop(self) -> None:
        interval = max(TTL_TICK_SECONDS, min(ORPHAN_SWEEP_SECONDS, self._orphan_grace / 2))
        while True:
            await asyncio.sleep(interval)
            await self.sweep_orphans()
