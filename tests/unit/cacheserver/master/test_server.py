"""The master's start-up: the owner's file:// rule holds for mounts kept in the journal; a journal
folder it cannot write stops it."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.cacheserver.auth import Credentials
from strata.cacheserver.master.server import start_master
from strata.cacheserver.namespace.mounts import MountOptions, MountTable
from strata.contract.config import ServerConfig
from strata.contract.errors import FailedPrecondition


def test_journaled_file_mounts_outside_the_allowed_roots_are_kept_unusable(tmp_path: Path) -> None:
    allowed, other = tmp_path / "allowed", tmp_path / "other"
    allowed.mkdir()
    other.mkdir()
    table = MountTable(tmp_path / "journal", cluster_key="key")
    table.add("/in", f"file://{allowed}")
    out = table.add("/out", f"file://{other}", MountOptions(credentials={"token": "t0ken-value"}))
    table.add("/mem", "memory://bucket")
    restarted = MountTable(tmp_path / "journal", allowed_roots=[str(allowed)], cluster_key="key")
    assert [(m.path, bool(m.unusable)) for m in restarted.list()] == [("/in", False), ("/mem", False), ("/out", True)]
    [kept] = [m for m in restarted.list() if m.path == "/out"]
    assert kept.mount_id == out.mount_id
    assert "is not under a folder this cluster allows" in kept.unusable and "files not in the store yet are kept" in kept.unusable
    with pytest.raises(FailedPrecondition, match="mount /out .*allowedRoots"):
        restarted.resolve("/out/f")
    with pytest.raises(FailedPrecondition, match="mount /out"):
        restarted.store(kept)  # nothing under it is ever read or written
    restarted.add("/in2", f"file://{allowed}")  # a save keeps the unusable mount, credentials and all
    again = MountTable(tmp_path / "journal", allowed_roots=[str(allowed), str(other)], cluster_key="key")
    [back] = [m for m in again.list() if m.path == "/out"]
    assert not back.unusable and back.mount_id == out.mount_id and back.options.credentials == {"token": "t0ken-value"}
    again.remove("/out")  # its owner unmounts it: gone
    assert [m.path for m in MountTable(tmp_path / "journal", cluster_key="key").list()] == ["/in", "/in2", "/mem"]


async def test_a_master_whose_journal_folder_cannot_be_written_refuses_to_start(tmp_path: Path) -> None:
    """Otherwise it would start, and refuse every mount and every write it cannot journal."""
    taken = tmp_path / "journal"
    taken.write_text("a file where the folder should be")
    with pytest.raises(FailedPrecondition, match=f"the journal folder {taken} is not writable by uid"):
        await start_master(ServerConfig(), journal_dir=taken, credentials=Credentials.from_admin("t"),
                           bind="127.0.0.1", port=0, http_port=0)
    started = await start_master(ServerConfig(), journal_dir=tmp_path / "a" / "b", credentials=Credentials.from_admin("t"),
                                 bind="127.0.0.1", port=0, http_port=0)
    await started.stop(grace=0)
    assert (tmp_path / "a" / "b").is_dir() and not list((tmp_path / "a" / "b").iterdir())
