"""The many-files workload (issue 27): a file:// store of N files of 1 KiB, mounted read-only
and synced hourly, as an image or audio dataset is; its metadata path measured against the
same tree on local disk, while a probe asks the master's /healthz all along.

- listing: files/s of a whole walk: `find` of the local tree (the limit), the master's
  namespace alone (in this process, paging as the master does), the fsspec client's find
  (ListStatusPages over gRPC, in a new process; its peak memory kept) and `find` through a
  read-only FUSE mount of the Mount;
- stats: stats/s of warm files by 4 new processes at once on the worker's node, through the
  fsspec client (answered by the node's worker where it can), through FUSE and on local disk;
  the master's CPU time (/proc/<pid>/stat) and GetStatus requests (/metrics) meanwhile;
- the master's resident memory per file (/proc/<pid>/status VmRSS: the master exposes no
  tracemalloc) before and after the mount, the find and the stats;
- how long `mount add` and a report take, the slowest /healthz answer, failed probes, workers
  dropped and answers served stale while all this runs.

Each listing is done twice (the second walk is warm where anything caches), each stat pass
once warm (a first pass by as many new processes warms the node); the times go in the
workload's series, the master's numbers in its `extra`. report.judge_issue27 judges them.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contestants import Access
from results import Series, Workload
from workloads import load1, run_processes

BENCH = Path(__file__).resolve().parent
FILE_BYTES = 1024
FILES_PER_FOLDER = 1000
FOLDERS_PER_TOP = 100
STAT_PROCESSES = 4
IDLE_SAMPLE = 3.0  # seconds the master's CPU at rest is sampled for
MOUNT = "/manyfiles"
# How long the master's report may take to total the mount's files before the run goes on
# (the totals are made off the request's path, paced).
TOTALS_WAIT = 120.0
# Contestants that both list and stat: one label for both.
LABELS = {"local": "the tree on local disk (the limit): find, os.stat",
          "strata-fuse": "Strata, a read-only FUSE mount of the Mount: find, os.stat"}


@dataclass(frozen=True)
class Servers:
    """The Strata servers the workload runs against (bench/stack.py's or a test's)."""

    master_address: str
    master_pid: int
    master_http: int
    token: str
    node: str                                  # a host with a worker: its processes read short-circuit
    elsewhere: str                             # a host without a worker
    fuse: Callable[[str], Path | None]         # mounts a Mount read-only; its path, None without FUSE
    fuse_unavailable: Callable[[], str]        # why there is no FUSE mount


def make_tree(base: Path, files: int) -> Path:
    """`files` files of 1 KiB under base/tree, 1,000 a folder, two levels deep (100 folders
    of folders); made once (a marker says it is whole). The tree's root."""
    root = base / "tree"
    marker = base / f".made-{files}"
    if marker.exists():
        return root
    for folder_index in range((files + FILES_PER_FOLDER - 1) // FILES_PER_FOLDER):
        make_folder(root, folder_index, files)
    marker.touch()
    return root


def make_folder(root: Path, folder_index: int, files: int) -> None:
    """The tree's folder `folder_index` and its files (of the first `files` of the tree)."""
    folder = root / f"t{folder_index // FOLDERS_PER_TOP:03d}" / f"d{folder_index % FOLDERS_PER_TOP:02d}"
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        start = folder_index * FILES_PER_FOLDER
        for i in range(start, min(start + FILES_PER_FOLDER, files)):
            out = os.open(f"f{i % FILES_PER_FOLDER:03d}.bin", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644, dir_fd=fd)
            try:
                os.write(out, (b"%08d" % i) * (FILE_BYTES // 8))
            finally:
                os.close(out)
    finally:
        os.close(fd)


def relative_paths(files: int, sample: int) -> list[str]:
    """`sample` of the tree's files spread evenly over it, relative to its root."""
    step = max(1, files // sample)
    found = []
    for i in range(0, files, step)[:sample]:
        folder_index = i // FILES_PER_FOLDER
        found.append(f"t{folder_index // FOLDERS_PER_TOP:03d}/d{folder_index % FOLDERS_PER_TOP:02d}/"
                     f"f{i % FILES_PER_FOLDER:03d}.bin")
    return found


# -- the master process ----------------------------------------------------------------------

def rss(pid: int) -> int:
    """Resident bytes of process `pid`."""
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    if found is None:
        raise RuntimeError(f"no VmRSS in /proc/{pid}/status: is the process gone?")
    return int(found.group(1)) * 1024


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process `pid`, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def master_metric(http_port: int, name: str, labels: str = "") -> float:
    """A counter of the master's /metrics (summed over its labels unless `labels` is given)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    chosen = re.escape(labels) if labels else r"(?:\{[^}]*\})?"
    pattern = re.compile(rf"^{re.escape(name)}(?:_total)?({chosen})\s+(\S+)$", re.M)
    return sum(float(m.group(2)) for m in pattern.finditer(text))


class HealthProbe:
    """/healthz of the master every 50 ms in a process of its own (bench/healthprobe.py):
    probes, slowest answer, failures."""

    def __init__(self, http_port: int, scratch: Path) -> None:
        self.stop_file = scratch / f"probe-{time.monotonic_ns()}.stop"
        self.process = subprocess.Popen([sys.executable, "-P", str(BENCH / "healthprobe.py"),
                                         f"http://127.0.0.1:{http_port}/healthz", str(self.stop_file)],
                                        stdout=subprocess.PIPE, text=True)
        self.probes, self.slowest = 0, float("inf")
        self.failures: list[str] = []

    def stop(self) -> None:
        self.stop_file.touch()
        out, _ = self.process.communicate(timeout=60)
        self.stop_file.unlink(missing_ok=True)
        lines = out.splitlines()
        self.failures = lines[:-1]
        if lines:
            probes, slowest = lines[-1].split()
            self.probes, self.slowest = int(probes), float(slowest)


# -- the measurements --------------------------------------------------------------------------

def walk_with_find(root: Path) -> tuple[float, int]:
    """Seconds of `find ROOT -type f` and the files it printed."""
    started = time.perf_counter()
    done = subprocess.run(["find", str(root), "-type", "f"], stdout=subprocess.PIPE, check=True, timeout=3600)
    return time.perf_counter() - started, done.stdout.count(b"\n")


def namespace_listing(tree: Path, files: int) -> tuple[float, float]:
    """Seconds a new namespace of the master takes to list the tree recursively in pages (in
    this process, as bench/metadata_memory.py does): the first time (it walks the store),
    then again (from what it holds: the namespace alone)."""
    from metadata_memory import MountOptions, MountTable, Namespace, find  # one place names the namespace's modules

    async def listing() -> tuple[float, float]:
        table = MountTable(None, allowed_roots=[str(tree)])
        namespace = Namespace(table, None, block_size=4 << 20)
        table.add("/m", f"file://{tree}", MountOptions(read_only=True, metadata_sync_interval=3600))
        seconds = []
        for _ in range(2):
            started = time.perf_counter()
            found, _ = await find(namespace, "/m")
            seconds.append(time.perf_counter() - started)
            _check_count("the namespace's listing", found, files)
        return seconds[0], seconds[1]

    return asyncio.run(listing())


def _record(series: Series, seconds: float, count: int, unit: str) -> None:
    series.times.append(seconds)
    series.extra.setdefault(f"{unit}_per_s", []).append(round(count / seconds))


def _workload(files: int, stat_files: int) -> Workload:
    return Workload(f"manyfiles-{files}", f"Many files: a mount of {files:,} files of 1 KiB (issue 27)",
                    f"a file:// store of {files:,} files of 1 KiB, 1,000 a folder, two levels deep, mounted read-only and "
                    f"synced hourly; whole walks (files/s), stats of {stat_files:,} warm files by {STAT_PROCESSES} new "
                    "processes on the worker's node (stats/s), the master's memory, CPU and /healthz meanwhile", 0)


def failed(files: int, why: str) -> Workload:
    """The workload of a run that raised `why`: every target it has is judged MISS."""
    w = _workload(files, 0)
    w.extra = {"files": files, "failed": why}
    return w


def measure(servers: Servers, base: Path, files: int, stat_files: int,
            log: Callable[[str], None] = print) -> Workload:
    """Make (or reuse) the tree under `base`, mount it and measure; see the module docstring."""
    from strata.cacheserver.client.fs import StrataFileSystem
    from strata.contract.proto import strata_pb2 as pb

    w = _workload(files, stat_files)
    w.load = (load1(), 0.0)
    log(f"[{w.id}] making the tree of {files:,} files (kept for the next run)")
    tree = make_tree(base, files)
    pid, http = servers.master_pid, servers.master_http
    admin = StrataFileSystem(master=servers.master_address, token=servers.token, host=servers.elsewhere,
                             skip_instance_cache=True)
    probe = HealthProbe(http, base)
    extra: dict[str, Any] = {"files": files, "stat_files": stat_files, "stat_processes": STAT_PROCESSES}
    try:
        workers_before = len(admin.client.workers(refresh=True))
        rss_before = rss(pid)
        started = time.perf_counter()
        admin.client.mount(MOUNT, f"file://{tree}", pb.MountOptions(read_only=True, metadata_sync_interval=3600),
                           replace=True)
        extra["mount_add_s"] = time.perf_counter() - started
        time.sleep(1)  # whatever the master does after the answer is counted with the mount
        extra["rss_after_mount"] = rss(pid)
        started = time.perf_counter()
        admin.client.report()
        extra["report_s"] = time.perf_counter() - started
        log(f"[{w.id}] mount add {extra['mount_add_s']:.2f} s, report {extra['report_s']:.2f} s; "
            f"master {(extra['rss_after_mount'] - rss_before) / files:.0f} B/file after the mount")

        _listings(w, servers, tree, files, log)
        extra["rss_after_find"] = rss(pid)

        extra.update(_stats(w, servers, tree, files, stat_files, log))
        extra["rss_after_stats"] = rss(pid)

        def totalled() -> bool:
            return any(m.mount.path == MOUNT and m.ufs_files == files for m in admin.client.report().mounts)

        deadline = time.monotonic() + TOTALS_WAIT
        while not (done := totalled()) and time.monotonic() < deadline:
            time.sleep(1)
        extra["report_totalled"], extra["totals_wait_s"] = done, TOTALS_WAIT
        extra["rss_after_report"] = rss(pid)
        extra["rss_before"] = rss_before
        extra["workers_dropped"] = workers_before - len(admin.client.workers(refresh=True))
        extra["stale_answers"] = master_metric(http, "strata_master_stale_metadata_answers")
    finally:
        probe.stop()
        try:
            admin.client.unmount(MOUNT)
        except Exception as exc:  # noqa: BLE001 - the measurements stand; say what was left
            log(f"[{w.id}] could not unmount {MOUNT}: {exc}")
        admin.client.close()
    extra.update(health_probes=probe.probes, health_slowest_s=probe.slowest, health_failures=probe.failures[:5],
                 health_failed=len(probe.failures))
    for step in ("mount", "find", "stats", "report"):
        extra[f"bytes_per_file_after_{step}"] = (extra[f"rss_after_{step}"] - extra["rss_before"]) / files
    log(f"[{w.id}] master {extra['bytes_per_file_after_find']:.0f} B/file after the find; /healthz slowest "
        f"{probe.slowest:.3f} s of {probe.probes} probes, {len(probe.failures)} failed")
    w.extra = extra
    w.load = (w.load[0], load1())
    return w


def _listings(w: Workload, servers: Servers, tree: Path, files: int, log: Callable[[str], None]) -> None:
    """Whole walks, twice each: local find, the namespace alone, the fsspec client, FUSE."""
    local = w.series_for("local", LABELS["local"], "list")
    client = w.series_for("strata-client", "Strata fsspec find (ListStatusPages over gRPC, new process)", "list")
    fuse = w.series_for("strata-fuse", LABELS["strata-fuse"], "list")
    namespace = w.series_for("namespace", "the master's namespace alone (in process, in pages)", "list")
    mountpoint = servers.fuse(MOUNT)
    if mountpoint is None:
        fuse.skipped = servers.fuse_unavailable()
    job = {"access": Access("strata", MOUNT, {"master": servers.master_address, "token": servers.token,
                                              "host": servers.elsewhere}).to_json(),
           "op": "find", "full_paths": [MOUNT]}

    def local_walk() -> None:
        seconds, count = walk_with_find(tree)
        _check_count("local find", count, files)
        _record(local, seconds, count, "files")

    def client_walk() -> None:
        _, outputs = run_processes([job])
        _check_count("the fsspec client's find", int(outputs[0]["result"]), files)
        _record(client, outputs[0]["seconds"], files, "files")
        client.extra.setdefault("max_rss", []).append(outputs[0]["max_rss"])
        client.extra.setdefault("rss_growth", []).append(outputs[0]["max_rss"] - outputs[0]["rss_at_start"])

    def fuse_walk() -> None:
        assert mountpoint is not None
        seconds, count = walk_with_find(mountpoint)
        _check_count("find through FUSE", count, files)
        _record(fuse, seconds, count, "files")

    def namespace_walk() -> None:
        walked, listed = namespace_listing(tree, files)
        _record(namespace, listed, files, "files")
        namespace.extra["first_walk_files_per_s"] = [round(files / walked)]

    for rep in range(2):
        _attempt(local, rep, local_walk, log)
        _attempt(client, rep, client_walk, log)
        if mountpoint is not None:
            _attempt(fuse, rep, fuse_walk, log)
        log(f"[{w.id}] walk {rep + 1}: local {_last(local, 'files')} files/s, client {_last(client, 'files')} files/s, "
            f"FUSE {_last(fuse, 'files')} files/s")
    _attempt(namespace, 0, namespace_walk, log)
    log(f"[{w.id}] the namespace alone lists {_last(namespace, 'files')} files/s (its first walk, of the store: "
        f"{namespace.extra.get('first_walk_files_per_s', ['-'])[-1]} files/s)")


def _attempt(series: Series, rep: int, walk: Callable[[], None], log: Callable[[str], None]) -> None:
    """Run one measurement of `series`; a failure is recorded in it (a result), not raised."""
    try:
        walk()
    except Exception as exc:  # noqa: BLE001 - any failure of a contestant is a result
        message = f"pass {rep + 1}: {type(exc).__name__}: {' '.join(str(exc).split())}"[:400]
        series.failures.append(message)
        log(f"FAILED {series.contestant} {series.phase}: {message}")


def _last(series: Series, unit: str) -> str:
    values = series.extra.get(f"{unit}_per_s")
    return f"{values[-1]:,}" if values else "-"


def _stats(w: Workload, servers: Servers, tree: Path, files: int, stat_files: int,
           log: Callable[[str], None]) -> dict[str, Any]:
    """Each contestant's files stat'ed by STAT_PROCESSES new processes, once to warm, then
    timed by as many new ones; the master's CPU and GetStatus requests during the timed pass."""
    sample = relative_paths(files, stat_files)
    mountpoint = servers.fuse(MOUNT)
    accesses = {
        "local": (LABELS["local"], Access("posix", str(tree))),
        "strata-sc": ("Strata fsspec info on the worker's node", Access(
            "strata", MOUNT, {"master": servers.master_address, "token": servers.token, "host": servers.node})),
        "strata-fuse": (LABELS["strata-fuse"], Access("posix", str(mountpoint or ""))),
    }
    # The master's CPU at rest meanwhile (heartbeats, the /healthz probe), taken off what the
    # stats cost it.
    cpu = cpu_seconds(servers.master_pid)
    time.sleep(IDLE_SAMPLE)
    idle = (cpu_seconds(servers.master_pid) - cpu) / IDLE_SAMPLE
    found: dict[str, Any] = {"master_idle_cpu_per_s": idle}
    for cid, (label, access) in accesses.items():
        series = w.series_for(cid, label, "stat")
        if cid == "strata-fuse" and mountpoint is None:
            series.skipped = servers.fuse_unavailable()
            continue
        jobs = [{"access": access.to_json(), "op": "stat_files", "full_paths": [access.path(p) for p in share]}
                for share in (sample[i::STAT_PROCESSES] for i in range(STAT_PROCESSES))]
        measured: dict[str, float] = {}

        def stats() -> None:
            run_processes(jobs)  # warm: the node's worker, FUSE's caches, the kernel's
            cpu, requests = cpu_seconds(servers.master_pid), _get_status_requests(servers)
            seconds, outputs = run_processes(jobs)
            measured["cpu"] = cpu_seconds(servers.master_pid) - cpu
            measured["requests"] = _get_status_requests(servers) - requests
            measured["cpu"] = max(0.0, measured["cpu"] - idle * seconds)
            _check_count(f"{cid} stats", int(sum(o["result"] for o in outputs)), len(sample))
            _record(series, seconds, len(sample), "stats")

        _attempt(series, 0, stats, log)
        if not series.times:
            continue
        cpu, requests = measured["cpu"], measured["requests"]
        seconds = series.times[-1]
        series.extra["master_cpu_us_per_stat"] = [round(cpu / len(sample) * 1e6, 1)]
        series.extra["master_get_status"] = [int(requests)]
        if cid.startswith("strata"):
            found[f"{cid}_master_cpu_s"] = cpu
            found[f"{cid}_master_get_status"] = requests
        log(f"[{w.id}] {cid:12s} {len(sample) / seconds:9,.0f} stats/s; master {cpu:.2f} CPU s, "
            f"{requests:.0f} GetStatus")
    return found


def _get_status_requests(servers: Servers) -> float:
    return master_metric(servers.master_http, "strata_master_metadata_requests", '{method="GetStatus"}')


def _check_count(what: str, got: int, expected: int) -> None:
    if got != expected:
        raise AssertionError(f"{what} saw {got} files of {expected}")
