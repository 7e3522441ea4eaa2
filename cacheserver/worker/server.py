"""Run a worker: tiered block store, gRPC service, short-circuit socket, master link."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .. import constants, rpcutil
from ..auth import Credentials
from ..blockrefs import ref_of, reported_key
from ..cache.keys import BlockKey
from ..cache.store import BlockStore
from ..cache.tiers import TierConfig
from ..config import ServerConfig
from ..errors import StrataError
from ..httpserver import HttpServer, serve_until_signalled
from ..proto import strata_pb2 as pb
from ..proto import strata_pb2_grpc as pb_grpc
from ..uploads import pending_upload_metrics
from .mounts import WorkerMounts
from .service import BlockReports, WorkerService
from .transfer import DataServer, ShortCircuitServer
from .uploads import remove_stale_staging

log = logging.getLogger(__name__)

# How often the worker refreshes its list of peers (for placing written blocks).
PEER_REFRESH_SECONDS = 5.0
# How often blocks unused longer than their mount's TTL are freed (at most), and how often
# the worker checks whether a sweep is due.
TTL_SWEEP_SECONDS = 30.0
TTL_TICK_SECONDS = 0.5


@dataclass(frozen=True)
class WorkerIdentity:
    worker_id: str  # stable name: the pod name in Kubernetes
    host: str       # node name: what locality means
    advertise: str  # host part of the address clients and peers dial


def identity_from_env(port: int) -> WorkerIdentity:
    host = os.environ.get("STRATA_NODE_NAME") or os.environ.get(constants.ENV_HOSTNAME) or socket.gethostname()
    advertise = os.environ.get("STRATA_ADVERTISE_HOST") or os.environ.get("STRATA_POD_IP") or "127.0.0.1"
    worker_id = os.environ.get("STRATA_WORKER_ID") or os.environ.get("STRATA_POD_NAME") or f"{host}:{port}"
    return WorkerIdentity(worker_id=worker_id, host=host, advertise=advertise)


def tier_configs(config: ServerConfig, data_dir: Path, worker_id: str) -> list[TierConfig]:
    """Tiers from the config; a tier without dirs gets one under data_dir (MEM: /dev/shm)."""
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
    def __init__(self, worker: WorkerHandle) -> None:
        self._worker = worker

    def collect(self):  # type: ignore[no-untyped-def]
        c = self._worker.service.counters
        for name, value, text in (
            ("strata_worker_cache_hits", c.hits, "Block reads served from the cache"),
            ("strata_worker_cache_misses", c.misses, "Blocks fetched from the store"),
            ("strata_worker_ufs_bytes_read", c.ufs_bytes_read, "Bytes read from the store"),
            ("strata_worker_bytes_served", c.bytes_served, "Bytes served to readers"),
            ("strata_worker_short_circuit_reads", c.short_circuit_reads, "Blocks handed out as file descriptors"),
            ("strata_worker_data_port_reads", c.data_port_reads, "Block reads served over the data port"),
            ("strata_worker_corrupt_blocks", self._worker.service.store.corrupt_blocks,
             "Cached blocks found damaged (checksum or size) and dropped; readers got the store's bytes"),
            ("strata_worker_short_circuit_rechecks", c.short_circuit_rechecks,
             "Short-circuit reads whose reader found a bad checksum and had the worker check the block"),
        ):
            yield CounterMetricFamily(name, text, value=value)
        capacity = GaugeMetricFamily("strata_worker_tier_capacity_bytes", "Tier quota", labels=["medium"])
        used = GaugeMetricFamily("strata_worker_tier_used_bytes", "Bytes held in a tier", labels=["medium"])
        blocks = GaugeMetricFamily("strata_worker_tier_blocks", "Blocks held in a tier", labels=["medium"])
        for tier in self._worker.service.store.stats():
            capacity.add_metric([tier.medium], tier.capacity)
            used.add_metric([tier.medium], tier.used)
            blocks.add_metric([tier.medium], tier.blocks)
        yield capacity
        yield used
        yield blocks
        service = self._worker.service
        yield from pending_upload_metrics(
            "strata_worker", {p.mount_id: p for p in service.uploads.pending()},
            {v.mount_id: v.path for v in service.mounts.views()},
        )


@dataclass
class WorkerHandle:
    config: ServerConfig
    identity: WorkerIdentity
    token: str
    service: WorkerService
    server: grpc.aio.Server
    port: int
    http: HttpServer
    http_port: int
    data: DataServer
    data_port: int
    short_circuit: ShortCircuitServer | None
    master_channel: grpc.aio.Channel
    reports: BlockReports
    peers: list[pb.WorkerInfo] = field(default_factory=list)
    registered: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _peer_channels: dict[str, tuple[str, grpc.aio.Channel]] = field(default_factory=dict)

    @property
    def master(self) -> pb_grpc.MasterStub:
        return pb_grpc.MasterStub(self.master_channel)

    def info(self) -> pb.WorkerInfo:
        return pb.WorkerInfo(
            worker_id=self.identity.worker_id,
            host=self.identity.host,
            address=f"{self.identity.advertise}:{self.port}",
            domain_socket=str(self.short_circuit.advertised_path) if self.short_circuit else "",
            http_port=self.http_port,
            data_port=self.data_port,
        )

    def stats(self) -> pb.WorkerStats:
        c = self.service.counters
        by_mount: dict[int, int] = {}
        for block in self.service.store.blocks():
            by_mount[block.key.mount_id] = by_mount.get(block.key.mount_id, 0) + block.length
        return pb.WorkerStats(
            tiers=[pb.TierStats(medium=t.medium, capacity=t.capacity, used=t.used, blocks=t.blocks) for t in self.service.store.stats()],
            hits=c.hits, misses=c.misses, ufs_bytes_read=c.ufs_bytes_read, bytes_served=c.bytes_served,
            short_circuit_reads=c.short_circuit_reads, cached_bytes_by_mount=by_mount,
            pending_uploads=self.service.uploads.pending(),
        )

    def peer_stub(self, info: pb.WorkerInfo) -> pb_grpc.WorkerStub:
        cached = self._peer_channels.get(info.worker_id)
        if cached is None or cached[0] != info.address:
            cached = (info.address, rpcutil.aio_channel(info.address, self.token))
            self._peer_channels[info.worker_id] = cached
        return pb_grpc.WorkerStub(cached[1])

    async def register(self) -> None:
        blocks = [ref_of(b.key) for b in self.service.store.blocks()]
        self.reports.take()  # the full list supersedes pending deltas
        # A message holds a bounded batch; the rest follows as heartbeat deltas.
        blocks, rest = rpcutil.split_batch(blocks)
        self.requeue(rest, [])
        response = await self.master.RegisterWorker(
            pb.RegisterWorkerRequest(worker=self.info(), stats=self.stats(), blocks=blocks), timeout=30
        )
        self.registered = True
        if response.mount_table_version != self.service.mounts.version:
            await self.service.mounts.refresh()
        log.info("registered with the master as %s (%d blocks)", self.identity.worker_id, len(blocks))
        resumed = self.service.uploads.resume()
        if resumed:
            log.info("resumed %d staged uploads of a previous run", resumed)

    def requeue(self, added: list[pb.BlockRef], removed: list[pb.BlockRef]) -> None:
        """Deltas for a later heartbeat; newer ones of the same blocks win."""
        for ref in added:
            self.reports.added.setdefault(reported_key(ref).block_id, ref)
        for ref in removed:
            self.reports.removed.setdefault(reported_key(ref).block_id, ref)

    async def heartbeat_once(self) -> None:
        if not self.registered:
            await self.register()
            return
        added, removed = self.reports.take()
        added, later_added = rpcutil.split_batch(added)
        removed, later_removed = rpcutil.split_batch(removed)
        self.requeue(later_added, later_removed)
        try:
            response = await self.master.Heartbeat(pb.HeartbeatRequest(
                worker_id=self.identity.worker_id, stats=self.stats(), added=added, removed=removed,
                mount_table_version=self.service.mounts.version,
            ), timeout=10)
        except grpc.RpcError:
            self.requeue(added, removed)  # keep the deltas for the next try
            raise
        if response.reregister:
            await self.register()
        elif response.mount_table_version != self.service.mounts.version:
            await self.service.mounts.refresh()

    async def heartbeat_loop(self) -> None:
        failures = 0
        while True:
            try:
                await self.heartbeat_once()
                if failures:
                    log.info("master reachable again")
                failures = 0
            except (grpc.RpcError, StrataError) as exc:
                failures += 1
                if failures in (1, 10) or failures % 60 == 0:
                    log.warning("heartbeat to master %s failed (%d in a row): %s", self.config.master_address, failures,
                                exc.details() if isinstance(exc, grpc.RpcError) and hasattr(exc, "details") else exc)
            await asyncio.sleep(self.config.heartbeat_interval)

    async def peer_loop(self) -> None:
        while True:
            with contextlib.suppress(grpc.RpcError):
                response = await self.master.ListWorkers(pb.ListWorkersRequest(), timeout=10)
                self.peers = list(response.workers)
            await asyncio.sleep(PEER_REFRESH_SECONDS)

    async def ttl_loop(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(TTL_TICK_SECONDS)
            # Sweep at least twice per TTL, so a block outlives its TTL by at most half of it.
            ttls = [v.info.options.ttl_seconds for v in self.service.mounts.views() if v.info.options.ttl_seconds > 0]
            if ttls and time.monotonic() - last >= min(TTL_SWEEP_SECONDS, min(ttls) / 2):
                last = time.monotonic()
                self.sweep_ttl()

    def sweep_ttl(self) -> int:
        freed = 0
        now = time.time()
        held = self.service.unpersisted_written()
        for view in self.service.mounts.views():
            ttl = view.info.options.ttl_seconds
            if ttl > 0:
                freed += self.service.store.free_unused_since(now - ttl, mount_matcher(view.mount_id, held))
        return freed

    async def drain_and_stop(self) -> None:
        """A signalled stop: uploads of acknowledged writes get their drain time first
        (reads and heartbeats go on meanwhile), then the servers stop."""
        await self.service.uploads.drain()
        await self.stop()

    async def stop(self, grace: float = 2.0) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.short_circuit:
            self.short_circuit.stop()
        self.data.stop()
        await self.service.close()
        await self.http.stop()
        await self.server.stop(grace)
        for _, channel in self._peer_channels.values():
            await channel.close()
        await self.master_channel.close()


def mount_matcher(mount_id: int, held: set[str] | frozenset[str] = frozenset()) -> Callable[[BlockKey], bool]:
    """Blocks of a mount, except those whose ids are in `held`."""
    return lambda key: key.mount_id == mount_id and key.block_id not in held


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
) -> WorkerHandle:
    if not config.tiers:
        raise StrataError("worker: no cache tiers configured; add at least one tier (e.g. MEM 1Gi) to the config")
    data_dir.mkdir(parents=True, exist_ok=True)
    server = rpcutil.server(credentials, max_receive_bytes=rpcutil.WORKER_MAX_RECEIVE_BYTES)
    token = credentials.internal  # what this worker presents to the master and its peers
    bound = rpcutil.add_port(server, "worker", bind, port)
    identity = identity or identity_from_env(bound)
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
    staging = data_dir / "staging"
    remove_stale_staging(staging)
    master_channel = rpcutil.aio_channel(config.master_address, token)
    master_stub = pb_grpc.MasterStub(master_channel)
    mounts = WorkerMounts(lambda: master_stub.GetMountTable(pb.GetMountTableRequest(), timeout=30),
                          allowed_roots=config.local_sources.allowed_roots)
    handle: WorkerHandle | None = None
    service = WorkerService(
        config=config, worker_id=identity.worker_id, store=store, mounts=mounts,
        master=lambda: master_stub,
        peers=lambda: handle.peers if handle else [],
        peer_stub=lambda info: handle.peer_stub(info) if handle else pb_grpc.WorkerStub(master_channel),
        staging_dir=staging,
    )
    pb_grpc.add_WorkerServicer_to_server(service, server)
    await server.start()
    data = DataServer(service, credentials, asyncio.get_running_loop(), config.data_port)
    try:
        data_bound = data.start(bind, data_port)
    except OSError as exc:
        await server.stop(0)
        raise rpcutil.listen_error("worker", "block data", bind, data_port, "--data-port", exc) from None
    short_circuit = None
    if config.short_circuit:
        # One socket per worker: several workers of a cluster may share a node's folder.
        name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in identity.worker_id) + ".sock"
        advertised_dir = os.environ.get("STRATA_SHORT_CIRCUIT_DIR")
        short_circuit = ShortCircuitServer(
            service, data_dir / "sc" / name, credentials, asyncio.get_running_loop(), config.data_port,
            advertised_path=Path(advertised_dir) / name if advertised_dir else None,
        )
        short_circuit.start()
    registry = CollectorRegistry()
    http = HttpServer(registry, healthy=lambda: handle is not None and handle.registered)
    try:
        http_bound = await http.start(bind, http_port)
    except OSError as exc:
        data.stop()
        if short_circuit:
            short_circuit.stop()
        await server.stop(0)
        raise rpcutil.listen_error("worker", "HTTP (metrics, health)", bind, http_port, "--http-port", exc) from None
    handle = WorkerHandle(
        config=config, identity=identity, token=token, service=service, server=server, port=bound,
        http=http, http_port=http_bound, data=data, data_port=data_bound, short_circuit=short_circuit, master_channel=master_channel,
        reports=reports,
    )
    registry.register(WorkerCollector(handle))
    handle.tasks = [
        asyncio.ensure_future(handle.heartbeat_loop()),
        asyncio.ensure_future(handle.peer_loop()),
        asyncio.ensure_future(handle.ttl_loop()),
    ]
    log.info("worker %s serving gRPC on %s:%d (host %s), HTTP on %d, block data on %d",
             identity.worker_id, bind, bound, identity.host, http_bound, data_bound)
    return handle


async def run_worker(config: ServerConfig, **kwargs: object) -> None:
    """Serve until SIGTERM/SIGINT."""
    handle = await start_worker(config, **kwargs)  # type: ignore[arg-type]
    await serve_until_signalled("worker", handle.drain_and_stop)
