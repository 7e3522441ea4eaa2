"""The staging folder of ASYNC_THROUGH uploads: records, what a restart keeps, what is pending."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from strata.cacheserver.uploads import oldest_age_seconds, sum_pending
from strata.cacheserver.worker.mounts import WorkerMounts
from strata.cacheserver.worker.uploads import UploadRecord, Uploads, record_file, remove_stale_staging
from strata.contract.proto import strata_pb2 as pb


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
