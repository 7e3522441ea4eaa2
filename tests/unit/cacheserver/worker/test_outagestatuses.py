"""Statuses a worker takes from a read-only mount's store while the master is away, against a
real file:// store in a tmp folder."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from strata.cacheserver.worker.mounts import WorkerMounts
from strata.cacheserver.worker.outagestatuses import AWAY_PATIENCE, OutageStatuses
from strata.contract.errors import NotFound, Unreachable
from strata.contract.proto import strata_pb2 as pb

AWAY = Unreachable("status of the file from the master: master 127.0.0.1:1 could not be reached")


async def statuses(tmp_path: Path, *mounts: pb.MountInfo) -> OutageStatuses:
    async def fetch() -> pb.GetMountTableResponse:
        return pb.GetMountTableResponse(version=1, mounts=list(mounts))

    table = WorkerMounts(fetch, allowed_roots=[str(tmp_path)])
    await table.refresh()
    return OutageStatuses(table, block_size=4096, readahead_blocks=2, patience=2.0)


def mount(tmp_path: Path, path: str, mount_id: int, **options: object) -> pb.MountInfo:
    return pb.MountInfo(path=path, source=f"file://{tmp_path}", mount_id=mount_id,
                        options=pb.MountOptions(**options))  # type: ignore[arg-type]


async def test_a_read_only_mounts_file_is_answered_from_the_store_for_the_mounts_interval(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f.bin").write_bytes(b"x" * 10_000)
    outage = await statuses(tmp_path, mount(tmp_path, "/ro", 3, read_only=True, metadata_sync_interval=60),
                            mount(tmp_path, "/never", 4, read_only=True, metadata_sync_interval=-1))
    info = await outage.status("/ro/d/f.bin", AWAY)
    stat = (tmp_path / "d" / "f.bin").stat()
    assert (info.path, info.name, info.length, info.mount_id, info.block_size, info.readahead_blocks) == \
        ("/ro/d/f.bin", "f.bin", 10_000, 3, 4096, 2)
    assert info.persisted and info.read_only and not info.is_dir and info.version == info.store_version != ""
    assert info.mtime_unix_ms == stat.st_mtime_ns // 1_000_000
    assert 59_000 < info.valid_for_ms <= 60_000  # the mount's interval, from when the store was asked
    assert 299_000 < (await outage.status("/never/d/f.bin", AWAY)).valid_for_ms <= 300_000  # at most 5 minutes
    folder = await outage.status("/ro/d", AWAY)  # a FUSE lookup on the way to a file
    assert folder.is_dir and folder.version == "" and folder.length == 0 and folder.valid_for_ms > 59_000
    with pytest.raises(NotFound):  # the store's "not found" is believed
        await outage.status("/ro/d/gone.bin", AWAY)


async def test_the_masters_error_stands_where_the_store_cannot_stand_in(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"x")
    outage = await statuses(tmp_path, mount(tmp_path, "/rw", 1, metadata_sync_interval=60),
                            mount(tmp_path, "/every", 2, read_only=True, metadata_sync_interval=0),
                            mount(tmp_path, "/ro", 3, read_only=True, metadata_sync_interval=60))
    for path in ("/rw/f.bin",  # writable: close-to-open needs the master
                 "/every/f.bin",  # synced at every access: nothing is reusable
                 "/ro",  # the mount's root
                 "/ro/.strata-uploads/f.bin",  # Strata's own upload folder
                 "/elsewhere/f.bin"):  # no mount the worker knows
        with pytest.raises(Unreachable, match="could not be reached"):
            await outage.status(path, AWAY)


async def test_once_the_master_failed_a_status_question_waits_for_it_only_briefly(tmp_path: Path) -> None:
    outage = await statuses(tmp_path)
    assert outage.patience() == 2.0
    outage.master_failed()
    failed_at = outage.away_since
    assert failed_at is not None and failed_at <= time.monotonic()
    outage.master_failed()
    assert outage.away_since == failed_at and outage.patience() == AWAY_PATIENCE
    outage.master_answered()
    assert outage.away_since is None and outage.patience() == 2.0
