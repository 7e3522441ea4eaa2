"""The hand-off of a leaving worker's hot blocks: before a worker the operator scaled in
exits, the blocks it holds that no other live worker holds go to the workers that own them
once it is gone (placement over the workers that stay), the most recently read first, within
a time and a bandwidth budget, while it still serves reads.

The owners copy each block from this worker as they copy any block another worker holds
(they ask the master where it is, then read it checked in transit): the blocks are handed
over as blocks "not in the store", so a copy that fails is never fetched from the store
instead (the hand-off never costs the store a byte). A worker killed without warning loses
only its own blocks, as before.

Whether it leaves is asked of the master at the stop, and asked again for a few seconds
(`HandoffSettings.notice_seconds`) while the answer is no: the operator tells the master that
a drained node's worker leaves as the node is cordoned, at about the time the worker is
evicted.

A worker that stops without leaving (a restart, a rolling update) hands nothing off: it keeps its disk tiers' blocks where they are, and moves the blocks of its MEM tier
(lost with the process) to a disk tier within the same budget, the most recently read first
(BlockStore.keep_memory).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import grpc
from strata.contract.errors import StrataError
from strata.contract.proto import strata_pb2 as pb
from ..common.blockrefs import ref_of
from ..cache.index import CachedBlock
from ..cache.store import BlockStore
from ..placement import rank_workers
from .masterlink import MasterLink
from .peers import Peers
from .settings import HandoffSettings

log = logging.getLogger(__name__)

# Blocks asked about in one LocateBlocks call (the master takes up to 256).
LOCATE_BATCH = 256
# Blocks one owner is asked to copy in one CacheBlocks call: a block that fails fails its
# batch, so batches are small.
COPY_BATCH = 8
# Seconds the worker list may take to refresh before the hand-off starts.
REFRESH_TIMEOUT = 2.0
# Seconds between two questions whether this worker leaves (HandoffSettings.notice_seconds).
NOTICE_POLL = 0.25


@dataclass
class HandoffResult:
    """What a hand-off did."""

    blocks: int = 0         # handed to their owners
    bytes: int = 0
    held_elsewhere: int = 0  # blocks another live worker holds already: left alone
    failed: int = 0         # blocks an owner did not copy (an error, the deadline)
    left: int = 0           # blocks not handed off for lack of time


class Handoff:
    """Hands a leaving worker's blocks to their owners among the workers that stay."""

    def __init__(self, store: BlockStore, peers: Peers, link: MasterLink, *, worker_id: str,
                 settings: HandoffSettings | None = None) -> None:
        self._store = store
        self._peers = peers
        self._link = link
        self._worker_id = worker_id
        self.settings = settings or HandoffSettings()

    async def run(self) -> HandoffResult | None:
        """Hand off what the budget allows if this worker leaves the cluster (the master lists
        it decommissioning); else (or when no worker stays) keep its MEM blocks on its disk
        tiers, and return None. Never raises: the worker's exit must not wait on a failed
        hand-off."""
        if self.settings.seconds <= 0:
            return None
        deadline = time.monotonic() + self.settings.seconds
        staying = await self._staying()
        if not staying:
            moved = await self._store.keep_memory(deadline)
            if moved:
                log.info("moved %d block(s) of the MEM tier to a disk tier before exiting", moved)
            return None
        result = HandoffResult()
        started = time.monotonic()
        hottest = sorted(self._store.blocks(), key=lambda b: b.last_access, reverse=True)
        for at in range(0, len(hottest), LOCATE_BATCH):
            if time.monotonic() >= deadline:
                result.left += len(hottest) - at
                break
            await self._hand(hottest[at:at + LOCATE_BATCH], staying, deadline, started, result)
        log.info("handed off %d cached block(s) (%d bytes) to the workers that stay in %.1fs; %d held elsewhere "
                 "already, %d not copied, %d left for lack of time", result.blocks, result.bytes,
                 time.monotonic() - started, result.held_elsewhere, result.failed, result.left)
        return result

    async def _staying(self) -> dict[str, pb.WorkerInfo]:
        """The workers that stay, by id, if this one leaves the cluster; empty if it does not
        (or the master does not say)."""
        asked_until = time.monotonic() + self.settings.notice_seconds
        while True:
            try:
                await asyncio.wait_for(self._peers.refresh(), REFRESH_TIMEOUT)
            except (StrataError, TimeoutError) as exc:
                log.warning("not handing off cached blocks: the master did not list the workers (%s)", exc)
                return {}
            listed = self._peers.listed()
            me = next((w for w in listed if w.worker_id == self._worker_id), None)
            if me is None:
                return {}
            if me.decommissioning:
                break
            if time.monotonic() >= asked_until:
                return {}  # a restart: its disk tiers keep their blocks
            await asyncio.sleep(NOTICE_POLL)
        staying = {w.worker_id: w for w in listed if w.worker_id != self._worker_id and not w.decommissioning}
        if not staying:
            log.warning("not handing off cached blocks: no worker stays in the cluster")
        return staying

    async def _hand(self, blocks: list[CachedBlock], staying: dict[str, pb.WorkerInfo], deadline: float,
                    started: float, result: HandoffResult) -> None:
        """Hand one batch of blocks to their owners: those no other live worker holds."""
        refs = [handed_ref(b) for b in blocks]
        try:
            located = await self._link.client.locate_blocks(
                refs, timeout=max(0.1, deadline - time.monotonic()), what="the holders of the blocks to hand off")
        except StrataError as exc:
            log.warning("could not ask the master where %d block(s) are: %s", len(refs), exc)
            result.failed += len(refs)
            return
        by_owner: dict[str, list[tuple[pb.BlockRef, int]]] = {}
        for block, ref, where in zip(blocks, refs, located):
            if any(w != self._worker_id for w in where.worker_ids):
                result.held_elsewhere += 1
                continue
            owner = rank_workers(block.key.block_id, staying)[0]
            by_owner.setdefault(owner, []).append((ref, block.length))
        await asyncio.gather(*(self._copy(staying[owner], batch[i:i + COPY_BATCH], deadline, started, result)
                               for owner, batch in by_owner.items() for i in range(0, len(batch), COPY_BATCH)))

    async def _copy(self, owner: pb.WorkerInfo, batch: list[tuple[pb.BlockRef, int]], deadline: float,
                    started: float, result: HandoffResult) -> None:
        """Have `owner` copy a few blocks from this worker, at the budget's pace."""
        size = sum(length for _, length in batch)
        # The bandwidth budget: a batch is sent once the time its bytes and those of the
        # batches before it take at that rate has passed (never faster than the rate).
        result.bytes += size  # reserved now: the batches run side by side
        send_at = started + result.bytes / self.settings.bytes_per_second
        if send_at >= deadline:
            result.bytes -= size
            result.left += len(batch)
            return
        await asyncio.sleep(max(0.0, send_at - time.monotonic()))
        remaining = deadline - time.monotonic()
        request = pb.CacheBlocksRequest(blocks=[ref for ref, _ in batch])
        try:
            await self._peers.stub(owner).CacheBlocks(request, timeout=remaining)
        except grpc.RpcError as exc:
            result.bytes -= size
            result.failed += len(batch)
            log.info("worker %s did not take %d handed-off block(s): %s", owner.worker_id, len(batch),
                     exc.details() if hasattr(exc, "details") else exc)
            return
        result.blocks += len(batch)


def handed_ref(block: CachedBlock) -> pb.BlockRef:
    """The ref an owner copies `block` by: the file's length is said to end with the block
    (which gives the block its length), and the block is said not to be in the store, so the
    owner copies it from a worker holding it or not at all."""
    ref = ref_of(block.key)
    ref.file_length = block.key.index * block.key.block_size + block.key.length
    ref.in_store = False
    return ref
