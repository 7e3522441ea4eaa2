"""The staging folder of ASYNC_THROUGH uploads: records, what a restart keeps, what is
pending; what an upload checks of the staged copy it sends (against a real master and S3)."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
from storeproxy import StoreProxy

from strata.cacheserver.uploads import oldest_age_seconds, sum_pending
from strata.cacheserver.worker.mounts import WorkerMounts
from strata.cacheserver.worker.uploads import UploadRecord, Uploads, record_file, remove_stale_staging, staged_files
from strata.contract.proto import strata_pb2 as pb

from .conftest import Cluster, chunks, eventually, ref_for


async def _no_table() -> pb.GetMountTableResponse:
    return pb.GetMountTableResponse()


async def _release(refs: list[pb.BlockRef], keep_pinned: bool) -> None:
    return None


def uploads_in(folder: Path) -> Uploads:
    # No master call is expected: none to call (a call would fail on None).
    return Uploads(folder, master=None, mounts=WorkerMounts(_no_table), release=_release)  # type: ignore[arg-type]


def stage(folder: Path, name: str, record: dict[str, object] | None, data: bytes = b"abc") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    staged = folder / f"{name}.part"
    staged.write_bytes(data)
    if record is not None:
        record_file(staged).write_text(json.dumps(record))
    return staged


def test_a_restart_keeps_staged_writes_with_a_record_and_drops_the_rest(tmp_path: Path) -> None:
    kept = stage(tmp_path, "a" * 32, {"path": "/m/f", "mount_id": 1, "version": "w-1", "length": 3, "block_size": 4})
    orphan = stage(tmp_path, "b" * 32, None)
    lone_record = tmp_path / f"{'c' * 32}.upload.json"
    lone_record.write_text("{}")
    partial = tmp_path / f".{'d' * 32}.upload.json.0a1b2c3d.tmp"
    partial.write_text("{")
    remove_stale_staging(tmp_path)
    assert kept.exists() and record_file(kept).exists()
    assert not orphan.exists() and not lone_record.exists() and not partial.exists()


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


async def test_a_staged_copy_of_another_length_than_its_write_is_never_put_in_place(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The staged copy of an acknowledged ASYNC_THROUGH write lost its end before its upload
    (damaged on disk): it must not become the file in the store, for its blocks, the whole
    write, would then be let go. The store is down (a proxy refuses it) while the write is
    acknowledged, so the upload waits."""
    monkeypatch.setenv("STRATA_UPLOAD_BASE_DELAY", "0.01")
    monkeypatch.setenv("STRATA_UPLOAD_MAX_DELAY", "0.05")
    proxy = StoreProxy(target_port=int(cluster.s3.endpoint_url.rsplit(":", 1)[1]))
    try:
        await cluster.mount(endpoint_url=proxy.endpoint_url)
        parts = await cluster.worker()
        data = bytes(range(256)) * 40
        with proxy.refusing():
            info = await parts.writes.write_file(chunks("/m/cut.bin", data, write_type=pb.ASYNC_THROUGH,
                                                                overwrite=True))
            [staged] = staged_files(parts.uploads.staging_dir)
            os.truncate(staged, len(data) - 100)
        with caplog.at_level(logging.INFO, logger="strata.cacheserver"):
            async def refused() -> bool:
                return "not moved into place" in caplog.text

            await eventually(refused, "the upload of a cut staged copy refused")
        assert not (await cluster.status("/m/cut.bin")).persisted
        assert all(b.pinned for b in parts.store.blocks())
        # The acknowledged bytes are still there, in the cache.
        for index in range(3):
            source = await parts.reads.read_source(ref_for(info, index), 0, offset=0, length=0, readahead=0,
                                                   as_file=False)
            assert source.data == data[index * 4096:(index + 1) * 4096]
    finally:
        proxy.stop()
