"""Many workers on one master (issue 27, target 5): what each worker and each cached block
costs the master, and whether it stays responsive, at 10, 25, 50 and 100 workers.

    python -P bench/workers_scale.py [--steps 10,25,50,100] [--blocks-per-worker 10000]
                                     [--rest 10] [--probe 10] [--name workers-scale]

A real master process (`python -P -m strata.cacheserver master`, as bench/stack.py starts
it) and N synthetic workers: clients in this one process (asyncio, a gRPC connection each)
that speak the worker protocol with the internal token, as cacheserver/worker/membership.py
does: RegisterWorker with the list of blocks held (the first batch of at most
BLOCK_LIST_BATCH_BYTES, the rest as `added` of the following heartbeats), then a Heartbeat
with stats every `heartbeatInterval` (the config's default, 1 s) after the previous answer.
They are not worker processes: 100 worker processes do not fit this 2-core machine.

The blocks are real: a file:// store of sparse files (16 blocks of 1 MiB each, no disk used),
one folder a worker, mounted read-only; each worker reports the blocks of its folder under
the versions the master's listing gives, so GetBlockLocations of a file names its worker.

Workers are added step by step; at each step N:
- the new workers register with no blocks: the master's resident memory per worker;
- all N workers register again at once with every block they hold (what a master restart
  brings: every worker's full report): time until the last batch is acknowledged and the
  master's CPU meanwhile; resident memory per block;
- the master at rest (heartbeats only): CPU seconds per second;
- a client in a process of its own asks GetBlockLocations, LocateBlocks (one block, as a
  worker missing a block does), GetStatus in turn, and Report every 5 s, for `--probe` s;
  its latencies (median, 99th percentile, slowest), each GetBlockLocations checked to name
  the file's worker;
- all along: /healthz every 50 ms from a process of its own (bench/healthprobe.py), the
  slowest heartbeat answer, heartbeats answered `reregister` (a worker the master forgot)
  and workers missing from ListWorkers (dropped).

Output: results/NAME.json and results/NAME.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import yaml

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from manyfiles import HealthProbe, cpu_seconds, rss  # noqa: E402
from results import write_result  # noqa: E402

from strata.cacheserver import launcher, rpcutil  # noqa: E402
from strata.cacheserver.auth import Credentials  # noqa: E402
from strata.contract.config import ServerConfig  # noqa: E402
from strata.contract.proto import strata_pb2 as pb  # noqa: E402
from strata.contract.proto import strata_pb2_grpc as pb_grpc  # noqa: E402
from strata.contract.rpc import CHANNEL_OPTIONS, call_metadata  # noqa: E402

TOKEN = "strata-scale-bench-token"
MOUNT = "/scale"
BLOCK_SIZE = 1 << 20
BLOCKS_PER_FILE = 16
HEARTBEAT_INTERVAL = float(ServerConfig.model_fields["heartbeat_interval"].default)
HEARTBEAT_MISSES = int(ServerConfig.model_fields["heartbeat_misses"].default)
CALL_TIMEOUT = 60.0
REPORT_EVERY = 5.0      # the probe's Report cadence (seconds)
PROBE_PAUSE = 0.01      # between the probe's rounds
STARTUP_TIMEOUT = 90.0
REPORT_DEADLINE = 120.0  # for one worker's full report, one after another
STORM_DEADLINE = 60.0    # for every worker's at once, and for all to be listed again
# One connection a synthetic worker, as separate worker processes have (gRPC shares one
# connection between channels of one process to the same address otherwise).
WORKER_CHANNEL_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]


# -- the store and the master ----------------------------------------------------------------

def make_tree(root: Path, workers: int, files_per_worker: int) -> None:
    """Folder w### of sparse files of BLOCKS_PER_FILE blocks for each worker (made once)."""
    marker = root.parent / f".made-{workers}x{files_per_worker}"
    if marker.exists():
        return
    for w in range(workers):
        folder = root / f"w{w:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        for f in range(files_per_worker):
            with (folder / f"f{f:05d}.bin").open("wb") as out:
                out.truncate(BLOCKS_PER_FILE * BLOCK_SIZE)
    marker.touch()


