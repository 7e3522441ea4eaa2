"""Blocking helpers of file:// stores that work on descriptors already checked to lie under a
store's root (`local`): write a file a step at a time, list statuses, remove a tree, sync a
folder, and tell an upload whose writer died."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from .calls import Progress
from .status import _size_mtime_version

# Bytes a file:// upload or copy writes at a time (a step of its progress), and syncs at a
# time: its last fsync then has at most this much left to write, however large the file.
_COPY_CHUNK = 1 << 20
_SYNC_EVERY = 32 << 20


def _copy_into(out: BinaryIO, source: Path | int | bytes, progress: Progress) -> None:
    """Write `source` (a file's path, a descriptor, which this closes, or bytes) into `out`
    (a file a file:// store is given) a step of `progress` at a time, synced every
    _SYNC_EVERY bytes."""
    with contextlib.ExitStack() as stack:
        if isinstance(source, bytes):
            view = memoryview(source)
            chunks: Iterator[bytes | memoryview] = (view[i:i + _COPY_CHUNK] for i in range(0, len(view), _COPY_CHUNK))
        else:
            f = stack.enter_context(open(source, "rb"))
            chunks = iter(functools.partial(f.read, _COPY_CHUNK), b"")
        written = 0
        for chunk in chunks:
            out.write(chunk)
            written += len(chunk)
            if written % _SYNC_EVERY < len(chunk):
                out.flush()
                os.fdatasync(out.fileno())
            progress.step()


def _local_info(path: str, st: os.stat_result) -> dict[str, Any]:
    """What fsspec's `info` says of a local file, from its status (a link's target's)."""
    kind = "directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    return {"name": path, "size": st.st_size, "type": kind, "mtime": st.st_mtime}


def _rmtree_at(dir_fd: int, name: str, progress: Progress) -> None:
    """Remove the folder `name` of the folder `dir_fd` and all below it, each folder through
    its descriptor (each entry a step of `progress`): a link is removed, never followed (one swapped in
    for a folder meanwhile fails the open, O_NOFOLLOW)."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        for entry in os.listdir(fd):
            if stat.S_ISDIR(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode):
                _rmtree_at(fd, entry, progress)
            else:
                os.unlink(entry, dir_fd=fd)
            progress.step()
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _remove_if_dead(folder_fd: int, name: str, older_than: float) -> bool:
    """Remove the upload temporary file `name` (in the folder `folder_fd`) if its writer is
    gone: no process holds its lock (the writer's, released when it exits or is killed) and
    it has not changed for `older_than` seconds (where locks do not reach, e.g. NFS mounted
    with local locks, an upload under way keeps changing it). A file removed under a writer
    after all only fails that write: its rename finds nothing."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
    except FileNotFoundError:
        return False  # renamed into place meanwhile
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # being written
        st = os.fstat(fd)
        if time.time() - st.st_mtime < older_than:
            return False
        try:
            if os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_ino != st.st_ino:
                return False  # another file by that name now
        except FileNotFoundError:
            return False
        os.unlink(name, dir_fd=folder_fd)
        return True
    finally:
        os.close(fd)


def _write_note(folder_fd: int, name: str, text: str) -> None:
    """Write a small file `name` holding `text` in the folder `folder_fd`, on the disk (file
    and folder) when this returns."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder_fd)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.fsync(folder_fd)


def _local_version(st: os.stat_result) -> str:
    """The version `Store._status` gives a local file, from its stat."""
    return _size_mtime_version(st.st_size, st.st_mtime)
