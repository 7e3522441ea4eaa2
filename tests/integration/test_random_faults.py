"""One randomized run of reads, writes of every write type, removals and faults, against real
processes: a master, two workers, moto's S3 server behind a StoreProxy.

Faults: the store refused, hung or slowed (StoreProxy), a worker SIGKILLed and restarted, a
worker SIGSTOPped for a moment. Afterwards every acknowledged write must read back with its
bytes and, for the through types (ASYNC_THROUGH once its uploads settled), be in the store
with equal bytes; and every byte read during the run must have been one the file could hold
(what was last acknowledged, or, after a write or rm that failed, what was there before or
what the failed call carried).

The run is bounded in time and count, and seedable:

    STRATA_RANDOM_SEED=123 STRATA_RANDOM_SECONDS=75 STRATA_RANDOM_OPS=400 \\
        .venv/bin/pytest -q tests/integration/test_random_faults.py

A failure names the seed that reproduces the sequence of operations (the timing of faults
against the servers' own work is not reproducible: a seed replays the same choices).
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from storeproxy import Mode, StoreProxy

from strata.contract.errors import NotFound, StrataError
from strata.contract.modes import WriteType
from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK_SIZE, Cluster, Server, wait_until

SECONDS = float(os.environ.get("STRATA_RANDOM_SECONDS", "75"))
MAX_OPS = int(os.environ.get("STRATA_RANDOM_OPS", "400"))
# No single operation may take longer: a longer one is a hang, and a finding.
OP_TIMEOUT = 90.0
# After the faults end: uploads settle, workers re-register.
SETTLE_TIMEOUT = 90.0
SETTLED_FOR = 2.0  # seconds of no pending upload in the report (10 heartbeats)

pytestmark = pytest.mark.timeout(int(SECONDS + 4 * OP_TIMEOUT + SETTLE_TIMEOUT + 120))

WRITE_TYPES = tuple(WriteType)
THROUGH_TYPES = ("CACHE_THROUGH", "THROUGH", "ASYNC_THROUGH")
SIZES = (0, 1, 4097, BLOCK_SIZE - 1, BLOCK_SIZE + 1, 2 * BLOCK_SIZE + 3)
ABSENT = None


@dataclass
class Expected:
    """What one path may read as. `contents` holds every answer that is right now: one after
    an acknowledged write or rm, more after a call that failed (it may or may not have
    taken effect)."""

    contents: list[bytes | None]
    write_type: str = ""  # of the last acknowledged write ("" if it was removed or never written)
    settled: bool = True  # False after a failed write or rm: the outcome is one of `contents`

    def acknowledge(self, data: bytes | None, write_type: str) -> None:
        self.contents, self.write_type, self.settled = [data], write_type, True

    def fail(self, data: bytes | None) -> None:
        for maybe in (data, ABSENT):
            if maybe not in self.contents:
                self.contents.append(maybe)
        self.settled = False


@dataclass
class Run:
    seed: int
    rng: random.Random
    cluster: Cluster
    proxy: StoreProxy
    bucket: str
    expected: dict[str, Expected] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)
    fault_until: float = 0.0
    fault_ended: float = 0.0
    stopped: threading.Event = field(default_factory=threading.Event)
    clients: dict[str, Any] = field(default_factory=dict)

    def fs(self, host: str = "test-client") -> Any:
        """One filesystem per client host, its listings cache dropped before each use."""
        if host not in self.clients:
            self.clients[host] = self.cluster.fs(host=host)
        fs = self.clients[host]
        fs.invalidate_cache()
        return fs

    log: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def note(self, what: str, detail: str = "") -> None:
        """Count `what`; log it with `detail`."""
        self.counts[what] += 1
        self.log.append(f"{time.monotonic() - self.started:7.2f}s {what} {detail}")

    def key(self, path: str) -> str:
        return path.removeprefix("/r/")

    # -- operations -----------------------------------------------------------------------

    def write(self, path: str) -> None:
        write_type = self.rng.choice(WRITE_TYPES)
        data = self.rng.randbytes(self.rng.choice(SIZES))
        worker = self.rng.randrange(len(self.cluster.workers))
        self.log.append(f"  {write_type}, {len(data)} bytes, via node-{worker}")
        client = self.fs(host=f"node-{worker}").client
        try:
            client.write_file(path, [data], write_type=write_type.to_proto())
        except StrataError:
            self.note(f"write {write_type} failed")
            self.expected[path].fail(data)
            return
        self.note(f"write {write_type}")
        self.expected[path].acknowledge(data, write_type)

    def remove(self, path: str) -> None:
        try:
            self.fs().client.rm(path)
        except NotFound:
            self.note("rm of an absent file")
            return
        except StrataError:
            self.note("rm failed")
            self.expected[path].fail(ABSENT)
            return
        self.note("rm")
        self.expected[path].acknowledge(ABSENT, "")

    def read(self, path: str) -> None:
        host = self.rng.choice(["test-client", "node-0", "node-1"])  # remote, or short-circuit
        fs = self.fs(host=host)
        start, end = 0, None
        if self.rng.random() < 0.3:  # a range, maybe across blocks or past the end
            start = self.rng.randrange(0, 3 * BLOCK_SIZE)
            end = start + self.rng.randrange(1, 2 * BLOCK_SIZE)
        self.log.append(f"  from {host}, [{start}:{end}]")
        try:
            got: bytes | None = fs.cat_file(path, start, end) if end is not None else fs.cat_file(path)
        except FileNotFoundError:
            got = ABSENT
        except (StrataError, OSError):
            faulty = self.fault_until or time.monotonic() < self.fault_ended + 10
            self.note("read failed during a fault" if faulty else "read failed without a fault")
            return
        self.note("read")
        allowed = self.expected[path].contents
        if not any(got is c if c is ABSENT or got is ABSENT else got == c[start:end] for c in allowed):
            shown = "absent" if got is ABSENT else f"{len(got)} bytes"
            self.wrong.append(f"read of {path} [{start}:{end}] gave {shown}, not what it may hold "
                              f"({[('absent' if c is None else len(c)) for c in allowed]} bytes)")

    # -- faults ---------------------------------------------------------------------------

    def store_fault(self) -> threading.Thread:
        """The store refuses, hangs or slows for a few seconds; a timer ends it (an operation
        stuck on the store must not keep its fault going)."""
        kind: Mode = self.rng.choice(("refuse", "hang", "slow"))
        seconds = self.rng.uniform(1.5, 5.0)
        self.proxy.set_mode(kind, delay=1.0 if kind == "slow" else 0.0)
        self.fault_until = time.monotonic() + seconds
        self.note(f"store {kind}", f"for {seconds:.1f}s")

        def end() -> None:
            self.stopped.wait(seconds)
            self.proxy.set_mode("pass")
            self.fault_until = 0.0
            self.fault_ended = time.monotonic()
            self.log.append(f"{self.fault_ended - self.started:7.2f}s store fault ends")

        thread = threading.Thread(target=end, name="store-fault-end", daemon=True)
        thread.start()
        return thread

    def kill_worker(self) -> None:
        worker = self.rng.choice(self.cluster.workers)
        self.log.append(f"  SIGKILL {worker.name}")
        worker.stop(signal.SIGKILL)
        time.sleep(self.rng.uniform(0.2, 2.0))
        worker.start()
        worker.wait_healthy()
        self.fault_ended = time.monotonic()
        self.note("worker SIGKILL")

    def pause_worker(self) -> threading.Thread:
        worker: Server = self.rng.choice(self.cluster.workers)
        seconds = self.rng.uniform(0.5, 3.0)
        assert worker.process is not None
        pid = worker.process.pid
        os.killpg(pid, signal.SIGSTOP)
        self.note("worker SIGSTOP", f"{worker.name} for {seconds:.1f}s")

        def resume() -> None:
            self.stopped.wait(seconds)
            try:
                os.killpg(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass  # killed (and restarted) meanwhile
            self.fault_ended = time.monotonic()

        thread = threading.Thread(target=resume, name="sigcont", daemon=True)
        thread.start()
        return thread


def test_random_reads_writes_and_faults_lose_no_acknowledged_write(start_cluster: Any, s3: Any, bucket: str) -> None:
    seed = int(os.environ.get("STRATA_RANDOM_SEED") or random.randrange(2**32))
    print(f"random faults: seed {seed} ({SECONDS:.0f}s, at most {MAX_OPS} operations)")
    proxy = StoreProxy(target_port=int(s3.endpoint_url.rsplit(":", 1)[1]))
    cluster = start_cluster(workers=2)
    options = {**s3.storage_options(), "endpoint_url": proxy.endpoint_url}
    cluster.fs().client.mount("/r", f"s3://{bucket}", pb.MountOptions(options=options))
    run = Run(seed=seed, rng=random.Random(seed), cluster=cluster, proxy=proxy, bucket=bucket)
    for i in range(4):  # files the store has before the run
        data = run.rng.randbytes(run.rng.choice(SIZES))
        s3.put_object(bucket, f"seed-{i}", data)
        run.expected[f"/r/seed-{i}"] = Expected([data], "THROUGH")
    for i in range(8):
        run.expected[f"/r/w/f-{i}"] = Expected([ABSENT])
    paths = sorted(run.expected)
    timers: list[threading.Thread] = []  # end the faults
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="random-op")
    try:
        try:
            deadline = time.monotonic() + SECONDS
            ops = 0
            while time.monotonic() < deadline and ops < MAX_OPS:
                ops += 1
                roll = run.rng.random()
                path = run.rng.choice(paths)
                if roll < 0.04 and not run.fault_until:
                    name, op = "store fault", lambda: timers.append(run.store_fault())
                elif roll < 0.06:
                    name, op = "worker kill", run.kill_worker
                elif roll < 0.08 and not any(t.is_alive() for t in timers if t.name == "sigcont"):
                    name, op = "worker pause", lambda: timers.append(run.pause_worker())
                elif roll < 0.45:
                    name, op = f"write {path}", lambda: run.write(path)
                elif roll < 0.50:
                    name, op = f"rm {path}", lambda: run.remove(path)
                else:
                    name, op = f"read {path}", lambda: run.read(path)
                run.log.append(f"{time.monotonic() - run.started:7.2f}s start {name}")
                started = time.monotonic()
                try:
                    pool.submit(op).result(timeout=OP_TIMEOUT)
                except concurrent.futures.TimeoutError:
                    raise AssertionError(f"{name} did not end within {OP_TIMEOUT:.0f}s; the last steps:\n"
                                         + "\n".join(run.log[-30:])) from None
                run.counts["longest op ms"] = max(run.counts["longest op ms"], int((time.monotonic() - started) * 1000))
            run.counts["operations"] = ops
        finally:
            run.stopped.set()
            for thread in timers:
                thread.join(timeout=10)
            proxy.set_mode("pass")
            for worker in cluster.workers:
                if worker.process is None or worker.process.poll() is not None:
                    worker.child = None
                    worker.start()
                    worker.wait_healthy()
        print(f"random faults: seed {seed}: " + ", ".join(f"{k} {v}" for k, v in sorted(run.counts.items())))
        assert not run.wrong, "wrong bytes during the run:\n" + "\n".join(run.wrong[:20])
        verify(run)
    except AssertionError as exc:
        raise AssertionError(f"random faults, seed {seed} (rerun with STRATA_RANDOM_SEED={seed}): {exc}") from exc
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        proxy.stop()


def verify(run: Run) -> None:
    """After the run: every acknowledged write reads back; the through types are in the store."""
    cluster = run.cluster
    cluster.wait_workers(len(cluster.workers))
    # The report sums the workers' heartbeats: a write acknowledged a moment ago, or the
    # uploads a restarted worker recovers from its journal, count from its next heartbeat on.
    # None pending for SETTLED_FOR seconds (many heartbeats) is settled.
    zero_since: list[float] = []

    def settled() -> bool:
        if cluster.fs().client.report().pending_uploads.count:
            zero_since.clear()
            return False
        if not zero_since:
            zero_since.append(time.monotonic())
        return time.monotonic() - zero_since[0] >= SETTLED_FOR

    wait_until(settled, SETTLE_TIMEOUT, "the pending ASYNC_THROUGH uploads to settle")
    keys = {o["Key"] for o in cluster.s3.client().list_objects_v2(Bucket=run.bucket).get("Contents", [])}
    problems = []
    for path, expected in sorted(run.expected.items()):
        fs = cluster.fs()
        try:
            got: bytes | None = fs.cat_file(path)
        except FileNotFoundError:
            got = ABSENT
        if got not in expected.contents:
            problems.append(f"{path} reads as {'absent' if got is None else f'{len(got)} bytes'}, expected "
                            f"{[('absent' if c is None else len(c)) for c in expected.contents]}")
            continue
        if not expected.settled:
            continue
        [want] = expected.contents
        key = run.key(path)
        if want is ABSENT:
            if key in keys:
                problems.append(f"{path} was removed, yet the store holds {key}")
        elif expected.write_type in THROUGH_TYPES:
            if key not in keys:
                problems.append(f"{path} ({expected.write_type}, acknowledged) is not in the store")
            elif cluster.s3.get_object(run.bucket, key) != want:
                problems.append(f"{path} ({expected.write_type}, acknowledged) differs in the store")
            elif not fs.info(path)["persisted"]:
                problems.append(f"{path} ({expected.write_type}) is in the store but not marked persisted")
    staged = [p for w in range(len(cluster.workers)) for p in (cluster.root / f"worker-{w}" / "staging").glob("*.part")]
    if staged:
        problems.append(f"staged copies left after the uploads settled: {staged}")
    assert not problems, "after the run:\n" + "\n".join(problems)
