"""`make demo`: Strata on this machine, end to end, in a couple of minutes.

It starts a built-in S3 server (moto on 127.0.0.1) holding a generated Parquet table, a
private local Strata cluster (`strata local up` with its own STRATA_HOME and free ports, so
it never touches a cluster of yours), mounts the bucket, and sums the table's two columns
with pyarrow three ways: straight from S3 with s3fs, through Strata cold (blocks come from
S3 and are cached) and through Strata warm (blocks come from the cache). Then it prints
the speed-ups and stops everything it started, also on failure or Ctrl-C.

    .venv/bin/python -P scripts/demo.py [--size 256Mi] [--latency-ms 20] [--rate-mbit 1000] [--workers 1]

moto on loopback answers far faster than a real object store, so by default every request
to it passes bench/delayproxy.py: 20 ms to the first byte (`--latency-ms`) and at most
1 Gbit/s (`--rate-mbit`); 0 and 0 read moto directly. The output says so.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from strata.cacheserver.launcher import Child

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]
BUCKET = "strata-demo"
OBJECT = "trips/part-0.parquet"
MOUNT = "/demo"
# Rows per Parquet row group: 1Mi rows of two float64 columns = 16 MiB, one Strata block.
ROW_GROUP_ROWS = 1 << 20
COLUMNS = ("fare", "distance")
# Seconds any one `strata` command may take before the demo gives up on it.
COMMAND_TIMEOUT = 120.0
# Seconds the delaying proxy may take to start and print its port.
PROXY_START_TIMEOUT = 30.0


class DemoError(Exception):
    """A step failed; the message says which and what to look at."""


# -- the S3 store ----------------------------------------------------------------------------

def load_s3server() -> ModuleType:
    """tests/support/s3server.py, imported from its folder (the repo root must stay off
    sys.path: its folder operator/ would shadow the standard library's `operator`)."""
    support = str(REPO / "tests" / "support")
    if support not in sys.path:
        sys.path.append(support)
    return importlib.import_module("s3server")


def start_delay_proxy(target: str, ttfb_ms: float, rate_mbit: float, log: Path) -> tuple[Child, str]:
    """bench/delayproxy.py in front of `target` (HOST:PORT): every request waits `ttfb_ms` for
    its first byte, and with `rate_mbit` the bytes flow at most that fast. Returns the
    process and the proxy's endpoint URL."""
    from strata.cacheserver import launcher

    args = [sys.executable, "-P", str(REPO / "bench" / "delayproxy.py"), "--listen", "127.0.0.1",
            "--target", target, "--ttfb-ms", str(ttfb_ms)]
    if rate_mbit:
        args += ["--rate-mbit", str(rate_mbit)]
    proxy = launcher.start("the delaying proxy", args, log, stdout_pipe=True)
    try:
        port = proxy.read_port(PROXY_START_TIMEOUT)
    except launcher.LaunchError as exc:
        raise DemoError(str(exc)) from None
    return proxy, f"http://127.0.0.1:{port}"


# -- the dataset -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Dataset:
    path: Path
    rows: int
    bytes: int
    sums: tuple[float, float]


def make_dataset(path: Path, size: int) -> Dataset:
    """A Parquet file of two float64 columns of random numbers, about `size` bytes."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rows = max(size // (8 * len(COLUMNS)), 1)
    schema = pa.schema([(name, pa.float64()) for name in COLUMNS])
    sums = [0.0, 0.0]
    seed = 7
    with pq.ParquetWriter(path, schema, compression="snappy") as writer:
        for start in range(0, rows, ROW_GROUP_ROWS):
            n = min(ROW_GROUP_ROWS, rows - start)
            fare = pc.multiply(pc.random(n, initializer=seed), 80.0)
            distance = pc.multiply(pc.random(n, initializer=seed + 1), 30.0)
            seed += 2
            for i, column in enumerate((fare, distance)):
                sums[i] += pc.sum(column).as_py()
            writer.write_table(pa.table([fare, distance], schema=schema), row_group_size=ROW_GROUP_ROWS)
    return Dataset(path=path, rows=rows, bytes=path.stat().st_size, sums=(sums[0], sums[1]))


def sum_columns(fs: Any, path: str) -> tuple[float, float]:
    """Read the table with pyarrow through an fsspec filesystem and sum its columns."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(path, filesystem=fs)
    return (pc.sum(table[COLUMNS[0]]).as_py(), pc.sum(table[COLUMNS[1]]).as_py())


# -- helpers ---------------------------------------------------------------------------------

def say(text: str = "") -> None:
    print(text, flush=True)


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive ports nothing listens on (servers take port, port+1)."""
    from strata.cacheserver.localcluster import port_free

    rng = random.SystemRandom()
    for _ in range(200):
        first = rng.randrange(20000, 60000 - count)
        if all(port_free(host, p) for p in range(first, first + count)):
            return first
    raise DemoError(f"found no {count} consecutive free ports on {host} between 20000 and 60000")


def format_mib(n: float) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """fn's result and the seconds it took."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


class Strata:
    """Runs the `strata` CLI against the demo's private local cluster."""

    def __init__(self, home: Path) -> None:
        self.env = {**os.environ, "STRATA_HOME": str(home), "PYTHONSAFEPATH": "1"}
        for name in ("STRATA_MASTER", "STRATA_TOKEN", "STRATA_TOKEN_FILE"):
            self.env.pop(name, None)

    def __call__(self, *args: str, show: str | None = None, quiet: bool = False) -> str:
        say(f"$ strata {show or ' '.join(args)}")
        result = subprocess.run(
            [sys.executable, "-P", "-m", "strata.cacheserver", *args],
            env=self.env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False,
        )
        if result.returncode != 0:
            raise DemoError(f"`strata {show or ' '.join(args)}` failed (exit {result.returncode}):\n"
                            f"{result.stderr.strip() or result.stdout.strip()}")
        if not quiet and result.stdout.strip():
            say("  " + result.stdout.rstrip().replace("\n", "\n  "))
        return result.stdout


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """SIGTERM (e.g. from a CI runner) unwinds like Ctrl-C, so cleanup runs."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- the demo --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Result:
    label: str
    seconds: float


def run(size: int, latency_ms: float, rate_mbit: float, workers: int, work: Path,
        cleanup: contextlib.ExitStack) -> list[Result]:
    from strata.contract.units import format_size

    say(f"== 1/5  a Parquet table of two float64 columns, ~{format_size(size)}")
    dataset, took = timed(functools.partial(make_dataset, work / "part-0.parquet", size))
    say(f"  {dataset.rows:,} rows, {format_mib(dataset.bytes)} on disk, {math.ceil(dataset.rows / ROW_GROUP_ROWS)} row groups "
        f"({took:.1f}s)")

    say("== 2/5  a built-in S3 server (moto on 127.0.0.1) with the table in bucket " + BUCKET)
    s3server = load_s3server()
    s3 = s3server.start_moto_server()
    cleanup.callback(s3.stop)
    s3.create_bucket(BUCKET)
    start = time.perf_counter()
    s3.client().upload_file(str(dataset.path), BUCKET, OBJECT)
    say(f"  uploaded s3://{BUCKET}/{OBJECT} ({time.perf_counter() - start:.1f}s)")
    dataset.path.unlink()
    options = s3.storage_options()
    endpoint = options["endpoint_url"]
    if latency_ms > 0 or rate_mbit > 0:
        proxy, endpoint = start_delay_proxy(endpoint.removeprefix("http://"), latency_ms, rate_mbit,
                                            work / "proxy.log")
        cleanup.callback(proxy.stop)
        cap = f", at most {rate_mbit:g} Mbit/s" if rate_mbit else ", no bandwidth cap"
        say(f"  NOTE: moto on loopback is much faster than a remote store, so every request to it passes a\n"
            f"  proxy (bench/delayproxy.py, {endpoint}): {latency_ms:g} ms to the first byte{cap}.\n"
            f"  --latency-ms 0 --rate-mbit 0 reads moto directly.")

    say(f"== 3/5  a private local Strata cluster ({workers} worker, memory tier)")
    strata = Strata(work / "home")
    master_port = free_port_run(2)
    worker_port = free_port_run(2 * workers)
    mem = max(2 * size, 512 << 20)
    cleanup.callback(_local_down, strata)
    strata("local", "up", "--workers", str(workers), "--mem", f"{math.ceil(mem / (1 << 20))}Mi",
           "--master-port", str(master_port), "--worker-port", str(worker_port))
    strata("mount", "add", MOUNT, f"s3://{BUCKET}", "--option", f"endpoint_url={endpoint}",
           "--option", f"region={options['region']}", "--credential", f"key={options['key']}",
           "--credential", f"secret={options['secret']}", "--read-only",
           show=f"mount add {MOUNT} s3://{BUCKET} --option endpoint_url={endpoint} --credential key=... "
                "--credential secret=... --read-only")
    strata("fs", "ls", "-R", MOUNT)

    say("== 4/5  sum both columns with pyarrow.parquet.read_table")
    import fsspec

    os.environ.update({"STRATA_HOME": strata.env["STRATA_HOME"]})
    for name in ("STRATA_MASTER", "STRATA_TOKEN", "STRATA_TOKEN_FILE"):
        os.environ.pop(name, None)
    s3_fs, s3_path = fsspec.core.url_to_fs(
        f"s3://{BUCKET}/{OBJECT}", endpoint_url=endpoint, key=options["key"], secret=options["secret"],
        client_kwargs={"region_name": options["region"]}, skip_instance_cache=True,
    )
    strata_fs, strata_path = fsspec.core.url_to_fs(f"strata://{MOUNT}/{OBJECT}", skip_instance_cache=True)
    cleanup.callback(strata_fs.client.close)
    reads = [
        ("S3 directly (s3fs)", s3_fs, s3_path),
        ("Strata, cold (from S3, fills the cache)", strata_fs, strata_path),
        ("Strata, warm (from the cache)", strata_fs, strata_path),
    ]
    results = []
    for label, fs, path in reads:
        sums, seconds = timed(functools.partial(sum_columns, fs, path))
        if not all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(sums, dataset.sums)):
            raise DemoError(f"{label}: sums {sums} differ from the ones computed when writing {dataset.sums}")
        say(f"  {label:<42} {seconds:6.2f}s   sum(fare)={sums[0]:,.0f}  sum(distance)={sums[1]:,.0f}")
        results.append(Result(label, seconds))

    say("== 5/5  what the cache holds")
    _wait_reported(strata_fs.client, dataset.bytes)
    strata("report")
    _print_table(results, dataset.bytes)
    say("  A cold read pays the store once and fills the cache; every later read of these blocks, by\n"
        "  this job or any other on the cluster, is a warm one.")
    return results


def _wait_reported(client: Any, size: int, timeout: float = 15.0) -> None:
    """Workers report to the master on a heartbeat: wait until the master counts the table
    as cached and has seen the warm read's hits, so `strata report` shows them."""
    deadline = time.monotonic() + timeout
    while True:
        report = client.report()
        if sum(m.cached_bytes for m in report.mounts) >= size and report.hits > 0:
            return
        if time.monotonic() > deadline:
            say(f"  (after {timeout:.0f}s the master still reports {format_mib(sum(m.cached_bytes for m in report.mounts))} "
                "cached; the report below may lag the workers)")
            return
        time.sleep(0.2)


def _print_table(results: list[Result], size: int) -> None:
    base = results[0].seconds
    rows = [("read", "seconds", "MiB/s", "speed-up vs S3")]
    for r in results:
        rows.append((r.label, f"{r.seconds:.2f}", f"{size / (1 << 20) / r.seconds:.0f}", f"{base / r.seconds:.1f}x"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    say()
    for n, row in enumerate(rows):
        say("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            say("  " + "  ".join("-" * w for w in widths))
    say()


def _local_down(strata: Strata) -> None:
    with contextlib.suppress(DemoError, subprocess.TimeoutExpired):
        strata("local", "down")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from strata.contract.units import parse_size

    parser = argparse.ArgumentParser(description="Strata demo: cold and warm reads of a Parquet table from S3.")
    parser.add_argument("--size", default="256Mi", help="size of the generated table (default 256Mi)")
    parser.add_argument("--latency-ms", type=float, default=20.0,
                        help="time to first byte added to every request to the S3 server (default 20; 0: none)")
    parser.add_argument("--rate-mbit", type=float, default=1000.0,
                        help="bandwidth cap between readers and the S3 server (default 1000; 0: none)")
    parser.add_argument("--workers", type=int, default=1, help="Strata workers (default 1)")
    args = parser.parse_args(argv)
    args.size_bytes = parse_size(args.size, what="--size")
    if args.size_bytes <= 0 or args.latency_ms < 0 or args.rate_mbit < 0 or args.workers < 1:
        parser.error("--size must be > 0, --latency-ms and --rate-mbit >= 0, --workers >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="strata-demo-"))
    logs = work / "home" / "local" / "logs"
    code = 0
    with terminate_on_sigterm():
        cleanup = contextlib.ExitStack()
        try:
            with cleanup:
                try:
                    run(args.size_bytes, args.latency_ms, args.rate_mbit, args.workers, work, cleanup)
                except Exception:
                    _show_logs(logs)
                    raise
                finally:
                    # Cleanup must finish: a second Ctrl-C would leave servers behind.
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    say("== cleaning up (strata local down, stop the S3 server)")
        except KeyboardInterrupt:
            say("interrupted; everything the demo started is stopped")
            code = 130
        except DemoError as exc:
            say(f"demo failed: {exc}")
            code = 1
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            subprocess.run(["rm", "-rf", str(work)], check=False)
    if code == 0:
        say(f"done in {time.perf_counter() - started:.0f}s")
    return code


def _show_logs(logs: Path) -> None:
    for log in sorted(logs.glob("*.log")) if logs.is_dir() else []:
        tail = log.read_text(errors="replace").strip().splitlines()[-10:]
        if tail:
            say(f"-- last lines of {log.name}:\n  " + "\n  ".join(tail))


if __name__ == "__main__":
    sys.exit(main())
