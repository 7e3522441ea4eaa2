"""Open files of a FUSE mount.

Reading goes through the client library's file object (whole blocks, the next ones fetched
ahead while the reader is sequential, short-circuit reads on a worker's host).

Writing is buffered: the bytes go to an unlinked local spool file, and the whole file is
written through a worker (`write_file`, with the mount's write type) when the application
flushes, fsyncs or closes it and something changed. So any write pattern works (seeks back,
rewrites, truncates, reading back what was written) and a failed upload is reported by
close(2) or fsync(2). The price: the spool needs local disk space for the file, and the
upload starts when the file is closed, not while it is written.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from strata.contract.proto import strata_pb2 as pb
from ..client.fs import StrataFile
from ..common.durable import write_file

# Bytes read from the spool per piece of an upload.
UPLOAD_CHUNK = 4 * 1024 * 1024

T = TypeVar("T")


class ReadHandle:
    """A file opened for reading.

    The kernel sends reads of up to 1 MiB, several at once for one open file (its readahead,
    and programs reading one file from several threads: pyarrow reads a Parquet file's column
    chunks in parallel). Each is answered on its own by the client's file object, which
    fetches whole blocks and reads ahead where reads go on where earlier ones ended, and
    fetches just the bytes asked for otherwise (footers, indexes, random access).
    """

    def __init__(self, file: StrataFile) -> None:
        self._file = file
        # Reads around the kernel's page cache (direct I/O); a handle a successor opened
        # again counts as one that does not, as the predecessor's choice is not known.
        self.direct = False

    @property
    def info(self) -> pb.FileInfo:
        return self._file.file_info

    def read(self, size: int, offset: int) -> bytes:
        return self._file.pread(size, offset)

    def close(self) -> None:
        self._file.close()


class ReadRecords:
    """What each open read handle reads: its file's status (path, version, length, block
    size), one small file per handle in a folder of the mount's state, written before the
    kernel hears of the handle and removed when it is released. A successor that takes the
    mount over (mountkeeper.py) opens each handle again at the version its reader was reading: a
    file changed in the store meanwhile must not go on, in the same open file, with the new
    version's bytes. `directory` None: nothing is kept."""

    def __init__(self, directory: Path | None) -> None:
        self._directory = directory

    def _path(self, fh: int) -> Path | None:
        return None if self._directory is None else self._directory / str(fh)

    def add(self, fh: int, info: pb.FileInfo) -> None:
        path = self._path(fh)
        if path is None:
            return
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Not fsynced: a reboot ends the mount and its readers with it.
        write_file(path, info.SerializeToString(), sync_file=False, sync_folder=False)

    def get(self, fh: int) -> pb.FileInfo | None:
        """The status handle `fh` was opened with; None if none was kept."""
        path = self._path(fh)
        if path is None:
            return None
        try:
            return pb.FileInfo.FromString(path.read_bytes())
        except FileNotFoundError:
            return None

    def all(self) -> dict[int, pb.FileInfo]:
        """Every handle's status kept (a predecessor's, for a successor)."""
        if self._directory is None or not self._directory.is_dir():
            return {}
        kept = {}
        for path in self._directory.iterdir():
            if path.name.isdigit():
                info = self.get(int(path.name))
                if info is not None:
                    kept[int(path.name)] = info
        return kept

    def remove(self, fh: int) -> None:
        path = self._path(fh)
        if path is not None:
            path.unlink(missing_ok=True)


class WriteHandle:
    """A file opened for writing (see the module docstring)."""

    def __init__(self, path: str, spool_dir: str | None = None, *, dirty: bool = False) -> None:
        self.path = path  # namespace path; follows renames of the open file
        self._spool = tempfile.TemporaryFile(dir=spool_dir, prefix="strata-fuse-")
        self._fd = self._spool.fileno()
        self.size = 0
        self.dirty = dirty  # uploaded on the next commit (a created or truncated file is, even empty)
        self.discarded = False  # unlinked while open: never uploaded
        self.mtime_ns = time.time_ns()
        self._lock = threading.RLock()

    def fill(self, chunks: Iterable[bytes]) -> None:
        """Start from existing content (a file opened for writing without O_TRUNC)."""
        with self._lock:
            for data in chunks:
                os.pwrite(self._fd, data, self.size)
                self.size += len(data)

    def write(self, data: bytes | memoryview, offset: int) -> int:
        with self._lock:
            written = os.pwrite(self._fd, data, offset)
            self.size = max(self.size, offset + written)
            self.dirty = True
            self.mtime_ns = time.time_ns()
            return written

    def append(self, data: bytes | memoryview) -> int:
        """Write `data` at the end (a file opened with O_APPEND)."""
        with self._lock:
            return self.write(data, self.size)

    def read(self, size: int, offset: int) -> bytes:
        with self._lock:
            return os.pread(self._fd, max(0, min(size, self.size - offset)), offset)

    def truncate(self, length: int) -> None:
        with self._lock:
            os.ftruncate(self._fd, length)
            self.size = length
            self.dirty = True
            self.mtime_ns = time.time_ns()

    def _chunks(self) -> Iterator[bytes]:
        offset = 0
        while offset < self.size:
            data = os.pread(self._fd, min(UPLOAD_CHUNK, self.size - offset), offset)
            if not data:
                break
            offset += len(data)
            yield data

    def commit(self, upload: Callable[[str, Iterator[bytes]], T]) -> T | None:
        """Upload the whole file if it changed since the last commit; `upload(path, chunks)`
        returns what this returns (None when there was nothing to upload)."""
        with self._lock:
            if not self.dirty or self.discarded:
                return None
            result = upload(self.path, self._chunks())
            self.dirty = False
            return result

    def discard(self) -> None:
        with self._lock:
            self.discarded = True

    def close(self) -> None:
        with self._lock:
            self._spool.close()
