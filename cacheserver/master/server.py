"""Run the master: the composition root. `build_parts` builds the master's parts once, in
order, each handed the parts it uses; `start_master` binds the gRPC service, the HTTP
metrics/health server and the loops (worker expiry, dead-upload sweep) to them:

    MasterService (gRPC)                              thin adapter
    Files | Reports | Retention | Workers             metadata, reports, free/pin, membership RPCs
    Mounting                                          the mount table and its version
    Loads | Locations | Writes                        load jobs, block locations, writes and leases
    FileInfos, mount_to_proto | StoreTotals | WorkerLink
    BlockIndex | Membership

`MasterHandle` holds parts and transports while the master runs and stops them in order.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from strata.contract.config import ServerConfig
from strata.contract.httpserver import HttpServer, serve_until_signalled
from strata.contract.proto import strata_pb2_grpc as pb_grpc
from .. import rpcutil
from ..auth import Credentials
from ..background import BackgroundTasks
from ..namespace.mounts import MountTable
from ..namespace.statefile import check_state_dir
from ..namespace.tree import Namespace
from ..pendinguploads import pending_upload_metrics
from ..rpcmetrics import RequestMetrics
from ..storemetrics import STORE_METRICS
from .blocks import BlockIndex
from .files import Files
from .loads import Loads
from .locations import Locations
from .membership import Membership
from .messages import FileInfos
from .mounting import Mounting
from .reports import Reports
from .retention import Retention
from .service import MasterService
from .totals import StoreTotals
from .workerlink import WorkerLink
from .workers import Workers
from .writes import Writes

log = logging.getLogger(__name__)


class MasterCollector(Collector):
    """Prometheus metrics read from the master's state at scrape time."""

    def __init__(self, parts: MasterParts) -> None:
        self._parts = parts

    def collect(self):  # type: ignore[no-untyped-def]
        parts = self._parts
        live = parts.membership.live()
        yield GaugeMetricFamily("strata_master_workers_live", "Workers heartbeating", value=len(live))
        yield GaugeMetricFamily("strata_master_mounts", "Mounts in the namespace", value=len(parts.mounts.list()))
        capacity = GaugeMetricFamily("strata_cache_capacity_bytes", "Tier quota over live workers", labels=["medium"])
        used = GaugeMetricFamily("strata_cache_used_bytes", "Bytes cached over live workers", labels=["medium"])
        sums: dict[str, list[int]] = {}
        for record in live:
            for tier in record.stats.tiers:
                pair = sums.setdefault(tier.medium, [0, 0])
                pair[0] += tier.capacity
                pair[1] += tier.used
        for medium, (cap, use) in sorted(sums.items()):
            capacity.add_metric([medium], cap)
            used.add_metric([medium], use)
        yield capacity
        yield used
        hits = sum(r.stats.hits for r in live)
        misses = sum(r.stats.misses for r in live)
        yield GaugeMetricFamily("strata_cache_hits", "Block reads served from cache (live workers)", value=hits)
        yield GaugeMetricFamily("strata_cache_misses", "Block reads that went to the store (live workers)", value=misses)
        cached = GaugeMetricFamily("strata_mount_cached_bytes", "Cached bytes per mount", labels=["mount"])
        by_mount = parts.blocks.cached_bytes_by_mount()
        for mount in parts.mounts.list():
            cached.add_metric([mount.path], by_mount.get(mount.mount_id, 0))
        yield cached
        stale = CounterMetricFamily(
            "strata_master_stale_metadata_answers",
            "Answers given from metadata older than the mount's sync interval because the store could not be reached",
            labels=["mount"],
        )
        for path, count in sorted(parts.namespace.stale_served.items()):
            stale.add_metric([path], count)
        yield stale
        requests = CounterMetricFamily(
            "strata_master_metadata_requests",
            "GetStatus and ListStatus requests answered (clients reuse read-only mounts' answers while they hold)",
            labels=["method"],
        )
        for method in ("GetStatus", "ListStatus"):
            requests.add_metric([method], parts.files.metadata_requests[method])
        yield requests
        yield from pending_upload_metrics("strata_mount", parts.reports.pending_uploads(), {m.mount_id: m.path for m in parts.mounts.list()})


@dataclass
class MasterParts:
    """What a master is made of, wired once (`build_parts`)."""

    config: ServerConfig
    mounts: MountTable
    namespace: Namespace
    membership: Membership
    blocks: BlockIndex
    link: WorkerLink
    totals: StoreTotals
    writes: Writes
    loads: Loads
    locations: Locations
    mounting: Mounting
    files: Files
    retention: Retention
    workers: Workers
    reports: Reports
    background: BackgroundTasks

    async def close(self) -> None:
        self.loads.close()
        await self.background.close()
        await self.namespace.close()
        await self.link.close()


