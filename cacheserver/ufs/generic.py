"""The store backend for any fsspec filesystem (memory://, gcs://, ...), and the base of the
file:// and S3 backends: its operations are fsspec's, each one call through `StoreCalls`."""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import time
from collections.abc import AsyncGenerator, Iterable, Mapping
from pathlib import Path
from typing import Any

from fsspec.asyn import AsyncFileSystem
from fsspec.spec import AbstractFileSystem

from strata.contract.errors import DataLoss, InvalidArgument, StrataError
from strata.contract.urls import shown_url, url_userinfo
from ..settings import RetrySettings, StoreTimeouts
from .calls import STORE_THREADS, StoreCalls, StoreThreads
from .errors import VersionChanged, _ShortAnswer, s3_error
from .options import storage_options
from .status import WALK_PAGE, ListedPage, StoreTotals, UfsStatus, _mtime_seconds, _size_mtime_version, _upload_rel


class FsspecStore(StoreCalls):
    """One mount's store on an fsspec filesystem (`cls`, serving `protocol`): async
    operations on paths relative to the source URL."""

    def __init__(
        self,
        protocol: str,
        cls: type[AbstractFileSystem],
        source: str,
        options: Mapping[str, str] | None = None,
        *,
        credentials: Mapping[str, str] | None = None,
        retry: RetrySettings | None = None,
        timeouts: StoreTimeouts | None = None,
    ) -> None:
        self.protocol, self._cls = protocol, cls
        # The source as given reaches the store; every message shows `source`, which has no
        # user-info (contract.urls).
        self._source = source if source.endswith(":///") else source.rstrip("/")
        credentials = credentials or {}
        userinfo = url_userinfo(source)
        self._kwargs = storage_options(self._cls, {**(options or {}), **credentials}, frozenset(credentials))
        self._is_async = issubclass(self._cls, AsyncFileSystem)
        super().__init__(
            shown_url(self._source), self._cls._strip_protocol(source).rstrip("/") or "/",
            secrets={*credentials.values(), userinfo, userinfo.partition(":")[2]},
            endpoint=self._kwargs.get("endpoint_url"), retry=retry or RetrySettings(),
            timeouts=timeouts or StoreTimeouts(),
            threads=StoreThreads(STORE_THREADS, f"store-{self.protocol}") if not self._is_async else None,
        )
        self._fs = self._make_fs()
        self._fs_loop: asyncio.AbstractEventLoop | None = None

    def _fs_options(self) -> dict[str, Any]:
        """The keyword arguments the filesystem is made with, besides those Strata manages."""
        return dict(self._kwargs)

    def _make_fs(self) -> AbstractFileSystem:
        kwargs = self._fs_options()
        if self._is_async:
            kwargs["asynchronous"] = True
        try:
            fs = self._cls(skip_instance_cache=True, use_listings_cache=False, **kwargs)
        except TypeError as exc:
            raise InvalidArgument(f"store {self.source}: options not accepted: {self._redacted(str(exc))}") from None
        except Exception as exc:
            if self._shows_secret(exc):
                raise self._redacted_error(exc) from None
            raise
        return fs

    def _path(self, rel: str) -> str:
        rel = rel.strip("/")
        if rel in ("", "."):
            return self._root
        if any(part in ("..", ".") for part in rel.split("/")):
            raise InvalidArgument(f"path {rel!r} must not contain '.' or '..' components")
        return posixpath.join(self._root, rel)

    def _rel(self, name: str) -> str:
        name = name.rstrip("/")
        root = self._root.rstrip("/")
        if name == root or (not name and not root):
            return ""
        if name.startswith(root + "/"):
            return name[len(root) + 1:]
        # fsspec may hand back names without the leading slash of the root, or vice versa.
        if name.lstrip("/").startswith(root.lstrip("/") + "/"):
            return name.lstrip("/")[len(root.lstrip("/")) + 1:]
        raise StrataError(f"store {self.source} returned {name!r}, which is outside its root")

    def _status(self, info: Mapping[str, Any]) -> UfsStatus:
        rel = self._rel(str(info["name"]))
        is_dir = info.get("type") == "directory"
        length = 0 if is_dir else int(info.get("size") or 0)
        mtime = _mtime_seconds(info)
        if is_dir:
            version = ""
        else:
            etag = info.get("ETag") or info.get("etag") or ""
            version = str(etag).strip('"') or _size_mtime_version(length, mtime)
        return UfsStatus(path=rel, is_dir=is_dir, length=length,
                         mtime_unix_ms=int(mtime * 1000), version=version)

    # -- plumbing ---------------------------------------------------------------------------

    async def _filesystem(self) -> AbstractFileSystem:
        if self._is_async:
            loop = asyncio.get_running_loop()
            if self._fs_loop is not loop:
                if self._fs_loop is not None:
                    # A session belongs to one event loop: a new loop needs a new client.
                    self._fs = self._make_fs()
                self._fs_loop = loop
        return self._fs

    async def _fs_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call an fsspec method: its `_async` twin on async filesystems, else in a thread."""
        fs = await self._filesystem()
        if self._is_async:
            return await getattr(fs, "_" + method)(*args, **kwargs)
        return await self._blocking(getattr(fs, method), *args, **kwargs)

    # -- operations ---------------------------------------------------------------------------

    async def check(self) -> None:
        """Can the root be listed with these options? Raises NotFound (missing bucket or
        directory), PermissionDenied (refused credentials) or Unavailable (unreachable)."""
        await self._call("check", "", lambda: self._fs_call("ls", self._root, detail=False))

    async def info(self, rel: str) -> UfsStatus:
        path = self._path(rel)
        info = await self._call("info", rel, lambda: self._info(rel, path))
        return self._status(info)

    async def _info(self, rel: str, path: str) -> dict[str, Any]:
        """What the filesystem says of `rel` (at `path`): fsspec's `info`."""
        return dict(await self._fs_call("info", path))

    async def ls(self, rel: str) -> list[UfsStatus]:
        """Direct children of a directory (a file lists as itself)."""
        path = self._path(rel)
        entries = await self._call("list", rel, lambda: self._ls(rel, path))
        out = [self._status(e) for e in entries]
        return sorted((s for s in out if not (s.is_dir and s.path == rel.strip("/"))), key=lambda s: s.path)

    async def walk(self, rel: str, *, with_dirs: bool = False) -> list[UfsStatus]:
        """`walk_pages` gathered into one list: for trees a caller holds whole anyway (a
        folder copied file by file); the namespace takes a walk page by page."""
        return [status async for page in self.walk_pages(rel, with_dirs=with_dirs) for status in page]

    async def walk_pages(self, rel: str, *, with_dirs: bool = False,
                         page: int = WALK_PAGE) -> AsyncGenerator[list[UfsStatus], None]:
        """All files at or below `rel` (and, with `with_dirs`, the directories below it), in
        pages of at most `page` statuses, each made when the one before was taken: a walk
        of ten million files is never held as status objects at once. Sorted by path within
        each page and from page to page, except on S3, where a folder is known only from the
        keys below it (see `S3Store._walk_pages`). A file walks as itself; NotFound if
        nothing is at `rel` (a root may be empty)."""
        if page <= 0:
            raise InvalidArgument(f"a walk's page must hold at least one status, got {page}")
        path = self._path(rel)
        found = False
        async with contextlib.aclosing(self._walk_pages(rel, path, with_dirs, page)) as pages:
            async for chunk in pages:  # a walk left unfinished closes what it holds open at once
                found = found or bool(chunk)
                if chunk:
                    yield chunk
        if not found and rel.strip("/"):
            status = await self.info(rel)  # NotFound if there is nothing at all
            if not status.is_dir:
                yield [status]

    async def listed_from(self, folder: str, limit: int, start: str = "") -> ListedPage | None:
        """One page of the listing of `folder`: at most `limit` entries from `start` (a path
        in it, included; "" for its beginning) on in the listing's order, for the price of
        one request. None where a store lists a folder only whole (`ls`); only S3 pages."""
        self._path(folder)
        return None

    async def _ls(self, rel: str, path: str) -> list[dict[str, Any]]:
        """What the filesystem lists at `rel` (at `path`): fsspec's `ls`."""
        return list(await self._fs_call("ls", path, detail=True))

    async def _walk_pages(self, rel: str, path: str, with_dirs: bool,
                          page: int) -> AsyncGenerator[list[UfsStatus], None]:
        """`walk_pages` before the check that `rel` exists. Here the store answers whole
        (fsspec's `find`): its answer is held for the walk's length (the limit of a store
        that cannot page a walk); the statuses are made from it a page at a time, off the
        event loop."""
        found = await self._call(
            "walk", rel, lambda: self._fs_call("find", path, withdirs=with_dirs, detail=True)
        )
        names = await asyncio.to_thread(sorted, found)
        for at in range(0, len(names), page):
            yield await asyncio.to_thread(self._walked, rel, [found[name] for name in names[at:at + page]], with_dirs)

    def _walked(self, rel: str, infos: Iterable[Mapping[str, Any]], with_dirs: bool) -> list[UfsStatus]:
        """The statuses a walk of `rel` gives for what the store found (`infos`, in order):
        files, and folders below `rel` with `with_dirs`."""
        top = rel.strip("/")
        out = []
        for info in infos:
            status = self._status(info)
            if (with_dirs or not status.is_dir) and not (status.is_dir and status.path == top):
                out.append(status)
        return out

    async def totals(self, rel: str = "") -> StoreTotals:
        """How many files, and bytes, lie at or below `rel` (not counting Strata's upload
        folder and uploads' temporary files): a walk that holds one folder (file://) or one
        listing page (S3) at a time, paced to work at most TOTALS_DUTY of its time, for
        reports that may wait. Other stores are walked (`walk_pages`), counted page by page."""
        self._path(rel)
        files = size = 0
        async for page in self.walk_pages(rel):
            kept = [s.length for s in page if not _upload_rel(s.path)]
            files, size = files + len(kept), size + sum(kept)
        return StoreTotals(files, size)

    async def read_range(self, rel: str, start: int, end: int, *, version: str | None = None,
                         exact: bool = False) -> bytes:
        """Bytes [start, end) of a file; fewer if the file ends first. On S3 this is one
        ranged GET.

        With `exact` (the caller knows the file, of `version`, holds all of them), an answer
        of any other size is refused: retried like a transient failure (an answer cut short
        on its way), then DataLoss naming both sizes. Only the store's word says how many
        bytes it sent (a well-formed short answer passes every other check), and a short
        block served or cached would be a file with bytes missing.

        With `version` (a `UfsStatus.version`), the bytes are of that version of the file or
        the read fails with VersionChanged ("the file changed in the store"): S3 sends the
        etag as If-Match, so the store itself refuses another object; file:// compares size
        and mtime of the opened file before and after reading it; other stores compare the
        file's status after the read (an object replaced during the read and replaced back
        before that check would pass: those stores offer no conditional read)."""
        if start < 0 or end < start:
            raise InvalidArgument(f"read of {self.url(rel)}: bad range [{start}, {end})")
        if start == end and version is None:
            return b""
        path = self._path(rel)

        async def read() -> bytes:
            try:
                data = await self._read(rel, path, start, end, version)
            except OSError as exc:
                error = s3_error(exc)
                if error is not None and error[0] == "InvalidRange":
                    data = b""  # start at or past the end of the object
                else:
                    raise
            if exact and len(data) != end - start:
                raise _ShortAnswer(
                    f"store {self.source} answered the read of bytes {start}-{end - 1} of {self.url(rel)}"
                    f"{f' (version {version!r})' if version is not None else ''} with {len(data)} bytes, "
                    f"not {end - start}"
                )
            return data

        try:
            return await self._call("read", rel, read)
        except _ShortAnswer as exc:
            raise DataLoss(f"{exc}, at every try; the bytes are not used: check the store") from None

    async def _read(self, rel: str, path: str, start: int, end: int, version: str | None) -> bytes:
        """Bytes [start, end) of a file (fewer if it ends first), of `version` if given: the
        status after the read says so (these stores offer no conditional read)."""
        data = bytes(await self._fs_call("cat_file", path, start=start, end=end)) if end > start else b""
        if version is not None:
            self._check_version(rel, version, self._status(await self._fs_call("info", path)).version)
        return data

    def _check_version(self, rel: str, wanted: str, found: str) -> None:
        if found != wanted:
            raise VersionChanged(
                f"{self.url(rel)} changed in the store: it is version {found!r} now, the file was "
                f"opened as version {wanted!r}; open it again to read the new version"
            )

    async def write(self, rel: str, data: bytes) -> UfsStatus:
        """Create or replace a file with `data`."""
        path = self._path(rel)
        await self._call("write", rel, lambda: self._fs_call("pipe_file", path, data))
        return await self.info(rel)

    # Files Strata puts into a store (uploads, copies, moves into place) come back with the
    # version of the very object the operation made, taken from the store's own answer (S3:
    # the ETag of the PUT, the multipart upload or the copy; file://: the stat of the file
    # before it is renamed into place). A look at the path afterwards could find another
    # writer's object, whose version would then name this write's bytes. Other stores give
    # no such answer: for them the version is looked up after the operation.

    async def write_file(self, rel: str, local_path: Path) -> UfsStatus:
        """Upload a local (staged) file to `rel`, replacing what is there; the status of the
        object it made. On file:// stores the file appears whole or not at all (written
        aside, fsynced, renamed into place)."""
        path = self._path(rel)
        length = local_path.stat().st_size
        return await self._upload(rel, path, local_path, length)

    async def _upload(self, rel: str, path: str, local_path: Path, length: int) -> UfsStatus:
        """Upload `local_path` (of `length` bytes) to `rel` (at `path`); the status of what it made."""
        await self._call("upload", rel, lambda: self._fs_call("put_file", str(local_path), path))
        return await self.info(rel)

    async def copy(self, src: str, dst: str) -> UfsStatus:
        """Copy a file inside the store (S3: a server-side copy); the status of the copy."""
        src_path, dst_path = self._path(src), self._path(dst)
        await self._call("copy", src, lambda: self._fs_call("cp_file", src_path, dst_path))
        return await self.info(dst)

    async def move_file(self, src: str, dst: str) -> UfsStatus:
        """Move one file within the store, replacing what is at `dst`; the status of the
        moved file (S3: of the copy made at `dst`; file://: a rename, atomic)."""
        status = await self.copy(src, dst)
        await self.rm(src)
        return status

    def _written_status(self, rel: str, length: int, version: str) -> UfsStatus:
        """The status of a file this store just wrote: `length` bytes at version `version`."""
        return UfsStatus(path=rel.strip("/"), is_dir=False, length=length,
                         mtime_unix_ms=int(time.time() * 1000), version=version)

    async def remove_dead_uploads(self, older_than: float) -> int:
        """Remove the temporary files uploads to a file:// store left when their process died
        (see `LocalStore.remove_dead_uploads`); 0 for other stores (their uploads leave
        nothing listed)."""
        return 0

    async def rm(self, rel: str, recursive: bool = False) -> None:
        path = self._path(rel)
        await self._call("delete", rel, lambda: self._fs_call("rm", path, recursive=recursive))

    async def mv(self, src: str, dst: str) -> None:
        """Move a file or a directory tree."""
        src_path, dst_path = self._path(src), self._path(dst)
        if self._is_async:
            # Async filesystems move by copy + delete; each step is retried on its own.
            await self._call("copy", src, lambda: self._fs_call("copy", src_path, dst_path, recursive=True))
            await self._call("delete", src, lambda: self._fs_call("rm", src_path, recursive=True))
        else:
            await self._call("move", src, lambda: self._fs_call("mv", src_path, dst_path, recursive=True))

    async def mkdir(self, rel: str) -> None:
        """Create a directory and its parents (a no-op on stores without directories)."""
        path = self._path(rel)
        await self._call("mkdir", rel, lambda: self._fs_call("makedirs", path, exist_ok=True))

    async def close(self) -> None:
        """Close the store's client session (async filesystems) or let its threads go
        (blocking ones); safe to call twice."""
        if self._threads is not None:
            self._threads.shutdown(wait=False)