def start_master(workdir: Path, tree: Path) -> tuple[launcher.Child, str, int]:
    """A master process allowed to read `tree`; it, its gRPC address and its HTTP port."""
    config = workdir / "master.yaml"
    config.write_text(yaml.safe_dump({"blockSize": BLOCK_SIZE, "localSources": {"allowedRoots": [str(tree.parent)]}}))
    port, http = launcher.free_port(), launcher.free_port()
    env = {**os.environ, "STRATA_TOKEN": TOKEN, "PYTHONSAFEPATH": "1", "STRATA_LOG_LEVEL": "warning"}
    child = launcher.start("master", launcher.strata_argv(
        "master", "--config", str(config), "--journal-dir", str(workdir / "journal"), "--bind", "127.0.0.1",
        "--port", str(port), "--http-port", str(http)), workdir / "master.log", env=env)
    launcher.wait_ready([(child, lambda: launcher.http_ok(http, timeout=2), f"it answers /healthz on {http}")],
                        STARTUP_TIMEOUT)
    return child, f"127.0.0.1:{port}", http


async def mounted_files(address: str, tree: Path) -> list[pb.FileInfo]:
    """Mount the tree read-only at MOUNT and list it whole: every file with its version."""
    credentials = Credentials.from_admin(TOKEN)
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.MasterStub(channel)
        metadata = call_metadata(credentials.admin)
        await stub.Mount(pb.MountRequest(path=MOUNT, source=f"file://{tree}",
                                         options=pb.MountOptions(read_only=True, metadata_sync_interval=3600)),
                         metadata=metadata, timeout=CALL_TIMEOUT)
        files: list[pb.FileInfo] = []
        async for page in stub.ListStatusPages(pb.ListStatusRequest(path=MOUNT, recursive=True),
                                               metadata=metadata, timeout=600):
            files.extend(f for f in page.files if not f.is_dir)
        return files


