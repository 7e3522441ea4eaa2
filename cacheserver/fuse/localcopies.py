"""Whole local copies of the files a read-only mount reads, which the kernel reads itself
(FUSE passthrough, Linux 6.9+): `strata fuse --read-only --passthrough DIR:SIZE`.

A read through a FUSE mount's page cache is a copy out of 4 KiB pages, a fifth to a third
slower than a read of a local file, whose pages the kernel keeps in large folios. An OPEN
answered with FOPEN_PASSTHROUGH and a backing file has the kernel read that file instead:
its page cache, its readahead, no request to this process. The kernel passes a file through
to one backing file at the same offsets, and the worker keeps a file as one file per block;
so the pages the FUSE process answers a file's version with (each chunk checked against the
block's CRC-32C on its way from the worker, as every read is) are also written into a copy of
it in DIR, at their offsets. A file read whole that way (its first read, cold or warm) has its
copy complete; one read in part (a Parquet file's columns) has the rest read from the worker
on this node when the reader closes it, once every block of it is there (the master's word:
a copy never fetches from the store). Later opens of that version pass through to the copy.

- Checked at open: a copy is written from checked bytes only, and each open that would pass it
  through first looks at its file (inode, size, times): a file written to since it was made
  (or last read back) is read back whole, each piece's CRC-32C compared with the one summed
  as it was written (a copy written out of order, its gaps read at close: read back once it
  is whole, about 0.2 s a GiB; a copy changed before then cannot be checked); a copy that
  differs is removed and the open reads through the page cache. The
  copy is registered with the kernel (FUSE_DEV_IOC_BACKING_OPEN) once, at the first open that
  passes it through. The check runs on a thread of its own: an open waits for it CHECK_WAIT
  seconds at most, and while a check has run longer than that (the copies' disk does not
  answer) opens read through the page cache without waiting. What the kernel reads from the
  copy is not checked again, as a local file's bytes are not: the copy is in the FUSE
  process's own folder (mode 0600 in a 0700 folder), written once.
- Bounded: copies take at most SIZE bytes of DIR; a new copy evicts the least recently
  opened copies no file is open on (their id let go of, their file removed), copies being
  filled included; a file too big for the room is not copied. What a copy being filled holds
  in memory is a bit a page (which pages it has): 32 KiB a GiB.
- One way per file at a time: the kernel fails an open (EIO) that would mix passthrough with
  the page cache, or two backing files, on one file. While a file is open through the page
  cache, its opens stay there; while open passed through, its opens pass through to the same
  copy; an open of another version of it meanwhile (the file changed in the store) fails
  with EIO until those close, said in the log.
- The kernel cannot keep a file's pages while it is open passed through: an open that passes
  through drops them, one to two tenths of a second a GiB on the opener's time (the warm read
  right after a cold one was a third slower than the next). So once a copy is whole and no
  file is open on its path through the page cache, the writing thread has the kernel drop
  those pages (FUSE_NOTIFY_INVAL_INODE), and the next open finds none.
- A second read right after the first: when a reader closes a file it read whole, the last of
  its pages are still on their way to the copy (WRITES_BYTES at most). An open then waits for
  the copy (FINISH_WAIT at most; a fraction of a second) and passes through, instead of
  reading the whole file through the page cache once more. The copy's pages are written out
  to its disk as they come (WRITE_OUT at a time), so its end does not wait for a GiB of them.
- A version is never changed: a file changed in the store is a new version, copied anew.
- A successor process (the mount kept across a restart, see mountkeeper.py) starts with no
  copies: it lets go of the ids its predecessor registered (their names carry them) and
  removes their files; files the kernel opened through them read on. An open of a file the
  predecessor passed through that is still open fails (EIO) until those opens close.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

from strata.contract.proto import strata_pb2 as pb
from .interface import FuseError

log = logging.getLogger("strata.fuse")
_libc = ctypes.CDLL(None, use_errno=True)
_libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]

# Files smaller than this are not copied: a read of a few pages gains nothing from passthrough.
MIN_BYTES = 1024 * 1024
# Bytes of a copy checked at a time (one CRC-32C each).
PIECE = 4 * 1024 * 1024
# Copies waiting for the copying thread, at most; one past it is finished later.
PENDING = 64
PAGE = 4096
# Bytes of checked pages waiting to be written into copies, at most: a read past it leaves
# its pages out (read from the worker at the file's close). A read never waits for the
# copies' disk.
WRITES_BYTES = 64 * 1024 * 1024
CLOSE = -1  # a copy was dropped: its file is closed
READ_DONE = -2  # a file read in part was closed: its copy's gaps are read
PAGES = -3  # a file whose copy is whole was closed: the kernel drops its pages, if none is open through them
# Seconds a version whose blocks were not all on this node is not asked about again, and how
# many such versions are remembered.
ELSEWHERE_FOR = 5.0
ELSEWHERE = 1024
# Seconds an open waits for its copy's check (the copies' disk); past it, and while a check
# has run that long, opens read through the page cache.
CHECK_WAIT = 2.0
# Seconds an open waits for a copy whose every page the reads gave, still being written (the
# pages queued for the writing thread, WRITES_BYTES at most): then it passes through. A copy
# not whole by then is not waited for again (the disk is slow): its opens read through the
# page cache until it is.
FINISH_WAIT = 1.0
# Bytes written into a copy after which their write-out to the disk is started (the copy is
# not synced: it is a cache, and a successor removes the copies; see _write).
WRITE_OUT = 32 * 1024 * 1024
SYNC_FILE_RANGE_WRITE = 2  # sync_file_range(2): start writing out the dirty pages, wait for none
TEMP_SUFFIX = ".tmp"


def copy_name(info: pb.FileInfo) -> str:
    """The name of the copy of `info`'s version (its backing id, once it has one, after a dot)."""
    return hashlib.sha256(f"{info.path}\0{info.version}".encode("utf-8", "surrogateescape")).hexdigest()[:40]


