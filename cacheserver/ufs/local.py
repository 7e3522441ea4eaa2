"""The store backend for file:// sources, confined to their root: every name is looked up one
at a time from descriptors checked to lie under the root (and under a folder this cluster
allows), so a symbolic link, also one swapped in meanwhile, leads nothing outside; files
appear whole or not at all (written aside, fsynced, renamed into place)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import posixpath
import stat
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from fsspec.core import split_protocol
from fsspec.spec import AbstractFileSystem

from strata.contract.constants import UPLOAD_DIR
from strata.contract.errors import InvalidArgument, PermissionDenied, StrataError
from strata.contract.urls import shown_url
from ..settings import RetrySettings, StoreTimeouts
from .calls import Progress
from .generic import FsspecStore
from .localfiles import (
    _copy_into,
    _local_info,
    _local_version,
    _remove_if_dead,
    _rmtree_at,
    _write_note,
)
from .options import filesystem_class, is_local
from .status import (
    _ELSEWHERE_NOTE_SUFFIX,
    _TEMP_ELSEWHERE_PREFIX,
    _UPLOAD_TEMP_PREFIX,
    _UPLOAD_TEMP_SUFFIX,
    TOTALS_DUTY,
    StoreTotals,
    UfsStatus,
    _upload_rel,
)

log = logging.getLogger(__name__)

# How file:// stores open folders: to look names up in (O_PATH: search permission is
# enough), and to list, or make files in and fsync.
_FOLDER = os.O_PATH | os.O_DIRECTORY
_OPEN_FOLDER = os.O_RDONLY | os.O_DIRECTORY


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_source_allowed(source: str, allowed_roots: Sequence[str]) -> None:
    """PermissionDenied unless `source` is a store URL this cluster may mount: a file://
    source must lie, with its links resolved, at or below one of `allowed_roots`."""
    _, cls = filesystem_class(source)
    if not is_local(cls):
        return
    path = posixpath.normpath(cls._strip_protocol(source) or "/")
    if not allowed_roots:
        raise PermissionDenied(
            f"source {shown_url(source)!r} reads the servers' own files, and this cluster allows no file:// "
            "sources; its owner can allow folders in the CacheCluster's spec.localSources.allowedRoots"
        )
    real = os.path.realpath(path)
    if any(_is_within(real, os.path.realpath(root)) for root in allowed_roots):
        return
    raise PermissionDenied(
        f"source {shown_url(source)!r} is not under a folder this cluster allows for file:// sources "
        f"({', '.join(allowed_roots)}); add its folder to spec.localSources.allowedRoots of the CacheCluster"
    )


class LocalStore(FsspecStore):
    """One mount's store on the server host's own files (file://), under its root only."""

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
        allowed_roots: Sequence[str] | None = None,
    ) -> None:
        if protocol in ("file", "local") and not split_protocol(source)[1].startswith("/"):
            raise InvalidArgument(f"source {shown_url(source)!r}: a file:// source needs an absolute path, e.g. file:///data")
        super().__init__(protocol, cls, source, options, credentials=credentials, retry=retry, timeouts=timeouts)
        # Every path is checked, links resolved, to stay under the root, and (where this host
        # reads the files) the root under an allowed folder of this host.
        self._allowed_roots = allowed_roots

    def _path(self, rel: str) -> str:
        if self._allowed_roots is not None:
            check_source_allowed(self._source, self._allowed_roots)  # links resolved on this host
        path = super()._path(rel)
        if path != self._root and not self._inside_root(path):
            raise PermissionDenied(
                f"{self.url(rel.strip('/'))} leads out of the mount's root {self._root} through a symbolic link; "
                "Strata serves only files under the root of a file:// mount"
            )
        return path

    def _inside_root(self, path: str) -> bool:
        """Does `path`, with every symbolic link resolved (also one not yet created, for
        writes), stay at or below the root? Only for file:// stores."""
        return _is_within(os.path.realpath(path), os.path.realpath(self._root))

    # -- file:// stores: every name is looked up from descriptors checked to lie under the root --

    def _open_inside(self, rel: str, flags: int = os.O_RDONLY, *, make_folders: bool = False) -> int:
        """A descriptor of `rel` (blocking; a file, or a folder with O_DIRECTORY or O_PATH),
        opened one name at a time from the root, each folder on the way checked to lie under
        the root (`_opened_inside`) before the next name is looked up in it, and the last one
        too. `_path` checks names; a link swapped into the path after that check (by whoever
        else writes the folder) leads the lookup elsewhere, which this check then refuses, so
        nothing outside the root is read, listed, made, moved or removed. Links that stay
        inside the root are followed. With `make_folders`, `rel` is a folder, and missing
        folders on the way are made, each in a folder already checked."""
        names = [name for name in rel.strip("/").split("/") if name]
        if any(name in (".", "..") for name in names):
            raise InvalidArgument(f"path {rel!r} must not contain '.' or '..' components")
        fd = self._open_at(None, self._root, rel, flags if not names else _FOLDER)
        try:
            for i, name in enumerate(names):
                if make_folders:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, dir_fd=fd)
                inner = self._open_at(fd, name, rel, flags if i == len(names) - 1 else _FOLDER)
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_at(self, dir_fd: int | None, name: str, rel: str, flags: int) -> int:
        """`name` opened in the folder `dir_fd` (links followed), checked to lie under the
        root; `rel` names it in messages."""
        fd = os.open(name, flags | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            self._opened_inside(fd, rel)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _opened_inside(self, fd: int, rel: str) -> None:
        """PermissionDenied unless what `fd` opened lies under the root (and an allowed root)
        of this file:// store, by the kernel's path of the descriptor."""
        opened = os.readlink(f"/proc/self/fd/{fd}")
        inside = _is_within(opened, os.path.realpath(self._root)) and (
            self._allowed_roots is None
            or any(_is_within(opened, os.path.realpath(root)) for root in self._allowed_roots))
        if not inside:
            raise PermissionDenied(
                f"{self.url(rel)} leads out of the mount's root {self._root} through a symbolic link "
                "(changed while it was opened); Strata serves only files under the root of a file:// mount"
            )

    def _info_local(self, rel: str, path: str) -> dict[str, Any]:
        """`info` for file:// stores (blocking): the status of what `rel` (at `path`) leads to."""
        fd = self._open_inside(rel, os.O_PATH)
        try:
            return _local_info(path, os.fstat(fd))
        finally:
            os.close(fd)

    def _ls_local(self, rel: str, path: str) -> list[dict[str, Any]]:
        """`ls` for file:// stores (blocking): a file lists as itself; a folder's links are
        followed, so a linked folder lists as a folder, and links that lead out of the root,
        or nowhere, are left out."""
        fd = self._open_inside(rel, os.O_PATH)
        try:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                return [_local_info(path, st)]
            return [info for _, info in self._entries(fd, rel)]
        finally:
            os.close(fd)

    def _entries(self, folder_fd: int, rel: str, progress: Progress | None = None) -> list[tuple[str, dict[str, Any]]]:
        """The entries of an opened folder of the store (`rel`), each with its status, a
        link's being its target's when that lies under the root (each a step of `progress`)."""
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=folder_fd)
        try:
            names = os.listdir(fd)
            out = []
            for name in sorted(names):
                child = posixpath.join(rel.strip("/"), name)
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        target = self._open_at(fd, name, child, os.O_PATH)
                        try:
                            st = os.fstat(target)
                        finally:
                            os.close(target)
                except PermissionDenied:
                    log.info("store %s: %s is a link out of the root; left out of its listing", self.source, child)
                    continue
                except (FileNotFoundError, NotADirectoryError) as exc:
                    log.debug("store %s: %s left out of its listing: %s", self.source, child, exc)
                    continue  # gone since listed, or a link to nothing
                except OSError as exc:
                    if exc.errno != errno.ELOOP:
                        raise
                    continue  # a link loop
                out.append((name, _local_info(posixpath.join(self._root, child), st)))
                if progress is not None:
                    progress.step()
            return out
        finally:
            os.close(fd)

    def _walk_local(self, rel: str, path: str, with_dirs: bool, page: int, *,
                    progress: Progress) -> Generator[list[UfsStatus], None, None]:
        """`walk_pages` for file:// stores (blocking, a page at each step): folder by folder
        through descriptors, never through a link out of the root, and never into a folder
        that is its own ancestor (links inside the root may form loops). Holds the entries
        of the folders from the top down to the one it is in, and one page."""
        fd = self._open_inside(rel, os.O_PATH)
        try:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                yield [self._status(_local_info(path, st))]
                return
            out: list[UfsStatus] = []
            for status in self._walk_folder(fd, rel.strip("/"), frozenset(), with_dirs, progress):
                out.append(status)
                if len(out) >= page:
                    yield out
                    out = []
            if out:
                yield out
        finally:
            os.close(fd)

    def _walk_folder(self, fd: int, rel: str, ancestors: frozenset[tuple[int, int]], with_dirs: bool,
                     progress: Progress) -> Iterator[UfsStatus]:
        """The statuses below an opened folder (`rel`) in path order: a subfolder's tree
        sorts at its name and a slash, after names such as "a.txt" beside a folder "a"
        ("." sorts before "/"), so each folder's entries are ordered with that key."""
        progress.step()
        st = os.fstat(fd)
        here = (st.st_dev, st.st_ino)
        if here in ancestors:
            return
        ordered: list[tuple[str, UfsStatus | None]] = []
        for name, info in self._entries(fd, rel, progress):
            is_dir = info["type"] == "directory"
            if with_dirs or not is_dir:
                ordered.append((name, self._status(info)))
            if is_dir:
                ordered.append((name + "/", None))
        ordered.sort(key=lambda item: item[0])
        for key, status in ordered:
            if status is not None:
                yield status
                continue
            name = key[:-1]
            child = posixpath.join(rel, name)
            try:
                inner = self._open_at(fd, name, child, _FOLDER)
            except (PermissionDenied, FileNotFoundError, NotADirectoryError):
                continue  # changed since it was listed
            try:
                yield from self._walk_folder(inner, child, ancestors | {here}, with_dirs, progress)
            finally:
                os.close(inner)

    def _rm_local(self, rel: str, recursive: bool, *, progress: Progress) -> None:
        """`rm` for file:// stores (blocking): the name is removed from its folder's
        descriptor; a link is removed, never followed; a folder only with `recursive`
        (`_rmtree_at`)."""
        folder, name = posixpath.split(rel.strip("/"))
        if not name:
            raise InvalidArgument(f"{self.url(rel)} is the mount's root; it cannot be deleted")
        fd = self._open_inside(folder, _FOLDER)
        try:
            if not stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                os.unlink(name, dir_fd=fd)
            elif recursive:
                _rmtree_at(fd, name, progress)
            else:
                os.rmdir(name, dir_fd=fd)
        finally:
            os.close(fd)

    def _mkdir_local(self, rel: str, *, progress: Progress) -> None:
        os.close(self._open_inside(rel, _FOLDER, make_folders=True))
        progress.step()

    # -- operations ---------------------------------------------------------------------------

    async def check(self) -> None:
        await self._call("check", "", lambda: self._blocking(self._ls_local, "", self._root))

    async def _info(self, rel: str, path: str) -> dict[str, Any]:
        return await self._blocking(self._info_local, rel, path)

    async def _ls(self, rel: str, path: str) -> list[dict[str, Any]]:
        return await self._blocking(self._ls_local, rel, path)

    async def _walk_pages(self, rel: str, path: str, with_dirs: bool,
                          page: int) -> AsyncGenerator[list[UfsStatus], None]:
        """`_walk_local` a page at a time on the store's threads, each page a step of one
        walk given up on once it makes no progress for the stall timeout. A walk left
        unfinished (its taker stopped) stops at its next step."""
        progress = Progress()
        pages = self._walk_local(rel, path, with_dirs, page, progress=progress)
        broken: list[BaseException] = []

        def take() -> list[UfsStatus] | None:
            if broken:  # a retry of a step that failed: the walk cannot go on from there
                raise broken[0]
            try:
                return next(pages, None)
            except BaseException as exc:
                broken.append(exc)
                raise

        try:
            while True:
                progress.at = time.monotonic()  # the time its taker held the last page is no stall
                chunk = await self._call("walk", rel, lambda: self._blocking(take), progress=progress)
                if chunk is None:
                    return
                yield chunk
        finally:
            progress.given_up = True
            with contextlib.suppress(ValueError):  # a step still running: it stops at its next step
                pages.close()

    async def totals(self, rel: str = "") -> StoreTotals:
        path = self._path(rel)
        return await self._call_with_progress("walk", rel, self._total_local, rel, path)

    def _total_local(self, rel: str, path: str, *, progress: Progress) -> StoreTotals:
        fd = self._open_inside(rel, os.O_PATH)
        try:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                return StoreTotals(1, st.st_size)
            return self._total_folder(fd, rel.strip("/"), frozenset(), progress)
        finally:
            os.close(fd)

    def _total_folder(self, fd: int, rel: str, ancestors: frozenset[tuple[int, int]], progress: Progress) -> StoreTotals:
        """`_walk_folder`, counting instead of collecting; after each folder it sleeps for as
        long as the folder took (times the pace), so a walk of millions of files leaves the
        processor (and the interpreter's lock) to the master's requests."""
        started = time.monotonic()
        progress.step()
        st = os.fstat(fd)
        here = (st.st_dev, st.st_ino)
        if here in ancestors:
            return StoreTotals(0, 0)
        files = size = 0
        folders = []
        for name, info in self._entries(fd, rel, progress):
            child = posixpath.join(rel, name)
            if _upload_rel(child):
                continue
            if info["type"] == "directory":
                folders.append((name, child))
            else:
                files += 1
                size += int(info.get("size") or 0)
        time.sleep((time.monotonic() - started) * (1 - TOTALS_DUTY) / TOTALS_DUTY)
        for name, child in folders:
            try:
                inner = self._open_at(fd, name, child, _FOLDER)
            except (PermissionDenied, FileNotFoundError, NotADirectoryError):
                continue  # changed since it was listed
            try:
                below = self._total_folder(inner, child, ancestors | {here}, progress)
            finally:
                os.close(inner)
            files, size = files + below.files, size + below.total_bytes
        return StoreTotals(files, size)

    async def _read(self, rel: str, path: str, start: int, end: int, version: str | None) -> bytes:
        return await self._blocking(self._read_local_checked, rel, path, start, end, version)

    def _read_local_checked(self, rel: str, path: str, start: int, end: int, version: str | None) -> bytes:
        """Bytes [start, end) (fewer only where it ends) of an opened file (blocking) that
        lies under the root (`_opened_inside`) and, with `version`, whose size and mtime (its
        version) are the same before and after the read. A rewrite within one tick of the file
        system's clock (nanoseconds on ext4, xfs and tmpfs) that keeps the size would go
        unseen."""
        fd = self._open_inside(rel)
        try:
            if version is not None:
                self._check_version(rel, version, _local_version(os.fstat(fd)))
            # One pread may return less before the end (network and FUSE file systems; Linux
            # returns at most 2 GiB - 4 KiB a call): read on until the end or the file's end.
            pieces, got = [], 0
            while start + got < end and (piece := os.pread(fd, end - start - got, start + got)):
                pieces.append(piece)
                got += len(piece)
            if version is not None:
                self._check_version(rel, version, _local_version(os.fstat(fd)))
            return b"".join(pieces)
        finally:
            os.close(fd)

    async def write(self, rel: str, data: bytes) -> UfsStatus:
        path = self._path(rel)
        return await self._call_with_progress("write", rel, self._place_local, rel, path,
                                   lambda out, progress: _copy_into(out, data, progress))

    async def _upload(self, rel: str, path: str, local_path: Path, length: int) -> UfsStatus:
        return await self._call_with_progress("upload", rel, self._place_local, rel, path,
                                   lambda out, progress: _copy_into(out, local_path, progress))

    async def copy(self, src: str, dst: str) -> UfsStatus:
        self._path(src)
        dst_path = self._path(dst)
        return await self._call_with_progress("copy", src, self._place_local, dst, dst_path,
                                   lambda out, progress: _copy_into(out, self._open_inside(src), progress))

    async def move_file(self, src: str, dst: str) -> UfsStatus:
        for rel in (src, dst):
            self._path(rel)  # names first: a link out by name gets the clear message
        st = await self._call_with_progress("move", src, self._rename_local, src, dst, file_only=True)
        if st is not None:
            return UfsStatus(path=dst.strip("/"), is_dir=False,
                             length=st.st_size, mtime_unix_ms=int(st.st_mtime * 1000), version=_local_version(st))
        return await super().move_file(src, dst)

    def _place_local(self, rel: str, path: str, fill: Callable[[BinaryIO, Progress], object], *,
                     progress: Progress) -> UfsStatus:
        """Write a file of a file:// store whole or not at all (blocking): `fill` writes a
        temporary file in the store's upload folder, which is fsynced and renamed over
        `path`; the status of that file. Both folders are opened through descriptors checked
        to lie under the root (`_open_inside`), missing ones made there (a link at `path`
        itself is replaced, never followed).

        A rename cannot leave its file system: when `path`'s folder is on another one than
        the upload folder, the temporary file is written in that folder, under a name no
        listing or status shows (`is_upload_temp`), and a note in the upload folder, on the
        disk before the file is made, names it, so `remove_dead_uploads` finds it if this
        process dies before it is renamed."""
        name = posixpath.basename(path)
        folder = posixpath.dirname(rel.strip("/"))
        folder_fd = self._open_inside(folder, _OPEN_FOLDER, make_folders=True)
        try:
            aside_fd = self._open_inside(UPLOAD_DIR, _OPEN_FOLDER, make_folders=True)
            try:
                token = uuid.uuid4().hex
                note = ""
                if os.fstat(aside_fd).st_dev == os.fstat(folder_fd).st_dev:
                    tmp_dir_fd, tmp = aside_fd, f"{_UPLOAD_TEMP_PREFIX}{token}{_UPLOAD_TEMP_SUFFIX}"
                else:
                    note = f".{token}{_ELSEWHERE_NOTE_SUFFIX}"
                    _write_note(aside_fd, note, folder)
                    tmp_dir_fd, tmp = folder_fd, f"{_TEMP_ELSEWHERE_PREFIX}{token}{_UPLOAD_TEMP_SUFFIX}"
                try:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                                 dir_fd=tmp_dir_fd)
                    try:
                        with open(fd, "wb") as out:
                            fcntl.flock(out.fileno(), fcntl.LOCK_EX)  # in progress, until closed (or the process ends)
                            fill(out, progress)
                            out.flush()
                            os.fsync(out.fileno())
                            st = os.fstat(out.fileno())
                        progress.step()  # not given up on: the file goes into place
                        os.replace(tmp, name, src_dir_fd=tmp_dir_fd, dst_dir_fd=folder_fd)
                    except BaseException:
                        with contextlib.suppress(OSError):
                            os.unlink(tmp, dir_fd=tmp_dir_fd)
                        raise
                finally:
                    if note:
                        with contextlib.suppress(OSError):
                            os.unlink(note, dir_fd=aside_fd)
            finally:
                os.close(aside_fd)
            os.fsync(folder_fd)
        finally:
            os.close(folder_fd)
        return UfsStatus(path=rel.strip("/"), is_dir=False, length=st.st_size,
                         mtime_unix_ms=int(st.st_mtime * 1000), version=_local_version(st))

    def _rename_local(self, src: str, dst: str, *, file_only: bool, progress: Progress) -> os.stat_result | None:
        """Rename `src` of a file:// store over `dst` (blocking) between the descriptors of
        their folders, checked to lie under the root (the destination's made if missing);
        the source's status, taken before the rename (which keeps size and mtime). A link is
        moved itself, never followed. None if the two are on different file systems or, with
        `file_only`, the source is not a plain file."""
        src_folder, src_name = posixpath.split(src.strip("/"))
        dst_folder, dst_name = posixpath.split(dst.strip("/"))
        if not src_name or not dst_name:
            raise InvalidArgument(f"cannot move {self.url(src)} to {self.url(dst)}: the mount's root stays where it is")
        src_fd = self._open_inside(src_folder, _FOLDER)
        try:
            dst_fd = self._open_inside(dst_folder, _OPEN_FOLDER, make_folders=True)
            try:
                st = os.stat(src_name, dir_fd=src_fd, follow_symlinks=False)
                if file_only and not stat.S_ISREG(st.st_mode):
                    return None
                progress.step()
                try:
                    os.replace(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
                except OSError as exc:
                    if exc.errno == errno.EXDEV:
                        return None
                    raise
                os.fsync(dst_fd)
            finally:
                os.close(dst_fd)
        finally:
            os.close(src_fd)
        return st

    async def remove_dead_uploads(self, older_than: float) -> int:
        """Remove the temporary files uploads to a file:// store left when their process died
        (killed, or its machine went down), in its upload folder or in the folders its notes
        there name (`_place_local`): those no process holds and unchanged for `older_than`
        seconds (see `_remove_if_dead`), never one under way. Returns how many."""
        path = self._path(UPLOAD_DIR)

        def sweep() -> int:
            try:
                folder_fd = self._open_inside(UPLOAD_DIR, _OPEN_FOLDER)
            except FileNotFoundError:
                return 0
            try:
                removed = 0
                for name in os.listdir(folder_fd):
                    if name.endswith(_ELSEWHERE_NOTE_SUFFIX):
                        removed += self._remove_dead_elsewhere(folder_fd, name, older_than)
                    elif (name.startswith(_UPLOAD_TEMP_PREFIX) and name.endswith(_UPLOAD_TEMP_SUFFIX)
                            and _remove_if_dead(folder_fd, name, older_than)):
                        log.info("store %s: removed %s/%s, left by an upload whose process ended", self.source, path, name)
                        removed += 1
                return removed
            finally:
                os.close(folder_fd)

        return await self._call("clean-up", UPLOAD_DIR, lambda: self._blocking(sweep))

    def _remove_dead_elsewhere(self, uploads_fd: int, note: str, older_than: float) -> int:
        """Remove the temporary file the note `note` (in the upload folder) names, if its
        writer is gone, and the note once it names nothing under way; 1 if a file went. The
        note's folder is looked up from the root like any other (`_open_inside`)."""
        token = note.removeprefix(".").removesuffix(_ELSEWHERE_NOTE_SUFFIX)
        tmp = f"{_TEMP_ELSEWHERE_PREFIX}{token}{_UPLOAD_TEMP_SUFFIX}"
        try:
            fd = os.open(note, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=uploads_fd)
        except FileNotFoundError:
            return 0  # its upload ended meanwhile
        try:
            written = os.fstat(fd).st_mtime
            folder = os.read(fd, 4096).decode("utf-8", "replace")
        finally:
            os.close(fd)
        removed = 0
        try:
            folder_fd = self._open_inside(folder, _OPEN_FOLDER)
        except (OSError, StrataError):
            folder_fd = -1  # gone, or no longer under the root: nothing of ours to remove there
        if folder_fd >= 0:
            try:
                if _remove_if_dead(folder_fd, tmp, older_than):
                    log.info("store %s: removed %s/%s, left by an upload whose process ended", self.source,
                             posixpath.join(self._root, folder), tmp)
                    removed = 1
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.stat(tmp, dir_fd=folder_fd, follow_symlinks=False)
                        return 0  # under way, or not old enough yet: the note stays
            finally:
                os.close(folder_fd)
        if removed or time.time() - written >= older_than:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(note, dir_fd=uploads_fd)
        return removed

    async def rm(self, rel: str, recursive: bool = False) -> None:
        self._path(rel)
        await self._call_with_progress("delete", rel, self._rm_local, rel, recursive)

    async def mv(self, src: str, dst: str) -> None:
        self._path(src)
        self._path(dst)
        moved = await self._call_with_progress("move", src, self._rename_local, src, dst, file_only=False)
        if moved is None:  # onto another file system: copied, then removed
            await self._copy_tree(src, dst)
            await self.rm(src, recursive=True)

    async def _copy_tree(self, src: str, dst: str) -> None:
        """Copy a file, or a folder and all below it, within a file:// store."""
        top = src.strip("/")
        for status in await self.walk(src, with_dirs=True):
            below = dst.strip("/") + status.path[len(top):]
            if status.is_dir:
                await self.mkdir(below)
            else:
                await self.copy(status.path, below)
        if (await self.info(src)).is_dir:
            await self.mkdir(dst)

    async def mkdir(self, rel: str) -> None:
        self._path(rel)
        await self._call_with_progress("mkdir", rel, self._mkdir_local, rel)
