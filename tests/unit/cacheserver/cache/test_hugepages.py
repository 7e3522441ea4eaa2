"""A MEM tier's block files gathered into huge pages (cache/hugepages.py), on the real kernel:
the block's pages are checked by mapping the file at a huge-page-aligned address and asking
/proc/self/smaps how much of the mapping the kernel maps with huge page-table entries (it can
only for pages held in huge folios)."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from strata.cacheserver.cache import hugepages
from strata.cacheserver.common.keys import BlockKey

HUGE = hugepages.huge_page_size()
BLOCK = 4 * HUGE


def key(index: int, length: int) -> BlockKey:
    return BlockKey(1, "/data/file", "v1", index, 64 << 20, length)


def huge_mapped(path: Path) -> int:
    """Bytes of the file the kernel maps with huge page-table entries when it is mapped at an
    aligned address and read through."""
    fd = os.open(path, os.O_RDONLY)
    length = os.fstat(fd).st_size // HUGE * HUGE
    at, reserved = hugepages.mapped_aligned(fd, length, HUGE)
    try:
        view = (hugepages.ctypes.c_char * length).from_address(at)
        for offset in range(0, length, 4096):  # touch every page: the faults map them
            view[offset]
        smaps = Path("/proc/self/smaps").read_text()
        start = f"{at:x}-"
        entry = next(part for part in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", smaps) if part.startswith(start))
        return int(re.search(r"ShmemPmdMapped:\s+(\d+) kB", entry).group(1)) * 1024  # type: ignore[union-attr]
    finally:
        hugepages.unmap(reserved, length, HUGE)
        os.close(fd)


async def held_in_huge_pages(path: Path, nbytes: int) -> None:
    """Wait (10 s at most) until `nbytes` of the file are in huge pages: its collapse runs in
    the background."""
    deadline = time.monotonic() + 10
    while (mapped := huge_mapped(path)) < nbytes:
        assert time.monotonic() < deadline, f"{mapped} of {nbytes} bytes of {path.name} in huge pages"
        await asyncio.sleep(0.02)


def shmem_huge_denied() -> bool:
    try:
        return "[deny]" in Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read_text()
    except OSError:
        return True


pytestmark = pytest.mark.skipif(shmem_huge_denied(), reason="this kernel has no huge pages for tmpfs files")


@pytest.mark.parametrize("eviction", ["LRU"])
async def test_a_mem_tier_block_is_held_in_huge_pages_and_reads_the_same_bytes(make_store: Any, dirs: Any) -> None:
    store = await make_store(("MEM", 64 << 20))
    data = os.urandom(BLOCK + 12345)  # whole huge pages and a tail
    plain = dirs("MEM").parent / "plain.bin"
    plain.write_bytes(data)
    assert huge_mapped(plain) == 0, "this tmpfs gives files huge pages by itself: the test shows nothing"
    block = await store.put(key(0, len(data)), data)
    await held_in_huge_pages(block.path, BLOCK)
    assert huge_mapped(block.path) == BLOCK  # not the tail
    assert await store.read(block.key, 0, len(data)) == data  # the checksums hold
    await store.put(key(1, HUGE - 1), os.urandom(HUGE - 1))
    await asyncio.sleep(0.2)
    assert store.huge_pages.collapsed_bytes == BLOCK, "a block below a huge page was collapsed"


@pytest.mark.parametrize("eviction", ["LRU"])
async def test_a_block_promoted_into_memory_is_collapsed_there(make_store: Any) -> None:
    store = await make_store(("MEM", 64 << 20), ("SSD", 64 << 20))
    data = os.urandom(BLOCK)
    k = key(0, BLOCK)
    first = await store.put(k, data)
    await held_in_huge_pages(first.path, BLOCK)
    # Evicted to the SSD tier by a fill of memory, then read back up.
    for i in range(1, 8):
        await store.put(key(i, 8 << 20), os.urandom(8 << 20))
    assert store.lookup(k).medium == "SSD"  # type: ignore[union-attr]
    moved, _ = await store.get_or_fetch(k, lambda: asyncio.sleep(0, data), promote=True)
    assert moved.medium == "MEM"
    await held_in_huge_pages(moved.path, BLOCK)
    assert await store.read(k, 0, BLOCK) == data


@pytest.mark.parametrize("eviction", ["LRU"])
async def test_a_disk_tiers_blocks_are_left_as_the_file_system_keeps_them(make_store: Any) -> None:
    store = await make_store(("SSD", 64 << 20))
    await store.put(key(0, BLOCK), os.urandom(BLOCK))
    await asyncio.sleep(0.2)
    assert store.huge_pages.collapsed_bytes == 0, "a disk tier's block file was collapsed"
