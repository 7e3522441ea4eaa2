"""The files of a block in a tier directory, and how they are written without ever leaving
a partial file under a final name.

    <id>.blk                       the block's bytes
    <id>.meta                      its sidecar (metadata.BlockMetadata)
    .<id>.blk.<random>.tmp         being written; removed by the next scan if left behind

Block files and sidecars are the worker's alone: created mode 0600 in 0700 folders (see
tiers.Tier.prepare). Readers on the node get a block file's descriptor from the worker, never
its path.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from enum import Enum
from pathlib import Path

from ..common.durable import temporary_name, write_file

BLOCK_SUFFIX = ".blk"
META_SUFFIX = ".meta"
TEMP_SUFFIX = ".tmp"

log = logging.getLogger(__name__)
# Modes of what the block store creates: owner only (cached data may be anyone's secret).
FILE_MODE = 0o600
DIR_MODE = 0o700

_OURS = re.compile(r"^(?:\.)?(?P<id>[0-9a-f]{32})(?P<kind>\.blk|\.meta)(?P<temp>\.[0-9a-f]{8}\.tmp)?$")


class FileKind(Enum):
    BLOCK = "block"
    META = "meta"
    TEMP = "temp"


def block_file(directory: Path, block_id: str) -> Path:
    return directory / f"{block_id}{BLOCK_SUFFIX}"


def meta_file(directory: Path, block_id: str) -> Path:
    return directory / f"{block_id}{META_SUFFIX}"


def classify(name: str) -> tuple[str, FileKind] | None:
    """(block id, kind) of a file name this module makes; None for anything else, which a
    scan leaves alone."""
    match = _OURS.match(name)
    if match is None:
        return None
    hidden = name.startswith(".")
    if bool(match["temp"]) != hidden:
        return None
    if match["temp"]:
        return match["id"], FileKind.TEMP
    return match["id"], FileKind.BLOCK if match["kind"] == BLOCK_SUFFIX else FileKind.META


def write_atomically(path: Path, data: bytes | memoryview, *, durable: bool = False) -> None:
    """Write `data` to a temporary file next to `path`, then rename it over `path`.

    No fsync unless `durable`: a cache may lose recent blocks of store data in a power cut
    (the checksums catch a block whose bytes did not reach the disk; the store has them).
    A durable file is fsynced before the rename; its folder is the caller's to fsync, once
    for all the files it put there."""
    write_file(path, data, mode=FILE_MODE, sync_file=durable, sync_folder=False)


def copy_atomically(src: Path, dst: Path, *, durable: bool = False) -> None:
    """Make `dst` a copy of `src`: a hard link on the same file system, else a kernel-side
    copy (sendfile) into a temporary file that is then renamed. `src` stays in place. With
    `durable`, as in `write_atomically`."""
    tmp = temporary_name(dst)
    try:
        try:
            os.link(src, tmp)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
            shutil.copyfile(src, tmp)
        os.chmod(tmp, FILE_MODE)  # a copy gets the default mode; a link, its source's
        if durable:
            fsync_file(tmp)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_block_files(directory: Path, block_id: str) -> None:
    """Delete a block's bytes and sidecar; already missing is fine. A disk that refuses (gone
    read-only, failing) keeps them: logged, not raised, since the block has left the store's
    index either way, and a block kept on disk is still whole or fails its checksums."""
    for path in (block_file(directory, block_id), meta_file(directory, block_id)):
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot delete %s: %s", path, exc.strerror or exc)
