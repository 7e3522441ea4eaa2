"""A recursive listing of a tree the store's walk has not finished: pages go out as the walk
puts them in, the same entries as the finished walk's, the walk's error (never a short
listing) when it fails midway, and a folder the walk has gone past is listed from it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from strata.contract.errors import Unavailable
from strata.cacheserver.namespace.overlay import MAX_ANSWER_REUSE
from strata.cacheserver.namespace.mounts import MountOptions, MountTable
from strata.cacheserver.namespace.tree import Namespace
from strata.cacheserver.ufs import UfsStatus

BLOCK = 4 << 20
FOLDERS = 4
FILES = 3  # a folder: one page of the walk


class GatedStore:
    """A store whose walk gives a page a folder (the folder and its files, in path order) and
    then waits for the test to open the next gate; with `fail_after`, the walk fails as an
    unreachable store does after that many pages. It counts the folders' listings asked."""

    def __init__(self, *, fail_after: int | None = None) -> None:
        self.gates = [asyncio.Event() for _ in range(FOLDERS)]
        self.given = 0
        self.fail_after = fail_after
        self.listed: list[str] = []

    def url(self, rel: str) -> str:
        return f"gated:///{rel}"

    async def walk_pages(self, rel: str, *, with_dirs: bool = False, page: int = 5000) -> AsyncIterator[list[UfsStatus]]:
        for folder in range(FOLDERS):
            await self.gates[folder].wait()
            if folder == self.fail_after:
                raise Unavailable(f"{self.url(rel)}: connection refused (walk at folder {folder})")
            self.given += 1
            yield [UfsStatus(f"d{folder}", True, 0, 0, "")] + [
                UfsStatus(f"d{folder}/f{i}", False, 10 * folder + i, 1_733_000_000_000, f"v{folder}.{i}")
                for i in range(FILES)]

    async def ls(self, rel: str) -> list[UfsStatus]:
        self.listed.append(rel)
        folder = int(rel.removeprefix("d"))
        return [UfsStatus(f"{rel}/f{i}", False, 10 * folder + i, 1_733_000_000_000, f"v{folder}.{i}")
                for i in range(FILES)]

    async def close(self) -> None:
        pass


def mounted(store: GatedStore, **options: Any) -> Namespace:
    table = MountTable(None)
    mount = table.add("/g", "memory://gated", MountOptions(read_only=True, metadata_sync_interval=3600, **options))
    table._stores[mount.mount_id] = store  # type: ignore[assignment]  # the test's store
    return Namespace(table, None, block_size=BLOCK)


def expected() -> list[str]:
    return [path for folder in range(FOLDERS)
            for path in [f"/g/d{folder}"] + [f"/g/d{folder}/f{i}" for i in range(FILES)]]


async def test_the_first_page_comes_before_the_walk_ends_and_the_listing_equals_the_finished_one() -> None:
    store = GatedStore()
    ns = mounted(store)
    store.gates[0].set()
    pages = ns.list_pages("/g", recursive=True, page=3)
    first = await asyncio.wait_for(anext(pages), 10)
    assert [e.path for e in first] == ["/g/d0", "/g/d0/f0", "/g/d0/f1"]
    assert store.given == 1  # the walk is at its first folder
    # Clients may reuse them as they would the finished walk's (the mount's hour, at most 300 s).
    assert ns.valid_for_each(first) == [MAX_ANSWER_REUSE] * 3
    second = await asyncio.wait_for(anext(pages), 10)  # the rest of what the walk put in: a short page
    assert [e.path for e in second] == ["/g/d0/f2"]
    # A second listing joins the walk under way: it gives what is in, then follows.
    joined = ns.list_pages("/g", recursive=True)
    assert [e.path for e in await asyncio.wait_for(anext(joined), 10)] == expected()[:4]
    for gate in store.gates[1:]:
        gate.set()
    rest = [e.path async for page in pages for e in page]
    streamed = [e.path for e in first + second] + rest
    assert streamed == expected()
    assert expected()[:4] + [e.path async for page in joined for e in page] == expected()
    whole = await ns.list_status("/g", recursive=True)  # from the finished walk
    assert [e.path for e in whole] == streamed
    assert [e.length for e in whole if not e.is_dir] == [10 * d + i for d in range(FOLDERS) for i in range(FILES)]
    await ns.close()


async def test_a_walk_that_fails_midway_ends_the_listing_with_its_error_not_short() -> None:
    store = GatedStore(fail_after=2)
    ns = mounted(store, stale_if_error=True)  # nothing held yet: nothing stale to serve
    for gate in store.gates:
        gate.set()
    listed: list[str] = []
    with pytest.raises(Unavailable, match="connection refused \\(walk at folder 2\\)"):
        async for page in ns.list_pages("/g", recursive=True, page=3):
            listed += [e.path for e in page]
    assert listed == expected()[:len(listed)]  # some of what the walk had found (in order), then the error
    await ns.close()


async def test_a_folder_the_walk_has_gone_past_is_listed_from_it_without_asking_the_store() -> None:
    store = GatedStore()
    ns = mounted(store)
    store.gates[0].set()
    store.gates[1].set()
    pages = ns.list_pages("/g", recursive=True)
    seen: list[str] = []
    while "/g/d1/f2" not in seen:  # the walk has put in its second folder
        seen += [e.path for e in await asyncio.wait_for(anext(pages), 10)]
    assert [e.path for e in await ns.list_status("/g/d0")] == [f"/g/d0/f{i}" for i in range(FILES)]
    assert store.listed == []  # the walk has gone past d0
    # d1 is the walk's last folder in so far: it may have more to come, so the store is asked.
    assert [e.path for e in await ns.list_status("/g/d1")] == [f"/g/d1/f{i}" for i in range(FILES)]
    assert store.listed == ["d1"]
    for gate in store.gates[2:]:
        gate.set()
    assert [e.path async for page in pages for e in page][-1] == "/g/d3/f2"
    await ns.close()


class LateFolderStore(GatedStore):
    """A walk whose last page brings a folder that sorts before what it gave (as an S3 walk
    past the most it holds back may)."""

    async def walk_pages(self, rel: str, *, with_dirs: bool = False, page: int = 5000) -> AsyncIterator[list[UfsStatus]]:
        async for chunk in super().walk_pages(rel, with_dirs=with_dirs, page=page):
            yield chunk
        yield [UfsStatus("c", True, 0, 0, ""), UfsStatus("c/late", False, 1, 1_733_000_000_000, "v")]


async def test_a_walk_out_of_order_after_entries_were_given_ends_the_listing_saying_to_list_again() -> None:
    store = LateFolderStore()
    ns = mounted(store)
    store.gates[0].set()
    pages = ns.list_pages("/g", recursive=True, page=2)
    listed = [e.path for e in await asyncio.wait_for(anext(pages), 10)]
    for gate in store.gates[1:]:
        gate.set()
    with pytest.raises(Unavailable, match="came out of path order after .* entries were listed; list it again"):
        async for page in pages:
            listed += [e.path for e in page]
    assert listed and listed == expected()[:len(listed)]
    again = [e.path for e in await ns.list_status("/g", recursive=True)]  # the sorted walk
    assert again == sorted(expected() + ["/g/c", "/g/c/late"])
    await ns.close()