def refs_of(info: pb.FileInfo) -> list[pb.BlockRef]:
    size = info.block_size or BLOCK_SIZE
    return [pb.BlockRef(mount_id=info.mount_id, path=info.path, version=info.version, index=i, block_size=size,
                        file_length=info.length, in_store=True, length=min(size, info.length - i * size))
            for i in range((info.length + size - 1) // size)]


# -- synthetic workers -----------------------------------------------------------------------

@dataclass
class SyntheticWorker:
    """One worker as the master hears it: registration, heartbeats, block reports."""

    index: int
    address: str
    token: str
    refs: list[pb.BlockRef]
    mount_id: int
    channel: grpc.aio.Channel = field(init=False)
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex)
    pending: list[pb.BlockRef] = field(default_factory=list)
    reported: asyncio.Event = field(default_factory=asyncio.Event)
    held: int = 0                       # blocks of the last full report
    latencies: list[float] = field(default_factory=list)
    slowest_gap: float = 0.0            # longest time between two answered heartbeats
    reregistered: int = 0
    failures: list[str] = field(default_factory=list)
    hits: int = 0

    def __post_init__(self) -> None:
        self.channel = grpc.aio.insecure_channel(self.address, options=WORKER_CHANNEL_OPTIONS)
        self.stub = pb_grpc.MasterStub(self.channel)
        self.metadata = call_metadata(self.token)

    @property
    def worker_id(self) -> str:
        return f"synthetic-{self.index:03d}"

    def info(self) -> pb.WorkerInfo:
        # Nothing in this run makes the master call a worker (no Load, Free, pin): the
        # address is a port nothing listens on.
        return pb.WorkerInfo(worker_id=self.worker_id, host=f"node-{self.index:03d}", address="127.0.0.1:9")

    def stats(self) -> pb.WorkerStats:
        self.hits += 1
        used = self.held * BLOCK_SIZE
        return pb.WorkerStats(tiers=[pb.TierStats(medium="SSD", capacity=1 << 40, used=used, blocks=self.held)],
                              hits=self.hits, misses=self.held, ufs_bytes_read=used, bytes_served=self.hits * BLOCK_SIZE,
                              cached_bytes_by_mount={self.mount_id: used} if used else {})

    async def register(self, with_blocks: bool) -> None:
        """RegisterWorker with the first batch of the blocks held; the rest goes with the
        next heartbeats (`reported` is set when the last batch is acknowledged)."""
        self.held = len(self.refs) if with_blocks else 0
        first, self.pending = rpcutil.split_batch(self.refs if with_blocks else [])
        self.reported.clear()
        await self.stub.RegisterWorker(pb.RegisterWorkerRequest(worker=self.info(), stats=self.stats(), blocks=first,
                                                                incarnation=self.incarnation),
                                       metadata=self.metadata, timeout=CALL_TIMEOUT)
        if not self.pending:
            self.reported.set()

    async def heartbeat_once(self) -> None:
        added, rest = rpcutil.split_batch(self.pending)
        started = time.monotonic()
        answer = await self.stub.Heartbeat(pb.HeartbeatRequest(worker_id=self.worker_id, stats=self.stats(), added=added),
                                           metadata=self.metadata, timeout=CALL_TIMEOUT)
        self.latencies.append(time.monotonic() - started)
        self.pending = rest
        if answer.reregister:
            self.reregistered += 1
            await self.register(with_blocks=self.held > 0)
        elif not self.pending:
            self.reported.set()

    async def heartbeat_loop(self) -> None:
        last = time.monotonic()
        while True:
            try:
                await self.heartbeat_once()
                now = time.monotonic()
                self.slowest_gap, last = max(self.slowest_gap, now - last), now
            except grpc.RpcError as exc:
                self.failures.append(f"{exc.code().name}: {exc.details()}"[:200])
            await asyncio.sleep(HEARTBEAT_INTERVAL)

    def take_heartbeat_numbers(self) -> tuple[list[float], float, int, list[str]]:
        numbers = self.latencies, self.slowest_gap, self.reregistered, self.failures
        self.latencies, self.slowest_gap, self.reregistered, self.failures = [], 0.0, 0, []
        return numbers


# -- the client probe (a process of its own) -------------------------------------------------

async def probe(address: str, seconds: float, sample_file: Path) -> dict[str, Any]:
    """GetBlockLocations, LocateBlocks, GetStatus in turn and Report every REPORT_EVERY s for
    `seconds`; latencies per call and GetBlockLocations answers not naming the file's worker."""
    credentials = Credentials.from_admin(TOKEN)
    sample = json.loads(sample_file.read_text())
    rng = random.Random(1)
    latencies: dict[str, list[float]] = {"GetBlockLocations": [], "LocateBlocks": [], "GetStatus": [], "Report": []}
    wrong = 0
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.MasterStub(channel)
        data, internal, admin = (call_metadata(t) for t in (credentials.data, credentials.internal, credentials.admin))

        async def timed(name: str, call: Any) -> Any:
            started = time.monotonic()
            answer = await call
            latencies[name].append(time.monotonic() - started)
            return answer

        end = time.monotonic() + seconds
        next_report = time.monotonic()
        while time.monotonic() < end:
            entry = rng.choice(sample)
            where = await timed("GetBlockLocations", stub.GetBlockLocations(
                pb.GetBlockLocationsRequest(path=entry["path"]), metadata=data, timeout=CALL_TIMEOUT))
            wrong += any(list(b.worker_ids) != [entry["worker"]] for b in where.blocks)
            ref = pb.BlockRef(mount_id=entry["mount_id"], path=entry["path"], version=entry["version"],
                              index=rng.randrange(BLOCKS_PER_FILE), block_size=BLOCK_SIZE, file_length=entry["length"],
                              in_store=True)
            await timed("LocateBlocks", stub.LocateBlocks(pb.LocateBlocksRequest(blocks=[ref]), metadata=internal,
                                                          timeout=CALL_TIMEOUT))
            await timed("GetStatus", stub.GetStatus(pb.GetStatusRequest(path=entry["path"]), metadata=data,
                                                    timeout=CALL_TIMEOUT))
            if time.monotonic() >= next_report:
                await timed("Report", stub.Report(pb.ReportRequest(), metadata=admin, timeout=CALL_TIMEOUT))
                next_report = time.monotonic() + REPORT_EVERY
            await asyncio.sleep(PROBE_PAUSE)
    return {"latencies": latencies, "wrong_locations": wrong}


def run_probe(address: str, seconds: float, sample_file: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-P", __file__, "--probe-address", address, "--probe", str(seconds),
                             "--sample", str(sample_file)], stdout=subprocess.PIPE, text=True)


