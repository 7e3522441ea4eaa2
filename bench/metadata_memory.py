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

--client (with --generated) serves the namespace through a real master (its gRPC server, in
this process) and lists the fresh mount from a client in a new process as a client `find`
does (ListStatusPages, page by page, `StrataClient.ls_pages`): the seconds to its first
page, files/s, and the peak resident set of the master's process and the client's.

    .venv/bin/python -P bench/metadata_memory.py --files 10000000 --generated --client
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import secrets
import subprocess
import sys
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

    def __init__(self, files: int, *, in_order: bool = True) -> None:
        self.files = files
        # False: the first two statuses come swapped, so the namespace sorts the walk at its end
        # and listings wait for the whole walk, as every listing did before they streamed.
        self.in_order = in_order
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
        swap = not self.in_order
        async for status in self._statuses():
            if with_dirs or not status.is_dir:
                out.append(status)
                if swap and len(out) == 2:
                    out.reverse()
                    swap = False
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


async def find(ns: Namespace, path: str) -> tuple[int, float]:
    """A recursive listing as the master answers it: every entry with its reuse time, in
    pages (ListStatusPages) where the namespace makes them, else whole (ListStatus). The
    files listed, and the seconds until the first page (a client's wait before it hears of
    a file; on a fresh mount the walk's first page, or the whole walk where listings wait
    for it)."""
    started = time.monotonic()
    pages = ns.list_pages(path, recursive=True) if hasattr(ns, "list_pages") else None
    if pages is None:
        entries = await ns.list_status(path, recursive=True)
        first = time.monotonic() - started
        for entry in entries:
            ns.valid_for(entry)
        return sum(1 for e in entries if not e.is_dir), first
    files = 0
    first = 0.0
    async for page in pages:
        if page and not first:
            first = time.monotonic() - started
        if hasattr(ns, "valid_for_each"):  # a page's reuse times reckoned together, as the master does
            ns.valid_for_each(page)
        else:
            for entry in page:
                ns.valid_for(entry)
        files += sum(not entry.is_dir for entry in page)
    return files, first


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


def mount(table: MountTable, path: str, root: Path | None, files: int, options: MountOptions,
          whole_walk: bool = False) -> None:
    """Mount the file:// tree at `root`, or (None) a generated store of `files` files (with
    `whole_walk`, one whose listings wait for the whole walk)."""
    if root is not None:
        table.add(path, f"file://{root}", options)
        return
    added = table.add(path, "memory://generated", options)
    table._stores[added.mount_id] = GeneratedStore(files, in_order=not whole_walk)  # type: ignore[assignment]  # the bench's own store


async def measure(root: Path | None, files: int, rss: bool, whole_walk: bool = False) -> None:
    options = MountOptions(read_only=True, metadata_sync_interval=3600)
    table = MountTable(None, allowed_roots=[str(root.parent)] if root is not None else None)
    ns = Namespace(table, None, block_size=4 << 20)
    what = f"a file:// tree of {files:,} files" if root is not None else (
        f"a generated store of {files:,} files (statuses made up page by page, no files)")
    print(what + (": listings wait for the whole walk (as before they streamed)" if whole_walk else ""))
    if not rss:
        tracemalloc.start()
    base = held()
    mount(table, "/m", root, files, options, whole_walk)
    if rss:
        reset_peak()
    started, cpu = time.monotonic(), time.process_time()
    found, first_page = await find(ns, "/m")
    took, cpu = time.monotonic() - started, time.process_time() - cpu
    assert found == files, f"listed {found} files of {files}"
    after_find = held()
    if rss:
        peak = peak_resident()
        print(f"first find (walks the store): first page after {first_page:.2f}s; "
              f"{took:.1f}s, {files / took:,.0f} files/s ({files / cpu:,.0f} a CPU "
              f"second: the machine is shared); resident before "
              f"{base / 2**20:,.0f} MiB, peak {peak / 2**20:,.0f} MiB ({(peak - base) / files:.0f} B/file), "
              f"after {after_find / 2**20:,.0f} MiB ({(after_find - base) / files:.0f} B/file)")
        started, cpu = time.monotonic(), time.process_time()
        assert (await find(ns, "/m"))[0] == files
        took, cpu = time.monotonic() - started, time.process_time() - cpu
        print(f"second find (what the namespace holds, in pages): {took:.1f}s, {files / took:,.0f} files/s "
              f"({files / cpu:,.0f} a CPU second); "
              f"resident {held() / 2**20:,.0f} MiB")
        return
    print(f"find of {files} files: {took:.1f}s (under tracemalloc); held {(after_find - base) / files:.0f} B/file")
    mount(table, "/m2", root, files, options)
    assert (await find(ns, "/m2"))[0] == files
    print(f"after a second mount of the same folder, listed too: {(held() - base) / files:.0f} B/file")


