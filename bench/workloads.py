"""The five workloads of issue 6 and the three of issue 15 (training-style reads, a dataset
larger than the MEM tier, many readers on one worker). Repetitions are interleaved (rep 1 of every contestant,
then rep 2, ...) so a change in the machine's load hits all contestants alike."""

from __future__ import annotations

import json
import os
import random
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.contract.modes import WriteType

from contestants import Access, Contestant, LoopbackSender, close_filesystem, open_filesystem, remove_retired
from datasets import Dataset, human, size_label
from ops import READ_CHUNK, aggregate, check, count_lines, list_and_stat
from results import Series, Workload
from stack import TOKEN, WRITE_MOUNT, wait_until

BENCH = Path(__file__).resolve().parent
READER_TIMEOUT = 600.0
PERSIST_TIMEOUT = 300.0
WRITE_TYPES = tuple(WriteType)


def load1() -> float:
    return os.getloadavg()[0]


# A job longer than this goes to the reader in a file (an argument may be at most 128 KiB).
JOB_ARGUMENT_LIMIT = 100_000


def run_processes(jobs: Sequence[dict[str, Any]], job_dir: Path | None = None) -> tuple[float, list[dict[str, Any]]]:
    """One reader process per job (bench/reader.py), let go at once once all are ready;
    seconds until the last is done, and what each printed. A long job (thousands of paths)
    is written to a file in `job_dir` (default: a temporary folder) and passed as @FILE."""
    with tempfile.TemporaryDirectory(dir=job_dir) as folder:
        arguments = []
        for index, job in enumerate(jobs):
            text = json.dumps(job)
            if len(text) > JOB_ARGUMENT_LIMIT:
                path = Path(folder) / f"job-{index}.json"
                path.write_text(text)
                text = f"@{path}"
            arguments.append(text)
        procs = [subprocess.Popen([sys.executable, "-P", str(BENCH / "reader.py"), argument],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
                 for argument in arguments]
        try:
            for p in procs:
                _expect_line(p, "READY")
            start = time.perf_counter()
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            outputs = [json.loads(_expect_line(p, "{")) for p in procs]
            failed = [o["error"] for o in outputs if "error" in o]
            if failed:
                raise RuntimeError(f"{len(failed)} of {len(procs)} reader processes failed: {failed[0]}")
            return time.perf_counter() - start, outputs
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=30)
                for stream in (p.stdin, p.stdout):
                    if stream is not None:
                        stream.close()


def _expect_line(p: subprocess.Popen[str], prefix: str) -> str:
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], READER_TIMEOUT)
    line = p.stdout.readline() if ready else ""
    if not line.startswith(prefix):
        raise RuntimeError(f"reader process said {line!r} (exit code {p.poll()}), expected {prefix}...")
    return line