# -- the steps -------------------------------------------------------------------------------

def summary(values: list[float]) -> dict[str, float]:
    """Median, 99th percentile and slowest, in ms."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {"n": len(ordered), "p50_ms": round(1000 * statistics.median(ordered), 2),
            "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
            "max_ms": round(1000 * ordered[-1], 2)}


async def workers_listed(address: str) -> int:
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        answer = await pb_grpc.MasterStub(channel).ListWorkers(
            pb.ListWorkersRequest(), metadata=call_metadata(Credentials.from_admin(TOKEN).data), timeout=CALL_TIMEOUT)
        return len(answer.workers)


async def settle_memory(pid: int) -> int:
    """The master's resident bytes once its allocations of the last step have settled."""
    await asyncio.sleep(2 * HEARTBEAT_INTERVAL)
    return rss(pid)


def heartbeat_numbers(workers: list[SyntheticWorker]) -> dict[str, Any]:
    """The heartbeats since the last call: latencies, the longest silence, re-registrations."""
    numbers = [w.take_heartbeat_numbers() for w in workers]
    return {"heartbeat": summary([x for lat, _, _, _ in numbers for x in lat]),
            "heartbeat_slowest_gap_s": round(max((gap for _, gap, _, _ in numbers), default=0.0), 3),
            "reregistered": sum(r for _, _, r, _ in numbers),
            "heartbeat_failures": [f for _, _, _, fails in numbers for f in fails][:5]}


async def full_report(worker: SyntheticWorker, deadline: float) -> bool:
    """Register with every block held until the master acknowledges the last batch, again
    after a failed call (as a worker's next heartbeat does); False at `deadline`."""
    while time.monotonic() < deadline:
        try:
            await worker.register(with_blocks=True)
            await asyncio.wait_for(worker.reported.wait(), max(0.0, deadline - time.monotonic()))
            return True
        except grpc.RpcError as exc:
            worker.failures.append(f"RegisterWorker: {exc.code().name}: {exc.details()}"[:200])
            await asyncio.sleep(HEARTBEAT_INTERVAL)
        except TimeoutError:
            break
    return False


class LoopLag:
    """How late this process's own event loop wakes: the synthetic workers' heartbeats go
    out from it, so a late loop is a silence the master hears that is not the master's doing."""

    TICK = 0.05

    def __init__(self) -> None:
        self.slowest = 0.0

    async def watch(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.TICK)
            self.slowest = max(self.slowest, time.monotonic() - before - self.TICK)


def dropped_in_log(log_file: Path) -> int:
    """Workers the master has dropped so far ("stopped heartbeating; dropped from placement")."""
    return log_file.read_text(errors="replace").count("stopped heartbeating")


