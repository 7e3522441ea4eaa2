"""Block files of a MEM tier gathered into huge pages.

A MEM tier's block files live in a tmpfs (an emptyDir of medium Memory, /dev/shm), whose
mount keeps file pages 4 KiB each unless it was mounted with `huge=`, which a worker cannot
ask of the kubelet. The kernel copies such pages out to a reader (a short-circuit `pread`, the
data port's `sendfile`) one at a time: 2-3x slower than out of a disk file system's page
cache, whose folios are large, so a block held in memory read slower than the same block in
the page cache of an SSD tier. `madvise(MADV_COLLAPSE)` (Linux 6.1+) over a mapping of the
file asks the kernel to move its pages into 2 MiB folios, whatever the mount says (unless
the node's `shmem_enabled` is `deny`); no privilege is needed. The file's bytes do not change,
only the pages that hold them.

Each new block file of a MEM tier of at least one huge page is collapsed once, after it is
in place, in a thread of its own (never under the store's write lock: a cache fill does not
wait for it), at most PENDING_MAX waiting; a kernel that refuses (no MADV_COLLAPSE, a file
system without huge pages) is told once and asked no more. A collapse that finds no free huge
page (EAGAIN, ENOMEM) is tried twice more, then leaves the file as it is.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger(__name__)

MADV_COLLAPSE = 25  # include/uapi/asm-generic/mman-common.h
MAP_FIXED = 0x10
PENDING_MAX = 64
# A collapse that met a passing condition (no free huge page until memory is compacted, a
# page locked) is tried again after RETRY_PAUSE seconds, ATTEMPTS times in all.
TRANSIENT = (errno.EAGAIN, errno.ENOMEM, errno.EBUSY)
ATTEMPTS = 3
RETRY_PAUSE = 0.2


def huge_page_size() -> int:
    """The size of a PMD huge page (2 MiB on x86-64 and arm64 with 4 KiB pages)."""
    try:
        return int(Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 2 * 1024 * 1024


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_FAILED = ctypes.c_void_p(-1).value


def mapped_aligned(fd: int, length: int, huge: int) -> tuple[int, int]:
    """Map the first `length` bytes of `fd` read-only at an address aligned to `huge` (the
    kernel maps a file's huge folio with one page-table entry only there): (the address of
    the file's bytes, the start of the reservation to unmap, `length + huge` bytes)."""
    reserved = _libc.mmap(None, length + huge, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if reserved in (None, _FAILED):
        raise OSError(ctypes.get_errno(), "mmap of an address range")
    at = (reserved + huge - 1) // huge * huge
    if _libc.mmap(at, length, mmap.PROT_READ, mmap.MAP_SHARED | MAP_FIXED, fd, 0) in (None, _FAILED):
        err = ctypes.get_errno()
        _libc.munmap(reserved, length + huge)
        raise OSError(err, "mmap of the file")
    return at, reserved


def unmap(reserved: int, length: int, huge: int) -> None:
    _libc.munmap(reserved, length + huge)


def collapse(path: Path, huge: int) -> int:
    """Move the pages of the file's whole huge pages into huge folios; the bytes so held.
    OSError as madvise or mmap raised it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        length = os.fstat(fd).st_size // huge * huge
        if not length:
            return 0
        at, reserved = mapped_aligned(fd, length, huge)
        try:
            if _libc.madvise(at, length, MADV_COLLAPSE) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
        finally:
            unmap(reserved, length, huge)
        return length
    finally:
        os.close(fd)


class HugePages:
    """Collapses block files into huge pages in the background; see the module docstring."""

    def __init__(self) -> None:
        self.huge = huge_page_size()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="huge-pages")
        self._lock = threading.Lock()
        self._pending = 0
        self._refused = False
        self.collapsed_bytes = 0  # held in huge folios by this process's collapses

    def submit(self, path: Path, length: int) -> None:
        """Have the block file at `path` (`length` bytes) collapsed soon; nothing when it is
        smaller than a huge page, the kernel refused before, or PENDING_MAX wait already."""
        if length < self.huge or self._refused:
            return
        with self._lock:
            if self._pending >= PENDING_MAX:
                return
            self._pending += 1
        try:
            self._pool.submit(self._collapse, path)
        except RuntimeError:  # shut down
            with self._lock:
                self._pending -= 1

    def _collapse(self, path: Path) -> None:
        try:
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    self.collapsed_bytes += collapse(path, self.huge)
                    return
                except OSError as exc:
                    if exc.errno not in TRANSIENT or attempt == ATTEMPTS:
                        raise
                time.sleep(RETRY_PAUSE)
        except FileNotFoundError:
            pass  # evicted or moved meanwhile
        except OSError as exc:
            if exc.errno in TRANSIENT:
                log.debug("no huge pages for %s now: %s", path, exc)
            else:
                self._refused = True
                log.info("the MEM tier's block files stay in 4 KiB pages: the kernel refused to gather %s "
                         "into huge pages (%s); reads of them copy out slower than from a disk's page cache",
                         path, exc)
        finally:
            with self._lock:
                self._pending -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
