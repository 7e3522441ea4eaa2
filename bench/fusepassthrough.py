"""How near a FUSE file comes to a local file's page cache in each way the kernel can answer its
reads: from the FUSE file's own page cache (the server asked at each open, or the kernel opening
without asking, as Strata's read-only mounts do), or passed through to a backing file (Linux 6.9+:
FUSE_DEV_IOC_BACKING_OPEN and FOPEN_PASSTHROUGH), whose page cache is the local file's own.

    .venv/bin/python -P bench/fusepassthrough.py LOCAL/text-1g/lines.txt [--passes 10]

A minimal server (this module, one thread a connection, in the FUSE protocol of
cacheserver/fuse/wire.py) serves the one local file as `file` through each way; each copy is
read whole once, then front to back in 1 MiB reads, the copies taking turns (bench/pagecache.py),
and shown with the best pass's speed, its share of the local file's and the size of its folios.
Needs root (mount(2), and passthrough asks for CAP_SYS_ADMIN). A kernel without passthrough
says so, and the other ways are still measured.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
import tempfile
import threading
from pathlib import Path

from strata.cacheserver.fuse import kernel, wire
from strata.cacheserver.fuse.mountpoints import find_mount, unmount

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pagecache import PAGE, READ, best_passes, folio_pages  # noqa: E402

NAME = b"file"
FILE_ID = 2
TIMEOUT = 3600  # seconds the kernel may keep names and attributes: nothing changes
# Seconds the whole measurement may take: past it every connection is aborted, so a read
# waiting for a server that stopped answering fails (EIO, ENOTCONN) instead of waiting on.
DEADLINE = 600.0

OPENS_ANSWERED = "page cache, opens answered"
KERNEL_OPENS = "page cache, kernel opens"
PASSTHROUGH = "passthrough"
WAYS = {
    OPENS_ANSWERED: "the server answers each OPEN (FOPEN_KEEP_CACHE) and READs the pages",
    KERNEL_OPENS: "OPEN answered ENOSYS once: the kernel opens without asking (Strata's read-only mounts)",
    PASSTHROUGH: "each OPEN hands the kernel the local file (FOPEN_PASSTHROUGH): no READ reaches the server",
}


class OneFileServer:
    """One FUSE connection serving `source` as /file in the way `way` (a key of WAYS)."""

    def __init__(self, source: Path, mountpoint: Path, way: str) -> None:
        self.way = way
        self.source = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
        self.size = os.fstat(self.source).st_size
        self.mountpoint = mountpoint
        self.backing_id = 0  # the kernel's id of the local file, once the first OPEN made it
        self.refused = ""  # why the kernel refused passthrough, if it did
        self.fd = kernel.mount(kernel.MountRequest(mountpoint=mountpoint, source="bench:passthrough", read_only=True))
        self.thread = threading.Thread(target=self._serve, name=f"fuse {way}", daemon=True)
        self.thread.start()

    def abort(self) -> None:
        """End the connection: every request waiting for an answer fails at once."""
        entry = find_mount(self.mountpoint)
        if entry is not None and entry.device:
            kernel.abort(entry.device)

    def close(self) -> None:
        unmount(self.mountpoint, lazy=True)
        self.thread.join(timeout=10)
        os.close(self.fd)
        os.close(self.source)

    def _serve(self) -> None:
        buffer = bytearray(wire.MIN_READ_BUFFER + (1 << 20))
        while True:
            try:
                length = os.readv(self.fd, [buffer])
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.ENOENT, errno.EAGAIN):
                    continue
                return  # ENODEV: unmounted
            header = wire.parse_header(buffer)
            if header.opcode in wire.NO_REPLY:
                continue
            try:
                payload = self._answer(header, memoryview(buffer)[wire.IN_HEADER.size:length])
                error = 0
            except OSError as exc:
                payload, error = b"", exc.errno or errno.EIO
            except Exception as exc:  # a request this server cannot parse: it fails, the connection goes on
                print(f"{self.way}: opcode {header.opcode} failed: {exc!r}", file=sys.stderr)
                payload, error = b"", errno.EIO
            try:
                os.write(self.fd, wire.out_header(header.unique, len(payload), error) + payload)
            except OSError as exc:
                if exc.errno != errno.ENOENT:  # ENOENT: the request was interrupted, the connection goes on
                    return

    def _answer(self, header: wire.InHeader, body: memoryview) -> bytes:
        if header.opcode == wire.INIT:
            return self._init(body)
        if header.opcode == wire.LOOKUP:
            if bytes(body).split(b"\0")[0] != NAME:
                raise OSError(errno.ENOENT, "no such file")
            return wire.ENTRY_OUT_HEAD.pack(FILE_ID, 0, TIMEOUT, TIMEOUT, 0, 0) + self._attr(FILE_ID)
        if header.opcode == wire.GETATTR:
            return wire.ATTR_OUT_HEAD.pack(TIMEOUT, 0, 0) + self._attr(header.nodeid)
        if header.opcode == wire.OPEN:
            return self._open()
        if header.opcode == wire.READ:
            _, offset, size = wire.READ_IN.unpack_from(body)[:3]
            return os.pread(self.source, size, offset)
        if header.opcode in (wire.RELEASE, wire.FLUSH, wire.DESTROY):
            return b""
        raise OSError(errno.ENOSYS, "not served")

    def _init(self, body: memoryview) -> bytes:
        want = wire.ASYNC_READ | wire.MAX_PAGES | (wire.PASSTHROUGH if self.way == PASSTHROUGH else 0)
        agreed = wire.negotiate(body, want, READ)
        if self.way == PASSTHROUGH and not agreed.flags & wire.PASSTHROUGH:
            self.refused = "the kernel offers no passthrough at INIT"
        return agreed.pack()  # max_stack_depth 1 where passthrough was agreed

    def _open(self) -> bytes:
        if self.way == KERNEL_OPENS:
            raise OSError(errno.ENOSYS, "the kernel opens without asking from now on")
        if self.way == PASSTHROUGH and not self.refused:
            if not self.backing_id:
                try:
                    # Kept until the connection ends: an opener looks the id up after this
                    # reply is written, so it must not be closed at once.
                    self.backing_id = kernel.backing_open(self.fd, self.source)
                except OSError as exc:
                    self.refused = f"FUSE_DEV_IOC_BACKING_OPEN: {exc.strerror}"
            if self.backing_id:
                # The kernel refuses FOPEN_KEEP_CACHE with passthrough: the pages are the backing file's.
                return wire.open_out(0, wire.FOPEN_PASSTHROUGH, self.backing_id)
        return wire.open_out(0, wire.FOPEN_KEEP_CACHE)

    def _attr(self, nodeid: int) -> bytes:
        if nodeid == wire.ROOT_ID:
            return wire.ATTR.pack(wire.ROOT_ID, 0, 0, 0, 0, 0, 0, 0, 0, stat.S_IFDIR | 0o555, 2, 0, 0, 0, PAGE, 0)
        return wire.ATTR.pack(FILE_ID, self.size, -(-self.size // 512), 0, 0, 0, 0, 0, 0, stat.S_IFREG | 0o444, 1, 0,
                              0, 0, PAGE, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, help="a local file (on ext4: its page cache is the limit)")
    parser.add_argument("--passes", type=int, default=10)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("mounting the minimal servers needs root")
    servers: list[OneFileServer] = []
    deadline = threading.Timer(DEADLINE, lambda: [server.abort() for server in servers])
    deadline.daemon = True
    with tempfile.TemporaryDirectory(prefix="strata-passthrough-") as folder:
        try:
            deadline.start()
            for i, way in enumerate(WAYS):
                mountpoint = Path(folder) / str(i)
                mountpoint.mkdir()
                servers.append(OneFileServer(args.file, mountpoint, way))
            paths = [str(args.file)] + [str(s.mountpoint / NAME.decode()) for s in servers]
            seconds = best_passes(paths, args.passes)
            size = os.path.getsize(args.file)
            print(f"{args.file}: {size / 2**20:.0f} MiB, best of {args.passes} passes of 1 MiB reads, the copies in turns")
            for way, path, best in zip(["local file"] + list(WAYS), paths, seconds):
                folio = folio_pages(path)
                refused = next((s.refused for s in servers if s.way == way), "")
                print(f"  {way:28s} {size / best / 1e9:5.2f} GB/s  {seconds[0] / best:5.2f} of the local file  "
                      f"folios {f'{folio * PAGE / 1024:.0f} KiB' if folio else 'unknown'}"
                      + (f"  (not passed through: {refused})" if refused else ""))
            for way, text in WAYS.items():
                print(f"  {way}: {text}")
        finally:
            deadline.cancel()
            for server in servers:
                server.close()


if __name__ == "__main__":
    main()