@dataclass
class Runner:
    stack: Any
    contestants: list[Contestant]
    local_root: Path
    reps: int
    bucket: str
    mount: str
    log: Callable[[str], None] = print
    # Cold repetitions of datasets of at least `big` bytes (a cold GiB over the link takes
    # ~10 s per contestant): keeps the full run near half an hour.
    big_cold_reps: int = 3
    big: int = 1024 ** 3
    # The cache folders cold reads replaced (contestants.retire), removed between workloads.
    scratch: Path | None = None
    by_id: dict[str, Contestant] = field(init=False)

    def __post_init__(self) -> None:
        self.by_id = {c.id: c for c in self.contestants}

    def between_workloads(self) -> None:
        """Remove the cache folders the last workload's cold reads replaced (while no
        contestant reads)."""
        if self.scratch is not None:
            remove_retired(self.scratch)

    def timed(self, fn: Callable[[], float], expected: float, op: str, who: str) -> float:
        start = time.perf_counter()
        got = fn()
        seconds = time.perf_counter() - start
        check(op, got, expected, who)
        return seconds

    def attempt(self, series: Series, rep: int, fn: Callable[[], float]) -> float | None:
        """Seconds of fn, added to the series; a failure (an error, wrong bytes) is recorded
        in the series instead, and the run goes on with the other contestants."""
        try:
            seconds = fn()
        except Exception as exc:  # noqa: BLE001 - any failure of a contestant is a result
            message = f"rep {rep + 1}: {type(exc).__name__}: {' '.join(str(exc).split())}"[:400]
            series.failures.append(message)
            self.log(f"FAILED {series.contestant} {series.phase}: {message}")
            return None
        series.times.append(seconds)
        return seconds

    def cold_reps_for(self, dataset: Dataset) -> int:
        return min(self.reps, self.big_cold_reps) if dataset.bytes >= self.big else self.reps

    def skip_unavailable(self, workload: Workload, contestants: Sequence[Contestant], phases: Sequence[str]) -> None:
        for c in contestants:
            if c.unavailable:
                for phase in phases:
                    workload.series_for(c.id, c.label, phase).skipped = c.unavailable

    # -- 1 and 2: reads, cold and warm --------------------------------------------------------

    def reads(self, workload: Workload, dataset: Dataset, op: str, contestants: Sequence[str],
              extra_limit: Callable[[Workload], None] | None = None) -> Workload:
        chosen = [self.by_id[c] for c in contestants if c in self.by_id]
        self.skip_unavailable(workload, chosen, ("cold", "warm"))
        workload.load = (load1(), 0.0)
        cold_reps = self.cold_reps_for(dataset)
        for rep in range(self.reps):
            for c in chosen:
                if c.unavailable:
                    continue
                phases: tuple[str, ...] = ("cold", "warm") if c.cached else ("cold",)
                if rep >= cold_reps:  # the cache is still warm from the previous repetition
                    phases = tuple(p for p in phases if p != "cold")
                else:
                    c.cold([dataset.name])
                for phase in phases:
                    paths = [c.access.path(f) for f in dataset.files]
                    with c.filesystem() as fs:
                        fn = (lambda: aggregate(fs, paths)) if op == "aggregate" else (lambda: count_lines(fs, paths[0]))
                        seconds = self.attempt(workload.series_for(c.id, c.label, phase), rep,
                                               lambda: self.timed(fn, dataset.expected, op, c.id))
                    if seconds is None:
                        continue
                    self.log(f"[{workload.id}] rep {rep + 1}/{self.reps} {c.id:14s} {phase:5s} {seconds:7.3f} s"
                             f"  ({dataset.bytes / seconds / 1e6:8.1f} MB/s)  load {load1():.1f}")
            if extra_limit is not None:
                extra_limit(workload)
        for c in chosen:
            if not c.cached and not c.unavailable:
                cold = workload.series_for(c.id, c.label, "cold")
                warm = workload.series_for(c.id, c.label, "warm")
                warm.times, warm.failures = list(cold.times), list(cold.failures)
                warm.note = cold.note = "no cache: every read is a first read (one series, shown as both)"
        if cold_reps < self.reps:
            workload.extra["cold_repetitions"] = cold_reps
        workload.load = (workload.load[0], load1())
        for c in chosen:
            if c.cached and not c.unavailable:
                c.cold([dataset.name])  # leave no cached copies behind for the next workload
        return workload

    def aggregation(self, dataset: Dataset) -> Workload:
        w = Workload(f"aggregate-{size_label(dataset.nominal)}", f"Parquet aggregation, {human(dataset.nominal)}",
                     f"pyarrow reads columns a and b of {len(dataset.files)} Parquet files "
                     f"({dataset.bytes / 2**20:.0f} MiB, uncompressed float64) and sums them",
                     dataset.bytes)
        return self.reads(w, dataset, "aggregate", [c.id for c in self.contestants])

    def line_count(self, dataset: Dataset) -> Workload:
        w = Workload(f"linecount-{size_label(dataset.nominal)}", f"Line count, {human(dataset.nominal)} text file",
                     f"one thread reads the file front to back in {READ_CHUNK // 2**20} MiB reads and counts newlines",
                     dataset.bytes)
        local = Path(self.local_root) / dataset.files[0]
        sender = LoopbackSender(local)

        def tcp(workload: Workload) -> None:
            lines = [0]

            def consume(data: bytes) -> None:
                lines[0] += data.count(b"\n")

            def fn() -> float:
                lines[0] = 0
                sender.read(READ_CHUNK, consume)
                return float(lines[0])

            s = workload.series_for("loopback-tcp", "loopback TCP from another process (sendfile from page cache)", "warm")
            seconds = self.attempt(s, len(s.times), lambda: self.timed(fn, dataset.expected, "count_lines", "loopback-tcp"))
            if seconds is None:
                return
            self.log(f"[{workload.id}] loopback-tcp warm {seconds:7.3f} s ({dataset.bytes / seconds / 1e6:8.1f} MB/s)")

        try:
            return self.reads(w, dataset, "count_lines", [c.id for c in self.contestants], extra_limit=tcp)
        finally:
            sender.close()

    # -- 3: writes ----------------------------------------------------------------------------

    def writes(self, dataset: Dataset) -> Workload:
        """Write the dataset's tables as Parquet and read them back, per write type, against
        writing straight to the store with s3fs and to local disk."""
        import pyarrow.parquet as pq

        tables = [pq.read_table(self.local_root / f) for f in dataset.files]
        w = Workload(f"write-{size_label(dataset.nominal)}", f"Write a Parquet dataset and read it back, {human(dataset.nominal)}",
                     f"pyarrow writes {len(tables)} Parquet files through the filesystem, then the aggregation reads them back "
                     "(Strata: the fsspec client on another host, one write type each)", dataset.bytes)
        strata = self.by_id["strata-remote"].access
        modes: list[tuple[str, str, Access]] = [("s3fs", "s3fs, direct to the store", self.by_id["s3fs"].access)]
        for wt in WRITE_TYPES:  # through the writable mount of the store's writes/ folder
            modes.append((f"strata-{wt}", f"Strata, write type {wt}",
                          Access("strata", WRITE_MOUNT, {**strata.options, "write_type": wt})))
        scratch = self.local_root.parent / "writes"
        modes.append(("local", "local disk", Access("posix", str(scratch))))
        w.load = (load1(), 0.0)
        for rep in range(self.reps):
            for mid, label, access in modes:
                folder = f"{mid}-{rep}" if access.root == WRITE_MOUNT else f"writes/{mid}-{rep}"
                paths = [access.path(f"{folder}/part-{i:04d}.parquet") for i in range(len(tables))]
                fs = open_filesystem(access)
                if fs is None:
                    (scratch / folder).mkdir(parents=True, exist_ok=True)
                    paths = [str(scratch / folder / f"part-{i:04d}.parquet") for i in range(len(tables))]
                write_series, read_series = w.series_for(mid, label, "write"), w.series_for(mid, label, "read-back")
                start = time.perf_counter()

                def write_all() -> float:
                    for table, path in zip(tables, paths):
                        pq.write_table(table, path, filesystem=fs, compression="none")
                    if fs is None:
                        for path in paths:  # a local write is done when it is on disk
                            fd = os.open(path, os.O_RDONLY)
                            os.fsync(fd)
                            os.close(fd)
                    return time.perf_counter() - start

                try:
                    written = self.attempt(write_series, rep, write_all)
                    if written is None:
                        continue
                    read = self.attempt(read_series, rep,
                                        lambda: self.timed(lambda: aggregate(fs, paths), dataset.expected, "aggregate", mid))
                    msg = f"[{w.id}] rep {rep + 1}/{self.reps} {mid:20s} write {written:7.3f} s  read-back {read or 0:7.3f} s"
                    if mid == "strata-ASYNC_THROUGH":
                        persisted = self._wait_persisted(fs, paths) - start
                        write_series.extra.setdefault("persisted_after_s", []).append(persisted)
                        msg += f"  persisted after {persisted:.3f} s"
                    self.log(msg)
                finally:
                    self._remove(fs, access, folder, scratch)
        w.load = (w.load[0], load1())
        return w

    def _wait_persisted(self, fs: Any, paths: Sequence[str]) -> float:
        deadline = time.monotonic() + PERSIST_TIMEOUT
        while not all(fs.info(p)["persisted"] for p in paths):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ASYNC_THROUGH files not persisted after {PERSIST_TIMEOUT:.0f}s")
            time.sleep(0.05)
        return time.perf_counter()

    def _remove(self, fs: Any, access: Access, folder: str, scratch: Path) -> None:
        if fs is None:
            subprocess.run(["rm", "-rf", str(scratch / folder)], check=False)
            return
        try:
            fs.rm(access.path(folder), recursive=True)
        finally:
            close_filesystem(fs)

    # -- 4: sharing ---------------------------------------------------------------------------

    def sharing(self, dataset: Dataset, readers: int = 4) -> Workload:
        """`readers` processes aggregate the dataset at once, then one more process does."""
        w = Workload(f"sharing-{size_label(dataset.nominal)}", f"Sharing: {readers} processes at once, then a fifth, {human(dataset.nominal)}",
                     f"{readers} new processes run the aggregation on the same dataset at the same moment (time until the "
                     "last one is done), then one more new process runs it (its time); each cold before the four",
                     dataset.bytes)
        ids = ["s3fs", "simplecache", "strata-remote", "strata-fuse", "strata-sc"]
        chosen = [self.by_id[c] for c in ids if c in self.by_id]
        first, fifth = f"{readers} at once", "fifth"
        self.skip_unavailable(w, chosen, (first, fifth))
        w.load = (load1(), 0.0)
        for rep in range(self.reps):
            for c in chosen:
                if c.unavailable:
                    continue
                c.cold([dataset.name])
                s1, s5 = w.series_for(c.id, c.label, first), w.series_for(c.id, c.label, fifth)
                before = self.stack.worker_counters()
                together = self.attempt(s1, rep, lambda: self._readers(c, dataset, readers))
                middle = self.stack.worker_counters()
                alone = self.attempt(s5, rep, lambda: self._readers(c, dataset, 1))
                after = self.stack.worker_counters()
                if together is None or alone is None:
                    continue
                if c.id.startswith("strata"):
                    s1.extra.setdefault("store_bytes", []).append(middle["ufs_bytes_read"] - before["ufs_bytes_read"])
                    s5.extra.setdefault("store_bytes", []).append(after["ufs_bytes_read"] - middle["ufs_bytes_read"])
                    s5.extra.setdefault("cache_hits", []).append(after["cache_hits"] - middle["cache_hits"])
                self.log(f"[{w.id}] rep {rep + 1}/{self.reps} {c.id:14s} {readers} at once {together:7.3f} s  fifth {alone:7.3f} s")
        for c in chosen:
            if c.id == "simplecache":
                for phase in (first, fifth):
                    w.series_for(c.id, c.label, phase).note = "each process has its own cache folder"
            if c.cached and not c.unavailable:
                c.cold([dataset.name])
        w.load = (w.load[0], load1())
        return w

    def sharing_nodes(self, dataset: Dataset, readers_per_node: int = 2) -> Workload:
        """The dataset preloaded across the stack's workers (each block on one of them), then
        `readers_per_node` processes on every worker's node aggregate it at once, each through
        its own node's worker (short-circuit): what a warm cache costs the store when readers
        run beside workers that hold only part of it."""
        nodes = list(self.stack.nodes)
        readers = readers_per_node * len(nodes)
        w = Workload(f"nodes-sharing-{size_label(dataset.nominal)}",
                     f"Sharing across {len(nodes)} workers: {readers} processes on their nodes at once, "
                     f"{human(dataset.nominal)} preloaded",
                     f"the dataset is preloaded (Load: each block on one of {len(nodes)} workers), then {readers_per_node} "
                     f"new processes on each worker's node run the aggregation at the same moment, each reading through its "
                     "own node's worker (time until the last one is done); store bytes and bytes copied between workers "
                     "are the workers' counters, summed", dataset.bytes)
        phase, label = f"{readers} on {len(nodes)} nodes, preloaded", "Strata, fsspec client, short-circuit on each node"
        series = w.series_for("strata-sc", label, phase)
        w.load = (load1(), 0.0)
        folder = f"{self.mount}/{dataset.name}"
        for rep in range(self.reps):
            fs = self.stack.strata_fs()
            try:
                fs.client.free(folder)
                list(fs.client.load(folder))
                paths = [f"{self.mount}/{name}" for name in dataset.files]
                wait_until(lambda: all(all(b.worker_ids for b in fs.client.block_locations(p).blocks) for p in paths),
                           30, "the master to know where every preloaded block is")
            finally:
                close_filesystem(fs)
            before = self.stack.worker_counters()
            access = {"master": self.stack.master_address, "token": TOKEN}
            jobs = [{"access": Access("strata", self.mount, {**access, "host": node}).to_json(), "op": "aggregate",
                     "paths": list(dataset.files)} for node in nodes for _ in range(readers_per_node)]

            def together() -> float:
                seconds, outputs = self._processes(jobs)
                for out in outputs:
                    check("aggregate", float(out["result"]), dataset.expected, "a reader on a worker's node")
                return seconds

            took = self.attempt(series, rep, together)
            after = self.stack.worker_counters()
            if took is None:
                continue
            store = after["ufs_bytes_read"] - before["ufs_bytes_read"]
            copied = after.get("peer_bytes_read", 0.0) - before.get("peer_bytes_read", 0.0)
            series.extra.setdefault("store_bytes", []).append(store)
            series.extra.setdefault("peer_bytes", []).append(copied)
            self.log(f"[{w.id}] rep {rep + 1}/{self.reps} {readers} readers on {len(nodes)} nodes {took:7.3f} s  "
                     f"store {store / 2**20:.1f} MiB  between workers {copied / 2**20:.1f} MiB "
                     f"(dataset {dataset.bytes / 2**20:.0f} MiB)")
        w.load = (w.load[0], load1())
        return w

    def _readers(self, c: Contestant, dataset: Dataset, count: int) -> float:
        """Start `count` reader processes, let them go at once; seconds until the last is done."""
        jobs = []
        for _ in range(count):
            access = c.access
            if c.id == "simplecache":  # a per-process cache: every process starts with its own
                access = Access(access.kind, access.root, {**access.options, "cache_storage": str(self._fresh_cache(c))})
            jobs.append({"access": access.to_json(), "op": "aggregate", "paths": list(dataset.files)})
        seconds, outputs = self._processes(jobs)
        for out in outputs:
            check("aggregate", float(out["result"]), dataset.expected, f"{c.id} reader")
        return seconds

    def _processes(self, jobs: Sequence[dict[str, Any]]) -> tuple[float, list[dict[str, Any]]]:
        return run_processes(jobs)

    def _fresh_cache(self, c: Contestant) -> Path:
        folder = Path(c.access.options["cache_storage"]).parent / f"reader-{time.monotonic_ns()}"
        folder.mkdir(parents=True)
        return folder

    # -- 5: metadata --------------------------------------------------------------------------

    def metadata(self, dataset: Dataset, meta_mount: str) -> Workload:
        """List a folder of small files and stat each one."""
        w = Workload(f"metadata-{len(dataset.files)}", f"Metadata: list and stat {len(dataset.files):,} small files",
                     "list the folder, then stat every file in it (fsspec ls + info; os.scandir + os.stat through FUSE "
                     "and on local disk); Strata cold: the folder's mount is mounted anew, so the master lists the store",
                     0)
        fuse = self.stack.fuse_mountpoint
        roots: dict[str, str] = {
            "s3fs": f"{self.bucket}/{dataset.name}",
            "strata-remote": meta_mount,
            "strata-fuse": f"{fuse}{meta_mount}" if fuse is not None else "",
            "local": str(self.local_root / dataset.name),
        }
        chosen = [self.by_id[c] for c in roots if c in self.by_id]
        self.skip_unavailable(w, chosen, ("cold", "warm"))
        source = f"s3://{self.bucket}/{dataset.name}"
        w.load = (load1(), 0.0)
        for rep in range(self.reps):
            for c in chosen:
                if c.unavailable:
                    continue
                strata = c.id.startswith("strata")
                if strata:
                    self.stack.unmount(meta_mount)
                    self.stack.mount(meta_mount, source)
                phases = ("cold", "warm") if strata else ("cold",)
                for phase in phases:
                    with c.filesystem() as fs:
                        seconds = self.attempt(w.series_for(c.id, c.label, phase), rep, lambda: self.timed(
                            lambda: list_and_stat(fs, roots[c.id]), dataset.expected, "list_and_stat", c.id))
                    if seconds is None:
                        continue
                    self.log(f"[{w.id}] rep {rep + 1}/{self.reps} {c.id:14s} {phase:5s} {seconds:7.3f} s")
        for c in chosen:
            if not c.id.startswith("strata") and not c.unavailable:
                cold, warm = w.series_for(c.id, c.label, "cold"), w.series_for(c.id, c.label, "warm")
                warm.times, warm.failures = list(cold.times), list(cold.failures)
                cold.note = warm.note = ("one series: a new s3fs lists the store, then stats from its listing cache"
                                         if c.id == "s3fs" else "one series: local metadata is always cached")
        w.load = (w.load[0], load1())
        return w

    # -- issue 15, 1: training-style reads ----------------------------------------------------

    def training(self, dataset: Dataset, loaders: int = 4, warm_epochs: int = 3) -> Workload:
        """`loaders` processes read every file of the dataset once per epoch, each a share of
        a new shuffled order, as a data loader's workers do. Epoch 1 is cold, the next
        `warm_epochs` warm (a warm epoch lasts well under a second: one is too few to compare
        by); s3fs, which keeps nothing, reads one more epoch, as long as the cold one."""
        n = len(dataset.files)
        w = Workload(f"training-{n}", f"Training reads: {n:,} files of ~100 KiB, {loaders} loaders, {1 + warm_epochs} epochs",
                     f"{loaders} loader processes read whole files ({dataset.bytes / 2**20:.0f} MiB in all) in a shuffled "
                     f"order, a new one each epoch; time of each epoch (files/s in the table's notes); epoch 1 cold, "
                     "the others warm (s3fs: 2 epochs)", dataset.bytes)
        ids = ["s3fs", "simplecache", "strata-remote", "strata-remote-direct", "strata-fuse", "strata-sc", "local"]
        chosen = [self.by_id[c] for c in ids if c in self.by_id]
        self.skip_unavailable(w, chosen, ("cold", "warm"))
        w.load = (load1(), 0.0)
        # Every repetition starts with a cold epoch: a large dataset gets the cold reps.
        for rep in range(self.cold_reps_for(dataset)):
            for c in chosen:
                if c.unavailable:
                    continue
                c.cold([dataset.name])
                for epoch in range(1 + (warm_epochs if c.cached else 1)):
                    phase = "cold" if epoch == 0 else "warm"
                    order = list(dataset.files)
                    random.Random(rep * (1 + warm_epochs) + epoch).shuffle(order)
                    access = c.small_files or c.access
                    jobs = [{"access": access.to_json(), "op": "read_files", "paths": order[i::loaders]}
                            for i in range(loaders)]
                    series = w.series_for(c.id, c.label, phase)

                    def run() -> float:
                        seconds, outputs = self._processes(jobs)
                        check("read_files", sum(float(o["result"]) for o in outputs), dataset.expected, c.id)
                        series.extra.setdefault("client_cpu_s", []).append(sum(o["cpu"] for o in outputs))
                        return seconds

                    seconds = self.attempt(series, rep, run)
                    if seconds is not None:
                        series.extra.setdefault("files_per_s", []).append(n / seconds)
                        self.log(f"[{w.id}] rep {rep + 1}/{self.reps} {c.id:14s} epoch {epoch + 1} {seconds:7.3f} s"
                                 f"  ({n / seconds:8.0f} files/s)  load {load1():.1f}")
        for c in chosen:
            if c.id == "s3fs" and not c.unavailable:
                w.series_for(c.id, c.label, "warm").note = "no cache: every epoch reads the store"
            if c.cached and not c.unavailable:
                c.cold([dataset.name])
        w.load = (w.load[0], load1())
        return w

    # -- issue 15, 2: a dataset larger than the MEM tier --------------------------------------

    def spill(self, dataset: Dataset, mem_quota: int) -> Workload:
        """The aggregation of a dataset about twice the worker's MEM tier: its blocks spill to
        the SSD tier. The warm read should come from MEM and SSD, none from the store."""
        w = Workload(f"spill-{size_label(dataset.nominal)}",
                     f"A dataset twice the MEM tier, {human(dataset.nominal)} (MEM {human(mem_quota)} + SSD)",
                     "the aggregation, cold then warm, with blocks spilling from the MEM tier to the SSD tier; "
                     "store bytes and cache hit ratio of the warm read from the worker's counters", dataset.bytes)
        ids = ["s3fs", "strata-remote", "strata-fuse", "strata-sc", "local"]
        chosen = [self.by_id[c] for c in ids if c in self.by_id]
        self.skip_unavailable(w, chosen, ("cold", "warm"))
        w.load = (load1(), 0.0)
        paths_of = {c.id: [c.access.path(f) for f in dataset.files] for c in chosen}
        for rep in range(self.reps):
            for c in chosen:
                if c.unavailable:
                    continue
                c.cold([dataset.name])
                for phase in ("cold", "warm") if c.cached else ("cold",):
                    series = w.series_for(c.id, c.label, phase)
                    before = self.stack.worker_counters()
                    with c.filesystem() as fs:
                        seconds = self.attempt(series, rep, lambda: self.timed(
                            lambda: aggregate(fs, paths_of[c.id]), dataset.expected, "aggregate", c.id))
                    after = self.stack.worker_counters()
                    if seconds is None:
                        continue
                    if c.id.startswith("strata"):
                        hits = after.get("cache_hits", 0) - before.get("cache_hits", 0)
                        misses = after.get("cache_misses", 0) - before.get("cache_misses", 0)
                        series.extra.setdefault("store_bytes", []).append(
                            after.get("ufs_bytes_read", 0) - before.get("ufs_bytes_read", 0))
                        series.extra.setdefault("hit_ratio", []).append(hits / (hits + misses) if hits + misses else None)
                    self.log(f"[{w.id}] rep {rep + 1}/{self.reps} {c.id:14s} {phase:5s} {seconds:7.3f} s"
                             f"  ({dataset.bytes / seconds / 1e6:8.1f} MB/s)  store bytes "
                             f"{series.extra.get('store_bytes', ['-'])[-1]}")
        for c in chosen:
            if c.cached and not c.unavailable:
                c.cold([dataset.name])
        w.load = (w.load[0], load1())
        w.extra["mem_quota"] = mem_quota
        return w

    # -- issue 15, 3: many readers on one worker ------------------------------------------------

    def many_readers(self, dataset: Dataset, counts: Sequence[int] = (8, 32)) -> Workload:
        """n processes on a host without a worker read the same warm file at once from one
        worker's data port, against n processes reading it over loopback TCP from another
        process (datapath.py: bytes checked, CPU per GiB of readers and server)."""
        import datapath

        w = Workload(f"readers-{size_label(dataset.nominal)}",
                     f"Many readers on one worker: {', '.join(map(str, counts))} processes, {human(dataset.nominal)} each",
                     "n processes each read the same warm file whole, 16 MiB per read(), reader i starting at block "
                     "i*blocks/n; time until the last is done; CPU seconds per GiB of the readers and of the server "
                     "(the worker, or the loopback sender)", dataset.bytes)
        labels = {"strata-remote": self.by_id["strata-remote"].label if "strata-remote" in self.by_id else "strata-remote",
                  "loopback-tcp": "loopback TCP from another process (sendfile from page cache)"}
        w.load = (load1(), 0.0)
        try:
            rows = datapath.measure(self.stack, self.local_root, dataset.files[0], list(counts), self.reps)
        finally:
            for c in self.contestants:
                if c.id == "strata-remote":
                    c.cold([dataset.name])
        for row in rows:
            series = w.series_for(row["contestant"], labels[row["contestant"]], f"{row['readers']} readers")
            series.times = [r["wall"] for r in row["reps"]]
            series.extra.update({"mb_per_s": [r["bytes"] / r["wall"] / 1e6 for r in row["reps"]],
                                 "client_cpu_s_per_gib": [r["client_cpu_per_gib"] for r in row["reps"]],
                                 "server_cpu_s_per_gib": [r["server_cpu_per_gib"] for r in row["reps"]]})
            self.log(f"[{w.id}] {row['contestant']:14s} {row['readers']:3d} readers {row['gbps'] * 1000:8.1f} MB/s in all"
                     f"  CPU s/GiB: readers {row['client_cpu_per_gib']:.2f}, server {row['server_cpu_per_gib']:.2f}")
        w.load = (w.load[0], load1())
        return w
