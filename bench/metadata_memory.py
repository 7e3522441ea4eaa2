"""Bytes the master's namespace holds per file of a mounted tree, measured with tracemalloc.

A file:// tree of N empty files (folders of 1,000) is made once under --dir, mounted read-only
(synced hourly) in a namespace as the master builds it, and listed whole as a client's find
makes the master do (each entry with the reuse time ListStatus gives it); then the same folder
is mounted a second time and listed again. Prints the bytes held per file after each step.

    .venv/bin/python -P bench/metadata_memory.py --files 100000 --dir /tmp/tree-100k
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
import tracemalloc
from pathlib import Path

from strata.cacheserver.namespace.mounts import MountOptions, MountTable
from strata.cacheserver.namespace.tree import Namespace

FILES_PER_FOLDER = 1000


def make_tree(root: Path, files: int) -> None:
    marker = root.parent / f".made-{files}"
    if marker.exists():
        return
    for folder in range((files + FILES_PER_FOLDER - 1) // FILES_PER_FOLDER):
        path = root / f"d{folder:05d}"
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(min(FILES_PER_FOLDER, files - folder * FILES_PER_FOLDER)):
                os.close(os.open(f"f{i:05d}.bin", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
        finally:
            os.close(fd)
    marker.touch()


async def find(ns: Namespace, path: str) -> int:
    """A recursive listing as the master answers it: every entry with its reuse time, in
    pages (ListStatusPages) where the namespace makes them, else whole (ListStatus)."""
    pages = ns.list_pages(path, recursive=True) if hasattr(ns, "list_pages") else None
    if pages is None:
        entries = await ns.list_status(path, recursive=True)
        for entry in entries:
            ns.valid_for(entry)
        return sum(1 for e in entries if not e.is_dir)
    files = 0
    async for page in pages:
        if hasattr(ns, "valid_for_each"):  # a page's reuse times reckoned together, as the master does
            ns.valid_for_each(page)
        else:
            for entry in page:
                ns.valid_for(entry)
        files += sum(not entry.is_dir for entry in page)
    return files


def held() -> int:
    """Bytes allocated now: traced by tracemalloc, or (--rss) the process's resident set,
    which counts the allocator's slack too and runs at full speed."""
    gc.collect()
    if tracemalloc.is_tracing():
        return tracemalloc.get_traced_memory()[0]
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def measure(root: Path, files: int, rss: bool) -> None:
    options = MountOptions(read_only=True, metadata_sync_interval=3600)
    table = MountTable(None, allowed_roots=[str(root.parent)])
    ns = Namespace(table, None, block_size=4 << 20)
    if not rss:
        tracemalloc.start()
    base = held()
    table.add("/m", f"file://{root}", options)
    started = time.monotonic()
    found = await find(ns, "/m")
    took = time.monotonic() - started
    assert found == files, f"listed {found} files of {files}"
    after_find = held()
    how = "" if rss else " (under tracemalloc)"
    print(f"find of {files} files: {took:.1f}s{how}; held {(after_find - base) / files:.0f} B/file")
    table.add("/m2", f"file://{root}", options)
    assert await find(ns, "/m2") == files
    print(f"after a second mount of the same folder, listed too: {(held() - base) / files:.0f} B/file")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--dir", type=Path, required=True, help="where the tree is made (kept for the next run)")
    parser.add_argument("--rss", action="store_true", help="measure the resident set instead of tracing allocations")
    args = parser.parse_args()
    root = args.dir.resolve() / "tree"
    make_tree(root, args.files)
    asyncio.run(measure(root, args.files, args.rss))


if __name__ == "__main__":
    main()
