"""The answer to each kind of request of a FUSE session (see session.py), by the operations of
interface.py.

- Node ids come from a NodeTable (nodes.py), which a successor process replays; file handles
  carry whether they were opened for writing in their lowest bit, so a successor that does
  not know a handle can tell a read (opened again from the node's path) from a write (its
  buffered bytes died with the process: that call fails with EIO and the file keeps its
  last committed content).
- The kernel acts on the size of a file it was last told: an open of a file that changed
  since has it forget that first (see kernelattrs.py), and a write of a file opened with O_APPEND
  goes to the end of the open file, wherever the kernel places it.
- Reads of files the kernel opened without asking read their node's pin (see pins.py).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic

from . import kernel, wire
from .interface import MAX_IO, UTIME_NOW, UTIME_OMIT, FileInfo, FuseError, Operations, S
from .nodes import NodeTable
from .pins import Pins
from .kernelattrs import KernelAttrs

log = logging.getLogger("strata.fuse")

# What Strata asks for at INIT (see wire.py): parallel reads of one file, O_TRUNC at open,
# 1 MiB requests, the page cache dropped when a file's size or time changes.
WANT = (wire.ASYNC_READ | wire.ATOMIC_O_TRUNC | wire.BIG_WRITES | wire.AUTO_INVAL_DATA | wire.ASYNC_DIO
        | wire.PARALLEL_DIROPS | wire.MAX_PAGES)

Payload = Sequence[bytes | memoryview]


@dataclass(frozen=True)
class Showing:
    """A reply that gives the kernel the attributes of node `nodeid` (see kernelattrs.py)."""
    payload: Payload
    nodeid: int
    attr: wire.Attr


Handler = Callable[[wire.InHeader, memoryview], Payload | Showing | None]


def child(parent: str, name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise FuseError(errno.EINVAL)
    return "/" + name if parent == "/" else f"{parent}/{name}"


def attr_of(st: dict[str, Any]) -> wire.Attr:
    return wire.Attr(ino=st.get("st_ino", 0), mode=st["st_mode"], size=st.get("st_size", 0),
                     nlink=st.get("st_nlink", 1), uid=st.get("st_uid", 0), gid=st.get("st_gid", 0),
                     mtime_ns=st.get("st_mtime", 0), blksize=st.get("st_blksize", 4096))


def xattr_reply(value: bytes, size: int) -> Payload:
    """getxattr/listxattr: the length when asked for it (size 0), ERANGE when it does not fit."""
    if size == 0:
        return [wire.XATTR_OUT.pack(len(value), 0)]
    if len(value) > size:
        raise FuseError(errno.ERANGE)
    return [value]


class Handlers(Generic[S]):
    """The request handlers of a Session (which sets what is declared here)."""

    fd: int
    ops: Operations[S]
    nodes: NodeTable
    timeout: float
    read_only: bool
    root: str
    _on_init: Callable[[wire.InitReply], None]
    kernel_attrs: KernelAttrs
    kernel_opens: bool
    kernel_lists: bool
    pins: Pins[S]
    _dirs: dict[int, wire.Dirents]
    _dir_ids: Iterator[int]
    _lock: threading.Lock

    # -- notifications ------------------------------------------------------------------------

    def _invalidate(self, nodeid: int, path: str) -> None:
        """Have the kernel forget the attributes it holds of `nodeid` (see kernelattrs.py)."""
        try:
            os.write(self.fd, wire.inval_attributes_notification(nodeid))
        except OSError as exc:
            # ENOENT: the kernel holds no inode of that node, so nothing to forget.
            # ENODEV: the mount is gone, and nobody reads through it.
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                log.error("strata fuse: the kernel cannot forget the size of %s it holds: %s", path, exc)
                raise FuseError(errno.EIO) from exc

    def _invalidate_data(self, nodeid: int, path: str) -> None:
        """Have the kernel drop the pages and attributes it holds of `nodeid`."""
        try:
            os.write(self.fd, wire.inval_data_notification(nodeid))
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENODEV):  # see _invalidate
                log.error("strata fuse: the kernel cannot drop the pages of %s it holds: %s", path, exc)
                raise FuseError(errno.EIO) from exc

    def _drop_pages(self, path: str) -> None:
        """Have the kernel drop the pages it holds of `path` if it holds its node (never called
        while answering a request: the kernel waits for reads of those pages in flight)."""
        nodeid = self.nodes.node_id(path)
        if nodeid is not None:
            with contextlib.suppress(FuseError):  # said by _invalidate_data
                self._invalidate_data(nodeid, path)

    # -- helpers ------------------------------------------------------------------------------

    def _path(self, header: wire.InHeader) -> str:
        path = self.nodes.path(header.nodeid)
        if path is None:
            raise FuseError(errno.ESTALE if header.nodeid not in self.nodes else errno.ENOENT)
        return path

    def _entry(self, path: str, fi: FileInfo | None = None, *, then: Payload = ()) -> Showing:
        """An entry reply for `path` (followed by `then`), counted as a lookup of its node."""
        attr = attr_of(self.ops.getattr(path, fi))
        nodeid = self.nodes.lookup(path)
        if self.kernel_opens:
            self.pins.pin(nodeid, path)
        return Showing([wire.entry_out(nodeid, attr, self.timeout), *then], nodeid, attr)

    def _attr(self, header: wire.InHeader, path: str, fi: FileInfo | None) -> Showing:
        attr = attr_of(self.ops.getattr(path, fi))
        if self.kernel_opens:
            self.pins.pin(header.nodeid, path)
        return Showing([wire.attr_out(attr, self.timeout)], header.nodeid, attr)

    def _ok(self, header: wire.InHeader, body: memoryview) -> Payload:
        return []

    def _ignore(self, header: wire.InHeader, body: memoryview) -> None:
        return None

    # -- session ------------------------------------------------------------------------------

    def _init(self, header: wire.InHeader, body: memoryview) -> Payload:
        wanted = self.ops.passes_through()
        reply = wire.negotiate(body, WANT | (wire.PASSTHROUGH if wanted else 0), MAX_IO)
        if reply.flags & wire.PASSTHROUGH:
            self.pass_through(resumed=False)
        elif wanted:
            log.warning("strata fuse: this kernel passes no files through (Linux 6.9+ built with "
                        "CONFIG_FUSE_PASSTHROUGH can): files are read through the page cache")
        self._on_init(reply)
        log.info("strata fuse: %s ready (FUSE %d.%d, metadata timeout %.1fs%s)", self.root, reply.major,
                 reply.minor, self.timeout, ", read-only" if self.read_only else "")
        return [reply.pack()]

    def pass_through(self, *, resumed: bool) -> None:
        """Opens may hand the kernel a local file to read (agreed at INIT, by this process or,
        `resumed`, the predecessor whose connection it took over)."""
        self.ops.pass_through(functools.partial(kernel.backing_open, self.fd),
                              functools.partial(kernel.backing_close, self.fd), self._drop_pages, resumed=resumed)

    def _destroy(self, header: wire.InHeader, body: memoryview) -> Payload:
        self.ops.commit_all()
        return []

    # -- names --------------------------------------------------------------------------------

    def _lookup(self, header: wire.InHeader, body: memoryview) -> Showing:
        return self._entry(child(self._path(header), wire.names(body, 1)[0]))

    def _forget(self, header: wire.InHeader, body: memoryview) -> None:
        self.nodes.forget(header.nodeid, wire.FORGET_IN.unpack_from(body)[0])
        self._forgotten([header.nodeid])

    def _batch_forget(self, header: wire.InHeader, body: memoryview) -> None:
        count = wire.BATCH_FORGET_IN.unpack_from(body)[0]
        start = wire.BATCH_FORGET_IN.size
        items = [wire.FORGET_ONE.unpack_from(body, start + i * wire.FORGET_ONE.size) for i in range(count)]
        self.nodes.forget_many(items)
        self._forgotten([nodeid for nodeid, _ in items])

    def _forgotten(self, nodeids: list[int]) -> None:
        for nodeid in nodeids:
            if nodeid not in self.nodes:
                self.kernel_attrs.forget(nodeid)
                self.pins.forget(nodeid)

    def _getattr(self, header: wire.InHeader, body: memoryview) -> Showing:
        flags, _, fh = wire.GETATTR_IN.unpack_from(body)
        fi = FileInfo(fh=fh) if flags & wire.GETATTR_FH else None
        path = self.nodes.path(header.nodeid)
        if path is None and (fi is None or not self.ops.has_handle(fi.fh)):
            path = self._path(header)  # raises
        return self._attr(header, path or "/", fi)

    def _setattr(self, header: wire.InHeader, body: memoryview) -> Showing:
        (valid, _, fh, size, _owner, atime, mtime, _ctime, atimensec, mtimensec, _ctimensec, mode, _, uid, gid,
         _) = wire.SETATTR_IN.unpack_from(body)
        path = self._path(header)
        fi = FileInfo(fh=fh) if valid & wire.FATTR_FH else None
        if fi is not None and self.ops.is_write_handle(fh) and not self.ops.has_handle(fh):
            raise FuseError(errno.EIO)  # ftruncate of a file whose buffered bytes died with the last process
        if valid & wire.FATTR_MODE:
            self.ops.chmod(path, mode)
        if valid & (wire.FATTR_UID | wire.FATTR_GID):
            self.ops.chown(path, uid if valid & wire.FATTR_UID else -1, gid if valid & wire.FATTR_GID else -1)
        if valid & wire.FATTR_SIZE:
            self.ops.truncate(path, size, fi)
        times = wire.FATTR_ATIME | wire.FATTR_MTIME | wire.FATTR_ATIME_NOW | wire.FATTR_MTIME_NOW
        if valid & times:
            def when(now: int, given: int, sec: int, nsec: int) -> int:
                if valid & now:
                    return UTIME_NOW
                return sec * 1_000_000_000 + nsec if valid & given else UTIME_OMIT

            self.ops.utimens(path, (when(wire.FATTR_ATIME_NOW, wire.FATTR_ATIME, atime, atimensec),
                                    when(wire.FATTR_MTIME_NOW, wire.FATTR_MTIME, mtime, mtimensec)))
        return self._attr(header, path, fi)

    def _statfs(self, header: wire.InHeader, body: memoryview) -> Payload:
        st = self.ops.statfs("/")
        return [wire.STATFS_OUT.pack(st["f_blocks"], st["f_bfree"], st["f_bavail"], 0, 0, st["f_bsize"],
                                     st["f_namemax"], st["f_frsize"])]

    # -- files --------------------------------------------------------------------------------

    def _open(self, header: wire.InHeader, body: memoryview) -> Payload:
        flags, _ = wire.OPEN_IN.unpack_from(body)
        if self.kernel_opens:
            raise FuseError(errno.ENOSYS)  # the kernel opens files without asking from now on
        fi = FileInfo(flags=flags)
        path = self._path(header)
        self.ops.open(path, fi)
        if flags & os.O_TRUNC and flags & os.O_ACCMODE != os.O_RDONLY:
            self.kernel_attrs.forget(header.nodeid)  # the kernel sets the size to 0 itself, and asks again
        else:
            try:
                # The open file may be another version than the kernel's attributes describe.
                self.kernel_attrs.ensure(header.nodeid, attr_of(self.ops.getattr(path, fi)),
                                  lambda: self._invalidate(header.nodeid, path))
            except BaseException:
                self.ops.release(path, fi)  # nothing written yet: nothing is uploaded
                raise
        # A file opened for reading has nothing to flush: its close(2) need not wait for an
        # answer from this process.
        reading = flags & os.O_ACCMODE == os.O_RDONLY
        if fi.backing_id:  # the kernel reads the local file: no page cache of its own to keep
            return [wire.open_out(fi.fh, wire.FOPEN_PASSTHROUGH | wire.FOPEN_NOFLUSH, fi.backing_id)]
        return [wire.open_out(fi.fh, (wire.FOPEN_KEEP_CACHE if fi.keep_cache else 0)
                              | (wire.FOPEN_DIRECT_IO if fi.direct_io else 0)
                              | (wire.FOPEN_NOFLUSH if reading else 0))]

    def _create(self, header: wire.InHeader, body: memoryview) -> Showing:
        flags, mode, _umask, _ = wire.CREATE_IN.unpack_from(body)
        path = child(self._path(header), wire.names(body[wire.CREATE_IN.size:], 1)[0])
        fi = FileInfo(flags=flags)
        self.ops.create(path, mode, fi)
        return self._entry(path, fi, then=[wire.open_out(fi.fh, 0)])

    def _known(self, fh: int, path: str | None) -> FileInfo:
        """The open file `fh`; one this process did not open (its predecessor did) is opened
        again if it was opened for reading."""
        if not self.ops.has_handle(fh):
            if self.ops.is_write_handle(fh) or path is None:
                log.warning("strata fuse: a file handle of the previous process (%s) is gone: EIO", path)
                raise FuseError(errno.EIO)
            self.ops.reopen(path, fh)
        return FileInfo(fh=fh)

    def _read(self, header: wire.InHeader, body: memoryview) -> Payload:
        fh, offset, size, *_ = wire.READ_IN.unpack_from(body)
        path = self.nodes.path(header.nodeid)
        if fh == 0 and self.kernel_opens:  # opened by the kernel without asking
            pin = self.pins.pinned(header.nodeid, self._path(header))
            data = self.ops.read_at(pin, size, offset, functools.partial(self.pins.changed, header.nodeid, pin))
        else:
            data = self.ops.read(path or "", size, offset, self._known(fh, path))
        if len(data) < size:
            self.kernel_attrs.read_short(header.nodeid, offset + len(data))
        return [data]

    def _write(self, header: wire.InHeader, body: memoryview) -> Payload:
        fh, offset, size, write_flags, _owner, flags, _ = wire.WRITE_IN.unpack_from(body)
        data = body[wire.WRITE_IN.size:wire.WRITE_IN.size + size]
        path = self.nodes.path(header.nodeid)
        fi = self._known(fh, path)
        self.kernel_attrs.forget(header.nodeid)  # the kernel sets the size it holds itself
        if flags & os.O_APPEND and not write_flags & wire.WRITE_CACHE:
            # At the end of the open file: the kernel places it at the size it holds, which
            # may be older than the file this handle opened.
            written = self.ops.append(path or "", data, fi)
        else:
            written = self.ops.write(path or "", data, offset, fi)
        return [wire.WRITE_OUT.pack(written, 0)]

    def _flush(self, header: wire.InHeader, body: memoryview) -> Payload:
        fh = wire.FLUSH_IN.unpack_from(body)[0]
        if self.read_only:
            raise FuseError(errno.ENOSYS)  # nothing is written: the kernel sends no FLUSH from now on
        if not self.ops.has_handle(fh):
            if self.ops.is_write_handle(fh):
                raise FuseError(errno.EIO)  # see _known: the buffered bytes are lost, close(2) says so
            return []
        self.ops.flush("", FileInfo(fh=fh))
        return []

    def _fsync(self, header: wire.InHeader, body: memoryview) -> Payload:
        fh, flags, _ = wire.FSYNC_IN.unpack_from(body)
        if not self.ops.has_handle(fh):
            if self.ops.is_write_handle(fh):
                raise FuseError(errno.EIO)
            return []
        self.ops.fsync("", flags & 1, FileInfo(fh=fh))
        return []

    def _release(self, header: wire.InHeader, body: memoryview) -> Payload:
        self.ops.release("", FileInfo(fh=wire.RELEASE_IN.unpack_from(body)[0]))
        return []

    # -- directories --------------------------------------------------------------------------

    def _opendir(self, header: wire.InHeader, body: memoryview) -> Payload:
        path = self._path(header)
        with self._lock:
            dh = next(self._dir_ids)
        # Where the kernel keeps metadata, it keeps listings too: its copy of one is answered
        # from while the listing stands, and read anew after.
        flags = 0
        if self.kernel_lists:
            flags = wire.FOPEN_CACHE_DIR | (wire.FOPEN_KEEP_CACHE if self.ops.listing_unchanged(path) else 0)
        return [wire.open_out(dh, flags)]

    def _listing(self, header: wire.InHeader, dh: int, offset: int) -> wire.Dirents:
        """The entries of an open directory, listed at its first READDIR and kept until
        RELEASEDIR (so a listing read in several requests is one consistent listing)."""
        with self._lock:
            listing = self._dirs.get(dh)
        if listing is None or offset == 0:
            listing = wire.Dirents(self.ops.readdir(self._path(header), None))
            with self._lock:
                self._dirs[dh] = listing
        return listing

    def _readdir(self, header: wire.InHeader, body: memoryview) -> Payload:
        dh, offset, size, *_ = wire.READ_IN.unpack_from(body)
        return [self._listing(header, dh, offset).reply(offset, size)]

    def _releasedir(self, header: wire.InHeader, body: memoryview) -> Payload:
        with self._lock:
            self._dirs.pop(wire.RELEASE_IN.unpack_from(body)[0], None)
        return []

    # -- changes ------------------------------------------------------------------------------

    def _mkdir(self, header: wire.InHeader, body: memoryview) -> Showing:
        mode, _umask = wire.MKDIR_IN.unpack_from(body)
        path = child(self._path(header), wire.names(body[wire.MKDIR_IN.size:], 1)[0])
        self.ops.mkdir(path, mode)
        return self._entry(path)

    def _unlink(self, header: wire.InHeader, body: memoryview) -> Payload:
        path = child(self._path(header), wire.names(body, 1)[0])
        self.ops.unlink(path)
        self.nodes.remove(path)
        return []

    def _rmdir(self, header: wire.InHeader, body: memoryview) -> Payload:
        path = child(self._path(header), wire.names(body, 1)[0])
        self.ops.rmdir(path)
        self.nodes.remove(path)
        return []

    def _move(self, header: wire.InHeader, newdir: int, names: memoryview, flags: int = 0) -> Payload:
        old, new = wire.names(names, 2)
        src = child(self._path(header), old)
        target = self.nodes.path(newdir)
        if target is None:
            raise FuseError(errno.ENOENT)
        dst = child(target, new)
        if flags & ~wire.RENAME_NOREPLACE:
            raise FuseError(errno.EINVAL)  # RENAME_EXCHANGE, RENAME_WHITEOUT
        if flags & wire.RENAME_NOREPLACE:
            try:
                self.ops.getattr(dst, None)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise
            else:
                raise FuseError(errno.EEXIST)
        self.ops.rename(src, dst)
        self.nodes.rename(src, dst)
        return []

    def _rename(self, header: wire.InHeader, body: memoryview) -> Payload:
        newdir = wire.RENAME_IN.unpack_from(body)[0]
        return self._move(header, newdir, body[wire.RENAME_IN.size:])

    def _rename2(self, header: wire.InHeader, body: memoryview) -> Payload:
        newdir, flags, _ = wire.RENAME2_IN.unpack_from(body)
        return self._move(header, newdir, body[wire.RENAME2_IN.size:], flags)

    # -- extended attributes ------------------------------------------------------------------

    def _getxattr(self, header: wire.InHeader, body: memoryview) -> Payload:
        size, _ = wire.XATTR_SIZE_IN.unpack_from(body)
        name = wire.names(body[wire.XATTR_SIZE_IN.size:], 1)[0]
        return xattr_reply(self.ops.getxattr(self._path(header), name), size)

    def _listxattr(self, header: wire.InHeader, body: memoryview) -> Payload:
        size, _ = wire.XATTR_SIZE_IN.unpack_from(body)
        names = self.ops.listxattr(self._path(header))
        return xattr_reply(b"".join(n.encode() + b"\0" for n in names), size)

    def _setxattr(self, header: wire.InHeader, body: memoryview) -> Payload:
        self.ops.setxattr(self._path(header), "", b"", 0)
        return []

    def _removexattr(self, header: wire.InHeader, body: memoryview) -> Payload:
        self.ops.removexattr(self._path(header), "")
        return []
