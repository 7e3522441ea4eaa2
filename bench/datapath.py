"""The remote read path against its limit: warm block bytes from one worker's data port to 1,
8 or 32 reader processes, against the same bytes sent by another process over loopback TCP
(sendfile from the page cache, received into a reused buffer: the most a reader on this host
can get). CPU seconds per GiB are measured for the readers (getrusage) and for the serving
process (the worker, or the loopback sender; /proc/<pid>/stat).

    .venv/bin/python -P bench/datapath.py --size 256Mi --readers 1,8,32 --reps 3

Every reader reads the whole file once per repetition, 16 MiB per read() (as a sequential
fsspec user does); reader i of N starts at block i*blocks/N and wraps around, so the readers
do not all ask for the same block at once. The loopback readers read the same bytes in the
same order. Before the timed repetitions every reader reads the file once checking the CRC-32
of each block against the file's (untimed), so a wrong byte fails the run. Writes results/<name>.json and prints one table; a run takes about a minute
(256 MiB, 3 repetitions).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

READ = 16 * 1024 * 1024
GIB = 2**30
TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def order(blocks: int, first: int) -> list[int]:
    return [(first + i) % blocks for i in range(blocks)]


# -- the reader process ---------------------------------------------------------------------


def _read_strata(fs: Any, path: str, size: int, block: int, first: int, check: bool) -> tuple[int, int]:
    """(bytes, crc) of the whole file read through the fsspec client, from block `first` on
    (crc 0 unless `check`)."""
    crcs: dict[int, int] = {}
    total = 0
    with fs.open(path, "rb") as f:
        for index in order(-(-size // block), first):
            f.seek(index * block)
            crc, left = 0, min(block, size - index * block)
            while left > 0:
                data = f.read(min(READ, left))
                if not data:
                    raise AssertionError(f"{path}: end of file at {f.tell()} of {size}")
                if check:
                    crc = zlib.crc32(data, crc)
                left -= len(data)
                total += len(data)
            crcs[index] = crc
    return total, _combine(crcs)


def _read_tcp(port: int, size: int, block: int, first: int, check: bool) -> tuple[int, int]:
    """The same bytes from the loopback sender: one request line, then the bytes."""
    buf = bytearray(READ)
    view = memoryview(buf)
    crcs: dict[int, int] = {}
    total = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for index in order(-(-size // block), first):
            length = min(block, size - index * block)
            sock.sendall(f"{index * block} {length}\n".encode())
            crc, left = 0, length
            while left > 0:
                n = sock.recv_into(view[:min(READ, left)])
                if n == 0:
                    raise AssertionError("loopback sender closed early")
                if check:
                    crc = zlib.crc32(view[:n], crc)
                left -= n
                total += n
            crcs[index] = crc
    return total, _combine(crcs)


def _combine(crcs: dict[int, int]) -> int:
    """One number per file from the blocks' CRCs (in block order), to compare readers."""
    return zlib.crc32(json.dumps(sorted(crcs.items())).encode())


def child(job: dict[str, Any]) -> None:
    fs = None
    if job["kind"] == "strata":
        from strata.cacheserver.client.fs import StrataFileSystem

        fs = StrataFileSystem(skip_instance_cache=True, **job["options"])
    print("READY", flush=True)
    while (command := sys.stdin.readline().strip()) in ("go", "check"):
        check = command == "check"
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        if fs is not None:
            got, crc = _read_strata(fs, job["path"], job["size"], job["block"], job["first"], check)
        else:
            got, crc = _read_tcp(job["port"], job["size"], job["block"], job["first"], check)
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        print(json.dumps({"seconds": seconds, "bytes": got, "crc": crc,
                          "user": after.ru_utime - before.ru_utime, "sys": after.ru_stime - before.ru_stime}), flush=True)


# -- the loopback sender --------------------------------------------------------------------

