"""How fast the kernel's page cache answers reads of each given file, and in what size of
folios it holds the file's pages: the limit of a warm read through FUSE, measured beside a
local file.

    .venv/bin/python -P bench/pagecache.py MOUNT/agg-1g/part-0000.parquet LOCAL/agg-1g/part-0000.parquet

Each file is read whole once (so its pages are cached), then front to back in 1 MiB reads into
one reused buffer, the files taking turns, `--passes` times; the best pass of each is shown
(GB/s), with the size of the folios that hold its pages (from /proc/self/pagemap and
/proc/kpageflags, so as root). A file whose pages sit in 4 KiB folios is copied out page by
page, each page looked up on its own; one in large folios (ext4's, a huge tmpfs's) in runs of
up to 2 MiB.
"""

from __future__ import annotations

import argparse
import mmap
import os
import struct
import sys
import time
from pathlib import Path

PAGE = mmap.PAGESIZE
READ = 1 << 20
ENTRY = struct.Struct("=Q")
PRESENT = 1 << 63
PFN_MASK = (1 << 55) - 1
COMPOUND_TAIL = 1 << 16


def best_passes(paths: list[str], passes: int) -> list[float]:
    """Seconds of the best front-to-back read of each file, the files read in turns."""
    buf = bytearray(READ)
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    try:
        best = [float("inf")] * len(fds)
        for _ in range(passes + 1):  # the first pass fills the page cache
            for i, fd in enumerate(fds):
                os.lseek(fd, 0, os.SEEK_SET)
                start = time.perf_counter()
                while os.readv(fd, [buf]):
                    pass
                best[i] = min(best[i], time.perf_counter() - start)
        return best
    finally:
        for fd in fds:
            os.close(fd)


def folio_pages(path: str, limit: int = 1 << 16) -> float | None:
    """Average pages per folio of the file's first `limit` cached pages (None: not readable,
    e.g. not root). Maps the file, touches each page, finds each page's frame in pagemap and
    whether kpageflags marks it the head or tail of a compound (large) folio."""
    size = os.path.getsize(path)
    pages = min(size // PAGE, limit)
    if pages == 0:
        return None
    with open(path, "rb") as f, mmap.mmap(f.fileno(), pages * PAGE, prot=mmap.PROT_READ) as m:
        for i in range(pages):
            m[i * PAGE]
        start = _mapped_at(path, pages * PAGE)
        try:
            with open("/proc/self/pagemap", "rb") as pagemap, open("/proc/kpageflags", "rb") as kflags:
                folios = 0
                for i in range(pages):
                    pagemap.seek((start // PAGE + i) * ENTRY.size)
                    entry = ENTRY.unpack(pagemap.read(ENTRY.size))[0]
                    if not entry & PRESENT or not entry & PFN_MASK:
                        return None  # frame numbers are hidden from this user
                    kflags.seek((entry & PFN_MASK) * ENTRY.size)
                    flags = ENTRY.unpack(kflags.read(ENTRY.size))[0]
                    folios += not flags & COMPOUND_TAIL  # a head, or a folio of one page
        except PermissionError:
            return None
    return pages / folios if folios else None


def _mapped_at(path: str, length: int) -> int:
    """The start of this process's newest mapping of `path` of `length` bytes."""
    real = os.path.realpath(path)
    found = 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == real:
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if high - low == length:
                found = low
    if not found:
        raise RuntimeError(f"no mapping of {real} found")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--passes", type=int, default=10)
    args = parser.parse_args()
    seconds = best_passes(args.files, args.passes)
    for path, best in zip(args.files, seconds):
        folio = folio_pages(path)
        size = os.path.getsize(path)
        shown = f"{folio * PAGE / 1024:.0f} KiB" if folio else "unknown (run as root)"
        print(f"{path}: {size / best / 1e9:.2f} GB/s (best of {args.passes}, {size / 2**20:.0f} MiB in {best:.3f} s), "
              f"folios {shown} on average")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
