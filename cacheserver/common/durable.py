"""Durable writes: a file replaced whole, never seen half written, that survives a crash.

Every file Strata keeps on local disk (the master's state, cached blocks and their sidecars,
staged uploads, a FUSE mount's state, the client's records) is written here: into a temporary
file in the same folder, fsynced, renamed over the final name, and the folder fsynced. A
crash at any step leaves the old file whole or the new one, never a torn one, and a failed
write leaves no temporary file behind. The temporary file is named `.<name>.<8 hex>.tmp`
(what the block store's and the upload staging's scans remove when a crash left one).

    write_file(path, data)                         # bytes, or
    with replacing(path) as out: out.write(...)    # a file written piece by piece
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

# Mode of a file created here: readable by its owner only, as most of what Strata keeps may
# be someone's secret (credentials in the master's state, cached bytes).
FILE_MODE = 0o600


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make the entries of `folder` (a file renamed into it) survive a crash of the machine."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_name(path: Path) -> Path:
    """A fresh name beside `path` for the file that will replace it."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


@contextlib.contextmanager
def replacing(path: Path, *, mode: int = FILE_MODE, sync_file: bool = True,
              sync_folder: bool = True) -> Iterator[BinaryIO]:
    """A new file, open for writing, that replaces `path` when the block ends without an
    error; on an error the temporary file is removed and `path` is left as it was.

    By default the file is fsynced before the rename and its folder after it: the new
    content survives a crash of the process and of the machine. The two options are for
    callers whose rule differs, each on purpose:

    - `sync_file=False`: the caller accepts losing the new content in a power cut (block
      files of store data, which their checksums catch and the store still holds; state of
      a FUSE mount that a reboot ends anyway; a record the client can do without), or it
      fsyncs the file itself (`out.flush()` then `os.fsync(out.fileno())`, e.g. off an
      event loop). A crash of the process still leaves the old file or the new one.
    - `sync_folder=False`: the caller fsyncs the folder itself, once for the several files
      it puts there (`fsync_dir`), or, with `sync_file=False`, accepts losing the new
      content in a power cut (see above).
    """
    tmp = temporary_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        with open(fd, "wb") as out:
            yield out
            if sync_file:
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_folder:
        fsync_dir(path.parent)


def write_file(path: Path, data: bytes | memoryview, *, mode: int = FILE_MODE, sync_file: bool = True,
               sync_folder: bool = True) -> None:
    """Replace `path` with `data`, as `replacing` says (and with its options)."""
    with replacing(path, mode=mode, sync_file=sync_file, sync_folder=sync_folder) as out:
        out.write(data)