_SENDER = r"""
import os, socket, sys, threading
path = sys.argv[1]
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(128)
print(s.getsockname()[1], flush=True)
def serve(conn):
    with conn, open(path, "rb") as f, conn.makefile("rb") as lines:
        for line in lines:
            offset, length = map(int, line.split())
            while length > 0:
                n = os.sendfile(conn.fileno(), f.fileno(), offset, length)
                offset += n; length -= n
while True:
    conn, _ = s.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


# -- the run --------------------------------------------------------------------------------


class Readers:
    """N reader processes of one kind, started once, run together per repetition."""

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-P", __file__, "--child", json.dumps(job)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for job in jobs]
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line.startswith("READY"):
                raise RuntimeError(f"reader did not start: {line!r}")

    def run(self, server_pid: int, command: str = "go") -> dict[str, Any]:
        server_before = cpu_of(server_pid)
        start = time.perf_counter()
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(command + "\n")
            p.stdin.flush()
        results = []
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line.startswith("{"):
                raise RuntimeError(f"reader failed: {line!r}")
            results.append(json.loads(line))
        wall = time.perf_counter() - start
        moved = sum(r["bytes"] for r in results)
        return {"wall": wall, "bytes": moved, "gbps": moved / wall / 1e9, "crcs": sorted({r["crc"] for r in results}),
                "client_cpu_per_gib": sum(r["user"] + r["sys"] for r in results) / (moved / GIB),
                "client_sys_per_gib": sum(r["sys"] for r in results) / (moved / GIB),
                "server_cpu_per_gib": (cpu_of(server_pid) - server_before) / (moved / GIB)}

    def close(self) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.close()
        for p in self.procs:
            p.wait(timeout=60)
            assert p.stdout is not None
            p.stdout.close()


def median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def measure(stack: Any, local: Path, rel: str, counts: list[int], reps: int) -> list[dict[str, Any]]:
    """For each reader count n: n processes read the file `rel` (under the stack's mount and
    under `local`) through the data port of the stack's worker, warm, and n read it over
    loopback TCP; `reps` interleaved runs each. One row per contestant and n: the runs and
    their medians (GB/s, CPU seconds per GiB of readers and server), and the remote path's
    share of the limit."""
    from stack import MOUNT, OTHER_HOST, TOKEN
    from strata.contract.units import parse_size

    size = (local / rel).stat().st_size
    block = parse_size(stack.settings.block_size)
    worker = next(c for c in stack.children if c.name == "worker").process.pid
    options = {"master": stack.master_address, "token": TOKEN, "host": OTHER_HOST}
    path = f"{MOUNT}/{rel}"
    warm = Readers([{"kind": "strata", "options": options, "path": path, "size": size, "block": block, "first": 0}])
    expected = warm.run(worker, "check")["crcs"]  # fills the cache
    warm.close()
    rows: list[dict[str, Any]] = []
    sender = subprocess.Popen([sys.executable, "-c", _SENDER, str(local / rel)], stdout=subprocess.PIPE, text=True)
    try:
        assert sender.stdout is not None
        port = int(sender.stdout.readline())
        blocks = -(-size // block)
        for n in counts:
            kinds = {
                "strata-remote": (worker, [{"kind": "strata", "options": options, "path": path, "size": size,
                                            "block": block, "first": i * blocks // n} for i in range(n)]),
                "loopback-tcp": (sender.pid, [{"kind": "tcp", "port": port, "size": size, "block": block,
                                               "first": i * blocks // n} for i in range(n)]),
            }
            started = {k: Readers(jobs) for k, (_, jobs) in kinds.items()}
            runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
            try:
                for k, readers in started.items():  # every reader's bytes checked, untimed
                    got = readers.run(kinds[k][0], "check")["crcs"]
                    if got != expected:
                        raise AssertionError(f"{k} with {n} readers read other bytes: {got} != {expected}")
                for _ in range(reps):  # interleaved: a change in load hits both alike
                    for k, readers in started.items():
                        runs[k].append(readers.run(kinds[k][0]))
            finally:
                for readers in started.values():
                    readers.close()
            for k, rs in runs.items():
                row: dict[str, Any] = {"contestant": k, "readers": n, "reps": rs}
                for key in ("gbps", "client_cpu_per_gib", "client_sys_per_gib", "server_cpu_per_gib"):
                    row[key] = median([r[key] for r in rs])
                rows.append(row)
            limit = rows[-1]["gbps"]
            rows[-2]["of_limit"] = rows[-2]["gbps"] / limit
    finally:
        sender.kill()
        sender.wait(timeout=10)
        if sender.stdout is not None:
            sender.stdout.close()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description="warm remote reads (data port) against loopback TCP")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--size", default="256Mi", help="the file every reader reads (default 256Mi)")
    p.add_argument("--readers", default="1,8,32", help="reader process counts (default 1,8,32)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--name", default="datapath")
    p.add_argument("--workdir", type=Path, default=BENCH / ".scratch")
    p.add_argument("--out", type=Path, default=BENCH / "results")
    args = p.parse_args()
    if args.child:
        child(json.loads(args.child))
        return 0

    import datasets
    from stack import BUCKET, MOUNT, Stack, StackSettings
    from strata.contract.units import parse_size

    size = parse_size(args.size)
    counts = [int(n) for n in args.readers.split(",") if n.strip()]
    local = args.workdir / "data"
    ds = datasets.text_dataset(local, f"text-{datasets.size_label(size)}", size)
    size = (local / ds.files[0]).stat().st_size
    load = os.getloadavg()
    with Stack(StackSettings(), args.workdir / "datapath") as stack:
        datasets.upload(ds, local, stack.s3fs(), BUCKET)
        stack.mount(MOUNT, f"s3://{BUCKET}")
        rows = measure(stack, local, ds.files[0], counts, args.reps)
    block = parse_size(StackSettings().block_size)
    result = {"size": size, "block": block, "reps": args.reps, "load_start": load[0], "load_end": os.getloadavg()[0],
              "cpus": os.cpu_count(), "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    print(f"file {size / 2**20:.0f} MiB, {args.reps} reps, load average {load[0]:.2f} -> {result['load_end']:.2f}")
    print(f"{'contestant':14s} {'readers':>7s} {'GB/s':>6s} {'of limit':>8s} {'client CPU s/GiB':>16s} "
          f"{'(sys)':>6s} {'server CPU s/GiB':>16s}")
    for row in rows:
        share = f"{row['of_limit']:.0%}" if "of_limit" in row else ""
        print(f"{row['contestant']:14s} {row['readers']:7d} {row['gbps']:6.2f} {share:>8s} "
              f"{row['client_cpu_per_gib']:16.2f} {row['client_sys_per_gib']:6.2f} {row['server_cpu_per_gib']:16.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
