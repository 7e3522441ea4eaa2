"""Writes: each write type keeps its promise at acknowledgement; a refused write leaves
nothing; appends and copies. Against a real master and S3."""

from __future__ import annotations

import pytest

from strata.cacheserver.worker.server import WorkerParts
from strata.contract.errors import AlreadyExists, DataLoss, InvalidArgument, PermissionDenied
from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK, Cluster, chunks, eventually

DATA = bytes(range(256)) * 40  # 10240 bytes: two whole blocks and a part


def pinned(parts: WorkerParts, path: str) -> list[bool]:
    return [b.pinned for b in sorted(parts.store.blocks(), key=lambda b: b.key.index) if b.key.path == path]


def staged(parts: WorkerParts) -> list[str]:
    return sorted(p.name for p in parts.uploads.staging_dir.iterdir())


def in_store(cluster: Cluster, key: str) -> bytes | None:
    try:
        return cluster.get(key)
    except Exception:  # noqa: BLE001 - botocore's NoSuchKey
        return None


async def test_cache_through_is_in_the_store_and_cached_at_ack(cluster: Cluster) -> None:
    await cluster.mount()
    parts = await cluster.worker()
    info = await parts.writes.write_file(chunks("/m/ct.bin", DATA, write_type=pb.CACHE_THROUGH))
    assert (info.length, info.persisted, info.block_size) == (len(DATA), True, BLOCK)
    assert cluster.get("m/ct.bin") == DATA
    assert pinned(parts, "/m/ct.bin") == [False, False, False]
    assert staged(parts) == []


async def test_through_is_in_the_store_and_not_cached(cluster: Cluster) -> None:
    await cluster.mount()
    parts = await cluster.worker()
    info = await parts.writes.write_file(chunks("/m/t.bin", DATA, write_type=pb.THROUGH))
    assert info.persisted and cluster.get("m/t.bin") == DATA
    assert list(parts.store.blocks()) == []


async def test_must_cache_is_pinned_here_and_not_in_the_store(cluster: Cluster) -> None:
    await cluster.mount(ttl_seconds=1)
    parts = await cluster.worker()
    info = await parts.writes.write_file(chunks("/m/mc.bin", DATA, write_type=pb.MUST_CACHE))
    assert not info.persisted and (await cluster.status("/m/mc.bin")).version == info.version
    assert in_store(cluster, "m/mc.bin") is None
    assert pinned(parts, "/m/mc.bin") == [True, True, True]
    # The only copy of the file: a TTL sweep, however late, leaves it.
    assert len(parts.retention.unpersisted_written()) == 3
    await parts.mounts.refresh()
    assert parts.retention.sweep_ttl(now=4e9) == 0 and len(list(parts.store.blocks())) == 3


async def test_async_through_is_acknowledged_staged_then_persisted_and_released(cluster: Cluster) -> None:
    await cluster.mount()
    parts = await cluster.worker()
    info = await parts.writes.write_file(chunks("/m/at.bin", DATA, write_type=pb.ASYNC_THROUGH))
    assert not info.persisted

    async def persisted() -> bool:
        return (await cluster.status("/m/at.bin")).persisted

    await eventually(persisted, "the upload of /m/at.bin")
    assert cluster.get("m/at.bin") == DATA

    async def released() -> bool:
        return pinned(parts, "/m/at.bin") == [False, False, False] and staged(parts) == []

    await eventually(released, "the blocks of /m/at.bin unpinned and its staged copy gone")


async def test_a_write_over_an_existing_file_without_overwrite_leaves_it_alone(cluster: Cluster) -> None:
    await cluster.mount()
    cluster.put("m/e.bin", b"old")
    parts = await cluster.worker()
    with pytest.raises(AlreadyExists):
        await parts.writes.write_file(chunks("/m/e.bin", DATA, write_type=pb.CACHE_THROUGH))
    assert cluster.get("m/e.bin") == b"old"
    assert staged(parts) == [] and list(parts.store.blocks()) == []
    info = await parts.writes.write_file(chunks("/m/e.bin", DATA, write_type=pb.CACHE_THROUGH, overwrite=True))
    assert info.length == len(DATA) and cluster.get("m/e.bin") == DATA


