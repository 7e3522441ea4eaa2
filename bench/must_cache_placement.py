"""What placing MUST_CACHE blocks on a disk tier costs a writer.

The only copy of a MUST_CACHE (or not yet uploaded ASYNC_THROUGH) block goes to the first
disk tier of a worker that has one, fsynced before the write is acknowledged; a worker with
MEM alone keeps it in MEM (what every worker did before). This script starts two local
clusters side by side (`strata local up` in private homes, on free ports of 127.0.0.1): one
worker with MEM alone, one with MEM and an SSD tier on this machine's disk, and writes the same
file of `--size` (256 MiB by default) with MUST_CACHE through each, in turn, `--reps` times,
from this process (the client streams to the worker over loopback gRPC; the worker stages
the file on its disk, then caches its blocks).

    .venv/bin/python -P bench/must_cache_placement.py [--size 256Mi] [--reps 5] [--disk DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from strata.cacheserver import localcluster
from strata.cacheserver.auth import Role, local_token_name
from strata.cacheserver.client.fs import StrataFileSystem
from strata.cacheserver.launcher import free_port
from strata.contract import constants
from strata.contract.proto import strata_pb2 as pb
from strata.contract.units import format_size, parse_size


@contextmanager
def cluster(home: Path, disk: Path | None, source: Path) -> Iterator[StrataFileSystem]:
    """A local cluster of one worker in `home` (MEM 1Gi, and an SSD tier in `disk` if given),
    `source` mounted at /w; its filesystem object."""
    os.environ[constants.ENV_HOME] = str(home)
    spec = localcluster.LocalClusterSpec(
        workers=1, mem="1Gi", ssd=(f"{disk}:2Gi",) if disk else (),
        master_port=free_port(), worker_port=free_port(),
    )
    try:
        state = localcluster.up(spec)
        token = (home / "local" / local_token_name(Role.ADMIN)).read_text()
        fs = StrataFileSystem(master=state.master, token=token, skip_instance_cache=True, write_type="MUST_CACHE")
        fs.client.mount("/w", f"file://{source}", pb.MountOptions())
        yield fs
        fs.client.close()
    finally:
        os.environ[constants.ENV_HOME] = str(home)
        localcluster.down()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="256Mi")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--disk", type=Path, default=Path("/var/tmp"), help="folder on the disk for the SSD tier")
    args = parser.parse_args()
    size = parse_size(args.size, what="--size")
    data = os.urandom(size)
    times: dict[str, list[float]] = {"MEM alone (blocks in MEM)": [], "MEM + SSD (blocks on the SSD, fsynced)": []}
    with tempfile.TemporaryDirectory(dir=args.disk) as scratch:
        root = Path(scratch)
        for name in ("mem", "ssd", "source-mem", "source-ssd"):
            (root / name).mkdir()
        with cluster(root / "home-mem", None, root / "source-mem") as mem_fs, \
                cluster(root / "home-ssd", root / "ssd", root / "source-ssd") as ssd_fs:
            for rep in range(args.reps):
                for label, fs in zip(times, (mem_fs, ssd_fs)):
                    path = f"/w/file-{rep}.bin"
                    started = time.perf_counter()
                    fs.pipe_file(path, data)
                    times[label].append(time.perf_counter() - started)
                    fs.rm(path)
    print(f"MUST_CACHE write of {format_size(size)}, {args.reps} times each, interleaved "
          f"(disk tier in {args.disk}; {os.cpu_count()} CPUs, 1-minute load {os.getloadavg()[0]:.1f}):")
    for label, seconds in times.items():
        median = statistics.median(seconds)
        print(f"  {label:40s} median {median:6.3f} s ({size / median / 2**20:5.0f} MiB/s), "
              f"min {min(seconds):.3f} s, max {max(seconds):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
