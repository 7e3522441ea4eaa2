"""Workers as the master hears them: registrations, heartbeats with their block reports,
the operator's decommissioning, and expiry of the silent ones."""

from __future__ import annotations

import logging

from strata.contract.errors import InvalidArgument
from strata.contract.proto import strata_pb2 as pb
from .blocks import BlockIndex
from .membership import Membership
from .mounting import Mounting
from .workerlink import WorkerLink
from .writes import Writes

log = logging.getLogger(__name__)


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

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerResponse:
        info = request.worker
        if not info.worker_id or not info.address:
            raise InvalidArgument("RegisterWorker: worker_id and address are required")
        previous = self._incarnations.get(info.worker_id)
        self._incarnations[info.worker_id] = request.incarnation
        if previous is not None and previous != request.incarnation:
            self.writes.end_writes_of(info.worker_id)
        self.membership.register(info, request.stats, incarnation=request.incarnation, stopping=request.stopping)
        self.blocks.drop_worker(info.worker_id)
        self.blocks.add(info.worker_id, request.blocks)
        log.info("worker %s registered at %s (host %s, %d blocks)", info.worker_id, info.address, info.host, len(request.blocks))
        return pb.RegisterWorkerResponse(mount_table_version=self.mounting.table_version)

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        if not self.membership.heartbeat(request.worker_id, request.stats, stopping=request.stopping):
            return pb.HeartbeatResponse(reregister=True, mount_table_version=self.mounting.table_version)
        self.blocks.add(request.worker_id, request.added)
        self.blocks.remove(request.worker_id, request.removed)
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

    def expire_workers(self) -> None:
        for worker_id in self.membership.expire():
            log.warning("worker %s stopped heartbeating; dropped from placement", worker_id)
            self.blocks.drop_worker(worker_id)
            self.link.drop(worker_id)