@dataclass
class _Check:
    """An open's request to check a copy, and its answer."""
    done: threading.Event = field(default_factory=threading.Event)
    passed: bool = False


@dataclass
class Copy:
    info: pb.FileInfo
    path: Path
    pieces: list[int] = field(default_factory=list)  # CRC-32C of each PIECE as written (once taken)
    # While it is filled: each PIECE's CRC-32C over its bytes written so far, in order from its
    # start, as (bytes, CRC-32C); (-1, 0) once one came out of order (then read back when whole).
    summed: dict[int, tuple[int, int]] = field(default_factory=dict)
    ready: bool = False  # written whole and named
    fd: int = -1  # its temporary file while it is filled (-1: none): the writing thread's alone
    filling: bool = True  # pages are still written into it
    dropped: bool = False  # evicted or failed: the writing thread closes its file
    covered: Pages = field(default_factory=lambda: Pages(0))  # the PAGEs written
    left: int = 0  # pages not written yet
    given: Pages = field(default_factory=lambda: Pages(0))  # the PAGEs the reads gave to be written
    ungiven: int = 0  # pages no read gave yet
    late: bool = False  # an open waited FINISH_WAIT for it to be whole in vain: none waits again
    unwritten: int = 0  # bytes written into its file since their write-out was last started
    queued: bool = False  # waiting for the copying thread (its gaps filled, or its pieces' CRC-32C taken)
    backing_id: int = 0  # the kernel's id of it (0: not registered)
    stamp: tuple[int, ...] = ()  # its file's identity and times when last checked
    opens: int = 0  # files the kernel opened passed through to it

    @property
    def temp(self) -> Path:
        """Its file while it is filled."""
        return self.path.with_name(self.path.name + TEMP_SUFFIX)


