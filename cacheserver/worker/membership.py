"""The worker's place in the cluster: who it is, its registration with the master (with the
full list of its blocks) and its heartbeats (stats and block deltas; the master answers
with the mount table's version and whether to register again)."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from dataclasses import dataclass, field

from strata.contract.errors import StrataError
from strata.contract.proto import strata_pb2 as pb
from .. import rpcutil
from ..cache.store import BlockStore
from ..common.blockrefs import ref_of, reported_key
from ..common.keys import BlockKey
from ..settings import ServerEnvironment
from ..cache.index import CachedBlock
from .masterlink import MasterLink
from .mounts import WorkerMounts
from .reads import Counters
from .uploads import Uploads

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerIdentity:
    worker_id: str  # stable name: the pod name in Kubernetes
    host: str       # node name: what locality means
    advertise: str  # host part of the address clients and peers dial


def identity_from_env(port: int, env: ServerEnvironment) -> WorkerIdentity:
    """Who the worker listening on `port` is, from its environment."""
    host = env.node_name or env.hostname or socket.gethostname()
    advertise = env.advertise_host or env.pod_ip or "127.0.0.1"
    worker_id = env.worker_id or env.pod_name or f"{host}:{port}"
    return WorkerIdentity(worker_id=worker_id, host=host, advertise=advertise)


@dataclass(frozen=True)
class Endpoints:
    """Where the worker listens, once its servers are bound."""

    port: int                 # gRPC
    http_port: int
    data_port: int
    domain_socket: str = ""   # the short-circuit socket readers on this host open ("" if none)


@dataclass
class BlockReports:
    """Blocks added and removed since the last heartbeat."""

    added: dict[str, pb.BlockRef] = field(default_factory=dict)
    removed: dict[str, pb.BlockRef] = field(default_factory=dict)

    def on_change(self, added: list[CachedBlock], removed: list[BlockKey]) -> None:
        for block in added:
            ref = ref_of(block.key)
            self.removed.pop(block.key.block_id, None)
            self.added[block.key.block_id] = ref
        for key in removed:
            self.added.pop(key.block_id, None)
            self.removed[key.block_id] = ref_of(key)

    def take(self) -> tuple[list[pb.BlockRef], list[pb.BlockRef]]:
        added, removed = list(self.added.values()), list(self.removed.values())
        self.added.clear()
        self.removed.clear()
        return added, removed

    def requeue(self, added: list[pb.BlockRef], removed: list[pb.BlockRef]) -> None:
        """Deltas for a later heartbeat; newer ones of the same blocks win."""
        for ref in added:
            self.added.setdefault(reported_key(ref).block_id, ref)
        for ref in removed:
            self.removed.setdefault(reported_key(ref).block_id, ref)


class Membership:
    """Registration and heartbeats of one worker."""

    def __init__(self, *, identity: WorkerIdentity, link: MasterLink, store: BlockStore, mounts: WorkerMounts,
                 uploads: Uploads, counters: Counters, reports: BlockReports, heartbeat_interval: float) -> None:
        self.identity = identity
        self._link = link
        self._store = store
        self._mounts = mounts
        self._uploads = uploads
        self._counters = counters
        self.reports = reports
        self._interval = heartbeat_interval
        self.endpoints: Endpoints | None = None
        self.registered = False
        # Names this run of the process for the master: the writes a previous run left open
        # end when this one registers.
        self.incarnation = uuid.uuid4().hex
        # Set on the stop signal: registrations and heartbeats tell the master this run drains.
        self.stopping = False

    def listening(self, endpoints: Endpoints) -> None:
        """The servers are bound: registrations from now on advertise these endpoints."""
        self.endpoints = endpoints

    def is_registered(self) -> bool:
        return self.registered

    def info(self) -> pb.WorkerInfo:
        if self.endpoints is None:
            raise StrataError(f"worker {self.identity.worker_id}: not listening yet, nothing to advertise")
        e = self.endpoints
        return pb.WorkerInfo(
            worker_id=self.identity.worker_id, host=self.identity.host,
            address=f"{self.identity.advertise}:{e.port}", domain_socket=e.domain_socket,
            http_port=e.http_port, data_port=e.data_port,
        )

    def stats(self) -> pb.WorkerStats:
        c = self._counters
        return pb.WorkerStats(
            tiers=[pb.TierStats(medium=t.medium, capacity=t.capacity, used=t.used, blocks=t.blocks)
                   for t in self._store.stats()],
            hits=c.hits, misses=c.misses, ufs_bytes_read=c.ufs_bytes_read, bytes_served=c.bytes_served,
            short_circuit_reads=c.short_circuit_reads, cached_bytes_by_mount=self._store.bytes_by_mount(),
            pending_uploads=self._uploads.pending(),
        )

    async def register(self) -> None:
        blocks = [ref_of(b.key) for b in self._store.blocks()]
        self.reports.take()  # the full list supersedes pending deltas
        # A message holds a bounded batch; the rest follows as heartbeat deltas.
        blocks, rest = rpcutil.split_batch(blocks)
        self.reports.requeue(rest, [])
        response = await self._link.register(pb.RegisterWorkerRequest(worker=self.info(), stats=self.stats(),
                                                                      blocks=blocks, incarnation=self.incarnation,
                                                                      stopping=self.stopping))
        self.registered = True
        if response.mount_table_version != self._mounts.version:
            await self._mounts.refresh()
        log.info("registered with the master as %s (%d blocks)", self.identity.worker_id, len(blocks))
        resumed = self._uploads.resume()
        if resumed:
            log.info("resumed %d staged uploads of a previous run", resumed)

    async def heartbeat_once(self) -> None:
        if not self.registered:
            await self.register()
            return
        added, removed = self.reports.take()
        added, later_added = rpcutil.split_batch(added)
        removed, later_removed = rpcutil.split_batch(removed)
        self.reports.requeue(later_added, later_removed)
        try:
            response = await self._link.heartbeat(pb.HeartbeatRequest(
                worker_id=self.identity.worker_id, stats=self.stats(), added=added, removed=removed,
                mount_table_version=self._mounts.version, stopping=self.stopping,
            ))
        except StrataError:
            self.reports.requeue(added, removed)  # keep the deltas for the next try
            raise
        if response.reregister:
            await self.register()
        elif response.mount_table_version != self._mounts.version:
            await self._mounts.refresh()

    async def stop(self, timeout: float) -> None:
        """The stop signal came: tell the master at once (within `timeout` seconds; the
        heartbeats that follow repeat it) that this run drains, so a master told that this
        worker leaves places nothing more on it."""
        self.stopping = True
        try:
            await asyncio.wait_for(self.heartbeat_once(), timeout)
        except (StrataError, TimeoutError) as exc:
            log.warning("could not tell the master %s that this worker stops: %s", self._link.address, exc)

    async def heartbeat_loop(self) -> None:
        failures = 0
        while True:
            try:
                await self.heartbeat_once()
                if failures:
                    log.info("master reachable again")
                failures = 0
            except StrataError as exc:
                failures += 1
                if failures in (1, 10) or failures % 60 == 0:
                    log.warning("heartbeat to master %s failed (%d in a row): %s", self._link.address, failures, exc)
            await asyncio.sleep(self._interval)
