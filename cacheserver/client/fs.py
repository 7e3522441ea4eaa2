"""fsspec filesystem for protocol `strata`, so pandas, pyarrow and dask read
`strata:///datasets/x/part-0.parquet` unchanged.

    fs = fsspec.filesystem("strata", master="host:19998")
    pd.read_parquet("strata:///datasets/x/part-0.parquet")
    pd.read_parquet("strata://host:19998/datasets/x/part-0.parquet")  # master in the URL
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timezone
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import infer_storage_options

from strata.contract.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, StrataError
from strata.contract.modes import WriteType
from strata.contract.proto import strata_pb2 as pb
from ..common.paths import parent
from .core import Block, StrataClient
from .settings import ClientSettings
from .listings import LISTINGS_EXPIRY, LISTINGS_MAX_ENTRIES, Listing, Listings
from .streaming import StreamingUpload
from .transfer import LocalBlock

# Threads fetching blocks for the files of one filesystem object (the blocks a sequential
# reader keeps in flight: the cluster's cachePolicy.readaheadBlocks, or `readahead`).
FETCH_THREADS = 16
# A read smaller than this that does not continue the previous one fetches just its range,
# not the whole block (footers, indexes, random access).
SMALL_READ = 1024 * 1024
# readline() looks for the end of a line in a block file held open this many bytes at a time.
LINE_WINDOW = 64 * 1024


def _info_dict(info: pb.FileInfo) -> dict[str, Any]:
    return {
        "name": info.path,
        "size": info.length,
        "type": "directory" if info.is_dir else "file",
        "mtime": info.mtime_unix_ms / 1000.0,
        "version": info.version,
        "persisted": info.persisted,
        "cached_bytes": info.cached_bytes,
        "pinned": info.pinned,
        "block_size": info.block_size,
        "readahead_blocks": info.readahead_blocks,
    }


class StrataFileSystem(AbstractFileSystem):  # type: ignore[misc]
    protocol = "strata"
    root_marker = "/"

    def __init__(self, master: str | None = None, token: str | None = None, *, host: str | None = None,
                 short_circuit: bool = True, readahead: int | None = None, write_type: str = "",
                 client_kind: str = "fsspec", settings: ClientSettings | None = None, near_cache: str | None = None,
                 near_cache_bytes: int | None = None, **kwargs: Any) -> None:
        """`near_cache`, `near_cache_bytes`: the client settings of those names (a folder for
        the near cache of a host that runs no worker, and its quota), over the environment's."""
        kwargs.setdefault("listings_expiry_time", LISTINGS_EXPIRY)
        chosen = {name: value for name, value in (("near_cache", near_cache), ("near_cache_bytes", near_cache_bytes))
                  if value is not None}
        if chosen:
            settings = ClientSettings(**{**(settings or ClientSettings()).model_dump(), **chosen})
        super().__init__(**kwargs)
        self.dircache = Listings(LISTINGS_MAX_ENTRIES, **kwargs)
        self.client = StrataClient(master=master, token=token, host=host, short_circuit=short_circuit,
                                   settings=settings, kind=client_kind)
        if readahead is not None and readahead < 0:
            raise InvalidArgument(f"readahead must be a number of blocks >= 0, got {readahead}")
        # None: each file's FileInfo.readahead_blocks (the cluster's cachePolicy.readaheadBlocks).
        self.readahead = readahead
        self.write_type = WriteType.proto_of(write_type)
        threads = FETCH_THREADS if readahead is None else max(2, readahead + 2)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="strata-read")

    # -- paths -------------------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]  # type: ignore[return-value]
        path = str(path)
        if path.startswith("strata://"):
            rest = path[len("strata://"):]
            # strata:///a/b -> /a/b ; strata://host:port/a/b -> /a/b
            path = rest if rest.startswith("/") else "/" + rest.partition("/")[2]
        path = "/" + path.lstrip("/")
        return path.rstrip("/") or "/"

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        options = infer_storage_options(path)
        host = options.get("host")
        if host:
            port = options.get("port")
            return {"master": f"{host}:{port}" if port else host}
        return {}

    # -- metadata ----------------------------------------------------------------------------

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        if path != "/":
            # An entry of a folder listed a moment ago (ls, then info of each file: one round
            # trip, not one per file). A folder's own listing is no answer for the folder.
            listed = self.dircache.get(parent(path))  # (fsspec's _parent parses the path again)
            entry = listed.by_name.get(path) if isinstance(listed, Listing) else None
            if entry is not None:
                return dict(entry)
        return _info_dict(self.client.stat(path))

    def ls(self, path: str, detail: bool = True, refresh: bool = False, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        listing: list[dict[str, Any]] | None = None if refresh else self.dircache.get(path)
        if listing is None:
            # One round trip: the master lists a file as itself. The client holds each entry
            # as a stat's answer (opening each file listed asks the master no more where the
            # mount allows it, see StrataClient.stat).
            entries = self.client.ls(path)
            if len(entries) == 1 and entries[0].path == path and not entries[0].is_dir:
                return [_info_dict(entries[0])] if detail else [entries[0].path]
            listing = Listing([_info_dict(e) for e in entries])
            self.dircache[path] = listing
        return [dict(e) for e in listing] if detail else [e["name"] for e in listing]

    def invalidate_cache(self, path: str | None = None) -> None:
        if path is None:
            self.dircache.clear()
        else:
            path = self._strip_protocol(path)
            for listed in [p for p in self.dircache if p == path or p.startswith(path.rstrip("/") + "/")]:
                self.dircache.pop(listed, None)
            folder = path
            while folder != "/":  # the folders whose listings show it
                folder = self._parent(folder)
                self.dircache.pop(folder, None)
        super().invalidate_cache(path)

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False, **kwargs: Any) -> Any:
        if maxdepth is not None:
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)
        path = self._strip_protocol(path)
        try:
            info = self.client.stat(path)
        except NotFound:
            return {} if detail else []  # as every fsspec filesystem: nothing found
        # Page by page: the answer is all that is held of a tree of millions of files.
        pages = [[info]] if not info.is_dir else self.client.ls_pages(path, recursive=True)
        if not detail:
            return sorted(e.path for page in pages for e in page if withdirs or not e.is_dir)
        return {e.path: _info_dict(e) for page in pages for e in page if withdirs or not e.is_dir}

    def ukey(self, path: str) -> str:
        return str(self.info(path)["version"])

    def modified(self, path: str) -> datetime:
        """When the file last changed (the store's time, or when it was written through
        Strata), in UTC."""
        return datetime.fromtimestamp(self.info(path)["mtime"], tz=timezone.utc)

    def block_locations(self, path: str) -> list[dict[str, Any]]:
        """Per block: offset, length and the hosts holding it (for locality-aware schedulers)."""
        response = self.client.block_locations(self._strip_protocol(path))
        return [{"index": b.index, "offset": b.offset, "length": b.length, "hosts": list(b.hosts)} for b in response.blocks]

    # -- changes -----------------------------------------------------------------------------

    def _rm(self, path: str) -> None:
        self.client.rm(self._strip_protocol(path))
        self.invalidate_cache(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        for p in [path] if isinstance(path, str) else path:
            try:
                self.client.rm(self._strip_protocol(p), recursive=recursive)
            finally:
                self.invalidate_cache(p)

    def mv(self, path1: str, path2: str, recursive: bool = False, maxdepth: int | None = None, **kwargs: Any) -> None:
        try:
            self.client.mv(self._strip_protocol(path1), self._strip_protocol(path2))
        finally:
            self.invalidate_cache(path1)
            self.invalidate_cache(path2)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Directories exist when files are written below them (as in object stores)."""

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """See mkdir."""

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Copy a file inside the cluster: the store copies it (both in one mount, a write
        type that writes the store), else a worker reads it (cache, store or the peers holding
        it) and writes the copy with the write type; no byte passes through this client. A
        folder needs no copy: folders exist by what is below them."""
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.info(src)["type"] == "directory":
            return
        try:
            self.client.copy_file(src, dst, write_type=self.write_type)
        finally:
            self.invalidate_cache(dst)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        try:
            self.client.write_file(self._strip_protocol(path), [value], write_type=self.write_type,
                                   overwrite=mode == "overwrite")
        finally:
            self.invalidate_cache(path)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        with self.open(path, "rb") as f:
            if start is not None:
                f.seek(start if start >= 0 else max(0, f.size + start))
            if end is None:
                return f.read()  # type: ignore[no-any-return]
            end = end if end >= 0 else f.size + end
            return f.read(max(0, end - f.tell()))  # type: ignore[no-any-return]

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None, autocommit: bool = True,
              cache_options: dict[str, Any] | None = None, **kwargs: Any) -> StrataFile:
        if mode not in ("rb", "wb", "xb", "ab"):
            raise InvalidArgument(f"strata files open with mode rb, wb, xb or ab, not {mode!r}")
        return StrataFile(self, self._strip_protocol(path), mode, write_type=kwargs.get("write_type"),
                          file_info=kwargs.get("file_info"))