async def step(n: int, workers: list[SyntheticWorker], make: Any, loops: list[asyncio.Task[None]], pid: int,
               http: int, address: str, args: argparse.Namespace, sample_file: Path, log_file: Path) -> dict[str, Any]:
    """Grow to `n` workers and measure (see the module's docstring)."""
    result: dict[str, Any] = {"workers": n, "load_average_at_start": round(os.getloadavg()[0], 1)}
    dropped = dropped_in_log(log_file)
    health = HealthProbe(http, Path(tempfile.gettempdir()))
    try:
        before_empty = rss(pid)
        new = [make(i) for i in range(len(workers), n)]
        await asyncio.gather(*(w.register(with_blocks=False) for w in new))
        workers.extend(new)
        loops.extend(asyncio.ensure_future(w.heartbeat_loop()) for w in new)
        after_empty = await settle_memory(pid)
        result["rss_per_new_worker_bytes"] = round((after_empty - before_empty) / len(new))

        # The new workers' full reports one after another, as workers that start in turn.
        cpu, seconds = cpu_seconds(pid), []
        for w in new:
            started = time.monotonic()
            if not await full_report(w, started + REPORT_DEADLINE):
                raise RuntimeError(f"{w.worker_id}'s full report was not acknowledged within {REPORT_DEADLINE:.0f}s")
            seconds.append(time.monotonic() - started)
        new_blocks = sum(w.held for w in new)
        result["blocks"] = blocks = sum(w.held for w in workers)
        result["one_report_blocks"] = new[0].held
        result["one_report_s"] = round(statistics.median(seconds), 3)
        result["one_report_cpu_us_per_block"] = round(1e6 * (cpu_seconds(pid) - cpu) / new_blocks, 2)
        after_blocks = await settle_memory(pid)
        result["rss_per_new_block_bytes"] = round((after_blocks - after_empty) / new_blocks)
        heartbeat_numbers(workers)  # what follows counts heartbeats from here

        cpu, started = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(args.rest)
        result["rest_cpu_per_s"] = round((cpu_seconds(pid) - cpu) / (time.monotonic() - started), 4)
        result["rest_cpu_ms_per_heartbeat"] = round(
            1000 * (result["rest_cpu_per_s"] - args.idle_cpu_per_s) / (n / HEARTBEAT_INTERVAL), 3)

        client = run_probe(address, args.probe, sample_file)
        out, _ = await asyncio.to_thread(client.communicate, timeout=args.probe + 600)
        if client.returncode != 0:
            raise RuntimeError(f"the client probe failed (exit {client.returncode})")
        probed = json.loads(out)
        result["client"] = {name: summary(values) for name, values in probed["latencies"].items()}
        result["wrong_locations"] = probed["wrong_locations"]
        result["rss_bytes"] = rss(pid)
        result.update(heartbeat_numbers(workers))
        result["workers_listed"] = await workers_listed(address)
        result["dropped"] = dropped_in_log(log_file) - dropped
    finally:
        await asyncio.to_thread(health.stop)
    result["healthz_slowest_s"] = round(health.slowest, 3)
    result["healthz_probes"], result["healthz_failed"] = health.probes, len(health.failures)
    result["storm"] = await storm(workers, pid, http, address, log_file)
    return result


async def storm(workers: list[SyntheticWorker], pid: int, http: int, address: str, log_file: Path) -> dict[str, Any]:
    """Every worker registers again at once with every block it holds (what a master restart
    brings): until the master has acknowledged all and lists every worker, or STORM_DEADLINE."""
    found: dict[str, Any] = {"blocks": sum(len(w.refs) for w in workers)}
    dropped = dropped_in_log(log_file)
    health = HealthProbe(http, Path(tempfile.gettempdir()))
    try:
        cpu, started = cpu_seconds(pid), time.monotonic()
        deadline = started + STORM_DEADLINE
        lag = LoopLag()
        watch = asyncio.ensure_future(lag.watch())
        done = await asyncio.gather(*(full_report(w, deadline) for w in workers))
        watch.cancel()
        found["bench_loop_lag_max_s"] = round(lag.slowest, 3)
        found["acknowledged_s"] = round(time.monotonic() - started, 2) if all(done) else None
        found["cpu_s"] = round(cpu_seconds(pid) - cpu, 2)
        found["cpu_us_per_block"] = round(1e6 * found["cpu_s"] / found["blocks"], 2)
        while (listed := await workers_listed(address)) < len(workers) and time.monotonic() < deadline:
            await asyncio.sleep(HEARTBEAT_INTERVAL)
        found["all_listed_s"] = round(time.monotonic() - started, 2) if listed == len(workers) else None
        found["workers_listed"] = listed
        found["dropped"] = dropped_in_log(log_file) - dropped
        found.update(heartbeat_numbers(workers))
    finally:
        await asyncio.to_thread(health.stop)
    found["healthz_slowest_s"] = round(health.slowest, 3)
    # Let a master still behind catch up before the next step measures.
    await asyncio.sleep(2 * HEARTBEAT_INTERVAL * HEARTBEAT_MISSES)
    return found


