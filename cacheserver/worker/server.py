"""Run a worker: the composition root. `build_parts` builds the worker's parts once, in
order, each handed the parts it uses; `start_worker` binds the transports to them:

    WorkerService (gRPC) | DataServer, ShortCircuitServer (block sockets)   thin adapters
    Membership      registration and heartbeats
    Writes          staging, write types, copies and appends
    BlockReads | Peers | Retention | Uploads
    MasterLink | WorkerMounts | FileStatuses

`WorkerHandle` holds parts and transports while the worker runs and stops them in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from strata.contract.config import ServerConfig
from strata.contract.errors import StrataError
from strata.contract.httpserver import HttpServer, serve_until_signalled
from strata.contract.proto import strata_pb2_grpc as pb_grpc
from .. import rpcutil
from ..auth import Credentials
from ..common.blockwire import CLIENT_KINDS, OTHER_CLIENT
from ..cache.store import BlockStore
from ..cache.tiers import TierConfig
from ..pendinguploads import pending_upload_metrics
from ..settings import ServerEnvironment
from ..storemetrics import STORE_METRICS
from .handoff import Handoff
from .masterlink import MasterLink
from .membership import BlockReports, Endpoints, Membership, WorkerIdentity, identity_from_env
from .mounts import WorkerMounts
from .peers import Peers
from .reads import SERVED_PATHS, BlockReads, Counters
from .retention import Retention
from .service import WorkerService
from .transfer import BlockSocketServer, DataServer, ShortCircuitServer
from .uploads import STAGING_FOLDER, Uploads, remove_stale_staging
from .writes import Writes

log = logging.getLogger(__name__)

# Seconds a stopping worker waits for the master to hear that it stops before it drains
# (the heartbeats during the drain repeat it).
STOP_NOTICE_TIMEOUT = 2.0


def tier_configs(config: ServerConfig, data_dir: Path, worker_id: str) -> list[TierConfig]:
    """Tiers from the config; a tier without dirs gets one under data_dir (MEM: in /dev/shm,
    named after the worker, so its next process finds the written blocks it holds)."""
    tiers = []
    settings = config.tiers or ()
    for tier in settings:
        dirs = tier.dirs
        if not dirs:
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in worker_id)
            dirs = (Path("/dev/shm") / f"strata-{safe}",) if tier.medium == "MEM" else (data_dir / "tiers" / tier.medium.lower(),)
        tiers.append(TierConfig(medium=tier.medium, quota=tier.quota, dirs=tuple(dirs)))
    return tiers


class WorkerCollector(Collector):
    def __init__(self, counters: Counters, store: BlockStore, uploads: Uploads, mounts: WorkerMounts,
                 peers: Peers, sockets: Sequence[BlockSocketServer] = ()) -> None:
        self._sockets = sockets
        self._counters = counters
        self._peers = peers
        self._store = store
        self._uploads = uploads
        self._mounts = mounts

    def collect(self):  # type: ignore[no-untyped-def]
        c = self._counters
        for name, value, text in (
            ("strata_worker_cache_hits", c.hits,
             "Block reads served from the cache (this node's readers' and other workers' that missed them)"),
            ("strata_worker_cache_misses", c.misses, "Blocks fetched from the store"),
            ("strata_worker_ufs_bytes_read", c.ufs_bytes_read, "Bytes read from the store"),
            ("strata_worker_bytes_served", c.bytes_served, "Bytes served to readers"),
            ("strata_worker_short_circuit_reads", c.short_circuit_reads, "Blocks handed out as file descriptors"),
            ("strata_worker_data_port_reads", c.data_port_reads, "Block reads served over the data port"),
            ("strata_worker_kept_opens", c.kept_opens,
             "Opens (and stats) answered by a block socket's thread from a kept status (and block) alone"),
            ("strata_worker_outage_statuses", c.outage_statuses,
             "Statuses of read-only mounts' files answered from their stores while the master was away"),
            ("strata_worker_corrupt_blocks", self._store.corrupt_blocks,
             "Cached blocks found damaged (checksum or size) and dropped; readers got the store's bytes"),
            ("strata_worker_short_circuit_rechecks", c.short_circuit_rechecks,
             "Short-circuit reads whose reader found a bad checksum and had the worker check the block"),
            ("strata_worker_peer_reads", c.peer_reads,
             "Missed blocks copied from the worker holding them instead of fetched from the store"),
            ("strata_worker_peer_bytes_read", c.peer_bytes_read, "Bytes copied from other workers' caches"),
            ("strata_worker_peer_bytes_served", c.peer_bytes_served, "Bytes of cached blocks sent to other workers"),
            ("strata_worker_folder_readahead_files", c.folder_readahead_files,
             "Small files fetched from the store ahead of their readers (a folder's read-ahead)"),
            ("strata_worker_folder_readahead_bytes", c.folder_readahead_bytes,
             "Bytes of the small files fetched ahead of their readers"),
            ("strata_worker_block_socket_requests", sum(s.requests for s in self._sockets),
             "Requests (blocks, opens, stats, listings, the status table) on the data port and short-circuit socket"),
            ("strata_worker_peer_failures", self._peers.failed,
             "Holders that did not send a missed block in time (or sent it damaged): the store's bytes were used"),
            ("strata_worker_huge_page_bytes", self._store.huge_pages.collapsed_bytes,
             "Bytes of MEM tier block files the kernel moved into 2 MiB pages (cache/hugepages.py)"),
        ):
            yield CounterMetricFamily(name, text, value=value)
        served = CounterMetricFamily("strata_worker_served_bytes",
                                     "Bytes served to readers, by the path they took and the kind of reader",
                                     labels=["path", "client"])
        for path in SERVED_PATHS:
            for client in (*CLIENT_KINDS, OTHER_CLIENT):  # bounded: never a value a request made up
                served.add_metric([path, client], c.served_bytes[path, client])
        yield served
        names = {v.mount_id: v.path for v in self._mounts.views()}
        for name, by_mount, text in (
            ("strata_worker_mount_cache_hits", c.hits_by_mount, "Block reads served from the cache (to readers and other workers), by mount"),
            ("strata_worker_mount_cache_misses", c.misses_by_mount, "Blocks fetched from the store, by mount"),
        ):
            family = CounterMetricFamily(name, text, labels=["mount"])
            for mount_id in sorted(set(names) | set(by_mount)):  # a mount never hit shows 0
                family.add_metric([names.get(mount_id, str(mount_id))], by_mount[mount_id])
            yield family
        hit_bytes = CounterMetricFamily("strata_worker_cache_hit_bytes",
                                        "Bytes of the blocks found cached, by the tier holding them", labels=["medium"])
        evicted = CounterMetricFamily("strata_worker_tier_evicted_blocks",
                                      "Blocks evicted from a tier (moved a tier down or out of the cache)",
                                      labels=["medium"])
        for tier in self._store.stats():
            hit_bytes.add_metric([tier.medium], c.hit_bytes_by_medium[tier.medium])
            evicted.add_metric([tier.medium], self._store.evicted.get(tier.medium, 0))
        yield hit_bytes
        yield evicted
        capacity = GaugeMetricFamily("strata_worker_tier_capacity_bytes", "Tier quota", labels=["medium"])
        used = GaugeMetricFamily("strata_worker_tier_used_bytes", "Bytes held in a tier", labels=["medium"])
        blocks = GaugeMetricFamily("strata_worker_tier_blocks", "Blocks held in a tier", labels=["medium"])
        for tier in self._store.stats():
            capacity.add_metric([tier.medium], tier.capacity)
            used.add_metric([tier.medium], tier.used)
            blocks.add_metric([tier.medium], tier.blocks)
        yield capacity
        yield used
        yield blocks
        yield from pending_upload_metrics(
            "strata_worker", {p.mount_id: p for p in self._uploads.pending()},
            names,
        )


@dataclass
class WorkerParts:
    """What a worker is made of, wired once (`build_parts`)."""

    config: ServerConfig
    identity: WorkerIdentity
    counters: Counters
    store: BlockStore
    mounts: WorkerMounts
    link: MasterLink
    retention: Retention
    uploads: Uploads
    reads: BlockReads
    peers: Peers
    writes: Writes
    membership: Membership
    handoff: Handoff

    def loops(self) -> list[asyncio.Task[None]]:
        """Start what the worker runs for as long as it lives."""
        return [
            asyncio.ensure_future(self.membership.heartbeat_loop()),
            asyncio.ensure_future(self.peers.refresh_loop()),
            asyncio.ensure_future(self.retention.ttl_loop()),
            asyncio.ensure_future(self.retention.orphan_loop()),
        ]

    async def close(self) -> None:
        """Stop uploads and readahead, close the stores and the block store. The channels
        (master, peers) stay open until `close_channels`: the gRPC server may still answer."""
        await self.uploads.close()
        await self.reads.close()
        await self.mounts.close()
        await self.store.close()

    async def close_channels(self) -> None:
        await self.peers.close()
        await self.link.close()


async def build_parts(config: ServerConfig, *, data_dir: Path, token: str, identity: WorkerIdentity) -> WorkerParts:
    """The worker's parts on `data_dir` (block store found there opened, staging folder
    cleaned), talking to the master at config.master_address with `token`."""
    reports = BlockReports()
    store = BlockStore(
        tier_configs(config, data_dir, identity.worker_id),
        eviction=config.cache_policy.eviction,
        high_watermark=config.cache_policy.high_watermark,
        low_watermark=config.cache_policy.low_watermark,
        on_change=reports.on_change,
        block_size=config.block_size,
    )
    await store.open()
    reports.take()  # the registration carries the rescanned blocks
    staging = data_dir / STAGING_FOLDER
    remove_stale_staging(staging)
    link = MasterLink(config.master_address, token, worker_id=identity.worker_id, block_size=config.block_size)
    mounts = WorkerMounts(link.mount_table, allowed_roots=config.local_sources.allowed_roots)
    counters = Counters()
    peers = Peers(link, worker_id=identity.worker_id, token=token)
    reads = BlockReads(config=config, worker_id=identity.worker_id, store=store, mounts=mounts, link=link,
                       counters=counters, held_elsewhere=peers.held_elsewhere)
    retention = Retention(store, mounts, orphan_grace=config.orphan_block_grace,
                          freed=reads.kept.published.drop_files)
    # A staged copy lost while its write's blocks were kept is staged again from them.
    uploads = Uploads(staging, master=link.stub, mounts=mounts, release=retention.release,
                      read_block=reads.whole_block)
    writes = Writes(config=config, store=store, mounts=mounts, link=link, uploads=uploads, retention=retention,
                    reads=reads, peers=peers)
    membership = Membership(identity=identity, link=link, store=store, mounts=mounts, uploads=uploads,
                            counters=counters, reports=reports, heartbeat_interval=config.heartbeat_interval)
    handoff = Handoff(store, peers, link, worker_id=identity.worker_id)
    return WorkerParts(config=config, identity=identity, counters=counters, store=store, mounts=mounts, link=link,
                       retention=retention, uploads=uploads, reads=reads, peers=peers, writes=writes,
                       membership=membership, handoff=handoff)


@dataclass
class WorkerHandle:
    """A running worker: its parts and its servers."""

    parts: WorkerParts
    server: grpc.aio.Server
    port: int
    http: HttpServer
    http_port: int
    data: DataServer
    data_port: int
    short_circuit: ShortCircuitServer | None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def drain_and_stop(self) -> None:
        """A signalled stop: uploads of acknowledged writes get their drain time first and,
        on a worker leaving the cluster, its hot blocks go to the workers that stay (see
        handoff.py), side by side (reads and heartbeats go on meanwhile); then the servers
        stop. The master hears first that this run stops."""
        await self.parts.membership.stop(timeout=STOP_NOTICE_TIMEOUT)
        await asyncio.gather(self.parts.uploads.drain(), self.parts.handoff.run())
        await self.stop()

    async def stop(self, grace: float = 2.0) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.short_circuit:
            self.short_circuit.stop()
        self.data.stop()
        await self.parts.close()
        await self.http.stop()
        await self.server.stop(grace)
        await self.parts.close_channels()


async def start_worker(
    config: ServerConfig,
    *,
    data_dir: Path,
    credentials: Credentials,
    bind: str = "0.0.0.0",
    port: int,
    http_port: int,
    data_port: int,
    identity: WorkerIdentity | None = None,
    env: ServerEnvironment | None = None,
) -> WorkerHandle:
    if not config.tiers:
        raise StrataError("worker: no cache tiers configured; add at least one tier (e.g. MEM 1Gi) to the config")
    data_dir.mkdir(parents=True, exist_ok=True)
    server = rpcutil.server(credentials, max_receive_bytes=rpcutil.WORKER_MAX_RECEIVE_BYTES)
    token = credentials.internal  # what this worker presents to the master and its peers
    bound = rpcutil.add_port(server, "worker", bind, port)
    env = env or ServerEnvironment()
    identity = identity or identity_from_env(bound, env)
    parts = await build_parts(config, data_dir=data_dir, token=token, identity=identity)
    reads = parts.reads

    # The transports, adapters over the parts.
    pb_grpc.add_WorkerServicer_to_server(WorkerService(reads=reads, writes=parts.writes, retention=parts.retention),
                                         server)
    await server.start()
    loop = asyncio.get_running_loop()
    data = DataServer(reads, credentials, loop, config.data_port)
    try:
        data_bound = data.start(bind, data_port)
    except OSError as exc:
        await server.stop(0)
        raise rpcutil.listen_error("worker", "block data", bind, data_port, "--data-port", exc) from None
    short_circuit = None
    if config.short_circuit:
        # One socket per worker: several workers of a cluster may share a node's folder.
        name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in identity.worker_id) + ".sock"
        short_circuit = ShortCircuitServer(
            reads, data_dir / "sc" / name, credentials, loop, config.data_port,
            advertised_path=env.short_circuit_dir / name if env.short_circuit_dir else None,
        )
        short_circuit.start()
    registry = CollectorRegistry()
    http = HttpServer(registry, healthy=parts.membership.is_registered)
    try:
        http_bound = await http.start(bind, http_port)
    except OSError as exc:
        data.stop()
        if short_circuit:
            short_circuit.stop()
        await server.stop(0)
        raise rpcutil.listen_error("worker", "HTTP (metrics, health)", bind, http_port, "--http-port", exc) from None
    parts.membership.listening(Endpoints(
        port=bound, http_port=http_bound, data_port=data_bound,
        domain_socket=str(short_circuit.advertised_path) if short_circuit else "",
    ))
    registry.register(WorkerCollector(parts.counters, parts.store, parts.uploads, parts.mounts, parts.peers,
                                      [data, *([short_circuit] if short_circuit else [])]))
    registry.register(STORE_METRICS)
    handle = WorkerHandle(parts=parts, server=server, port=bound, http=http, http_port=http_bound, data=data,
                          data_port=data_bound, short_circuit=short_circuit, tasks=parts.loops())
    log.info("worker %s serving gRPC on %s:%d (host %s), HTTP on %d, block data on %d",
             identity.worker_id, bind, bound, identity.host, http_bound, data_bound)
    return handle


async def run_worker(config: ServerConfig, **kwargs: object) -> None:
    """Serve until SIGTERM/SIGINT."""
    handle = await start_worker(config, **kwargs)  # type: ignore[arg-type]
    await serve_until_signalled("worker", handle.drain_and_stop)
