"""The staging folder of ASYNC_THROUGH uploads: records, what a restart keeps, what is
pending; what an upload checks of the staged copy it sends (against a real master and S3)."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from storeproxy import StoreProxy

from strata.cacheserver.pendinguploads import oldest_age_seconds, sum_pending
from strata.cacheserver.worker.mounts import WorkerMounts
from strata.cacheserver.worker.uploads import (
    UploadRecord,
    Uploads,
    record_file,
    remove_stale_staging,
    staged_file,
    staged_files,
)
from strata.contract.proto import strata_pb2 as pb

from strata.cacheserver.common.blockrefs import key_of
from strata.cacheserver.worker.server import WorkerParts

from .conftest import Cluster, chunks, eventually, ref_for


async def _no_table() -> pb.GetMountTableResponse:
    return pb.GetMountTableResponse()


async def _release(refs: list[pb.BlockRef], keep_pinned: bool) -> None:
    return None


async def _no_block(ref: pb.BlockRef) -> bytes | None:
    return None


def uploads_in(folder: Path) -> Uploads:
    # No master call is expected: none to call (a call would fail on None).
    return Uploads(folder, master=None, mounts=WorkerMounts(_no_table), release=_release,  # type: ignore[arg-type]
                   read_block=_no_block)


def stage(folder: Path, name: str, record: dict[str, object] | None, data: bytes = b"abc") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    staged = folder / f"{name}.part"
    staged.write_bytes(data)
    if record is not None:
        record_file(staged).write_text(json.dumps(record))
    return staged


def test_a_restart_keeps_staged_writes_with_a_record_and_drops_the_rest(tmp_path: Path) -> None:
    record = {"path": "/m/f", "mount_id": 1, "version": "w-1", "length": 3, "block_size": 4}
    kept = stage(tmp_path, "a" * 32, record)
    orphan = stage(tmp_path, "b" * 32, None)
    unreadable = tmp_path / f"{'c' * 32}.upload.json"
    unreadable.write_text("{}")
    partial = tmp_path / f".{'d' * 32}.upload.json.0a1b2c3d.tmp"
    partial.write_text("{")
    # A record whose staged copy is gone: its write is staged again from its blocks.
    lone = record_file(stage(tmp_path, "e" * 32, {**record, "path": "/m/g"}))
    staged_file(lone).unlink()
    remove_stale_staging(tmp_path)
    assert kept.exists() and record_file(kept).exists() and lone.exists()
    assert not orphan.exists() and not unreadable.exists() and not partial.exists()
    assert sorted(p.record.path for p in uploads_in(tmp_path)._uploads.values()) == ["/m/f", "/m/g"]


def test_a_record_of_the_first_format_is_an_acknowledged_pending_upload(tmp_path: Path) -> None:
    staged = stage(tmp_path, "a" * 32, {"path": "/m/f", "mount_id": 7, "version": "w-1", "length": 3, "block_size": 4})
    an_hour_ago = time.time() - 3600
    os.utime(staged, (an_hour_ago, an_hour_ago))
    [pending] = uploads_in(tmp_path).pending()
    assert (pending.mount_id, pending.count, pending.bytes) == (7, 1, 3)
    assert 3590 < oldest_age_seconds(pending) < 3700


def test_unacknowledged_writes_are_not_pending_uploads(tmp_path: Path) -> None:
    record = UploadRecord(path="/m/f", mount_id=1, version="w-1", length=3, block_size=4, acknowledged=False,
                          staged_unix_ms=1)
    stage(tmp_path, "a" * 32, json.loads(record.model_dump_json()))
    assert uploads_in(tmp_path).pending() == []


def test_pending_uploads_sum_counts_bytes_and_the_oldest() -> None:
    total = sum_pending([pb.PendingUploads(count=2, bytes=10, oldest_unix_ms=5000),
                         pb.PendingUploads(count=1, bytes=1, oldest_unix_ms=3000),
                         pb.PendingUploads()], mount_id=4)
    assert (total.mount_id, total.count, total.bytes, total.oldest_unix_ms) == (4, 3, 11, 3000)
    assert oldest_age_seconds(total, now_unix=10.0) == 7.0
    assert oldest_age_seconds(pb.PendingUploads()) == 0.0


@pytest.fixture
def proxy(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreProxy]:
    """A proxy in front of the store, for a test to have refuse; uploads retry at once."""
    monkeypatch.setenv("STRATA_UPLOAD_BASE_DELAY", "0.01")
    monkeypatch.setenv("STRATA_UPLOAD_MAX_DELAY", "0.05")
    store_proxy = StoreProxy(target_port=int(cluster.s3.endpoint_url.rsplit(":", 1)[1]))
    yield store_proxy
    store_proxy.stop()


async def _acknowledged_while_the_store_refuses(cluster: Cluster, proxy: StoreProxy, path: str,
                                                data: bytes) -> tuple[WorkerParts, pb.FileInfo, Path]:
    """An ASYNC_THROUGH write acknowledged through a worker whose store is behind `proxy`
    (the caller has it refuse, so the upload waits): the worker's parts, the file, its
    staged copy."""
    await cluster.mount(endpoint_url=proxy.endpoint_url)
    parts = await cluster.worker()
    info = await parts.writes.write_file(chunks(path, data, write_type=pb.ASYNC_THROUGH, overwrite=True))
    [staged] = staged_files(parts.uploads.staging_dir)
    return parts, info, staged


async def test_a_staged_copy_cut_short_is_staged_again_from_the_blocks(
        cluster: Cluster, proxy: StoreProxy) -> None:
    """The staged copy of an acknowledged ASYNC_THROUGH write lost its end before its upload
    (damaged on disk): it must never become the file in the store (its blocks, the whole
    write, would then be let go), and the upload must not loop on it forever: the copy is
    made again from the write's blocks and the whole write lands."""
    data = bytes(range(256)) * 40
    with proxy.refusing():
        parts, info, staged = await _acknowledged_while_the_store_refuses(cluster, proxy, "/m/cut.bin", data)
        os.truncate(staged, len(data) - 100)

    async def persisted() -> bool:
        return (await cluster.status("/m/cut.bin")).persisted

    await eventually(persisted, "the cut write uploaded whole")
    assert cluster.get("m/cut.bin") == data
    assert not staged.exists() and parts.uploads.pending() == []
    assert info.version.startswith("w-")