async def idle_cpu(pid: int, http: int, seconds: float) -> float:
    """The master's CPU seconds a second with no worker, /healthz asked as in the steps."""
    health = HealthProbe(http, Path(tempfile.gettempdir()))
    try:
        cpu, started = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(seconds)
        return round((cpu_seconds(pid) - cpu) / (time.monotonic() - started), 4)
    finally:
        await asyncio.to_thread(health.stop)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    steps = [int(s) for s in args.steps.split(",")]
    files_per_worker = max(1, args.blocks_per_worker // BLOCKS_PER_FILE)
    args.workdir.mkdir(parents=True, exist_ok=True)
    tree = args.workdir / "tree"
    make_tree(tree, max(steps), files_per_worker)
    run_dir = Path(tempfile.mkdtemp(prefix="strata-workers-scale-"))
    master, address, http = start_master(run_dir, tree)
    loops: list[asyncio.Task[None]] = []
    workers: list[SyntheticWorker] = []
    try:
        rss_start = rss(master.pid)
        files = await mounted_files(address, tree)
        rss_mounted = await settle_memory(master.pid)
        args.idle_cpu_per_s = await idle_cpu(master.pid, http, args.rest)
        by_worker: dict[int, list[pb.BlockRef]] = {}
        for info in files:
            folder = info.path[len(MOUNT) + 1:].split("/", 1)[0]
            by_worker.setdefault(int(folder[1:]), []).extend(refs_of(info))
        mount_id = files[0].mount_id
        sample = [{"path": f.path, "version": f.version, "length": f.length, "mount_id": f.mount_id,
                   "worker": f"synthetic-{int(f.path[len(MOUNT) + 2:].split('/', 1)[0]):03d}"} for f in files]
        internal = Credentials.from_admin(TOKEN).internal

        def make(i: int) -> SyntheticWorker:
            return SyntheticWorker(i, address, internal, by_worker[i], mount_id)

        results = []
        for n in steps:
            sample_file = run_dir / f"sample-{n}.json"
            sample_file.write_text(json.dumps([s for s in sample if int(s["worker"].rsplit("-", 1)[1]) < n]))
            result = await step(n, workers, make, loops, master.pid, http, address, args, sample_file,
                                run_dir / "master.log")
            results.append(result)
            print(json.dumps(result), flush=True)
        return {"settings": {"steps": steps, "blocks_per_worker": files_per_worker * BLOCKS_PER_FILE,
                             "block_size": BLOCK_SIZE, "blocks_per_file": BLOCKS_PER_FILE, "files": len(files),
                             "heartbeat_interval_s": HEARTBEAT_INTERVAL, "heartbeat_misses": HEARTBEAT_MISSES,
                             "rest_s": args.rest, "probe_s": args.probe, "report_every_s": REPORT_EVERY,
                             "storm_deadline_s": STORM_DEADLINE},
                "master_rss_start": rss_start, "idle_cpu_per_s": args.idle_cpu_per_s, "master_rss_mounted": rss_mounted,
                "steps": results, "load_average": os.getloadavg(), "cpus": os.cpu_count()}
    finally:
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        for w in workers:
            await w.channel.close()
        master.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    mib = 1 << 20
    lines = [
        "# Many workers on one master (issue 27, target 5)",
        "",
        f"One real master process; N **synthetic workers**: clients in one bench process speaking the worker "
        f"protocol over the master's gRPC API (RegisterWorker with the blocks held, a Heartbeat with stats every "
        f"{s['heartbeat_interval_s']:g} s, the default; {s['heartbeat_misses']} missed drop a worker), not worker "
        f"processes (100 of those do not fit 2 cores). Each worker reports {s['blocks_per_worker']:,} blocks of "
        f"{s['block_size'] // mib} MiB ({s['blocks_per_file']} a file) of a read-only file:// mount of "
        f"{s['files']:,} sparse files. At each step the new workers join and report their blocks one after "
        f"another; then {s['rest_s']:g} s of heartbeats only (rest); then a client process asks GetBlockLocations, "
        f"LocateBlocks (1 block), GetStatus in turn and Report every {s['report_every_s']:g} s for {s['probe_s']:g} s "
        "while the workers heartbeat; last, all N workers register again at once with every block (the storm a "
        "master restart brings).",
        "",
        "## Joining, at rest, with a client",
        "",
        "| workers | blocks | one report: s (us CPU/block) | master CPU s/s at rest (ms a heartbeat) | RSS MiB "
        "| RSS/worker (no blocks) | RSS/block | heartbeat p50 / p99 / max ms | /healthz slowest s "
        "| dropped / re-registered |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["steps"]:
        hb = r["heartbeat"]
        lines.append(
            f"| {r['workers']} | {r['blocks']:,} | {r['one_report_s']} ({r['one_report_cpu_us_per_block']}) "
            f"| {r['rest_cpu_per_s']} ({r['rest_cpu_ms_per_heartbeat']}) | {r['rss_bytes'] / mib:.0f} "
            f"| {r['rss_per_new_worker_bytes'] / 1024:.0f} KiB | {r['rss_per_new_block_bytes']} B "
            f"| {hb.get('p50_ms', '-')} / {hb.get('p99_ms', '-')} / {hb.get('max_ms', '-')} "
            f"| {r['healthz_slowest_s']} | {r['dropped']} / {r['reregistered']} |")
    lines += ["", "Client latency meanwhile (ms: median / 99th percentile / slowest (calls)):", "",
              "| workers | GetBlockLocations (16 blocks) | LocateBlocks (1 block) | GetStatus | Report "
              "| answers not naming the holder |",
              "|---|---|---|---|---|---|"]
    for r in result["steps"]:
        cells = [f"{c.get('p50_ms', '-')} / {c.get('p99_ms', '-')} / {c.get('max_ms', '-')} ({c['n']})"
                 for c in (r["client"][name] for name in ("GetBlockLocations", "LocateBlocks", "GetStatus", "Report"))]
        lines.append(f"| {r['workers']} | " + " | ".join(cells) + f" | {r['wrong_locations']} |")
    lines += ["", "## Every worker's full report at once (a master restart)", "",
              "| workers | blocks | all acknowledged after s | master CPU s (us/block) | all listed again after s "
              "| workers dropped meanwhile | re-registered | heartbeat max ms | /healthz slowest s |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in result["steps"]:
        st = r["storm"]
        never = f"not within {s['storm_deadline_s']:.0f}"
        lines.append(
            f"| {r['workers']} | {st['blocks']:,} | {st['acknowledged_s'] if st['acknowledged_s'] is not None else never} "
            f"| {st['cpu_s']} ({st['cpu_us_per_block']}) "
            f"| {st['all_listed_s'] if st['all_listed_s'] is not None else never} | {st['dropped']} "
            f"| {st['reregistered']} | {st['heartbeat'].get('max_ms', '-')} | {st['healthz_slowest_s']} |")
    loads = ", ".join(f"{r['load_average_at_start']}" for r in result["steps"])
    lines += ["", f"Master RSS at start {result['master_rss_start'] / mib:.0f} MiB, after the mount and its listing "
              f"{result['master_rss_mounted'] / mib:.0f} MiB. RSS/worker and RSS/block are the growth of the step "
              "over its new workers and blocks; RSS is the whole process. The master's CPU with no worker "
              f"(/healthz asked every 50 ms, as in every step): {result['idle_cpu_per_s']} s/s; the CPU a heartbeat "
              "is the rest's CPU above that, over the heartbeats a second. 1-minute load average at each step's "
              f"start: {loads}; at the end {result['load_average'][0]:.1f} ({result['cpus']} CPUs, shared with "
              "other jobs).", ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", default="10,25,50,100", help="worker counts, growing")
    p.add_argument("--blocks-per-worker", type=int, default=10_000)
    p.add_argument("--rest", type=float, default=10.0, help="seconds of heartbeats only at each step")
    p.add_argument("--probe", type=float, default=10.0, help="seconds of client calls at each step")
    p.add_argument("--workdir", type=Path, default=BENCH / ".scratch" / "workers-scale")
    p.add_argument("--name", default="workers-scale")
    p.add_argument("--probe-address", help=argparse.SUPPRESS)
    p.add_argument("--sample", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.probe_address:
        print(json.dumps(asyncio.run(probe(args.probe_address, args.probe, args.sample))))
        return 0
    result = asyncio.run(measure(args))
    text = report(result)
    write_result(BENCH / "results" / args.name, result, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
