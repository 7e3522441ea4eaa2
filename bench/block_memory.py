"""Bytes the master holds per cached block, and the time of the queries its block index answers.

N cached blocks as three workers report them (registering with all they hold): 90% are files of
one block, the rest files of 100 blocks; each block is held by one worker, one block in ten by
two; two mounts. Prints the bytes held per block (tracemalloc, or the resident set with --rss)
and the time of each query the master asks of the index: the holders of a block (LocateBlocks,
GetBlockLocations, a load's "already held"), the cached bytes of a file (every FileInfo), the
per-mount and per-worker sums (Report, /metrics), a worker's re-registration and its drop.

    .venv/bin/python -P bench/block_memory.py --blocks 1000000 [--rss]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

from strata.cacheserver.common.keys import BlockKey
from strata.cacheserver.master.blocks import BlockIndex
from strata.contract.proto import strata_pb2 as pb

BLOCK_SIZE = 4 << 20
LAST_LENGTH = 1 << 20  # a long file's last block: a part of a block
SMALL_FILE = 100_000  # bytes of a one-block file
LONG_FILE_BLOCKS = 100
WORKERS = ("worker-0", "worker-1", "worker-2")
MOUNTS = (1_733_000_000_000_001, 1_733_000_000_000_002)  # as the master gives them: microseconds
REPORT_BATCH = 10_000  # refs made at a time, so the index alone is measured
SMALL_WORKER_BLOCKS = 1_000  # a worker that just joined
SUMS = 5  # times each sum is asked for (a walk of every block took seconds)


def held() -> int:
    gc.collect()
    if tracemalloc.is_tracing():
        return tracemalloc.get_traced_memory()[0]
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Dataset:
    """The files and which workers hold each block, made from numbers alone (no list a block)."""

    def __init__(self, blocks: int) -> None:
        self.long_files = blocks // 10 // LONG_FILE_BLOCKS
        self.small_files = blocks - self.long_files * LONG_FILE_BLOCKS
        self.blocks = self.small_files + self.long_files * LONG_FILE_BLOCKS

    def file(self, number: int) -> tuple[int, str, str, int]:
        """(mount id, path, version, length) of file `number`."""
        mount = MOUNTS[number % 2]
        if number < self.small_files:
            return mount, f"train/d{number // 1000:05d}/f{number % 1000:03d}.jpg", f"{SMALL_FILE}-{1_733_000_000_000_000_000 + number}", SMALL_FILE
        length = (LONG_FILE_BLOCKS - 1) * BLOCK_SIZE + LAST_LENGTH
        return mount, f"shards/s{number:07d}.tar", f"{length}-{1_733_000_000_000_000_000 + number}", length

    def files(self) -> int:
        return self.small_files + self.long_files

    def blocks_of(self, number: int) -> int:
        return 1 if number < self.small_files else LONG_FILE_BLOCKS

    def holders(self, number: int, index: int) -> tuple[int, ...]:
        """Worker numbers holding a block: most by one, one in ten by two."""
        n = number * LONG_FILE_BLOCKS + index
        first = n % 3
        return (first, (first + 1) % 3) if n % 10 == 0 else (first,)

    def refs(self, worker: int) -> Iterator[list[pb.BlockRef]]:
        """A worker's block report, in batches."""
        batch: list[pb.BlockRef] = []
        for number in range(self.files()):
            mount, path, version, length = self.file(number)
            for index in range(self.blocks_of(number)):
                if worker in self.holders(number, index):
                    batch.append(pb.BlockRef(mount_id=mount, path=path, version=version, index=index,
                                             block_size=BLOCK_SIZE,
                                             length=min(BLOCK_SIZE, length - index * BLOCK_SIZE)))
                    if len(batch) == REPORT_BATCH:
                        yield batch
                        batch = []
        if batch:
            yield batch

    def key(self, number: int, index: int) -> BlockKey:
        mount, path, version, length = self.file(number)
        return BlockKey.of_file(mount, path, version, block_size=BLOCK_SIZE, file_length=length, index=index)


def timed(what: str, count: int, run: object) -> None:
    started = time.perf_counter()
    run()  # type: ignore[operator]
    took = time.perf_counter() - started
    print(f"  {what}: {took * 1e6 / count:,.1f} us each ({count:,} in {took:.3f}s)")


def cached_bytes_of_file(index: BlockIndex, data: Dataset, number: int) -> int:
    mount, path, version, length = data.file(number)
    return index.cached_bytes_of_file(mount, path, version, block_size=BLOCK_SIZE, file_length=length)


def measure(blocks: int, rss: bool) -> None:
    data = Dataset(blocks)
    if not rss:
        tracemalloc.start()
    base = held()
    index = BlockIndex()
    started = time.perf_counter()
    for worker, worker_id in enumerate(WORKERS):
        for batch in data.refs(worker):
            index.add(worker_id, batch)
    took = time.perf_counter() - started
    after = held()
    how = "resident set" if rss else "tracemalloc"
    print(f"{data.blocks:,} cached blocks ({data.small_files:,} one-block files, {data.long_files:,} of "
          f"{LONG_FILE_BLOCKS}): {(after - base) / data.blocks:,.0f} B/block ({how}); reports added in {took:.1f}s")
    if not rss:
        tracemalloc.stop()
    rng = random.Random(7)
    numbers = [rng.randrange(data.files()) for _ in range(20_000)]
    keys = [data.key(n, rng.randrange(data.blocks_of(n))) for n in numbers]
    timed("holders of a block", len(keys), lambda: [index.holders(k) for k in keys])
    timed("cached bytes of a file", len(numbers), lambda: [cached_bytes_of_file(index, data, n) for n in numbers])
    timed("cached bytes by mount", SUMS, lambda: [index.cached_bytes_by_mount() for _ in range(SUMS)])
    timed("cached bytes by worker, each mount", SUMS * len(MOUNTS),
          lambda: [index.cached_bytes_by_worker(m) for _ in range(SUMS) for m in MOUNTS])
    few = [ref for batch in data.refs(0) for ref in batch[:100]][:SMALL_WORKER_BLOCKS]
    index.add("worker-3", few)
    timed(f"drop of worker-3 ({len(few):,} blocks)", 1, lambda: index.drop_worker("worker-3"))
    reports = list(data.refs(2))
    count = sum(len(b) for b in reports)
    timed("drop of worker-2", 1, lambda: index.drop_worker(WORKERS[2]))
    timed("worker-2 registering again (a block)", count, lambda: [index.add(WORKERS[2], b) for b in reports])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--rss", action="store_true", help="measure the resident set instead of tracing allocations")
    args = parser.parse_args()
    measure(args.blocks, args.rss)


if __name__ == "__main__":
    main()