def build_parts(config: ServerConfig, mounts: MountTable, namespace: Namespace, token: str) -> MasterParts:
    """The master's parts over the mount table and namespace; `token` is what it presents to
    the workers."""
    background = BackgroundTasks()
    membership = Membership(timeout=config.heartbeat_interval * config.heartbeat_misses)
    blocks = BlockIndex()
    infos = FileInfos(config, namespace, blocks)
    link = WorkerLink(membership, token, background)
    totals = StoreTotals(mounts, background)
    writes = Writes(mounts=mounts, namespace=namespace, infos=infos, background=background)
    loads = Loads(config=config, namespace=namespace, membership=membership, blocks=blocks, link=link)
    locations = Locations(config=config, namespace=namespace, blocks=blocks, membership=membership, infos=infos)
    mounting = Mounting(config=config, mounts=mounts, namespace=namespace, totals=totals, loads=loads, link=link,
                        background=background)
    files = Files(mounts=mounts, namespace=namespace, infos=infos, writes=writes, link=link, background=background)
    retention = Retention(mounts=mounts, namespace=namespace, mounting=mounting, link=link)
    workers = Workers(membership=membership, blocks=blocks, writes=writes, mounting=mounting, link=link)
    reports = Reports(config=config, mounts=mounts, membership=membership, blocks=blocks, mounting=mounting,
                      totals=totals, loads=loads)
    return MasterParts(config=config, mounts=mounts, namespace=namespace, membership=membership, blocks=blocks,
                       link=link, totals=totals, writes=writes, loads=loads, locations=locations, mounting=mounting,
                       files=files, retention=retention, workers=workers, reports=reports, background=background)


@dataclass
class MasterHandle:
    parts: MasterParts
    server: grpc.aio.Server
    http: HttpServer
    port: int
    http_port: int
    expiry: asyncio.Task[None]
    sweep: asyncio.Task[None]

    async def stop(self, grace: float = 2.0) -> None:
        self.expiry.cancel()
        self.sweep.cancel()
        await self.parts.close()
        await self.http.stop()
        await self.server.stop(grace)


async def start_master(
    config: ServerConfig,
    *,
    journal_dir: Path | None,
    credentials: Credentials,
    bind: str = "0.0.0.0",
    port: int,
    http_port: int,
) -> MasterHandle:
    if journal_dir is not None:
        check_state_dir(journal_dir)
    # Journaled file:// mounts the allowed roots no longer cover load unusable: the owner's
    # rule holds from the start, and their files not in the store yet are kept.
    mounts = MountTable(journal_dir, allowed_roots=config.local_sources.allowed_roots, cluster_key=credentials.internal)
    namespace = Namespace(mounts, journal_dir, block_size=config.block_size)
    parts = build_parts(config, mounts, namespace, credentials.internal)
    requests = RequestMetrics("strata_master")
    server = rpcutil.server(credentials, max_receive_bytes=rpcutil.MASTER_MAX_RECEIVE_BYTES, interceptors=[requests])
    service = MasterService(mounting=parts.mounting, files=parts.files, locations=parts.locations, writes=parts.writes,
                            loads=parts.loads, retention=parts.retention, workers=parts.workers, reports=parts.reports)
    pb_grpc.add_MasterServicer_to_server(service, server)
    bound = rpcutil.add_port(server, "master", bind, port)
    await server.start()
    registry = CollectorRegistry()
    registry.register(MasterCollector(parts))
    registry.register(requests)
    registry.register(STORE_METRICS)
    http = HttpServer(registry, healthy=lambda: True)
    try:
        http_bound = await http.start(bind, http_port)
    except OSError as exc:
        await server.stop(0)
        raise rpcutil.listen_error("master", "HTTP (metrics, health)", bind, http_port, "--http-port", exc) from None

    async def expire_loop() -> None:
        loop = asyncio.get_running_loop()
        woke, waited = loop.time(), False
        while True:
            await asyncio.sleep(config.heartbeat_interval)
            late = loop.time() - woke - config.heartbeat_interval
            woke = loop.time()
            if late > config.heartbeat_interval and not waited:
                # The master itself was held (no CPU, a long step): the heartbeats that came
                # meanwhile wait in line behind this wake-up; judge the workers next round
                # (one round at most: a master held again and again still drops dead workers).
                log.warning("the master did not run for %.1fs; workers are judged by their heartbeats next round", late)
                waited = True
                continue
            waited = False
            await parts.workers.expire_workers()

    expiry = asyncio.ensure_future(expire_loop())
    sweep = asyncio.ensure_future(parts.writes.sweep_dead_uploads())
    log.info("master serving gRPC on %s:%d, HTTP on %s:%d (%d mounts)", bind, bound, bind, http_bound, len(mounts.list()))
    return MasterHandle(parts, server, http, bound, http_bound, expiry, sweep)


async def run_master(config: ServerConfig, **kwargs: object) -> None:
    """Serve until SIGTERM/SIGINT."""
    handle = await start_master(config, **kwargs)  # type: ignore[arg-type]
    await serve_until_signalled("master", handle.stop)