class Pages:
    """A set of page numbers below `count`, a bit each."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._bits = bytearray(-(-count // 8))

    def add(self, first: int, last: int) -> int:
        """Add pages [first, last); how many were not there."""
        if first >= last:
            return 0
        low, high = first // 8, -(-last // 8)
        had = int.from_bytes(self._bits[low:high], "little")
        adding = ((1 << (last - first)) - 1) << (first - low * 8)
        self._bits[low:high] = (had | adding).to_bytes(high - low, "little")
        return (adding & ~had).bit_count()

    def missing(self) -> Iterator[tuple[int, int]]:
        """The runs [first, last) of pages not in the set, in order."""
        absent = ~int.from_bytes(self._bits, "little") & ((1 << self.count) - 1)
        while absent:
            first = (absent & -absent).bit_length() - 1
            run = ((absent >> first) + 1) & ~(absent >> first)  # the lowest page present past the run
            last = first + run.bit_length() - 1
            yield first, last
            absent &= ~((1 << last) - 1)


def _gaps(covered: Pages, length: int) -> list[tuple[int, int]]:
    """The byte ranges (offset, length) of the pages not written yet."""
    return [(first * PAGE, min(last * PAGE, length) - first * PAGE) for first, last in covered.missing()]


def _page_span(offset: int, end: int, length: int) -> tuple[int, int]:
    """The pages [first, last) bytes [offset, end) of a `length`-byte file fill whole (the
    last page of the file counts whole when they reach its end)."""
    return -(-offset // PAGE), -(-end // PAGE) if end == length else end // PAGE


def _start_write_out(fd: int) -> None:
    """Start writing the file's dirty pages out to its disk, without waiting for them."""
    if _libc.sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _pieces(fd: int, length: int) -> Iterator[int]:
    """The CRC-32C of each PIECE of the file `fd`'s first `length` bytes."""
    for offset in range(0, length, PIECE):
        yield crc32c(os.pread(fd, PIECE, offset))


def _sum_pieces(summed: dict[int, tuple[int, int]], offset: int, data: memoryview) -> None:
    """Carry on the CRC-32C of the PIECEs that bytes `data` at `offset` of a copy fall in (see
    Copy.summed)."""
    at = 0
    while at < len(data):
        index, start = divmod(offset + at, PIECE)
        take = min(PIECE - start, len(data) - at)
        done, value = summed.get(index, (0, 0))
        summed[index] = (done + take, crc32c(data[at:at + take], value)) if done == start else (-1, 0)
        at += take