def _weak_fetcher(file: StrataFile) -> Callable[[int, int], bytes]:
    method = weakref.WeakMethod(file._fetch_range)

    def fetch(start: int, end: int) -> bytes:
        bound = method()
        if bound is None:
            raise ValueError("I/O operation on closed file.")
        return bound(start, end)

    return fetch


class StrataFile(AbstractBufferedFile):  # type: ignore[misc]
    """Reads whole blocks, keeping the next ones in flight while the reader is sequential;
    writes stream to a worker as they come.

    A file opened from a status the client held (not asked of the master at this open, see
    StrataClient.stat) may name a version the namespace has since let go of early (another
    client's read found the file changed in the store): if its first read is refused for
    that reason before any byte was returned, the file is opened again with the master's
    status now and the read is served from that version: a read of the whole file whatever
    its length (to the new end), any other read if the length is the same (its reader may
    have used the length shown). Once a byte was returned, the file stays the version it
    returned."""

    def __init__(self, fs: StrataFileSystem, path: str, mode: str, write_type: str | None = None,
                 file_info: pb.FileInfo | None = None,
                 may_reopen: Callable[[pb.FileInfo, pb.FileInfo], bool] | None = None) -> None:
        """`file_info` (mode rb): read the file as that status names it (a version opened
        before), not as the master describes it now. `may_reopen(old, new)` (also settable
        as an attribute before the first read): asked, and so told, before the file goes on
        as another version as above; False keeps the refusal (the FUSE server, whose kernel
        may hold pages of the old version)."""
        self.fs = fs
        self.client = fs.client
        if mode == "rb":
            reused = False
            first: Block | None = None  # the whole file, when it came with its status
            if file_info is None:
                file_info, reused, first = self.client.open_status(path)
            self._adopt(file_info, self._holders_of(file_info, path))
            # Reopened once at most: while nothing is returned, a held status may be replaced.
            self._reopenable = reused
            self.may_reopen = may_reopen
            self._reopen_lock = threading.Lock()
            super().__init__(fs, path, mode, block_size=self.file_info.block_size or 1, cache_type="none",
                             size=self.file_info.length)
            # fsspec's cache calls back into the file; through a weak reference, a file that
            # is dropped unclosed (pyarrow drops the files it reads) is freed, and lets go of
            # its blocks, at once instead of at the next garbage collection.
            self.cache.fetcher = _weak_fetcher(self)
            self._blocks: OrderedDict[int, Future[Block]] = OrderedDict()
            if first is not None:
                self._blocks[0] = Future()
                self._blocks[0].set_result(first)
            self._last_index = -2
            # readline's last window of a block file: (the block, its offset in it, its bytes)
            self._window: tuple[LocalBlock, int, bytes] | None = None
            self._lock = threading.Lock()
        else:
            existing = self._existing_length(path) if mode in ("xb", "ab") else None
            if mode == "xb" and existing is not None:
                raise AlreadyExists(f"{path} already exists; open it with mode wb to replace it")
            super().__init__(fs, path, mode, block_size=4 * 1024 * 1024, cache_type="none")
            if mode == "ab":
                self.loc = existing or 0  # tell() counts from the end of what is there
            wt = WriteType.proto_of(write_type) if write_type else fs.write_type
            self._upload: StreamingUpload | None = None
            self._write_type = wt

    def _adopt(self, info: pb.FileInfo, holders: dict[int, list[str]]) -> None:
        """Read the file as `info` names it, its blocks not in the store from `holders`."""
        self.file_info = info
        self._holders = holders
        self._readahead = self.fs.readahead if self.fs.readahead is not None else info.readahead_blocks

    def _holders_of(self, info: pb.FileInfo, path: str) -> dict[int, list[str]]:
        """The workers holding each block of a file not in the store yet (none for others)."""
        if info.is_dir:
            raise IsADirectoryError(f"{path} is a directory")
        if info.persisted:
            return {}
        return {b.index: list(b.worker_ids) for b in self.client.block_locations(path).blocks}

    def _reopen(self, opened: pb.FileInfo, whole: bool) -> bool:
        """Open the file again with the master's status now, in place of `opened`, whose
        block was refused; False if the read cannot go on as another version: bytes of
        `opened` were returned, `may_reopen` says no, or the length changed and the read is
        not of the whole file (its reader may have used the length it was shown: the size,
        a seek from the end). Called with the reopen lock held."""
        if self.file_info is not opened:  # another thread opened it again already
            return whole or self.file_info.length == opened.length
        if not self._reopenable:
            return False
        self._reopenable = False
        fresh = self.client.stat(self.path, fresh=True)
        if fresh.version == opened.version or fresh.is_dir or (fresh.length != opened.length and not whole):
            return False  # refused for another reason, no longer a file, or a range of another length
        holders = self._holders_of(fresh, self.path)
        if self.may_reopen is not None and not self.may_reopen(opened, fresh):
            return False
        with self._lock:
            for future in self._blocks.values():
                future.cancel()
            self._blocks.clear()
            self._last_index = -2
            self._window = None
            self._adopt(fresh, holders)
            self.blocksize = fresh.block_size or 1
            self.size = self.cache.size = fresh.length
        return True

    def _read_pieces(self, start: int, end: int, *, to_end: bool = False,
                     joined: bool = False) -> list[bytes | memoryview]:
        """`_pieces(start, end, joined)`, through a reopen (see the class) while one may happen;
        `to_end`: `end` is the length opened, and stands for the end of the version read."""
        if not self._reopenable:
            return self._pieces(start, end, joined=joined)
        opened = self.file_info
        whole = to_end and start == 0
        try:
            parts = self._pieces(start, end, joined=joined)
        except FailedPrecondition:
            with self._reopen_lock:
                if not self._reopen(opened, whole):
                    raise
        else:
            with self._reopen_lock:
                if self.file_info is opened:
                    self._reopenable = False  # bytes of this version are returned: it stays
                    return parts
                if not self._reopen(opened, whole):
                    raise FailedPrecondition(
                        f"{self.path} changed in the store as it was opened ({opened.length} bytes, now "
                        f"{self.file_info.length}): open it again")
        # Opened again (here or by another thread meanwhile): the bytes of the new version.
        return self._pieces(start, self.file_info.length if to_end else end, joined=joined)

    def _existing_length(self, path: str) -> int | None:
        """The length of the file at `path`; None if there is none."""
        try:
            info = self.client.stat(path)
        except NotFound:
            return None
        if info.is_dir:
            raise IsADirectoryError(f"{path} is a directory; a file cannot be written there")
        return int(info.length)

    # -- reading -----------------------------------------------------------------------------

    def _fetch_block(self, index: int) -> Block:
        ref = self.client.block_ref(self.file_info, index)
        return self.client.hold_block(ref, holders=self._holders.get(index, ()))

    def _block_future(self, index: int) -> Future[Block]:
        future = self._blocks.get(index)
        if future is None:
            # Not a method of the file: a queued fetch does not keep a dropped file alive.
            ref = self.client.block_ref(self.file_info, index)
            future = self.fs._pool.submit(self.client.hold_block, ref, holders=self._holders.get(index, ()))
            self._blocks[index] = future
        self._blocks.move_to_end(index)
        while len(self._blocks) > self._readahead + 2:
            old, fut = self._blocks.popitem(last=False)
            fut.cancel()
        return future

    def _pieces(self, start: int, end: int, *, joined: bool = False) -> list[bytes | memoryview]:
        """Bytes [start, end) of the file as pieces in order: views of the blocks held (no
        copy), or bytes; `joined`: the range as one piece, a view of a block held in memory
        or else put together in one buffer of the client's pool as it is read (block files
        are read straight into it and checked there: one copy, where pieces and their join
        make two)."""
        info = self.file_info
        size = info.block_size
        end = min(end, info.length)
        if start >= end:
            return []
        first, last = start // size, (end - 1) // size
        sequential = first in (self._last_index, self._last_index + 1) or (start == 0 and end - start >= SMALL_READ)
        if first == last and not sequential and end - start < SMALL_READ and first not in self._blocks:
            ref = self.client.block_ref(info, first)
            piece = self.client.read_block(ref, start - first * size, end - start, holders=self._holders.get(first, ()))
            # A next read in this block or the one after counts as sequential: it fetches
            # whole blocks and reads ahead (the kernel reads a FUSE file 128 KiB at a time).
            self._last_index = first
            return [piece if isinstance(piece, bytes) else memoryview(piece)]
        parts: list[bytes | memoryview] = []
        whole: memoryview | None = None
        at = 0
        blocks = (info.length + size - 1) // size
        for i in range(first, last + 1):
            with self._lock:
                future = self._block_future(i)
                # Keep the next blocks in flight while this one is consumed.
                for ahead in range(i + 1, min(blocks, i + 1 + self._readahead)):
                    self._block_future(ahead)
            try:
                data = future.result()
            except CancelledError:  # dropped before it ran by another thread's reads (pread)
                data = self._fetch_block(i)
            except StrataError:
                with self._lock:
                    self._blocks.pop(i, None)
                raise
            lo = max(start - i * size, 0)
            hi = min(end - i * size, len(data))
            if joined and i == first and (last > first or isinstance(data, LocalBlock)):
                # One buffer of the client's pool (used again once nothing refers to it: no
                # page of it is cleared or faulted in anew) that the blocks are read into.
                whole = self.client.buffers.view(end - start)
            if whole is not None:
                if hi - lo != min(end, (i + 1) * size) - max(start, i * size):
                    raise StrataError(f"block {i} of {self.path} holds {len(data)} bytes, fewer than the "
                                      f"{info.block_size} of a block of a {info.length}-byte file")
                if isinstance(data, LocalBlock):
                    data.read_into(lo, hi, whole[at:at + hi - lo])
                else:
                    whole[at:at + hi - lo] = memoryview(data)[lo:hi]
                at += hi - lo
            elif isinstance(data, LocalBlock):
                parts.append(data.read(lo, hi))
            elif isinstance(data, bytes) and (lo, hi) == (0, len(data)):
                parts.append(data)
            else:
                parts.append(memoryview(data)[lo:hi])
        self._last_index = last
        return parts if whole is None else [whole]

    def _fetch_range(self, start: int, end: int) -> bytes:
        # The result is copied out of the blocks once, whatever the number of blocks (a
        # whole block already held as bytes is handed over as it is).
        parts = self._read_pieces(start, end)
        if len(parts) == 1:
            return parts[0] if isinstance(parts[0], bytes) else parts[0].tobytes()
        return b"".join(parts)

    def _take(self, length: int, *, joined: bool = False) -> list[bytes | memoryview]:
        """The pieces of the next `length` bytes (< 0: to the end; `joined`: see `_pieces`);
        moves the position."""
        if self.mode != "rb":
            raise ValueError("File not in read mode")
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        to_end = length < 0
        if to_end:
            length = self.size - self.loc
        parts = self._read_pieces(self.loc, self.loc + length, to_end=to_end, joined=joined)
        self.loc += sum(len(p) for p in parts)
        return parts

    def read(self, length: int = -1) -> bytes:
        if self.mode == "rb" and self._reopenable and (length is None or length < 0):
            # The first read, to the end, of a file opened from a held status: to the end of
            # the version it reads (see the class).
            return b"".join(self._take(-1))
        return super().read(length)  # type: ignore[no-any-return]

    def read_buffer(self, length: int = -1) -> bytes | memoryview:
        """As read(), but what lies in one block comes as a read-only view of the block's
        memory, not a copy (a range across blocks: a view of one buffer it was read into). pyarrow reads a file object through this when it has it (its
        Parquet and IPC readers then decode straight from the block); the view keeps the
        block's memory alive, however long it is held."""
        parts = self._take(-1 if length is None else int(length), joined=True)
        if len(parts) == 1:
            return parts[0] if isinstance(parts[0], bytes) else parts[0].toreadonly()
        return b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        """Read into a writable buffer (one copy, from the blocks)."""
        out = memoryview(buffer).cast("B")
        at = 0
        for part in self._take(out.nbytes):
            out[at:at + len(part)] = part
            at += len(part)
        return at

    def pread(self, size: int, offset: int) -> bytes:
        """Up to `size` bytes at `offset`, as os.pread: the file position does not move, and
        several threads may read one file at once (a FUSE mount's reads of one open file)."""
        return self._fetch_range(offset, offset + size)

    def readline(self, size: int | None = -1) -> bytes:
        """One line, found in the blocks already held (fsspec's default reads a whole block
        per line and seeks back, which copies 16 MiB for every line)."""
        if self.mode != "rb":
            return super().readline(size)  # type: ignore[no-any-return]
        if self._reopenable and self.loc < self.size:
            self._read_pieces(self.loc, self.loc + 1)  # a file opened from a held status: see the class
        limit = self.size - self.loc if size is None or size < 0 else min(size, self.size - self.loc)
        parts: list[bytes] = []
        taken = 0
        block = self.file_info.block_size
        while taken < limit:
            index = self.loc // block
            with self._lock:
                future = self._block_future(index)
                for ahead in range(index + 1, min((self.size + block - 1) // block, index + 1 + self._readahead)):
                    self._block_future(ahead)
            data = future.result()
            start = self.loc - index * block
            stop = min(len(data), start + (limit - taken))
            if isinstance(data, LocalBlock):  # read a window of the block file at a time
                window = self._line_window(data, start, stop)
                newline = window.find(b"\n")
                piece = window[:newline + 1] if newline >= 0 else window
            else:
                newline = data.find(b"\n", start, stop)
                piece = data[start:newline + 1 if newline >= 0 else stop]
            parts.append(piece)
            taken += len(piece)
            self.loc += len(piece)
            self._last_index = index
            if newline >= 0:
                break
        return b"".join(parts)

    def _line_window(self, block: LocalBlock, start: int, stop: int) -> bytes:
        """Bytes [start, at most stop) of a block file held open, from the checked window the
        last readline read when it covers `start` (the lines of one window cost one read and
        one check, not one each), else from a new window of up to LINE_WINDOW bytes."""
        held = self._window
        if held is None or held[0] is not block or not held[1] <= start < held[1] + len(held[2]):
            held = self._window = (block, start, bytes(block.read(start, min(stop, start + LINE_WINDOW))))
        _, at, window = held
        return window[start - at:stop - at]

    # -- writing -----------------------------------------------------------------------------

    def _initiate_upload(self) -> None:
        self._upload = StreamingUpload(self.client, self.path, self._write_type, overwrite=self.mode != "xb",
                                       append=self.mode == "ab")

    def _upload_chunk(self, final: bool = False) -> bool:
        if self._upload is None:
            self._initiate_upload()
        assert self._upload is not None
        data = self.buffer.getvalue()
        if data:
            self._upload.send(data)
        if final:
            try:
                self._upload.finish()
            finally:
                self.fs.invalidate_cache(self.path)
        return True

    def close(self) -> None:
        if self.mode == "rb" and not self.closed:
            with self._lock:
                for future in self._blocks.values():
                    if not future.cancel() and future.done() and future.exception() is None:
                        block = future.result()
                        if isinstance(block, LocalBlock):
                            block.stop_reading_ahead()  # the client may keep its file (held_blocks)
                self._blocks.clear()
                self._window = None
        super().close()