async def measure_client(files: int, whole_walk: bool) -> None:
    """A client's find of a fresh mount of a generated store through a real master (see the
    module docstring)."""
    from strata.cacheserver.auth import Credentials
    from strata.cacheserver.master.server import start_master
    from strata.contract.config import ServerConfig

    token = f"bench-{secrets.token_hex(8)}"
    handle = await start_master(ServerConfig(), journal_dir=None, credentials=Credentials.from_admin(token),
                                bind="127.0.0.1", port=0, http_port=0)
    try:
        base = held()
        mount(handle.parts.mounts, "/m", None, files, MountOptions(read_only=True, metadata_sync_interval=3600),
              whole_walk)
        reset_peak()
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-P", __file__, "--client-of", f"127.0.0.1:{handle.port}", token, "--files", str(files),
            stdout=subprocess.PIPE)
        out, _ = await client.communicate()
        if client.returncode != 0:
            raise RuntimeError(f"the client's find failed (exit {client.returncode})")
        found = json.loads(out)
        master_peak = peak_resident()
    finally:
        await handle.stop(0)
    assert found["files"] == files, f"the client listed {found['files']} files of {files}"
    took = found["seconds"]
    print(f"{'generated':>9} {files:,} files{' (listings wait for the whole walk)' if whole_walk else ''}: "
          f"client find of a fresh mount: first page after {found['first_page']:.2f}s, {took:.1f}s in all, "
          f"{files / took:,.0f} files/s; peak resident: master {master_peak / 2**20:,.0f} MiB "
          f"({base / 2**20:,.0f} at the start), client {found['peak'] / 2**20:,.0f} MiB")


def client_find(master: str, token: str) -> None:
    """Run in the client's process: list /m recursively page by page; print what it took."""
    from strata.cacheserver.client.fs import StrataFileSystem

    fs = StrataFileSystem(master=master, token=token, host="bench-client", skip_instance_cache=True)
    started = time.monotonic()
    first, files = 0.0, 0
    for page in fs.client.ls_pages("/m", recursive=True):
        first = first or time.monotonic() - started
        files += sum(not entry.is_dir for entry in page)
    print(json.dumps({"first_page": first, "seconds": time.monotonic() - started, "files": files,
                      "peak": peak_resident()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--dir", type=Path, help="where the tree is made (kept for the next run)")
    parser.add_argument("--generated", action="store_true", help="a store that makes its listing up: no files")
    parser.add_argument("--rss", action="store_true", help="measure the resident set instead of tracing allocations")
    parser.add_argument("--client", action="store_true",
                        help="with --generated: a client's find through a real master (in this process)")
    parser.add_argument("--client-of", nargs=2, metavar=("MASTER", "TOKEN"), help=argparse.SUPPRESS)
    parser.add_argument("--whole-walk", action="store_true",
                        help="with --generated: listings wait for the whole walk, as before they streamed")
    args = parser.parse_args()
    if args.client_of:
        client_find(*args.client_of)
        return
    if args.client:
        if not args.generated:
            parser.error("--client lists a generated store: give --generated")
        asyncio.run(measure_client(args.files, args.whole_walk))
        return
    if args.generated == (args.dir is not None):
        parser.error("give either --dir (a file:// tree) or --generated")
    root = None
    if args.dir is not None:
        root = args.dir.resolve() / "tree"
        make_tree(root, args.files)
    asyncio.run(measure(root, args.files, args.rss, args.whole_walk))


if __name__ == "__main__":
    main()
