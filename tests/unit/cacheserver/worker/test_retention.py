"""Retention: pins, frees and TTL sweeps of a worker's blocks, on a real block store."""

from __future__ import annotations

from pathlib import Path

from strata.cacheserver.common.blockrefs import key_of
from strata.cacheserver.cache.store import BlockStore
from strata.cacheserver.cache.tiers import TierConfig
from strata.cacheserver.worker.mounts import WorkerMounts
from strata.cacheserver.worker.retention import Retention
from strata.contract.errors import Unavailable
from strata.contract.proto import strata_pb2 as pb

BLOCK = 1024


def ref(mount_id: int, path: str, version: str, index: int = 0) -> pb.BlockRef:
    return pb.BlockRef(mount_id=mount_id, path=path, version=version, index=index, block_size=BLOCK,
                       file_length=2 * BLOCK)


async def parts(tmp_path: Path, ttl: float = 0.0) -> tuple[BlockStore, Retention]:
    store = BlockStore([TierConfig(medium="SSD", quota=1 << 20, dirs=(tmp_path / "ssd",))], block_size=BLOCK)
    await store.open()
    mounts = WorkerMounts(_no_refresh)
    mounts.apply(pb.GetMountTableResponse(version=1, mounts=[
        pb.MountInfo(mount_id=1, path="/a", source=f"file://{tmp_path}", options=pb.MountOptions(ttl_seconds=ttl)),
        pb.MountInfo(mount_id=2, path="/b", source=f"file://{tmp_path}"),
    ]))
    return store, Retention(store, mounts)


async def _no_refresh() -> pb.GetMountTableResponse:
    raise AssertionError("the mount table is given")


def held(store: BlockStore) -> dict[tuple[str, int], bool]:
    return {(b.key.path, b.key.index): b.pinned for b in store.blocks()}


async def test_free_takes_a_mount_below_a_prefix_except_kept_files(tmp_path: Path) -> None:
    store, retention = await parts(tmp_path)
    for r in (ref(1, "/a/x/f", "v1"), ref(1, "/a/x/g", "v1"), ref(1, "/a/y/h", "v1"), ref(2, "/b/x/f", "v1")):
        await store.put(key_of(r), b"z" * BLOCK)
    freed = retention.free(pb.FreeBlocksRequest(mount_id=1, path_prefix="/a/x", keep=[ref(1, "/a/x/g", "v1")]))
    assert freed == BLOCK
    assert sorted(held(store)) == [("/a/x/g", 0), ("/a/y/h", 0), ("/b/x/f", 0)]
    await store.close()


async def test_pins_by_block_and_by_prefix_and_release_keeps_pinned_files(tmp_path: Path) -> None:
    store, retention = await parts(tmp_path)
    blocks = [ref(1, "/a/f", "v1", 0), ref(1, "/a/f", "v1", 1), ref(1, "/a/g", "v1")]
    for r in blocks:
        await store.put(key_of(r), b"z" * BLOCK)
    assert retention.pin(pb.PinBlocksRequest(blocks=blocks[:1], pinned=True)) == 1
    assert retention.pin(pb.PinBlocksRequest(mount_id=1, path_prefix="/a/g", pinned=True)) == 1
    assert held(store) == {("/a/f", 0): True, ("/a/f", 1): False, ("/a/g", 0): True}
    await retention.release(blocks[:1], True)  # its file lies under a pinned prefix: stays
    assert held(store)[("/a/f", 0)] is True
    await retention.release(blocks, False)
    assert set(held(store).values()) == {False}
    await store.close()


async def test_a_ttl_sweep_frees_unused_blocks_of_its_mount_but_never_an_unpersisted_write(tmp_path: Path) -> None:
    store, retention = await parts(tmp_path, ttl=60)
    read = ref(1, "/a/read", "etag-1")
    written = ref(1, "/a/written", "w-0123")  # a MUST_CACHE / ASYNC_THROUGH write: the only copy
    other_mount = ref(2, "/b/read", "etag-2")
    await store.put(key_of(read), b"r" * BLOCK)
    await store.put(key_of(written), b"w" * BLOCK, pin=True)
    await store.put(key_of(other_mount), b"o" * BLOCK)
    assert retention.unpersisted_written() == {key_of(written).block_id}
    assert retention.sweep_ttl(now=4e9) == BLOCK
    assert sorted(held(store)) == [("/a/written", 0), ("/b/read", 0)]
    await store.close()


async def test_blocks_of_a_mount_the_master_lacks_go_after_the_grace_but_an_unpersisted_write_stays(
    tmp_path: Path,
) -> None:
    store = BlockStore([TierConfig(medium="SSD", quota=1 << 20, dirs=(tmp_path / "ssd",))], block_size=BLOCK)
    await store.open()
    tables = [pb.GetMountTableResponse(version=1, mounts=[pb.MountInfo(mount_id=2, path="/b", source=f"file://{tmp_path}")])]

    async def table() -> pb.GetMountTableResponse:
        if not tables:
            raise Unavailable("the master cannot be reached")
        return tables[-1]

    retention = Retention(store, WorkerMounts(table), orphan_grace=100)
    forgotten, written, known = ref(1, "/a/read", "etag-1"), ref(1, "/a/written", "w-0123"), ref(2, "/b/read", "e")
    await store.put(key_of(forgotten), b"r" * BLOCK)
    await store.put(key_of(written), b"w" * BLOCK, pin=True)
    await store.put(key_of(known), b"k" * BLOCK)
    assert await retention.sweep_orphans(now=1000) == 0   # first seen missing: the grace starts
    assert await retention.sweep_orphans(now=1099) == 0
    # Back in the table within the grace: the clock starts again when it is missing again.
    tables.append(pb.GetMountTableResponse(version=2, mounts=[*tables[0].mounts, pb.MountInfo(
        mount_id=1, path="/a", source=f"file://{tmp_path}")]))
    assert await retention.sweep_orphans(now=1100) == 0
    tables.append(tables[0])
    assert await retention.sweep_orphans(now=1150) == 0
    saved = list(tables)
    tables.clear()  # nothing is judged while the master cannot be asked
    assert await retention.sweep_orphans(now=1200) == 0
    tables.extend(saved)
    assert await retention.sweep_orphans(now=1250) == BLOCK
    assert sorted(held(store)) == [("/a/written", 0), ("/b/read", 0)]
    await store.close()
