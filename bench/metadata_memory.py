"""Bytes the master's namespace holds per file of a mounted tree, and the most it held while
it walked the tree (issue 27, target 3).

A tree of N files is mounted read-only (synced hourly) in a namespace as the master builds
it and listed whole as a client's find makes the master do (each entry with the reuse time
ListStatus gives it): the first listing walks the store, a second one lists what the
namespace holds. The tree is either

- a file:// tree of N empty files (folders of 1,000) made once under --dir (a tree of the
  many-files benchmark, `manyfiles.py`, is found there and used as it is), or
- with --generated, a store that makes its listing up without files: N statuses in the
  many-files tree's shape (1,000 files a folder, 100 folders a top folder, file://-like
  versions), handed to the namespace through the store's walk interface as a store hands
  them. Only the namespace's memory and speed are measured then, not a store's.

Tracing (the default) counts the bytes the namespace holds per file after the listing, and
after a second mount of the same folder, listed too. --rss runs at full speed and reads the
process's resident set instead: its peak during the first listing (VmHWM, the walk included),
what is resident after it, and the second listing's speed in files/s.

    .venv/bin/python -P bench/metadata_memory.py --files 100000 --dir /tmp/tree-100k
    .venv/bin/python -P bench/metadata_memory.py --files 10000000 --generated --rss
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

from strata.cacheserver.namespace.mounts import MountOptions, MountTable
from strata.cacheserver.namespace.tree import Namespace
from strata.cacheserver.ufs import UfsStatus

FILES_PER_FOLDER = 1000
FOLDERS_PER_TOP = 100  # as the many-files benchmark's tree
GENERATED_PAGE = 5000


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


class GeneratedStore:
    """A store of `files` files that exist only as its listing: a walk makes their statuses
    page by page, in path order, in the many-files tree's shape (t000/d00/f000.bin, ...),
    each file 1 KiB with a file://-like version ("size-mtime_ns"). It answers what a walk
    of the namespace asks: `walk_pages`, `walk` (all at once, as a namespace that takes a
    walk whole asks) and `url`."""

    walks_in_order = True  # as `Store.walks_in_order`: its statuses come in path order

    def __init__(self, files: int) -> None:
        self.files = files
        self.source = f"generated://{files}-files"

    def url(self, rel: str) -> str:
        return f"{self.source}/{rel}" if rel else self.source

    def _statuses(self) -> AsyncIterator[UfsStatus]:
        async def made() -> AsyncIterator[UfsStatus]:
            base_ms = 1_733_000_000_000
            for index in range(self.files):
                folder, at = divmod(index, FILES_PER_FOLDER)
                top, inner = divmod(folder, FOLDERS_PER_TOP)
                if at == 0:
                    if inner == 0:
                        yield UfsStatus(f"t{top:03d}", True, 0, 0, "")
                    yield UfsStatus(f"t{top:03d}/d{inner:02d}", True, 0, 0, "")
                mtime_ns = (base_ms + index) * 1_000_000 + 123_456
                yield UfsStatus(f"t{top:03d}/d{inner:02d}/f{at:03d}.bin", False, 1024, mtime_ns // 1_000_000,
                                f"1024-{mtime_ns}")

        return made()

    async def walk_pages(self, rel: str, *, with_dirs: bool = False,
                         page: int = GENERATED_PAGE) -> AsyncIterator[list[UfsStatus]]:
        assert rel == "", f"the generated store walks its root only, not {rel!r}"
        out: list[UfsStatus] = []
        async for status in self._statuses():
            if with_dirs or not status.is_dir:
                out.append(status)
                if len(out) >= page:
                    yield out
                    out = []
                    await asyncio.sleep(0)
        if out:
            yield out

    async def walk(self, rel: str, *, with_dirs: bool = False) -> list[UfsStatus]:
        return [status async for page in self.walk_pages(rel, with_dirs=with_dirs) for status in page]

    async def close(self) -> None:
        pass


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


def peak_resident() -> int:
    """The process's peak resident set since `reset_peak` (VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak() -> None:
    """Start VmHWM again from the resident set now (Linux: "5" to clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def mount(table: MountTable, path: str, root: Path | None, files: int, options: MountOptions) -> None:
    """Mount the file:// tree at `root`, or (None) a generated store of `files` files."""
    if root is not None:
        table.add(path, f"file://{root}", options)
        return
    added = table.add(path, "memory://generated", options)
    table._stores[added.mount_id] = GeneratedStore(files)  # type: ignore[assignment]  # the bench's own store


async def measure(root: Path | None, files: int, rss: bool) -> None:
    options = MountOptions(read_only=True, metadata_sync_interval=3600)
    table = MountTable(None, allowed_roots=[str(root.parent)] if root is not None else None)
    ns = Namespace(table, None, block_size=4 << 20)
    what = f"a file:// tree of {files:,} files" if root is not None else (
        f"a generated store of {files:,} files (statuses made up page by page, no files)")
    print(what)
    if not rss:
        tracemalloc.start()
    base = held()
    mount(table, "/m", root, files, options)
    if rss:
        reset_peak()
    started, cpu = time.monotonic(), time.process_time()
    found = await find(ns, "/m")
    took, cpu = time.monotonic() - started, time.process_time() - cpu
    assert found == files, f"listed {found} files of {files}"
    after_find = held()
    if rss:
        peak = peak_resident()
        print(f"first find (walks the store): {took:.1f}s, {files / took:,.0f} files/s ({files / cpu:,.0f} a CPU "
              f"second: the machine is shared); resident before "
              f"{base / 2**20:,.0f} MiB, peak {peak / 2**20:,.0f} MiB ({(peak - base) / files:.0f} B/file), "
              f"after {after_find / 2**20:,.0f} MiB ({(after_find - base) / files:.0f} B/file)")
        started, cpu = time.monotonic(), time.process_time()
        assert await find(ns, "/m") == files
        took, cpu = time.monotonic() - started, time.process_time() - cpu
        print(f"second find (what the namespace holds, in pages): {took:.1f}s, {files / took:,.0f} files/s "
              f"({files / cpu:,.0f} a CPU second); "
              f"resident {held() / 2**20:,.0f} MiB")
        return
    print(f"find of {files} files: {took:.1f}s (under tracemalloc); held {(after_find - base) / files:.0f} B/file")
    mount(table, "/m2", root, files, options)
    assert await find(ns, "/m2") == files
    print(f"after a second mount of the same folder, listed too: {(held() - base) / files:.0f} B/file")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--dir", type=Path, help="where the tree is made (kept for the next run)")
    parser.add_argument("--generated", action="store_true", help="a store that makes its listing up: no files")
    parser.add_argument("--rss", action="store_true", help="measure the resident set instead of tracing allocations")
    args = parser.parse_args()
    if args.generated == (args.dir is not None):
        parser.error("give either --dir (a file:// tree) or --generated")
    root = None
    if args.dir is not None:
        root = args.dir.resolve() / "tree"
        make_tree(root, args.files)
    asyncio.run(measure(root, args.files, args.rss))


if __name__ == "__main__":
    main()
