from __future__ import annotations

import asyncio
import errno
import threading
import time
import tracemalloc
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from tinydisk import filled, tiny_disk

from strata.cacheserver.namespace.entries import FileEntry
from strata.cacheserver.namespace.overlay import MAX_ANSWER_REUSE
from strata.cacheserver.namespace.mounts import MountOptions, MountTable
from strata.cacheserver.namespace.tree import Namespace
from strata.cacheserver.settings import StoreTimeouts
from strata.cacheserver.ufs import UfsStatus
from strata.contract.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
)

BLOCK = 4096


class GatedMemoryFileSystem(MemoryFileSystem):
    """memory:// that counts store calls and can hold them at a gate."""

    protocol = "gatedmem"
    calls: ClassVar[Counter[str]] = Counter()
    gate: ClassVar[threading.Event] = threading.Event()
    # Raised by every store call while set: a store that cannot be reached, and so on.
    failure: ClassVar[BaseException | None] = None
    _nested = threading.local()

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return str(MemoryFileSystem._strip_protocol(path.removeprefix("gatedmem://")))

    def _call(self, method: str, call: Callable[[], Any]) -> Any:
        """Count calls from the Store (not the ones fsspec makes inside them)."""
        if getattr(self._nested, "active", False):
            return call()
        type(self).calls[method] += 1
        assert type(self).gate.wait(10), "test left the gate closed"
        if type(self).failure is not None:
            raise type(self).failure
        self._nested.active = True
        try:
            return call()
        finally:
            self._nested.active = False

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        return self._call("ls", lambda: super(GatedMemoryFileSystem, self).ls(path, detail=detail, **kwargs))

    def info(self, path: str, **kwargs: Any) -> Any:
        return self._call("info", lambda: super(GatedMemoryFileSystem, self).info(path, **kwargs))

    def find(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return self._call("find", lambda: super(GatedMemoryFileSystem, self).find(path, *args, **kwargs))


class Env:
    """A namespace with one mount at /m over a fresh memory store."""

    def __init__(self, state_dir: Path | None, **options: Any) -> None:
        self.root = f"/ns-{uuid.uuid4().hex}"
        self.fs = fsspec.filesystem("memory")
        self.fs.makedirs(self.root, exist_ok=True)
        self.state_dir = state_dir
        self.mounts = MountTable(state_dir)
        self.mount = self.mounts.add("/m", f"gatedmem://{self.root}", MountOptions(**options))
        self.ns = Namespace(self.mounts, state_dir, block_size=BLOCK)

    def put(self, rel: str, data: bytes) -> None:
        """Change the store behind Strata's back."""
        self.fs.pipe_file(f"{self.root}/{rel}", data)

    def remove(self, rel: str) -> None:
        self.fs.rm(f"{self.root}/{rel}", recursive=True)

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(f"{self.root}/{rel}"))

    @property
    def calls(self) -> Counter[str]:
        return GatedMemoryFileSystem.calls


@pytest.fixture(autouse=True)
def gatedmem() -> None:
    fsspec.register_implementation("gatedmem", GatedMemoryFileSystem, clobber=True)
    GatedMemoryFileSystem.calls.clear()
    GatedMemoryFileSystem.gate.set()
    GatedMemoryFileSystem.failure = None


