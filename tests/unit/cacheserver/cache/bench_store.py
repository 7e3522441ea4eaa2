"""Micro-benchmark of the block store (not a test: it measures, it does not assert).

    .venv/bin/python -P tests/unit/cacheserver/cache/bench_store.py [--rounds N] [--ssd-dir DIR]

Prints MiB/s of put() and of read() of a whole cached 16 MiB block (CRC32 of every chunk
included) from a MEM tier in /dev/shm and from an SSD tier directory (on disk; after the
put the file is usually in the page cache, so this is the store's overhead, not the disk's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from strata.cacheserver.cache import BlockStore, TierConfig
from strata.cacheserver.common.keys import BlockKey
from strata.contract.constants import DEFAULT_BLOCK_SIZE

MIB = 1024 * 1024


async def measure(medium: str, directory: Path, rounds: int) -> tuple[float, float, float]:
    data = os.urandom(DEFAULT_BLOCK_SIZE)
    quota = DEFAULT_BLOCK_SIZE * (rounds + 2)
    async with BlockStore([TierConfig(medium, quota, (directory,))]) as store:
        start = time.perf_counter()
        for i in range(rounds):
            await store.put(BlockKey(1, "/bench", "v", i, len(data), len(data)), data)
        put_rate = rounds * DEFAULT_BLOCK_SIZE / MIB / (time.perf_counter() - start)
        key = BlockKey(1, "/bench", "v", 0, len(data), len(data))
        await store.read(key, 0, DEFAULT_BLOCK_SIZE)  # warm up
        start = time.perf_counter()
        for _ in range(rounds):
            assert len(await store.read(key, 0, DEFAULT_BLOCK_SIZE)) == DEFAULT_BLOCK_SIZE
        read_rate = rounds * DEFAULT_BLOCK_SIZE / MIB / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(rounds):  # short-circuit: what a local client gets from the fd
            fd, _block = store.open_fd(key)
            try:
                assert len(os.pread(fd, DEFAULT_BLOCK_SIZE, 0)) == DEFAULT_BLOCK_SIZE
            finally:
                os.close(fd)
        fd_rate = rounds * DEFAULT_BLOCK_SIZE / MIB / (time.perf_counter() - start)
    return put_rate, read_rate, fd_rate


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--ssd-dir", type=Path, default=None, help="default: a temporary directory")
    args = parser.parse_args()
    mem = Path(tempfile.mkdtemp(prefix="strata-bench-", dir="/dev/shm"))
    ssd = Path(tempfile.mkdtemp(prefix="strata-bench-", dir=args.ssd_dir))
    try:
        for medium, directory in (("MEM", mem), ("SSD", ssd)):
            put_rate, read_rate, fd_rate = await measure(medium, directory, args.rounds)
            print(
                f"{medium} ({directory}): put {put_rate:7.0f} MiB/s   read() {read_rate:7.0f} MiB/s   "
                f"open_fd+pread {fd_rate:7.0f} MiB/s   (16 MiB blocks, {args.rounds} rounds)"
            )
    finally:
        shutil.rmtree(mem, ignore_errors=True)
        shutil.rmtree(ssd, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
