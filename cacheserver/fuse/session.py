"""A FUSE session: read the kernel's requests from /dev/fuse, answer them with the operations of
interface.py (StrataOperations, in operations.py, in a mount) by the handlers of handlers.py.

- Several threads each read the next request from the same descriptor and answer it
  themselves, so requests are served in parallel (reads of one file included). They all read
  the one descriptor, not clones of it (FUSE_DEV_IOC_CLONE): the kernel ends the requests a
  clone was serving with an error when the clone is closed, so a process that dies would fail
  its readers, while requests read from the shared descriptor wait (see mountkeeper.py).
- `resume()` asks the kernel to queue again every request the previous process read and did
  not answer (FUSE_NOTIFY_RESEND, kernel 6.9+).
- An ioctl (Python's buffered `open()` asks whether each file is a terminal) is answered
  ENOTTY in the loop itself, before the request is parsed: the kernel never remembers that a
  server has no ioctls (it passes ENOSYS on as ENOTTY and asks again at the next one), so
  every such open costs one round trip, kept as short as the loop allows.
- The node table stays near its bound (`--max-nodes`): a thread of its own has the kernel drop
  the least recently looked-up entries past it (nodelimit.py).
- A reply that gives the kernel a node's attributes is written through KernelAttrs (kernelattrs.py),
  so what the kernel holds is known.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable

from . import wire
from .handlers import Handler, Handlers, Payload, Showing
from .interface import MAX_IO, Operations, S
from .nodelimit import NodeLimit
from .nodes import NodeTable
from .pins import Pins
from .kernelattrs import KernelAttrs

log = logging.getLogger("strata.fuse")

# Threads reading requests; each holds a buffer of MAX_IO plus headers.
THREADS = 16
BUFFER = MAX_IO + 4096
# The answer to every ioctl, less its unique id (see _serve).
NO_IOCTL = wire.OUT_HEADER.size, -errno.ENOTTY


class Session(Handlers[S]):
    """Serves `ops` on the connection `fd`: `timeout` seconds the kernel may reuse metadata,
    `read_only` a mount that refuses changes, `root` what it shows (for the log)."""

    def __init__(self, fd: int, ops: Operations[S], nodes: NodeTable, *, timeout: float, read_only: bool,
                 root: str = "/", on_init: Callable[[wire.InitReply], None] = lambda reply: None) -> None:
        self.fd = fd
        self.ops = ops
        self.nodes = nodes
        self.timeout = timeout
        self.read_only = read_only
        self.root = root
        self._on_init = on_init
        self.kernel_attrs = KernelAttrs()
        self.node_limit = NodeLimit(fd, nodes)
        # The kernel opens files without asking (see the module docstring); not where opens
        # may pass files through, which only an answer to an OPEN does.
        self.kernel_opens = read_only and self.timeout > 0 and not ops.passes_through()
        # The kernel keeps listings of this mount's folders (see Handlers._opendir).
        self.kernel_lists = self.kernel_opens
        self.pins = Pins(ops, self._invalidate_data)
        self._dirs: dict[int, wire.Dirents] = {}
        self._dir_ids = iter(range(1, 1 << 62))
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._handlers: dict[int, Handler] = {
            wire.INIT: self._init, wire.DESTROY: self._destroy,
            wire.LOOKUP: self._lookup, wire.FORGET: self._forget, wire.BATCH_FORGET: self._batch_forget,
            wire.GETATTR: self._getattr, wire.SETATTR: self._setattr, wire.STATFS: self._statfs,
            wire.ACCESS: self._ok, wire.INTERRUPT: self._ignore,
            wire.OPEN: self._open, wire.CREATE: self._create, wire.READ: self._read, wire.WRITE: self._write,
            wire.FLUSH: self._flush, wire.FSYNC: self._fsync, wire.RELEASE: self._release,
            wire.OPENDIR: self._opendir, wire.READDIR: self._readdir, wire.RELEASEDIR: self._releasedir,
            wire.MKDIR: self._mkdir, wire.UNLINK: self._unlink, wire.RMDIR: self._rmdir,
            wire.RENAME: self._rename, wire.RENAME2: self._rename2,
            wire.GETXATTR: self._getxattr, wire.LISTXATTR: self._listxattr,
            wire.SETXATTR: self._setxattr, wire.REMOVEXATTR: self._removexattr,
        }

    # -- the loop --------------------------------------------------------------------------------

    def start(self, threads: int = THREADS) -> None:
        if self.kernel_opens:
            self.pins.start()
        self.node_limit.start()
        for i in range(threads):
            thread = threading.Thread(target=self._serve, name=f"strata-fuse-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def resume(self) -> bool:
        """Have the kernel queue again the requests a previous process read and did not answer;
        False if it cannot (Linux before 6.9)."""
        try:
            os.write(self.fd, wire.resend_notification())
        except OSError as exc:
            log.error("strata fuse: the kernel cannot resend requests in flight: %s", exc)
            return False
        return True

    def wait(self) -> None:
        """Until the connection ends (the mount was unmounted or aborted)."""
        for thread in self._threads:
            thread.join()

    def _serve(self) -> None:
        buf = bytearray(BUFFER)
        view = memoryview(buf)
        opcode_unique, out_header = wire.OPCODE_UNIQUE.unpack_from, wire.OUT_HEADER.pack
        length, enotty = NO_IOCTL
        while True:
            try:
                n = os.readv(self.fd, [buf])
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue  # interrupted, or a request withdrawn before it was read
                if exc.errno != errno.ENODEV:
                    log.error("strata fuse: reading /dev/fuse: %s", exc)
                return  # ENODEV: unmounted
            if n == 0:
                return  # end of file: the other end of a socket standing in for /dev/fuse closed
            if n < wire.IN_HEADER.size:
                continue
            opcode, unique = opcode_unique(buf)
            if opcode == wire.IOCTL:
                try:
                    os.write(self.fd, out_header(length, enotty, unique))
                except OSError:
                    pass  # the caller was interrupted (ENOENT), or the mount is gone (the next read says)
                continue
            self.dispatch(view[:n])

    def dispatch(self, request: memoryview) -> None:
        header = wire.parse_header(request)
        body = request[wire.IN_HEADER.size:header.length]
        handler = self._handlers.get(header.opcode)
        error = 0
        payload: Payload | Showing | None = []
        try:
            if handler is None:
                error = errno.ENOSYS
            else:
                payload = handler(header, body)
        except OSError as exc:
            error = exc.errno or errno.EIO
        except Exception:
            log.exception("strata fuse: request %d on node %d failed", header.opcode, header.nodeid)
            error = errno.EIO
        if header.opcode in wire.NO_REPLY or payload is None:
            return
        if isinstance(payload, Showing):  # never set when the handler failed
            showing = payload
            self.kernel_attrs.reply(showing.nodeid, showing.attr, lambda: self._reply(header.unique, showing.payload))
        else:
            self._reply(header.unique, [] if error else payload, error)

    def _reply(self, unique: int, payload: Payload, error: int = 0) -> bool:
        """Answer request `unique`; False if the kernel did not take the answer."""
        length = sum(len(p) for p in payload)
        try:
            os.writev(self.fd, [wire.out_header(unique, length, error), *payload])
        except OSError as exc:
            # ENOENT: the caller was interrupted and the kernel dropped the request.
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                log.error("strata fuse: answering request %d: %s", unique, exc)
            return False
        return True