def _whole_sums(summed: dict[int, tuple[int, int]], length: int) -> list[int]:
    """The CRC-32C of every PIECE of a `length`-byte copy, if each was summed whole; else []."""
    count = -(-length // PIECE)
    sums = []
    for index in range(count):
        done, value = summed.get(index, (-1, 0))
        if done != min(PIECE, length - index * PIECE):
            return []
        sums.append(value)
    return sums


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    """A file's inode, size and times: a write changes its mtime, any change its ctime."""
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _write_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> int:
    """Write `data` at `offset` whole; the offset after it."""
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        offset += done
        view = view[done:]
    return offset


# The bytes of ranges (offset, length) of a version, checked, as (offset, bytes) pieces.
Reader = Callable[[pb.FileInfo, list[tuple[int, int]]], Iterator[tuple[int, bytes]]]
HeldHere = Callable[[pb.FileInfo], bool]
ReadThroughPages = Callable[[str], bool]


class LocalCopies:
    """The copies in `folder`, `room` bytes at most, of the versions read through this mount
    (`fill`), their gaps read by `read(info, ranges)` once `held_here(info)` (every block of
    the version is on this node's worker). Passthrough starts once `attach` gives it the
    connection's registration (INIT agreed on it); a folder of None: never (no copy is made,
    no open passes through)."""

    def __init__(self, folder: Path | None, room: int, read: Reader, held_here: HeldHere,
                 read_through_pages: ReadThroughPages) -> None:
        """Copies in `folder` (None: none made), `room` bytes at most; `read(info, ranges)`
        reads ranges of a version from this node's worker, `held_here(info)` says whether every
        block of it is on this node, `read_through_pages(path)` whether a file is open on
        `path` through the page cache."""
        self.folder = folder
        self.room = room
        self._read = read
        self._held_here = held_here
        self._read_through_pages = read_through_pages
        self._elsewhere: OrderedDict[str, float] = OrderedDict()  # name: when its blocks were not all here
        self._copies: OrderedDict[str, Copy] = OrderedDict()  # least recently opened first
        self._passing: dict[str, tuple[str, int]] = {}  # path: (copy name, files open passed through)
        self._handles: dict[int, tuple[str, str]] = {}  # file handle opened passed through: its path, copy
        self._used = 0
        self._register: Callable[[int], int] | None = None
        self._unregister: Callable[[int], None] = lambda backing_id: None
        self._drop_pages: Callable[[str], None] = lambda path: None
        self._pending: queue.Queue[str] = queue.Queue(PENDING)
        # Pages to write into copies, WRITES_BYTES at most (and, with no bytes, CLOSE or READ_DONE).
        self._writes: queue.SimpleQueue[tuple[Copy, int, bytes | memoryview]] = queue.SimpleQueue()
        self._waiting = 0  # bytes in _writes
        # The checks of copies at open run on a thread of their own (see usable), one at a time.
        self._checks: queue.SimpleQueue[tuple[str, Copy, _Check]] = queue.SimpleQueue()
        self._checking_since = 0.0  # time.monotonic() when the check under way began (0: none)
        self._lock = threading.Lock()
        self._written = threading.Condition(self._lock)  # _waiting went down
        self._finished = threading.Condition(self._lock)  # a copy was made ready, or dropped

    @property
    def wanted(self) -> bool:
        """Whether this mount passes files through where the kernel can."""
        return self.folder is not None

    def _clear(self, folder: Path, unregister: Callable[[int], None] | None) -> None:
        """Remove the copies an earlier process left, letting go of the ids it registered on
        this connection (`unregister`: a predecessor's; None: another connection's, gone);
        the folder is made if missing."""
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        for entry in folder.iterdir():
            name, _, suffix = entry.name.partition(".")
            if suffix.isdigit() and unregister is not None:
                try:
                    unregister(int(suffix))
                except OSError as exc:
                    log.warning("strata fuse: could not let go of backing file %s: %s", entry, exc)
            entry.unlink(missing_ok=True)

    def attach(self, register: Callable[[int], int], unregister: Callable[[int], None],
               drop_pages: Callable[[str], None], *, resumed: bool) -> None:
        """Passthrough was agreed (`resumed`: by the predecessor whose connection this process
        took over): copies are made and registered from now on, what an earlier process left
        in the folder cleared first. `drop_pages(path)` has the kernel drop the pages it holds
        of a file (see _pages_passed)."""
        if self.folder is None:
            return
        self._clear(self.folder, unregister if resumed else None)
        self._register, self._unregister, self._drop_pages = register, unregister, drop_pages
        threading.Thread(target=self._copy_pending, name="strata-fuse-copies", daemon=True).start()
        threading.Thread(target=self._write_pending, name="strata-fuse-copy-writes", daemon=True).start()
        threading.Thread(target=self._check_pending, name="strata-fuse-copy-checks", daemon=True).start()

    # -- opens -------------------------------------------------------------------------------------

    def usable(self, info: pb.FileInfo) -> Copy | None:
        """The copy of `info`'s version an open may pass through to: written, checked and
        registered (each once), and kept for the open until `opened` or `unused`; None
        otherwise (the open's reads fill one)."""
        if self._folder_for(info) is None:
            return None
        name = copy_name(info)
        with self._lock:
            copy = self._copies.get(name)
            if copy is not None and self._finishing_locked(copy):
                # Its reads gave every page (a file read whole, just closed): passed through
                # once they are written, in a fraction of a second.
                if not self._finished.wait_for(lambda: copy.ready or self._copies.get(name) is not copy,
                                               FINISH_WAIT):
                    copy.late = True
                    log.warning("strata fuse: the copy of %s was not written within %gs (its disk is slow?): "
                                "its opens read through the page cache until it is", info.path, FINISH_WAIT)
            if copy is None or not copy.ready or self._copies.get(name) is not copy:
                return None
            if self._disk_hangs_locked():
                return None
            copy.opens += 1  # not evicted meanwhile
        check = _Check()
        self._checks.put((name, copy, check))
        if check.done.wait(CHECK_WAIT) and check.passed:
            return copy
        if not check.done.is_set():
            log.warning("strata fuse: the check of the copy of %s took more than %gs (its disk does not answer?): "
                        "opens read through the page cache until it ends", info.path, CHECK_WAIT)
        self.unused(copy)
        return None

    @staticmethod
    def _finishing_locked(copy: Copy) -> bool:
        """Whether `copy` is not ready yet but will be without another read: every page given,
        some still on their way to its file."""
        return not copy.ready and not copy.ungiven and not copy.late and not copy.dropped

    def _disk_hangs_locked(self) -> bool:
        """Whether the copies' disk does not answer: said by a check that has waited for it
        longer than CHECK_WAIT (until it ends, nothing else is asked of that disk on a thread
        that answers requests)."""
        since = self._checking_since
        return bool(since) and time.monotonic() - since > CHECK_WAIT

    def _check_pending(self) -> None:
        """The checking thread: a copy's file is looked at (and read back, if it changed) here,
        so an open whose copies' disk hangs waits CHECK_WAIT seconds at most, once."""
        while True:
            name, copy, check = self._checks.get()
            with self._lock:
                self._checking_since = time.monotonic()
            try:
                check.passed = self._check_and_register(name, copy)
            except Exception as exc:  # noqa: BLE001 - the open reads through the page cache instead
                log.warning("strata fuse: the copy of %s could not be checked: %s", copy.info.path, exc)
                self._drop(name, copy)
            finally:
                with self._lock:
                    self._checking_since = 0.0
                check.done.set()

    def fill(self, info: pb.FileInfo, offset: int, data: bytes | memoryview) -> None:
        """Bytes of version `info` at `offset`, checked, that a read through the page cache
        gave: written into its copy (begun if there is none and it fits)."""
        folder = self._folder_for(info)
        if folder is None or not data:
            return
        name = copy_name(info)
        with self._lock:
            copy = self._copies.get(name)
            if copy is None:
                copy = self._begin_locked(folder, name, info)
            if copy is None or not copy.filling or self._waiting + len(data) > WRITES_BYTES:
                return
            self._waiting += len(data)
            copy.ungiven -= copy.given.add(*_page_span(offset, min(offset + len(data), info.length), info.length))
        self._writes.put((copy, offset, data))

    def read_done(self, info: pb.FileInfo) -> None:
        """A file open through the page cache at version `info` was closed: the rest of its
        copy (all of it, if the kernel answered every read from its pages) is read from this
        node's worker; a copy already whole has the kernel drop the file's pages, if no file
        is open through them any more (see _pages_passed)."""
        folder = self._folder_for(info)
        if folder is None:
            return
        name = copy_name(info)
        with self._lock:
            since = self._elsewhere.get(name)
            if since is not None and time.monotonic() - since < ELSEWHERE_FOR:
                return
            copy = self._copies.get(name) or self._begin_locked(folder, name, info)
            if copy is None or not (copy.filling or copy.ready):
                return
            job = READ_DONE if copy.filling else PAGES
        self._writes.put((copy, job, b""))  # after the pages its reads gave are written

    def _folder_for(self, info: pb.FileInfo) -> Path | None:
        """Where a copy of `info` would be kept; None if it is not to be copied (passthrough
        not agreed, or a file too small to gain or too large for the room)."""
        if self._register is None or not MIN_BYTES <= info.length <= self.room:
            return None
        return self.folder

    def unused(self, copy: Copy) -> None:
        """The open `usable` kept `copy` for did not pass through to it."""
        with self._lock:
            copy.opens -= 1

    def passing(self, path: str) -> str | None:
        """The name of the copy files open on `path` are passed through to (None: none is)."""
        with self._lock:
            held = self._passing.get(path)
            return held[0] if held else None

    def opened(self, fh: int, copy: Copy) -> None:
        """Handle `fh` was opened passed through to `copy` (kept for it by `usable`)."""
        name = copy_name(copy.info)
        with self._lock:
            self._copies.move_to_end(name)
            held = self._passing.get(copy.info.path, (name, 0))
            self._passing[copy.info.path] = (name, held[1] + 1)
            self._handles[fh] = (copy.info.path, name)

    def read_ahead(self, fh: int, offset: int, size: int) -> bool:
        """Whether `fh` is open passed through: then a read of it is only ever a readahead
        hint (posix_fadvise WILLNEED, readahead(2)), which the kernel turns into reads for its
        own page cache of the file, a cache no read of a file passed through uses. The hint is
        given to the copy the kernel reads instead."""
        with self._lock:
            held = self._handles.get(fh)
            if held is None:
                return False
            copy = self._copies.get(held[1])
            # None: removed (evicted) since, the kernel holds it open still; or its disk hangs
            path = copy.path if copy is not None and not self._disk_hangs_locked() else None
        if path is not None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.posix_fadvise(fd, offset, size, os.POSIX_FADV_WILLNEED)
                finally:
                    os.close(fd)
            except OSError:
                pass  # a hint: renamed by its registration meanwhile, or its disk failing
        return True

    def released(self, fh: int) -> None:
        with self._lock:
            held = self._handles.pop(fh, None)
            if held is None:
                return
            path, name = held
            copy = self._copies.get(name)
            if copy is not None:
                copy.opens -= 1
            count = self._passing[path][1]
            if count > 1:
                self._passing[path] = (name, count - 1)
            else:
                del self._passing[path]

    @staticmethod
    def conflict(path: str) -> FuseError:
        """An open of `path` at another version than the files open on it passed through."""
        log.warning("strata fuse: %s changed in the store while open passed through to its copy of the older "
                    "version: opens of it fail until those files are closed", path)
        return FuseError(errno.EIO)

    # -- copies ------------------------------------------------------------------------------------

    def _begin_locked(self, folder: Path, name: str, info: pb.FileInfo) -> Copy | None:
        """A new copy of `info` to fill (None if it does not fit); its file is made by the
        writing thread."""
        if not self._make_room(info.length):
            return None
        pages = -(-info.length // PAGE)
        copy = Copy(info, folder / name, covered=Pages(pages), left=pages, given=Pages(pages), ungiven=pages)
        self._copies[name] = copy
        self._used += info.length
        return copy

    def _write_pending(self) -> None:
        """The writing thread: pages into copies, and each copy made whole named."""
        while True:
            copy, offset, data = self._writes.get()
            with self._lock:
                self._waiting -= len(data)
                self._written.notify_all()
            try:
                self._write(copy, offset, data)
            except OSError as exc:
                log.warning("strata fuse: no local copy of %s for passthrough: %s", copy.info.path, exc)
                with self._lock:
                    if self._copies.get(copy_name(copy.info)) is copy:
                        self._drop_locked(copy_name(copy.info))
                self._close(copy)

    def _write(self, copy: Copy, offset: int, data: bytes | memoryview) -> None:
        if offset == PAGES:
            self._pages_passed(copy.info.path)
            return
        if offset == READ_DONE:
            with self._lock:
                if copy.filling:
                    self._enqueue_locked(copy_name(copy.info), copy)
            return
        if copy.dropped or offset == CLOSE:
            self._close(copy)
            return
        temp = copy.temp
        if copy.fd < 0:
            copy.fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            os.ftruncate(copy.fd, copy.info.length)
        end = min(offset + len(data), copy.info.length)
        if offset >= end:
            return
        written = memoryview(data)[:end - offset]
        _write_all(copy.fd, written, offset)
        _sum_pieces(copy.summed, offset, written)
        # Its pages written out as they come, not left dirty: the kernel would write a GiB of
        # them out seconds later, while the copy is read passed through, and those reads slow
        # down (aggregation 1 GiB warm: 0.31-0.72 s with dirty copies, 0.31-0.41 with written
        # ones); nor all at once when it is whole, which an open waiting for it would wait out.
        copy.unwritten += end - offset
        if copy.unwritten >= WRITE_OUT:
            _start_write_out(copy.fd)
            copy.unwritten = 0
        with self._lock:
            if copy.dropped:  # its file was removed meanwhile, perhaps after this opened it anew
                temp.unlink(missing_ok=True)
                return
            copy.left -= copy.covered.add(*_page_span(offset, end, copy.info.length))
            if copy.left or copy.dropped:
                return
            copy.filling = False
        # Whole: named, and ready for the next open (written from checked bytes: sound while its
        # file is not written to, see _check_and_register). The CRC-32C of its pieces, for a
        # later check, were summed as it was written; a copy written out of order has them
        # taken by the copying thread (reading it back whole, at the time of the next reads).
        pieces = _whole_sums(copy.summed, copy.info.length)
        copy.summed = {}
        _start_write_out(copy.fd)
        self._close(copy)
        os.rename(temp, copy.path)
        stamp = _stamp(os.stat(copy.path))
        name = copy_name(copy.info)
        # The kernel's pages of the file are dropped before the copy is ready, so the open that
        # passes through first (perhaps waiting for it, see usable) does not drop them itself.
        self._pages_passed(copy.info.path)
        with self._lock:
            self._finished.notify_all()
            if self._copies.get(name) is not copy:  # dropped meanwhile
                copy.path.unlink(missing_ok=True)
                return
            copy.ready, copy.stamp, copy.covered, copy.given, copy.pieces = True, stamp, Pages(0), Pages(0), pieces
            if not pieces:
                self._enqueue_locked(name, copy)
        log.info("strata fuse: copied %s (%.0f MiB): its next open passes it through", copy.info.path,
                 copy.info.length / 2**20)

    def _pages_passed(self, path: str) -> None:
        """The copy of `path` is whole: its next open passes through, and the kernel drops the
        pages it holds of the file at that open (an open that passes through cannot keep them),
        on the opener's time: one to two tenths of a second a GiB. They are dropped now
        instead, by this thread, unless a file is still open on `path` through them (then at
        its close, see read_done)."""
        if not self._read_through_pages(path):
            self._drop_pages(path)

    @staticmethod
    def _close(copy: Copy) -> None:
        if copy.fd >= 0:
            os.close(copy.fd)
            copy.fd = -1

    def _enqueue_locked(self, name: str, copy: Copy) -> None:
        if copy.queued:
            return
        try:
            self._pending.put_nowait(name)
        except queue.Full:
            return  # finished at a later close
        copy.queued = True

    def _make_room(self, length: int) -> bool:
        """Evict the least recently opened copies no file is open on until `length` more bytes
        fit; False if they cannot. Called with the lock held."""
        for name in list(self._copies):
            if self._used + length <= self.room:
                break
            if self._copies[name].opens == 0:
                self._drop_locked(name)
        return self._used + length <= self.room

    def _drop_locked(self, name: str) -> None:
        copy = self._copies.pop(name)
        self._used -= copy.info.length
        self._finished.notify_all()
        if copy.backing_id:
            try:
                self._unregister(copy.backing_id)
            except OSError as exc:
                log.warning("strata fuse: could not let go of the backing file of %s: %s", copy.info.path, exc)
        if copy.filling:  # the writing thread closes its file
            copy.dropped, copy.filling = True, False
            self._writes.put((copy, CLOSE, b""))
        copy.temp.unlink(missing_ok=True)
        copy.path.unlink(missing_ok=True)

    def _copy_pending(self) -> None:
        while True:
            name = self._pending.get()
            with self._lock:
                copy = self._copies.get(name)
                if copy is None:
                    continue
                copy.queued = False
            try:
                if copy.ready:
                    self._take_pieces(name, copy)
                else:
                    self._fill_gaps(name, copy)
            except Exception as exc:  # noqa: BLE001 - the file is read through the page cache instead
                log.warning("strata fuse: no local copy of %s for passthrough: %s", copy.info.path, exc)
                with self._lock:
                    if self._copies.get(name) is copy:
                        self._drop_locked(name)

    def _take_pieces(self, name: str, copy: Copy) -> None:
        """The CRC-32C of each piece of a whole copy, as it was written (its file unchanged)."""
        while True:
            with self._lock:
                path = copy.path
            try:
                file = open(path, "rb", buffering=0)  # noqa: SIM115 - closed below
                break
            except FileNotFoundError:
                with self._lock:
                    if copy.path == path:  # removed, not renamed by its registration meanwhile
                        raise
        with file:
            stamp = _stamp(os.fstat(file.fileno()))
            pieces = list(_pieces(file.fileno(), copy.info.length))
        with self._lock:
            # Not written to since it was named (its registration's rename changes its ctime alone).
            if self._copies.get(name) is copy and copy.stamp[:3] == stamp[:3]:
                copy.pieces = pieces

    def _fill_gaps(self, name: str, copy: Copy) -> None:
        """Read the pages of a copy not written yet from this node's worker, if every block of
        the version is there (the copy is then whole)."""
        with self._lock:
            if not copy.filling:
                return
            gaps = _gaps(copy.covered, copy.info.length)
        if not self._held_here(copy.info):
            with self._lock:
                self._elsewhere[name] = time.monotonic()
                self._elsewhere.move_to_end(name)
                while len(self._elsewhere) > ELSEWHERE:
                    self._elsewhere.popitem(last=False)
            return
        for offset, data in self._read(copy.info, gaps):
            with self._lock:
                while self._waiting + len(data) > WRITES_BYTES and self._waiting:
                    self._written.wait()
                if not copy.filling:
                    return  # evicted meanwhile
                self._waiting += len(data)
            self._writes.put((copy, offset, data))

    def _check_and_register(self, name: str, copy: Copy) -> bool:
        """Register the copy with the kernel, once; a copy whose file changed since it was
        written or last checked (a write to it changes its times) is first read back against
        its pieces' CRC-32C. False (the copy removed) if it cannot pass through."""
        try:
            fd = os.open(copy.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("strata fuse: the copy of %s is gone (%s): read through the page cache", copy.info.path, exc)
            self._drop(name, copy)
            return False
        try:
            stamp = _stamp(os.fstat(fd))
            with self._lock:
                unchanged = copy.stamp == stamp
                if unchanged and copy.backing_id:
                    return True
            if not unchanged:
                bad = self._first_bad_piece(fd, copy) if copy.pieces else 0  # changed before its pieces were taken
                if bad is not None:
                    log.warning("strata fuse: the copy of %s failed its check at byte %d: removed, the file is "
                                "read through the page cache", copy.info.path, bad)
                    self._drop(name, copy)
                    return False
            with self._lock:
                if self._register is None or self._copies.get(name) is not copy:
                    return False
                if copy.backing_id:  # registered before, and read back now
                    copy.stamp = stamp
                    return True
                try:
                    copy.backing_id = self._register(fd)
                except OSError as exc:
                    log.warning("strata fuse: the kernel refused %s as a backing file (%s): no passthrough on "
                                "this mount", copy.path, exc)
                    self._register = None
                    return False
                path = copy.path
            # Named by its id, so a successor lets go of it (see the module docstring); renamed
            # outside the lock, which the reads' page writes take (this disk may be slow).
            registered = path.with_name(f"{name}.{copy.backing_id}")
            os.rename(path, registered)
            with self._lock:
                copy.path, copy.stamp = registered, _stamp(os.fstat(fd))
            return True
        finally:
            os.close(fd)

    @staticmethod
    def _first_bad_piece(fd: int, copy: Copy) -> int | None:
        size = os.fstat(fd).st_size
        if size != copy.info.length:
            return min(size, copy.info.length)
        for index, (found, expected) in enumerate(zip(_pieces(fd, size), copy.pieces)):
            if found != expected:
                return index * PIECE
        return None

    def _drop(self, name: str, copy: Copy) -> None:
        """Remove a copy that failed: no later open passes through to it (files the kernel
        opened through it before read on; opens of the file fail until they close)."""
        with self._lock:
            if self._copies.get(name) is copy:
                self._drop_locked(name)

    def close(self) -> None:
        """Remove every copy: the connection ended, and its ids with it."""
        with self._lock:
            self._register, self._unregister = None, lambda backing_id: None
            for name in list(self._copies):
                self._drop_locked(name)