async def test_a_write_whose_staged_copy_is_gone_after_a_restart_is_uploaded_from_its_blocks(
        cluster: Cluster, proxy: StoreProxy) -> None:
    """A worker stops with an acknowledged ASYNC_THROUGH write not in the store (the store is
    down); its next process finds the record and the write's pinned blocks, but not the
    staged copy (the folder it was in was lost, the record kept): the write is staged again
    from its blocks and uploaded, never dropped."""
    data = os.urandom(3 * 4096 + 17)
    with proxy.refusing():
        first, info, staged = await _acknowledged_while_the_store_refuses(cluster, proxy, "/m/kept.bin", data)
        await first.close()
        await first.close_channels()
        cluster.built.remove(first)
        staged.unlink()
        again = await cluster.worker()  # the same folder: its blocks and the record
        assert [p.count for p in again.uploads.pending()] == [1]

    async def persisted() -> bool:
        return (await cluster.status("/m/kept.bin")).persisted

    await eventually(persisted, "the write uploaded from its blocks")
    assert cluster.get("m/kept.bin") == data
    assert again.uploads.pending() == []
    assert info.length == len(data)


async def test_a_staged_copy_damaged_with_its_length_intact_is_made_again_from_the_blocks(
        cluster: Cluster, proxy: StoreProxy) -> None:
    """The staged copy of an acknowledged ASYNC_THROUGH write has a byte changed on disk
    while the store is down (same length): the upload puts the write's bytes into the store,
    staged again from its pinned blocks, never the damaged copy."""
    data = os.urandom(3 * 4096 + 17)
    with proxy.refusing():
        parts, _, staged = await _acknowledged_while_the_store_refuses(cluster, proxy, "/m/flipped.bin", data)
        damaged = bytearray(staged.read_bytes())
        damaged[4096 + 5] ^= 0x01
        staged.write_bytes(bytes(damaged))

    async def persisted() -> bool:
        return (await cluster.status("/m/flipped.bin")).persisted

    await eventually(persisted, "the write uploaded")
    assert cluster.get("m/flipped.bin") == data
    assert parts.uploads.pending() == []


async def test_an_upload_whose_bytes_are_gone_stays_pending_and_puts_nothing_in_the_store(
        cluster: Cluster, proxy: StoreProxy, caplog: pytest.LogCaptureFixture) -> None:
    """Neither the staged copy nor a block of the write: the write is not given up (it stays
    pending, a person sees it) and nothing is put in the store in its name."""
    data = os.urandom(2 * 4096)
    with proxy.refusing():
        parts, info, staged = await _acknowledged_while_the_store_refuses(cluster, proxy, "/m/gone.bin", data)
        staged.unlink()
        parts.store.remove(key_of(ref_for(info, 1)))
    with caplog.at_level(logging.INFO, logger="strata.cacheserver"):
        async def tried() -> bool:
            return "block 1 of it is not cached on this worker" in caplog.text

        await eventually(tried, "the upload tried and waiting for its bytes")
    assert [p.count for p in parts.uploads.pending()] == [1]
    assert not (await cluster.status("/m/gone.bin")).persisted
    with pytest.raises(ClientError, match="NoSuchKey"):
        cluster.get("m/gone.bin")