async def test_a_read_only_mount_refuses_writes_appends_and_copies(cluster: Cluster) -> None:
    await cluster.mount("/ro", read_only=True)
    cluster.put("ro/x", b"x")
    parts = await cluster.worker()
    with pytest.raises(PermissionDenied, match="/ro is read-only"):
        await parts.writes.write_file(chunks("/ro/y", DATA))
    with pytest.raises(PermissionDenied):
        await parts.writes.append_file(chunks("/ro/x", b"more"))
    with pytest.raises(PermissionDenied):
        await parts.writes.copy_file(pb.CopyFileRequest(src="/ro/x", dst="/ro/z"))
    assert staged(parts) == [] and in_store(cluster, "ro/y") is None


async def test_an_empty_stream_is_refused_with_a_clear_error(cluster: Cluster) -> None:
    await cluster.mount()
    parts = await cluster.worker()

    async def nothing():  # type: ignore[no-untyped-def]
        return
        yield  # noqa: unreachable - an async generator with no items

    with pytest.raises(InvalidArgument, match="first message must name the path"):
        await parts.writes.write_file(nothing())
    assert staged(parts) == []


async def test_bytes_damaged_on_the_way_are_refused_and_nothing_is_written(cluster: Cluster) -> None:
    await cluster.mount()
    cluster.put("m/kept", DATA)
    parts = await cluster.worker()

    async def damaged(path: str, *, unchecked: bool = False):  # type: ignore[no-untyped-def]
        async for chunk in chunks(path, DATA):
            if chunk.path == "" and not unchecked:
                chunk.data = chunk.data[:-1] + bytes([chunk.data[-1] ^ 1])  # after its CRC was taken
            if unchecked:
                chunk.ClearField("crc32c")
            yield chunk

    with pytest.raises(DataLoss, match=r"WriteFile: the 3000 bytes of message 1 failed their CRC-32C check"):
        await parts.writes.write_file(damaged("/m/new"))
    with pytest.raises(DataLoss, match=r"AppendFile: .* failed their CRC-32C check in transit; nothing was written"):
        await parts.writes.append_file(damaged("/m/kept"))
    with pytest.raises(InvalidArgument, match=r"message 0 carries no crc32c"):
        await parts.writes.write_file(damaged("/m/kept", unchecked=True))
    assert in_store(cluster, "m/new") is None and cluster.get("m/kept") == DATA and staged(parts) == []


async def test_append_adds_to_the_stored_file_or_makes_a_new_one(cluster: Cluster) -> None:
    await cluster.mount()
    cluster.put("m/log", DATA[:5000])
    parts = await cluster.worker()
    info = await parts.writes.append_file(chunks("/m/log", DATA[5000:]))
    assert info.length == len(DATA) and cluster.get("m/log") == DATA  # the cluster's default: CACHE_THROUGH
    fresh = await parts.writes.append_file(chunks("/m/new", b"first"))
    assert fresh.length == 5 and cluster.get("m/new") == b"first"


async def test_a_copy_within_one_store_is_made_by_the_store(cluster: Cluster) -> None:
    await cluster.mount()
    cluster.put("m/src", DATA)
    parts = await cluster.worker()
    info = await parts.writes.copy_file(pb.CopyFileRequest(src="/m/src", dst="/m/dst", write_type=pb.THROUGH))
    assert info.persisted and info.length == len(DATA) and cluster.get("m/dst") == DATA
    assert parts.reads.counters.ufs_bytes_read == 0  # no byte came through the worker


async def test_a_copy_of_a_cached_only_file_takes_its_blocks_from_the_cache(cluster: Cluster) -> None:
    await cluster.mount()
    parts = await cluster.worker()
    await parts.writes.write_file(chunks("/m/only", DATA, write_type=pb.MUST_CACHE))
    info = await parts.writes.copy_file(pb.CopyFileRequest(src="/m/only", dst="/m/copy", write_type=pb.THROUGH))
    assert info.persisted and cluster.get("m/copy") == DATA
    with pytest.raises(InvalidArgument, match="onto itself"):
        await parts.writes.copy_file(pb.CopyFileRequest(src="/m/only", dst="/m/only"))