def paths(entries: list[FileEntry]) -> list[str]:
    return [e.path for e in entries]


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout: float) -> float:
    """Seconds until `check()` holds; fails after `timeout`."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < timeout, f"condition not met within {timeout}s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


# -- the tree ------------------------------------------------------------------------------------


async def test_root_and_parents_of_mount_points_are_directories() -> None:
    table = MountTable(None)
    a = table.add("/data/a", "memory://tree-a")
    table.add("/data/b", "memory://tree-b")
    logs = table.add("/logs", "memory://tree-logs", MountOptions(read_only=True))
    fsspec.filesystem("memory").pipe_file("/tree-a/x.csv", b"1,2")
    ns = Namespace(table, None, block_size=BLOCK)

    root = await ns.get_status("/")
    assert (root.is_dir, root.mount_id, root.name) == (True, 0, "")
    data = await ns.get_status("/data/")
    assert data.is_dir and data.mount_id == 0
    assert paths(await ns.list_status("/")) == ["/data", "/logs"]
    listed = await ns.list_status("/data")
    assert paths(listed) == ["/data/a", "/data/b"]
    assert listed[0].mount_id == a.mount_id and listed[0].mtime_unix_ms == a.created_unix_ms
    mount_root = await ns.get_status("/logs")
    assert mount_root.is_dir and mount_root.mount_id == logs.mount_id and mount_root.read_only
    assert paths(await ns.list_status("/", recursive=True)) == [
        "/data", "/data/a", "/data/a/x.csv", "/data/b", "/logs",
    ]
    with pytest.raises(NotFound, match="no mount covers /other; mounts: /data/a, /data/b, /logs"):
        await ns.get_status("/other")
    with pytest.raises(NotFound, match="no mount covers /dat"):
        await ns.list_status("/dat")


async def test_store_files_and_directories() -> None:
    env = Env(None, read_only=True)
    env.put("dir/f.bin", b"x" * 10000)
    env.put("top.txt", b"top")
    entry = await env.ns.get_status("/m/dir/f.bin")
    assert (entry.path, entry.name, entry.is_dir, entry.length) == ("/m/dir/f.bin", "f.bin", False, 10000)
    assert entry.version and entry.persisted and entry.read_only and not entry.pinned
    assert entry.block_size == BLOCK and entry.mount_id == env.mount.mount_id
    assert paths(await env.ns.list_status("/m")) == ["/m/dir", "/m/top.txt"]
    assert await env.ns.list_status("/m/dir/f.bin") == [entry]
    assert paths(await env.ns.list_status("/m", recursive=True)) == ["/m/dir", "/m/dir/f.bin", "/m/top.txt"]
    with pytest.raises(NotFound, match=f"/m/nope does not exist \\(looked in gatedmem://{env.root}/nope\\)"):
        await env.ns.get_status("/m/nope")
    with pytest.raises(NotFound):
        await env.ns.list_status("/m/nope")


async def test_an_empty_s3_mount_lists_as_empty(s3_server: Any, bucket: str) -> None:
    table = MountTable(None)
    table.add("/s3", f"s3://{bucket}/data", MountOptions(options=s3_server.storage_options()))
    ns = Namespace(table, None, block_size=BLOCK)
    assert await ns.list_status("/s3") == []
    s3_server.put_object(bucket, "data/part-0", b"abc")
    s3_server.put_object(bucket, "data/sub/part-1", b"defg")
    ns.invalidate("/s3")
    assert [(e.path, e.length) for e in await ns.list_status("/s3", recursive=True)] == [
        ("/s3/part-0", 3), ("/s3/sub", 0), ("/s3/sub/part-1", 4),
    ]
    entry = await ns.get_status("/s3/sub/part-1")
    assert entry.version == s3_server.client().head_object(Bucket=bucket, Key="data/sub/part-1")["ETag"].strip('"')
    await table.aclose()


async def test_an_s3_walk_whose_folders_come_late_lists_in_path_order(s3_server: Any, bucket: str) -> None:
    # S3 knows a folder only from the keys below it: "a.txt" is listed before "a/x" shows the folder "a".
    for key in ("data/a.txt", "data/a/x", "data/a-b/y", "data/b"):
        s3_server.put_object(bucket, key, key.encode())
    table = MountTable(None)
    table.add("/s3", f"s3://{bucket}/data", MountOptions(options=s3_server.storage_options(),
                                                         metadata_sync_interval=300))
    ns = Namespace(table, None, block_size=BLOCK)
    try:
        listed = [(e.path, e.is_dir) for e in await ns.list_status("/s3", recursive=True)]
        assert listed == [("/s3/a", True), ("/s3/a-b", True), ("/s3/a-b/y", False), ("/s3/a.txt", False),
                          ("/s3/a/x", False), ("/s3/b", False)]
        with s3_server.recording() as asked:  # the walk answers stats and listings below it
            assert (await ns.get_status("/s3/a.txt")).length == len("data/a.txt")
            assert paths(await ns.list_status("/s3/a")) == ["/s3/a/x"]
        assert asked.requests == [], [(r.method, r.url) for r in asked.requests]
    finally:
        await ns.close()
        await table.aclose()


class GeneratedStore:
    """A store whose walk makes `files` statuses up (folders of 1,000) page by page, as a
    store's walk hands them over, without files: what a namespace holds of a walk is then
    measured alone. It answers a walk whole too (`walk`), as older namespaces asked."""

    def __init__(self, files: int) -> None:
        self.files = files

    def url(self, rel: str) -> str:
        return f"generated:///{rel}"

    async def walk_pages(self, rel: str, *, with_dirs: bool = False, page: int = 5000) -> AsyncIterator[list[UfsStatus]]:
        for start in range(0, self.files, page):
            out = []
            for i in range(start, min(start + page, self.files)):
                if i % 1000 == 0 and with_dirs:
                    out.append(UfsStatus(f"d{i // 1000:04d}", True, 0, 0, ""))
                out.append(UfsStatus(f"d{i // 1000:04d}/f{i % 1000:03d}.bin", False, 1024, 1_733_000_000_000 + i,
                                     f"1024-{1_733_000_000_000_000_000 + i}"))
            yield out

    async def walk(self, rel: str, *, with_dirs: bool = False) -> list[UfsStatus]:
        return [status async for page in self.walk_pages(rel, with_dirs=with_dirs) for status in page]

    async def close(self) -> None:
        pass


async def test_a_walk_holds_what_it_keeps_and_one_page_at_most() -> None:
    """A walk of ten million files must fit the master: the most it holds while it walks is
    the columns it keeps (~100 bytes a file) and the page of statuses being packed, never
    the whole walk as status objects (~300 bytes a file)."""
    files = 200_000
    table = MountTable(None)
    mount = table.add("/g", "memory://generated", MountOptions(read_only=True, metadata_sync_interval=3600))
    table._stores[mount.mount_id] = GeneratedStore(files)  # type: ignore[assignment]
    ns = Namespace(table, None, block_size=BLOCK)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        first: list[FileEntry] = []
        listed = 0
        async for page in ns.list_pages("/g", recursive=True):  # pages come as the walk puts them in
            first = first or page
            listed += len(page)
        held, peak = (n - before for n in tracemalloc.get_traced_memory())
    finally:
        tracemalloc.stop()
        await table.aclose()
    assert paths(first[:2]) == ["/g/d0000", "/g/d0000/f000.bin"]
    assert listed == files + files // 1000
    assert held / files < 110, f"{held / files:.0f} bytes a file held"
    assert peak / files < 120, f"{peak / files:.0f} bytes a file at the walk's peak ({held / files:.0f} held)"


async def test_a_missed_status_has_the_folder_looked_at_once_for_the_files_after_it(s3_server: Any,
                                                                                 bucket: str) -> None:
    names = [f"f{i}" for i in range(6)]
    for name in names:
        s3_server.put_object(bucket, f"data/ds/{name}", name.encode())
    s3_server.put_object(bucket, "data/ds/sub/x", b"below")
    table = MountTable(None)
    table.add("/s3", f"s3://{bucket}/data", MountOptions(options=s3_server.storage_options(), read_only=True,
                                                         metadata_sync_interval=300))
    table.add("/rw", f"s3://{bucket}/data", MountOptions(options=s3_server.storage_options(),
                                                         metadata_sync_interval=300))
    ns = Namespace(table, None, block_size=BLOCK)
    try:
        with s3_server.recording() as asked:
            assert (await ns.get_status("/rw/ds/f3")).length == 2
            await eventually(lambda: _no_looks(ns), timeout=10)
        # A writable mount's folder is not listed ahead of its reader: only the file's own HEAD.
        assert [r.method for r in asked.requests] == ["HEAD"], [(r.method, r.url) for r in asked.requests]
        assert (await ns.get_status("/s3/ds/f3")).length == 2
        await eventually(lambda: _no_looks(ns), timeout=10)
        etags = {n: s3_server.client().head_object(Bucket=bucket, Key=f"data/ds/{n}")["ETag"].strip('"') for n in names}
        with s3_server.recording() as seen:
            for name in names:
                entry = await ns.get_status(f"/s3/ds/{name}")
                assert (entry.length, entry.version) == (len(name), etags[name])
            assert [e.path for e in await ns.list_status("/s3/ds")] == [f"/s3/ds/{n}" for n in names] + ["/s3/ds/sub"]
        assert seen.requests == [], [(r.method, r.url) for r in seen.requests]
    finally:
        await ns.close()
        await table.aclose()


async def _no_looks(ns: Namespace) -> bool:
    return len(ns._looks) == 0


# -- metadata sync intervals --------------------------------------------------------------------------


async def test_interval_zero_asks_the_store_every_time() -> None:
    env = Env(None, metadata_sync_interval=0)
    env.put("f", b"one")
    first = await env.ns.get_status("/m/f")
    env.put("f", b"second")
    second = await env.ns.get_status("/m/f")
    assert second.length == 6 and second.version != first.version
    await env.ns.list_status("/m")
    await env.ns.list_status("/m")
    assert env.calls["ls"] == 2


async def test_interval_n_serves_from_cache_and_catches_up_within_n() -> None:
    interval = 1.0
    env = Env(None, metadata_sync_interval=interval)
    env.put("f", b"one")
    first = await env.ns.get_status("/m/f")
    for _ in range(5):
        assert await env.ns.get_status("/m/f") == first
    assert env.calls["info"] == 1
    env.put("f", b"changed")
    changed_at = time.monotonic()
    assert await env.ns.get_status("/m/f") == first  # still within the interval

    async def seen() -> bool:
        return (await env.ns.get_status("/m/f")).length == 7

    await eventually(seen, timeout=interval + 5)
    assert time.monotonic() - changed_at <= interval + 0.5


STALE_INTERVAL = 0.2


async def expired_warm_env(**options: Any) -> Env:
    """A mount with /m/d/f and /m/g known to the cache, their answers since expired."""
    env = Env(None, metadata_sync_interval=STALE_INTERVAL, **options)
    env.put("d/f", b"one")
    env.put("g", b"gee")
    await env.ns.get_status("/m/d/f")
    await env.ns.list_status("/m")
    await asyncio.sleep(STALE_INTERVAL * 1.5)  # let every answer expire
    return env


async def test_an_unreachable_store_is_answered_from_expired_metadata() -> None:
    env = await expired_warm_env()
    fresh = [await env.ns.get_status("/m/d/f"), await env.ns.list_status("/m")]
    await asyncio.sleep(STALE_INTERVAL * 1.5)
    GatedMemoryFileSystem.failure = ConnectionRefusedError(111, "Connection refused")
    calls = sum(env.calls.values())
    assert await env.ns.get_status("/m/d/f") == fresh[0]
    assert await env.ns.list_status("/m") == fresh[1]
    assert (await env.ns.get_status("/m/g")).length == 3  # from its parent's listing
    assert sum(env.calls.values()) > calls  # the store was asked first
    assert env.ns.stale_served == {"/m": 3}
    with pytest.raises(Unavailable):  # never seen: nothing to fall back on
        await env.ns.get_status("/m/d/never-seen")


async def test_a_slow_walk_of_a_healthy_store_is_waited_for_not_served_stale() -> None:
    """A walk of a large tree takes long; only an error of the store (or a folder's listing
    past stale_after) is an outage."""
    env = Env(None, metadata_sync_interval=STALE_INTERVAL)
    ns = Namespace(env.mounts, None, block_size=BLOCK, timeouts=StoreTimeouts(stale_after=0.2))
    env.put("d/f", b"one")
    await ns.list_status("/m", recursive=True)
    await ns.list_status("/m/d")
    env.put("d/g", b"new")
    await asyncio.sleep(STALE_INTERVAL * 1.5)
    GatedMemoryFileSystem.gate.clear()  # each store call takes a while
    walk = asyncio.ensure_future(ns.list_status("/m", recursive=True))
    listing = asyncio.ensure_future(ns.list_status("/m/d"))
    await asyncio.sleep(0.6)
    assert listing.done() and paths(listing.result()) == ["/m/d/f"]  # a listing past stale_after: stale
    assert not walk.done()
    GatedMemoryFileSystem.gate.set()
    assert paths(await walk) == ["/m/d", "/m/d/f", "/m/d/g"]
    assert ns.stale_served == {"/m": 1}


async def test_stale_if_error_off_fails_with_the_outage() -> None:
    env = await expired_warm_env(stale_if_error=False)
    GatedMemoryFileSystem.failure = ConnectionRefusedError(111, "Connection refused")
    with pytest.raises(Unavailable, match="could not be reached"):
        await env.ns.get_status("/m/d/f")
    assert env.ns.stale_served == {}


async def test_a_store_that_answers_not_found_is_believed() -> None:
    env = await expired_warm_env()
    env.remove("d/f")
    with pytest.raises(NotFound):
        await env.ns.get_status("/m/d/f")
    GatedMemoryFileSystem.failure = PermissionError(13, "Access Denied")
    with pytest.raises(PermissionDenied):
        await env.ns.list_status("/m")
    assert env.ns.stale_served == {}


async def test_interval_never_keeps_the_first_answer_until_invalidated() -> None:
    env = Env(None, metadata_sync_interval=-1)
    env.put("f", b"one")
    listing = await env.ns.list_status("/m")
    env.put("f", b"changed")
    env.put("g", b"new")
    assert await env.ns.list_status("/m") == listing
    assert (await env.ns.get_status("/m/f")).length == 3  # answered from the listing
    assert env.calls == Counter({"ls": 1})
    env.ns.invalidate("/m/f")
    assert (await env.ns.get_status("/m/f")).length == 7
    assert paths(await env.ns.list_status("/m")) == ["/m/f", "/m/g"]


async def test_a_recursive_listing_answers_later_stats_and_listings() -> None:
    env = Env(None, metadata_sync_interval=-1)
    env.put("a/b/c", b"c")
    env.put("a/d", b"d")
    await env.ns.list_status("/m", recursive=True)
    assert paths(await env.ns.list_status("/m/a")) == ["/m/a/b", "/m/a/d"]
    assert (await env.ns.get_status("/m/a/b/c")).length == 1
    assert await env.ns.list_status("/m/a/b/c") == [await env.ns.get_status("/m/a/b/c")]
    assert env.calls == Counter({"find": 1})


async def test_a_listing_comes_in_pages_of_the_size_asked_with_written_files_in_place() -> None:
    env = Env(None, metadata_sync_interval=-1)
    for name in ("a/1", "a/3", "b/1", "c"):
        env.put(name, b"x")
    env.ns.commit_file("/m/a/2", length=1, version="w1", persisted=False)
    env.ns.commit_file("/m/bb/new", length=1, version="w2", persisted=False)
    pages = [paths(page) async for page in env.ns.list_pages("/m", recursive=True, page=2)]
    assert pages == [["/m/a", "/m/a/1"], ["/m/a/2", "/m/a/3"], ["/m/b", "/m/b/1"], ["/m/bb", "/m/bb/new"], ["/m/c"]]
    assert paths(await env.ns.list_status("/m", recursive=True)) == [p for page in pages for p in page]
    assert [paths(page) async for page in env.ns.list_pages("/m", page=3)] == [["/m/a", "/m/b", "/m/bb"], ["/m/c"]]
    assert [paths(page) async for page in env.ns.list_pages("/m/a/1")] == [["/m/a/1"]]
    with pytest.raises(InvalidArgument, match="at least one entry, got 0"):
        [page async for page in env.ns.list_pages("/m", page=0)]


async def test_concurrent_misses_make_one_store_listing() -> None:
    env = Env(None, metadata_sync_interval=30)
    env.put("f", b"x")
    GatedMemoryFileSystem.gate.clear()
    callers = [asyncio.create_task(env.ns.list_status("/m")) for _ in range(5)]

    async def store_asked() -> bool:
        return env.calls["ls"] >= 1

    await eventually(store_asked, timeout=5)
    GatedMemoryFileSystem.gate.set()
    results = await asyncio.gather(*callers)
    assert all(paths(r) == ["/m/f"] for r in results)
    assert env.calls["ls"] == 1


async def test_an_answer_that_started_before_an_invalidation_is_not_kept() -> None:
    env = Env(None, metadata_sync_interval=-1)
    env.put("old", b"x")
    GatedMemoryFileSystem.gate.clear()
    slow = asyncio.create_task(env.ns.list_status("/m"))

    async def store_asked() -> bool:
        return env.calls["ls"] >= 1

    await eventually(store_asked, timeout=5)
    env.put("new", b"y")
    env.ns.invalidate("/m/new")
    GatedMemoryFileSystem.gate.set()
    await slow
    assert paths(await env.ns.list_status("/m")) == ["/m/new", "/m/old"]
    assert env.calls["ls"] == 2


# -- how long a client may reuse an answer (valid_for) ---------------------------------------------


async def test_an_answer_is_reusable_for_what_is_left_of_its_freshness_on_read_only_mounts() -> None:
    interval = 30.0
    env = Env(None, metadata_sync_interval=interval, read_only=True)
    env.put("d/f", b"one")
    env.put("g", b"gee")
    before = time.monotonic()
    entry = await env.ns.get_status("/m/d/f")
    left = env.ns.valid_for(entry)
    assert interval - (time.monotonic() - before) <= left <= interval
    await asyncio.sleep(0.3)
    assert left - 0.5 < env.ns.valid_for(entry) <= left - 0.3  # counts down with the cache entry
    listed = await env.ns.list_status("/m")  # answered by the listing from now on: its freshness
    assert all(interval - 0.5 < env.ns.valid_for(e) <= interval for e in listed if not e.is_dir)
    assert env.ns.valid_for(await env.ns.get_status("/m")) == 0  # a mount root
    env.put("d/f", b"changed")
    env.ns.invalidate("/m/d/f")  # as when a worker found it changed in the store
    assert env.ns.valid_for(entry) == 0  # the master no longer answers it
    assert env.ns.valid_for(await env.ns.get_status("/m/d/f")) > interval - 0.5


async def test_never_synced_answers_are_reusable_for_the_cap_only() -> None:
    env = Env(None, metadata_sync_interval=-1, read_only=True)
    env.put("f", b"one")
    assert env.ns.valid_for(await env.ns.get_status("/m/f")) == MAX_ANSWER_REUSE


@pytest.mark.parametrize("options", [
    {"metadata_sync_interval": 30},  # writable: close-to-open for writes through other clients
    {"metadata_sync_interval": 0, "read_only": True},  # asks the store on every access
], ids=["writable", "interval-0"])
async def test_answers_the_master_may_change_at_any_time_are_not_reusable(options: dict[str, Any]) -> None:
    env = Env(None, **options)
    env.put("f", b"one")
    assert env.ns.valid_for(await env.ns.get_status("/m/f")) == 0
    assert [env.ns.valid_for(e) for e in await env.ns.list_status("/m")] == [0]


async def test_an_answer_served_stale_is_not_reusable() -> None:
    env = await expired_warm_env(read_only=True)
    GatedMemoryFileSystem.failure = ConnectionRefusedError(111, "Connection refused")
    stale = await env.ns.get_status("/m/d/f")
    assert env.ns.stale_served == {"/m": 1}
    assert env.ns.valid_for(stale) == 0


async def test_a_page_of_a_walk_is_reusable_entry_by_entry_as_each_alone_is() -> None:
    interval = 30.0
    env = Env(None, metadata_sync_interval=interval, read_only=True)
    for folder in ("a", "b", "c"):
        for i in range(50):
            env.put(f"{folder}/f{i:03d}", b"x" * i)
    walked = [e async for page in env.ns.list_pages("/m", recursive=True, page=1000) for e in page]
    assert len(walked) == 3 + 150
    env.put("b/f007", b"changed")
    env.ns.invalidate("/m/b/f007")  # as when a worker found it changed in the store
    together = env.ns.valid_for_each(walked)
    alone = [env.ns.valid_for(e) for e in walked]
    assert [round(v) for v in together] == [round(v) for v in alone]
    by_path = dict(zip(paths(walked), together))
    assert by_path["/m/b/f007"] == 0  # the master no longer answers it
    # The invalidation forgot the listings above the file; the other folders' stay fresh.
    assert all(interval - 1 < v <= interval for p, v in by_path.items() if p.startswith(("/m/a/", "/m/c/")))


async def test_a_page_is_reusable_only_where_it_shows_the_pins_the_master_answers_with() -> None:
    env = Env(None, metadata_sync_interval=30.0, read_only=True)
    for folder in ("hot", "cold"):
        for i in range(3):
            env.put(f"{folder}/f{i}", b"x")
    before = [e async for page in env.ns.list_pages("/m", recursive=True) for e in page if not e.is_dir]
    env.ns.set_pinned("/m/hot", True)
    after = [e async for page in env.ns.list_pages("/m", recursive=True) for e in page if not e.is_dir]
    # Listed before the pin, the files below it say "not pinned": the master answers otherwise now.
    assert {p: v > 0 for p, v in zip(paths(before), env.ns.valid_for_each(before))} == {
        **{f"/m/hot/f{i}": False for i in range(3)}, **{f"/m/cold/f{i}": True for i in range(3)}}
    assert [e.pinned for e in after] == [False] * 3 + [True] * 3
    assert all(v > 0 for v in env.ns.valid_for_each(after))
    assert env.ns.valid_for_each(after) == pytest.approx([env.ns.valid_for(e) for e in after], abs=0.5)


async def test_a_listing_answers_stats_from_an_index() -> None:
    env = Env(None, metadata_sync_interval=-1, read_only=True)
    for i in range(2000):
        env.put(f"f{i:05d}", b"x")
    listed = await env.ns.list_status("/m")
    started = time.process_time()
    for entry in listed:
        assert await env.ns.get_status(entry.path) == entry
        assert env.ns.valid_for(entry) == MAX_ANSWER_REUSE
    took = time.process_time() - started
    assert env.calls["ls"] == 1 and env.calls["info"] == 0
    print(f"\n2000 stats answered from a listing of 2000: {took * 1000:.0f} ms of CPU")


# -- files written through Strata ----------------------------------------------------------------------


async def test_unpersisted_write_lives_only_in_the_overlay() -> None:
    env = Env(None, metadata_sync_interval=-1)
    env.put("existing", b"e")
    await env.ns.list_status("/m")  # cached before the write: the commit must invalidate
    committed = env.ns.commit_file("/m/new/dir/f", length=5, version="w1", persisted=False)
    assert (committed.persisted, committed.version, committed.length) == (False, "w1", 5)
    assert await env.ns.get_status("/m/new/dir/f") == committed
    assert not env.exists("new/dir/f")
    assert paths(await env.ns.list_status("/m")) == ["/m/existing", "/m/new"]
    assert (await env.ns.get_status("/m/new")).is_dir
    assert await env.ns.list_status("/m/new/dir") == [committed]
    assert await env.ns.list_status("/m/new/dir/f") == [committed]
    assert paths(await env.ns.list_status("/m", recursive=True)) == [
        "/m/existing", "/m/new", "/m/new/dir", "/m/new/dir/f",
    ]


async def test_persisted_write_keeps_its_version_until_the_store_changes(tmp_path: Path) -> None:
    env = Env(tmp_path, metadata_sync_interval=0)
    store = env.mounts.store(env.mount)
    ufs = await store.write("f", b"written")
    committed = env.ns.commit_file("/m/f", length=7, version="w1", persisted=True, ufs_version=ufs.version)
    assert committed.persisted and committed.version == "w1"
    assert (await env.ns.get_status("/m/f")).version == "w1"
    assert [e.version for e in await env.ns.list_status("/m")] == ["w1"]

    env.put("f", b"overwritten elsewhere")
    now = await env.ns.get_status("/m/f")
    assert now.version != "w1" and now.length == 21 and now.persisted
    # The overlay entry is gone for good, also after a restart.
    again = Namespace(MountTable(tmp_path), tmp_path, block_size=BLOCK)
    assert (await again.get_status("/m/f")).version == now.version


async def test_persisted_write_without_store_version_uses_the_written_version() -> None:
    env = Env(None, metadata_sync_interval=0)
    ufs = await env.mounts.store(env.mount).write("f", b"abc")
    env.ns.commit_file("/m/f", length=3, version=ufs.version, persisted=True, ufs_version=None)
    assert (await env.ns.get_status("/m/f")).version == ufs.version


async def test_persisted_write_deleted_in_the_store_disappears() -> None:
    env = Env(None, metadata_sync_interval=0)
    ufs = await env.mounts.store(env.mount).write("d/f", b"abc")
    env.ns.commit_file("/m/d/f", length=3, version="w1", persisted=True, ufs_version=ufs.version)
    env.remove("d/f")
    env.put("d/other", b"o")
    assert paths(await env.ns.list_status("/m/d")) == ["/m/d/other"]
    with pytest.raises(NotFound):
        await env.ns.get_status("/m/d/f")


async def test_mark_persisted_after_an_async_upload() -> None:
    env = Env(None, metadata_sync_interval=0)
    env.ns.commit_file("/m/f", length=3, version="w1", persisted=False)
    ufs = await env.mounts.store(env.mount).write("f", b"abc")
    marked = env.ns.mark_persisted("/m/f", ufs.version)
    assert marked.persisted and marked.version == "w1"
    assert await env.ns.get_status("/m/f") == marked
    with pytest.raises(NotFound, match="/m/g has no write waiting to be persisted"):
        env.ns.mark_persisted("/m/g", "v")


async def test_writes_are_refused_where_they_cannot_go() -> None:
    env = Env(None, read_only=True)
    with pytest.raises(PermissionDenied, match="mount /m is read-only"):
        env.ns.commit_file("/m/f", length=1, version="v", persisted=False)
    with pytest.raises(InvalidArgument, match="/m is a mount point"):
        env.ns.commit_file("/m", length=1, version="v", persisted=False)
    with pytest.raises(NotFound, match="no mount covers /elsewhere/f"):
        env.ns.commit_file("/elsewhere/f", length=1, version="v", persisted=False)


async def test_overlay_and_pins_survive_a_restart(tmp_path: Path) -> None:
    env = Env(tmp_path)
    env.ns.commit_file("/m/staged", length=4, version="w9", persisted=False)
    env.ns.set_pinned("/m/hot", True)
    again = Namespace(MountTable(tmp_path), tmp_path, block_size=BLOCK)
    staged = await again.get_status("/m/staged")
    assert (staged.version, staged.persisted) == ("w9", False)
    assert again.pinned_prefixes(env.mount.mount_id) == ["/m/hot"]


async def test_the_generation_orders_an_uploads_landing_after_a_restart(tmp_path: Path) -> None:
    # A write prepared (the master saw generation g) before a restart must learn that an
    # upload of its file landed after it: the generation goes on from the journal.
    env = Env(tmp_path)
    env.ns.commit_file("/m/f", length=3, version="w1", persisted=False)
    prepared = env.ns.generation
    again = Namespace(MountTable(tmp_path), tmp_path, block_size=BLOCK)
    assert again.generation == prepared
    again.mark_persisted("/m/f", "etag-1", version="w1")
    written = again.written("/m/f")
    assert written is not None and written.landed > prepared and again.generation == written.landed
    assert Namespace(MountTable(tmp_path), tmp_path, block_size=BLOCK).written("/m/f") == written


async def test_a_change_the_journal_cannot_hold_is_not_answered(tmp_path: Path) -> None:
    # A full journal disk: each change fails, and the namespace answers as before it, as it
    # will after a restart. (The persist of an upload was answered as done while the journal
    # still said "not in the store": the worker dropped its staged copy, and after a restart
    # the file was listed as not persisted, with no copy left to upload.)
    with tiny_disk("1m") as disk:
        env = Env(disk)
        env.ns.commit_file("/m/pending", length=4, version="w1", persisted=False)
        env.put("d/moved", b"4444")  # a written file in the store
        in_store = await env.mounts.store(env.mount).info("d/moved")
        env.ns.commit_file("/m/d/moved", length=4, version="w2", persisted=True, ufs_version=in_store.version)
        before = [await env.ns.get_status(p) for p in ("/m/pending", "/m/d/moved")]
        changes = [
            lambda: env.ns.commit_file("/m/new", length=4, version="w3", persisted=False),
            lambda: env.ns.mark_persisted("/m/pending", "etag-1", version="w1"),
            lambda: env.ns.drop_unpersisted("/m/pending", "w1"),
            lambda: env.ns.set_pinned("/m/d", True),
        ]
        with filled(disk):
            for change in changes:
                with pytest.raises(OSError) as failed:
                    change()
                assert failed.value.errno == errno.ENOSPC
            for call in (env.ns.set_mtime("/m/pending", 1000), env.ns.delete("/m/pending"),
                         env.ns.rename("/m/d", "/m/e")):
                with pytest.raises(OSError):
                    await call
            for answer in (env.ns, Namespace(MountTable(disk), disk, block_size=BLOCK)):
                assert [await answer.get_status(p) for p in ("/m/pending", "/m/d/moved")] == before
                with pytest.raises(NotFound):
                    await answer.get_status("/m/new")
                assert answer.pinned_prefixes(env.mount.mount_id) == []


async def test_unmounting_forgets_the_mounts_writes_and_pins(tmp_path: Path) -> None:
    env = Env(tmp_path)
    env.ns.commit_file("/m/staged", length=4, version="w9", persisted=False)
    env.ns.set_pinned("/m", True)
    env.mounts.add("/m", f"gatedmem://{env.root}-other", replace=True)
    new_id = env.mounts.get("/m").mount_id  # type: ignore[union-attr]
    assert new_id != env.mount.mount_id
    with pytest.raises(NotFound):
        await env.ns.get_status("/m/staged")
    assert env.ns.pinned_prefixes(env.mount.mount_id) == []
    assert env.ns.pinned_prefixes(new_id) == []
    again = Namespace(MountTable(tmp_path), tmp_path, block_size=BLOCK)
    with pytest.raises(NotFound):
        await again.get_status("/m/staged")


async def test_remounting_the_same_data_keeps_the_mount_id_writes_and_pins(tmp_path: Path) -> None:
    env = Env(tmp_path)
    env.ns.commit_file("/m/staged", length=4, version="w9", persisted=False)
    env.ns.set_pinned("/m", True)
    options = MountOptions(credentials={"token": "rotated"}, pin=True)
    env.mounts.add("/m", f"gatedmem://{env.root}", options, replace=True)
    assert env.mounts.get("/m").mount_id == env.mount.mount_id  # type: ignore[union-attr]
    assert (await env.ns.get_status("/m/staged")).length == 4
    assert env.ns.pinned_prefixes(env.mount.mount_id) == ["/m"]


# -- delete and rename ---------------------------------------------------------------------------------


async def test_delete_files_and_directories() -> None:
    env = Env(None, metadata_sync_interval=-1)
    env.put("a/1", b"1")
    env.put("a/2", b"2")
    env.put("b", b"b")
    env.ns.commit_file("/m/a/staged", length=1, version="w", persisted=False)
    await env.ns.list_status("/m", recursive=True)
    await env.ns.delete("/m/b")
    assert not env.exists("b")
    with pytest.raises(NotFound):
        await env.ns.get_status("/m/b")
    with pytest.raises(FailedPrecondition, match="directory /m/a is not empty; delete it recursively"):
        await env.ns.delete("/m/a")
    await env.ns.delete("/m/a", recursive=True)
    assert not env.exists("a")
    assert await env.ns.list_status("/m", recursive=True) == []
    with pytest.raises(NotFound):
        await env.ns.delete("/m/a")


async def test_deleting_a_file_written_over_a_store_copy_removes_that_copy_too() -> None:
    # A MUST_CACHE (or not yet uploaded) write over a file the store holds: after rm the
    # store's older copy must not show again.
    env = Env(None, metadata_sync_interval=0)
    env.put("f", b"older")
    env.ns.commit_file("/m/f", length=5, version="w1", persisted=False)
    await env.ns.delete("/m/f")
    assert not env.exists("f")
    with pytest.raises(NotFound):
        await env.ns.get_status("/m/f")


async def test_delete_an_unpersisted_file() -> None:
    env = Env(None)
    env.ns.commit_file("/m/only/here", length=1, version="w", persisted=False)
    await env.ns.delete("/m/only", recursive=True)
    assert await env.ns.list_status("/m") == []


async def test_delete_and_rename_are_refused_on_read_only_mounts_and_mount_points() -> None:
    env = Env(None, read_only=True)
    env.put("f", b"f")
    with pytest.raises(PermissionDenied, match="mount /m is read-only"):
        await env.ns.delete("/m/f")
    with pytest.raises(PermissionDenied, match="mount /m is read-only"):
        await env.ns.rename("/m/f", "/m/g")
    with pytest.raises(InvalidArgument, match="/m is a mount point; cannot delete it \\(unmount it instead\\)"):
        await env.ns.delete("/m", recursive=True)
    assert env.exists("f")


async def test_rename_moves_files_and_directories_in_the_store() -> None:
    env = Env(None, metadata_sync_interval=-1)
    env.put("a/1", b"1")
    env.put("f", b"ff")
    await env.ns.list_status("/m", recursive=True)
    await env.ns.rename("/m/f", "/m/g")
    assert env.exists("g") and not env.exists("f")
    assert paths(await env.ns.list_status("/m")) == ["/m/a", "/m/g"]
    await env.ns.rename("/m/a", "/m/b")
    assert paths(await env.ns.list_status("/m", recursive=True)) == ["/m/b", "/m/b/1", "/m/g"]
    with pytest.raises(AlreadyExists, match="/m/g already exists; delete it first"):
        await env.ns.rename("/m/b/1", "/m/g")
    with pytest.raises(InvalidArgument, match="cannot move /m/b into itself"):
        await env.ns.rename("/m/b", "/m/b/inner")
    with pytest.raises(NotFound):
        await env.ns.rename("/m/nothing", "/m/x")


async def test_rename_of_unpersisted_writes_is_refused() -> None:
    # Their cached blocks, the only copy, are keyed by path: a move would lose them.
    env = Env(None)
    env.ns.commit_file("/m/d/staged", length=3, version="w1", persisted=False)
    for src in ("/m/d/staged", "/m/d"):
        with pytest.raises(FailedPrecondition, match="/m/d/staged is not in the store yet"):
            await env.ns.rename(src, "/m/moved")
    kept = await env.ns.get_status("/m/d/staged")
    assert (kept.version, kept.persisted) == ("w1", False)


async def test_unpersisted_writes_are_answered_without_the_store() -> None:
    env = Env(None, metadata_sync_interval=0)
    env.ns.commit_file("/m/staged", length=3, version="w1", persisted=False)
    GatedMemoryFileSystem.gate.clear()  # a store that would hang every call
    try:
        staged = await asyncio.wait_for(env.ns.get_status("/m/staged"), 5)
    finally:
        GatedMemoryFileSystem.gate.set()
    assert (staged.version, staged.persisted) == ("w1", False)


async def test_a_persist_marks_only_the_version_it_uploaded() -> None:
    env = Env(None, metadata_sync_interval=0)
    env.ns.commit_file("/m/f", length=3, version="w1", persisted=False)
    assert env.ns.pending_write("/m/f", "w1") is not None
    env.ns.commit_file("/m/f", length=4, version="w2", persisted=False)
    assert env.ns.pending_write("/m/f", "w1") is None
    with pytest.raises(NotFound, match="replaced since version w1"):
        env.ns.mark_persisted("/m/f", "etag", version="w1")
    assert env.ns.drop_unpersisted("/m/f", "w1") is None
    assert env.ns.unpersisted_below("/m")[0][0] == "/m/f"
    dropped = env.ns.drop_unpersisted("/m/f")
    assert dropped is not None and dropped.version == "w2"
    with pytest.raises(NotFound):
        await env.ns.get_status("/m/f")


async def test_the_upload_folder_is_never_listed() -> None:
    env = Env(None, metadata_sync_interval=0)
    env.put(".strata-uploads/w-1", b"half an upload")
    env.put("real", b"r")
    assert paths(await env.ns.list_status("/m")) == ["/m/real"]
    assert paths(await env.ns.list_status("/m", recursive=True)) == ["/m/real"]
    with pytest.raises(NotFound):
        await env.ns.get_status("/m/.strata-uploads/w-1")


async def test_rename_across_mounts_is_refused() -> None:
    env = Env(None)
    env.mounts.add("/other", "memory://other-mount")
    env.put("f", b"f")
    with pytest.raises(InvalidArgument, match="cannot rename /m/f \\(mount /m\\) to /other/f \\(mount /other\\)"):
        await env.ns.rename("/m/f", "/other/f")


# -- pins ---------------------------------------------------------------------------------------------


async def test_pins_cover_everything_below_the_pinned_path() -> None:
    env = Env(None)
    env.put("hot/a", b"a")
    env.put("hot/sub/b", b"b")
    env.put("cold", b"c")
    env.ns.set_pinned("/m/hot", True)
    pinned = {e.path: e.pinned for e in await env.ns.list_status("/m", recursive=True)}
    assert pinned == {"/m/cold": False, "/m/hot": True, "/m/hot/a": True, "/m/hot/sub": True, "/m/hot/sub/b": True}
    assert env.ns.pinned_prefixes(env.mount.mount_id) == ["/m/hot"]
    env.ns.set_pinned("/m/hot", False)
    assert not (await env.ns.get_status("/m/hot/a")).pinned
    assert env.ns.pinned_prefixes(env.mount.mount_id) == []
    with pytest.raises(NotFound, match="no mount covers /x"):
        env.ns.set_pinned("/x", True)


async def test_a_pinned_mount_pins_all_its_files() -> None:
    env = Env(None, pin=True)
    env.put("f", b"f")
    assert (await env.ns.get_status("/m/f")).pinned
    assert (await env.ns.get_status("/m")).pinned
