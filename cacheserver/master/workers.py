"""Workers as the master hears them: registrations, heartbeats with their block reports,
the operator's decommissioning, and expiry of the silent ones."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from google.protobuf.message import Message

from strata.contract.errors import InvalidArgument
from strata.contract.proto import strata_pb2 as pb
from .. import heap
from ..common.pacing import between_steps
from .blocks import STEP, BlockIndex
from .membership import Membership
from .mounting import Mounting
from .workerlink import WorkerLink
from .writes import Writes

log = logging.getLogger(__name__)

Kept = TypeVar("Kept", bound=Message)

# A worker's block list goes into the index STEP blocks at a time: workers' full reports (a
# restarted master hears every worker's at once, up to 4 MiB of refs each) then hold no
# heartbeat behind them: at 25 workers of 10,000 blocks, whole reports applied at once held
# heartbeats past the worker timeout and the master dropped workers that were alive.
# A full list of at least this many blocks gives the allocator's free pages back after it.
TRIM_AFTER_BLOCKS = 10_000


class Workers:
    """The membership RPCs over the membership, the block index and the writes of each run."""

    def __init__(self, *, membership: Membership, blocks: BlockIndex, writes: Writes, mounting: Mounting,
                 link: WorkerLink) -> None:
        self.membership = membership
        self.blocks = blocks
        self.writes = writes
        self.mounting = mounting
        self.link = link
        # The run of each worker process last registered (RegisterWorkerRequest.incarnation).
        self._incarnations: dict[str, str] = {}
        self._index_locks: dict[str, asyncio.Lock] = {}  # by worker id (as few as the workers)
        # Full lists are taken in one at a time: a hundred taken side by side, step by step,
        # put a hundred steps ahead of every heartbeat (1.5 s and more on a busy master).
        self._full_lists = asyncio.Lock()
        # Workers whose registrations wait here (by id, how many): a worker sends no heartbeat
        # until its registration is answered, and a restarted master's storm of full lists
        # kept the last ones waiting past the heartbeat timeout.
        self._registering: Counter[str] = Counter()

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerResponse:
        info = request.worker
        if not info.worker_id or not info.address:
            raise InvalidArgument("RegisterWorker: worker_id and address are required")
        previous = self._incarnations.get(info.worker_id)
        self._incarnations[info.worker_id] = request.incarnation
        if previous is not None and previous != request.incarnation:
            self.writes.end_writes_of(info.worker_id)
        self.membership.register(_own(info), _own(request.stats), incarnation=request.incarnation,
                                 stopping=request.stopping)
        self._registering[info.worker_id] += 1
        try:
            async with self._indexing(info.worker_id), self._full_lists:
                await _stepwise(self.blocks.dropping(info.worker_id))
                await _in_steps(self.blocks.add, info.worker_id, request.blocks)
        finally:
            self._registering[info.worker_id] -= 1
            if not self._registering[info.worker_id]:
                del self._registering[info.worker_id]
        self.membership.heard(info.worker_id)
        if len(request.blocks) >= TRIM_AFTER_BLOCKS and not self._registering:
            # The last of a run of large lists (none waits: a lock just released still looks
            # free before its next holder runs, so a storm trimmed after each list; with one
            # trim, two storms of 100 workers dropped none, 2 before): their memory is free, but the
            # allocator keeps its pages unless asked (measured at 100 workers' lists of 10,000
            # blocks: ~270-390 B of resident memory a block without, the index holding ~150).
            await asyncio.to_thread(heap.trim)
        log.info("worker %s registered at %s (host %s, %d blocks)", info.worker_id, info.address, info.host, len(request.blocks))
        return pb.RegisterWorkerResponse(mount_table_version=self.mounting.table_version)

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        if not self.membership.heartbeat(request.worker_id, _own(request.stats), stopping=request.stopping):
            return pb.HeartbeatResponse(reregister=True, mount_table_version=self.mounting.table_version)
        if request.added or request.removed:
            # Only changes wait for the worker's index changes before them (its full list, a
            # drop): an answer held back there holds back the worker's next heartbeat, and a
            # restarted master's storm of full lists made live workers look silent.
            async with self._indexing(request.worker_id):
                await _in_steps(self.blocks.add, request.worker_id, request.added)
                await _in_steps(self.blocks.remove, request.worker_id, request.removed)
        return pb.HeartbeatResponse(mount_table_version=self.mounting.table_version)

    async def list_workers(self, request: pb.ListWorkersRequest) -> pb.ListWorkersResponse:
        return pb.ListWorkersResponse(workers=[self.membership.to_proto(r) for r in self.membership.live()])

    async def decommission_workers(self, request: pb.DecommissionWorkersRequest) -> pb.DecommissionWorkersResponse:
        serving = self.membership.serve(w for w in request.serving if w not in request.worker_ids)
        if serving:
            log.info("workers %s are wanted again: out of decommissioning (a run of them still stopping "
                     "stays out of placement)", ", ".join(serving))
        leaving = self.membership.decommission(request.worker_ids)
        if leaving:
            log.info("decommissioning workers %s", ", ".join(leaving))
        return pb.DecommissionWorkersResponse()

    async def expire_workers(self) -> None:
        for worker_id in self.membership.expire(registering=self._registering):
            log.warning("worker %s stopped heartbeating; dropped from placement", worker_id)
            self.link.drop(worker_id)
            async with self._indexing(worker_id):
                await _stepwise(self.blocks.dropping(worker_id))

    def _indexing(self, worker_id: str) -> asyncio.Lock:
        """One worker's changes to the block index, one after the other: its registration's
        drop and full list are not interleaved with an expiry's drop of the same worker."""
        lock = self._index_locks.get(worker_id)
        if lock is None:
            lock = self._index_locks[worker_id] = asyncio.Lock()
        return lock


def _own(message: Kept) -> Kept:
    """A copy of a part of a request, to keep: the part itself keeps the whole request's memory
    (protobuf's arena) for as long as it is held. A worker's registration kept this way held its
    block list, ~1.4 MiB for 10,000 blocks, for as long as the worker was known (measured with
    bench/workers_scale.py: ~150 B of resident memory a cached block)."""
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


async def _stepwise(steps: Iterator[None]) -> None:
    for _ in steps:
        await between_steps()


async def _in_steps(apply: Callable[[str, Sequence[pb.BlockRef]], None], worker_id: str,
                    refs: Sequence[pb.BlockRef]) -> None:
    """`apply` (the index's add or remove) to `refs`, STEP at a time, letting the event
    loop serve what waits between steps."""
    for at in range(0, len(refs), STEP):
        if at:
            await between_steps()
        apply(worker_id, refs[at:at + STEP])
