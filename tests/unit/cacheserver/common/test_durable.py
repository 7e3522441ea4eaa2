"""Durable writes (common/durable.py) on a real folder: what is left on disk after a write that
succeeds, fails, or is cut short by a crash of the writing process."""

from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path

import pytest

from strata.cacheserver.common import durable
from strata.cacheserver.common.durable import replacing, write_file


def test_write_file_replaces_the_whole_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_file(target, b"old and longer")
    write_file(target, b"new")
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["state.json"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_file(target, b"old")
    with pytest.raises(RuntimeError, match="disk went away"), replacing(target) as out:
        out.write(b"half of the ne")
        raise RuntimeError("disk went away")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_write_of_the_wrong_type_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "record"
    with pytest.raises(TypeError):
        write_file(target, "not bytes")  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []


def _crash_before_rename(target: Path) -> None:
    """The writing process dies (no cleanup, no exit handlers) after the new content is
    written and fsynced, before its rename."""
    def die(src: object, dst: object) -> None:
        os._exit(3)
    durable.os.replace = die  # type: ignore[assignment]  # this child process only
    write_file(target, b"the new content, never renamed into place")


def test_a_crash_before_the_rename_leaves_the_old_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_file(target, b"the old content")
    child = multiprocessing.get_context("fork").Process(target=_crash_before_rename, args=(target,))
    child.start()
    child.join(30)
    assert child.exitcode == 3
    assert target.read_bytes() == b"the old content"
    # What the crash left is a temporary file, named as the scans that clean up look for.
    [left] = [name for name in os.listdir(tmp_path) if name != "state.json"]
    assert left.startswith(".state.json.") and left.endswith(".tmp")


def test_the_file_and_its_folder_are_fsynced_unless_the_caller_says(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    write_file(tmp_path / "a", b"x")
    assert synced == ["file", "folder"]
    synced.clear()
    write_file(tmp_path / "b", b"x", sync_file=False)
    assert synced == ["folder"]
    synced.clear()
    write_file(tmp_path / "c", b"x", sync_folder=False)
    assert synced == ["file"]


def test_replacing_writes_piece_by_piece_with_the_mode_asked(tmp_path: Path) -> None:
    target = tmp_path / "journal"
    with replacing(target, mode=0o640) as out:
        for piece in (b"one ", b"two ", b"three"):
            out.write(piece)
    assert target.read_bytes() == b"one two three"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
