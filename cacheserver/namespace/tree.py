"""The file tree the master serves: file status and listings over all mounts, and the
changes clients make through Strata (files written, deleted, renamed, given a time; pins).

It stands on two layers: `answers.StoreAnswers`, the per-mount cache of what the stores said
(fresh as each mount's metadata sync interval asks, single flight, stale-if-error), and
`overlay.NamespaceOverlay`, the files written through Strata and the pins, journaled, applied
to those answers. Any change made through Strata invalidates the affected answers at once.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from strata.contract.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from ..ufs import UfsStatus
from .entries import FileEntry, OverlayEntry
from .mounts import Mount
from .overlay import NamespaceOverlay
from ..common.paths import is_under, join, normalize, relative
from .permissions import check_writable
from .relpaths import rel_parent, rel_under
from .statuses import find_listed
from .walks import Walk

# Entries a listing makes at a time (`Namespace.list_pages`); the master sends each page as one
# message (~135 bytes an entry, more with long paths: ~1 MiB at 4,096-byte paths a page of 250).
LIST_PAGE_ENTRIES = 1000

T = TypeVar("T")


async def _once(item: T) -> AsyncIterator[T]:
    yield item


class Namespace(NamespaceOverlay):
    """Metadata over the mount table (see the module docstring)."""

    # -- reading ----------------------------------------------------------------------------------

    async def get_status(self, path: str) -> FileEntry:
        """The file or directory at `path`; NotFound if there is none."""
        path = normalize(path)
        self._sync_mounts()
        mount = self._mounts.find(path)
        if mount is None:
            if self._holds_mounts(path):
                return self._dir_entry(path, None)
            self._mounts.resolve(path)  # raises NotFound naming the mounts
            raise AssertionError("unreachable")
        mount.check_usable()
        rel = relative(path, mount.path)
        if rel == "":
            return self._mount_root(mount)
        written = self._overlay.get(path)
        if written is not None and written.mount_id == mount.mount_id and not written.persisted:
            return self._overlay_entry(mount, path, written)  # only Strata has it: no store call
        entry = self._merge(mount, rel, await self._store_status(mount, rel))
        if entry is not None:
            return entry
        if self._written_below(mount, path):
            return self._dir_entry(path, mount)
        raise NotFound(f"{path} does not exist (looked in {self._mounts.store(mount).url(rel)})")

    async def list_status(self, path: str, recursive: bool = False) -> list[FileEntry]:
        """The entries in directory `path` (with `recursive`, everything below it), sorted
        by path; a file lists as itself."""
        entries = [entry async for page in self.list_pages(path, recursive) for entry in page]
        if self._mounts.find(normalize(path)) is None:
            entries.sort(key=lambda e: e.path)  # mounts' trees side by side
        return entries

    async def list_pages(self, path: str, recursive: bool = False, *,
                         page: int = LIST_PAGE_ENTRIES) -> AsyncIterator[list[FileEntry]]:
        """`list_status` in pages of at most `page` entries, each made when the one before
        was taken (a listing of millions of files is never held as entries at once, and the
        event loop serves other requests between pages). Sorted by path within each mount;
        a recursive listing above mount points gives each mount's tree after its root. A
        recursive listing that needs a walk of the store gives its pages as the walk puts
        them in (`walks.Walk`), where the store walks in path order, nothing stale would be
        served if the walk failed, and no file written through Strata waits below `path`;
        a walk that fails midway ends the listing with its error."""
        if page <= 0:
            raise InvalidArgument(f"a listing's page must hold at least one entry, got {page}")
        path = normalize(path)
        self._sync_mounts()
        mount = self._mounts.find(path)
        if mount is None:
            async for chunk in self._pages_above_mounts(path, recursive, page):
                yield chunk
            return
        mount.check_usable()
        rel = relative(path, mount.path)
        if rel:
            known = self._known_status(mount, rel)
            status = None if known is None else known.value
            if status is not None and not status.is_dir:
                file_entry = self._merge(mount, rel, status)
                if file_entry is not None:
                    yield [file_entry]
                    return
        walk = self._walk_under_way(mount, rel) if recursive and not self._written_below(mount, path) else None
        if walk is not None:
            # A fresh walk: its entries go out as it puts them in, in pages; nothing is held but
            # the walk's columns (the cache's answer anyway) and a page.
            async for chunk in self._paged(self._walked_entries(mount, *walk), page):
                yield chunk
            if walk[1].result()[0] is not None:
                return
            statuses: Sequence[UfsStatus] | None = None  # nothing at `rel` in the store
        else:
            statuses = await self._fetch(mount, "walk" if recursive else "list", rel)
        if statuses is None:
            if rel == "":
                statuses = []  # an empty mount (e.g. a bucket prefix with no objects yet)
            else:
                entry = await self.get_status(path)  # NotFound, or a file/dir only Strata knows
                if not entry.is_dir:
                    yield [entry]
                    return
                statuses = []
        elif rel and len(statuses) == 1 and statuses[0].path == rel and not statuses[0].is_dir:
            file_entry = self._merge(mount, rel, statuses[0])
            if file_entry is not None:
                yield [file_entry]
            return
        extra = self._written_extra(mount, rel, statuses, recursive)
        merged = self._merged(mount, statuses)
        async for chunk in self._paged(_once(heapq.merge(merged, extra, key=lambda e: e.path) if extra else merged),
                                       page):
            yield chunk

    @staticmethod
    async def _paged(runs: AsyncIterator[Iterator[FileEntry] | None], page: int) -> AsyncIterator[list[FileEntry]]:
        """The entries of `runs` in pages of `page`, each made when the one before was taken,
        and a page short of `page` wherever `runs` gives a None (no more entries at once)."""
        taken: list[FileEntry] = []
        async for run in runs:
            if run is None:
                if taken:
                    yield taken
                    taken = []
                continue
            for entry in run:
                taken.append(entry)
                if len(taken) >= page:
                    yield taken
                    taken = []
                    await asyncio.sleep(0)
        if taken:
            yield taken

    async def _walked_entries(self, mount: Mount, walk: Walk,
                              answer: asyncio.Task[Any]) -> AsyncIterator[Iterator[FileEntry] | None]:
        """The entries of a walk under way as it puts them in (`Walk.entries`), the overlay applied."""
        async for run in walk.entries(answer):
            yield None if run is None else self._merged(mount, run)

    def _merged(self, mount: Mount, statuses: Iterable[UfsStatus]) -> Iterator[FileEntry]:
        """The store's entries of a listing, with the overlay applied, one at a time."""
        for status in statuses:
            merged = self._merge(mount, status.path, status)
            if merged is not None:
                yield merged

    def _written_extra(self, mount: Mount, rel: str, statuses: Sequence[UfsStatus], recursive: bool) -> list[FileEntry]:
        """What a listing of `rel` shows beyond the store's `statuses` (sorted by path): files
        written through Strata and not in the store yet, and their folders; sorted by path.
        A persisted written file the listing lacks was deleted outside Strata: forgotten."""

        def listed(file_rel: str) -> bool:
            return find_listed(statuses, file_rel) is not None

        out: dict[str, FileEntry] = {}
        base = join(mount.path, rel)
        for path, written in self._written_below(mount, base):
            file_rel = relative(path, mount.path)
            if recursive or rel_parent(file_rel) == rel:
                if not listed(file_rel):
                    if written.persisted:
                        # The store listing is fresh and lacks it: deleted outside Strata.
                        del self._overlay[path]
                        self._save()
                        continue
                    out[path] = self._overlay_entry(mount, path, written)
                parents = []
                parent_rel = rel_parent(file_rel)
                while parent_rel != rel and rel_under(parent_rel, rel):
                    parents.append(parent_rel)
                    parent_rel = rel_parent(parent_rel)
            else:
                below = file_rel[len(rel):].lstrip("/") if rel else file_rel
                parents = [join(rel, below.split("/", 1)[0]) if rel else below.split("/", 1)[0]]
            for parent_rel in parents:
                parent_path = join(mount.path, parent_rel)
                if not listed(parent_rel) and parent_path not in out:
                    out[parent_path] = self._dir_entry(parent_path, mount)
        return sorted(out.values(), key=lambda e: e.path)

    async def _pages_above_mounts(self, path: str, recursive: bool, page: int) -> AsyncIterator[list[FileEntry]]:
        """Listing "/" or a directory that only holds mount points: its children, then
        (recursive) each child's tree in turn."""
        if not self._holds_mounts(path):
            self._mounts.resolve(path)  # raises NotFound naming the mounts
        children: dict[str, FileEntry] = {}
        for mount in self._mounts.list():
            if mount.path == path or not is_under(mount.path, path):
                continue
            below = mount.path[len(path):].lstrip("/")
            child = join(path, below.split("/", 1)[0])
            children[child] = self._mount_root(mount) if child == mount.path else self._dir_entry(child, None)
        out = sorted(children.values(), key=lambda e: e.path)
        for at in range(0, len(out), page):
            yield out[at:at + page]
        if recursive:
            for entry in out:
                async for chunk in self.list_pages(entry.path, recursive=True, page=page):
                    yield chunk

    # -- changes ------------------------------------------------------------------------------------

    def writable(self, path: str, action: str = "write") -> tuple[Mount, str]:
        """The mount of `path` and the path in it, if a client may `action` it (`check_writable`)."""
        self._sync_mounts()
        return self._writable(normalize(path), action)

    def _writable(self, path: str, action: str) -> tuple[Mount, str]:
        mount, rel = self._mounts.resolve(path)
        check_writable(path, rel, mount_path=mount.path, read_only=mount.options.read_only, action=action)
        return mount, rel

    def commit_file(
        self,
        path: str,
        *,
        length: int,
        version: str,
        persisted: bool,
        ufs_version: str | None = None,
        block_size: int = 0,
    ) -> FileEntry:
        """Record a file written through Strata. `ufs_version` is the store's version of the
        persisted copy; when a persisted file comes without one, the writer used the
        store's version as the file's `version`. `block_size` is the size its blocks were
        cut with (0: the namespace's); a commit of a version already recorded keeps the
        size recorded first (its blocks are cut already)."""
        path = normalize(path)
        self._sync_mounts()
        mount, _ = self._writable(path, "write")
        if not version:
            raise InvalidArgument(f"commit of {path}: the file's version must not be empty")
        if length < 0:
            raise InvalidArgument(f"commit of {path}: length must not be negative, got {length}")
        if block_size < 0:
            raise InvalidArgument(f"commit of {path}: block size must not be negative, got {block_size}")
        previous = self._overlay.get(path)
        if previous is not None and previous.version == version and previous.block_size:
            block_size = previous.block_size
        written = OverlayEntry(
            mount_id=mount.mount_id,
            length=length,
            version=version,
            mtime_unix_ms=int(time.time() * 1000),
            persisted=persisted,
            ufs_version=(ufs_version or version) if persisted else None,
            block_size=block_size or self._block_size,
        )
        self._change({**self._overlay, path: written})
        self.invalidate(path)
        return self._overlay_entry(mount, path, written)

    def written(self, path: str) -> OverlayEntry | None:
        """The record of a file written through Strata at `path`, if there is one."""
        self._sync_mounts()
        return self._overlay.get(normalize(path))

    def pending_write(self, path: str, version: str) -> tuple[Mount, str] | None:
        """(mount, relative path) of `path` if `version` of it is the current write and not
        in the store yet; None if the file was removed, replaced or persisted since."""
        path = normalize(path)
        self._sync_mounts()
        written = self._overlay.get(path)
        mount = self._mounts.find(path)
        if written is None or mount is None or written.mount_id != mount.mount_id:
            return None
        if written.version != version or written.persisted:
            return None
        return mount, relative(path, mount.path)

    def mark_persisted(self, path: str, ufs_version: str, *, version: str | None = None) -> FileEntry:
        """A written file reached the store (an ASYNC_THROUGH upload was moved into place);
        its cached blocks stay valid while the store holds `ufs_version`. With `version`,
        only that write of the file is marked (NotFound if it was replaced or removed). The
        entry records the generation it landed at (`OverlayEntry.landed`)."""
        path = normalize(path)
        self._sync_mounts()
        written = self._overlay.get(path)
        mount = self._mounts.find(path)
        if written is None or mount is None or written.mount_id != mount.mount_id:
            raise NotFound(f"{path} has no write waiting to be persisted; commit it first")
        if version is not None and written.version != version:
            raise NotFound(f"{path} was replaced since version {version} was written (now {written.version})")
        if not ufs_version:
            raise InvalidArgument(f"persist of {path}: the store's version must not be empty")
        persisted = replace(written, persisted=True, ufs_version=ufs_version, landed=self._generation + 1)
        self._change({**self._overlay, path: persisted})
        self.invalidate(path)
        return self._overlay_entry(mount, path, persisted)

    def drop_unpersisted(self, path: str, version: str | None = None) -> OverlayEntry | None:
        """Forget the write of `path` that is not in the store yet (only `version` of it, if
        given): a newer write supersedes it, or its writer could not acknowledge it. Returns
        the dropped entry, None if there was none."""
        path = normalize(path)
        self._sync_mounts()
        written = self._overlay.get(path)
        if written is None or written.persisted or (version is not None and written.version != version):
            return None
        self._change({p: e for p, e in self._overlay.items() if p != path})
        self.invalidate(path)
        return written

    def unpersisted_below(self, path: str) -> list[tuple[str, OverlayEntry]]:
        """Written files at or below `path` that are not in the store yet: their cached
        blocks are the only copy."""
        path = normalize(path)
        return sorted((p, e) for p, e in self._overlay.items() if not e.persisted and is_under(p, path))

    def _drop_written(self, path: str) -> dict[str, OverlayEntry]:
        """Remove and return the overlay entries at or below `path`."""
        dropped = {p: e for p, e in self._overlay.items() if is_under(p, path)}
        if dropped:
            self._change({p: e for p, e in self._overlay.items() if p not in dropped})
        return dropped

    async def delete(self, path: str, recursive: bool = False) -> dict[str, OverlayEntry]:
        """Delete a file, or a directory (non-empty ones only with `recursive`), in the
        store and in the overlay. Returns the written files it dropped from the overlay."""
        path = normalize(path)
        self._sync_mounts()
        mount, rel = self._writable(path, "delete")
        entry = await self.get_status(path)
        if entry.is_dir and not recursive and await self.list_status(path):
            raise FailedPrecondition(f"directory {path} is not empty; delete it recursively")
        # The store first, also for a file not persisted yet (an older copy may be there, which
        # must not show again): if the store cannot be reached, nothing changes.
        try:
            await self._mounts.store(mount).rm(rel, recursive=entry.is_dir)
        except NotFound:
            pass  # already gone from the store (or never there: a file or folder written through Strata)
        finally:
            self.invalidate(path)
        return self._drop_written(path)

    async def rename(self, src: str, dst: str) -> None:
        """Move a file or directory within one mount."""
        src, dst = normalize(src), normalize(dst)
        self._sync_mounts()
        src_mount, src_rel = self._mounts.resolve(src)
        dst_mount, dst_rel = self._mounts.resolve(dst)
        if src_mount.mount_id != dst_mount.mount_id:
            raise InvalidArgument(
                f"cannot rename {src} (mount {src_mount.path}) to {dst} (mount {dst_mount.path}): "
                "both must be in one mount; copy the data and delete the original instead"
            )
        self._writable(src, "rename")
        self._writable(dst, "rename onto")
        if is_under(dst, src):
            raise InvalidArgument(f"cannot move {src} into itself ({dst})")
        entry = await self.get_status(src)
        unpersisted = self.unpersisted_below(src)
        if unpersisted:
            # Cached blocks are keyed by path: a move would orphan the only copy.
            raise FailedPrecondition(
                f"cannot rename {src}: {unpersisted[0][0]} is not in the store yet (written with MUST_CACHE, "
                "or its ASYNC_THROUGH upload is pending); rename it once it is persisted, or copy it"
            )
        try:
            await self.get_status(dst)
        except NotFound:
            pass
        else:
            raise AlreadyExists(f"cannot rename {src} to {dst}: {dst} already exists; delete it first")
        # One change: the written files leave `src` and arrive at `dst` together.
        moved = {p: e for p, e in self._overlay.items() if is_under(p, src)}
        if moved:
            kept = {p: e for p, e in self._overlay.items() if p not in moved}
            self._change({**kept, **{dst + old[len(src):]: written for old, written in moved.items()}})
        try:
            if entry.persisted or entry.is_dir:
                await self._mounts.store(src_mount).mv(src_rel, dst_rel)
        except NotFound:
            if not (entry.is_dir and moved):
                raise
        finally:
            self.invalidate(src)
            self.invalidate(dst)

    async def set_mtime(self, path: str, mtime_unix_ms: int) -> FileEntry:
        """Give a file the modification time a program set (utime). Stores such as S3 keep
        their own times, so the namespace keeps it, as an overlay entry of the file's current
        version: it holds while the store's file stays that version (a changed file shows the
        store's time again), moves with renames and goes with deletes. A directory's time is
        not kept (it is the store's, or none)."""
        path = normalize(path)
        self._sync_mounts()
        mount, _ = self._writable(path, "set the time of")
        if mtime_unix_ms < 0:
            raise InvalidArgument(f"time of {path}: must be at or after 1970, got {mtime_unix_ms} ms")
        entry = await self.get_status(path)
        if entry.is_dir:
            return entry
        written = self._overlay.get(path)
        if written is not None and written.mount_id == mount.mount_id:
            timed = replace(written, mtime_unix_ms=mtime_unix_ms)
        else:  # a file only the store knows: keep its identity, change its time
            timed = OverlayEntry(mount_id=mount.mount_id, length=entry.length, version=entry.version,
                                 mtime_unix_ms=mtime_unix_ms, persisted=True, ufs_version=entry.version)
        self._change({**self._overlay, path: timed})
        return self._overlay_entry(mount, path, timed)

    # -- pins and invalidation --------------------------------------------------------------------

    def set_pinned(self, path: str, pinned: bool) -> None:
        """Pin (or unpin) everything at or below `path`. Unpinning removes a pin set on
        exactly this path; pins on a parent still hold."""
        path = normalize(path)
        self._sync_mounts()
        mount, _ = self._mounts.resolve(path)
        pins = set(self._pins.get(mount.mount_id, ()))
        if pinned:
            pins.add(path)
        else:
            pins.discard(path)
        self._change(pins={**self._pins, mount.mount_id: pins})

    def pinned_prefixes(self, mount_id: int) -> list[str]:
        """Namespace paths pinned in a mount (the mount's own `pin` option not included)."""
        self._sync_mounts()
        return sorted(self._pins.get(mount_id, ()))

    def invalidate(self, path: str) -> None:
        """Forget what the stores said about `path`, below it and its parents: the next
        access asks the store again."""
        path = normalize(path)
        self._sync_mounts()
        mount = self._mounts.find(path)
        if mount is not None:
            cache = self._caches.get(mount.mount_id)
            if cache is not None:
                cache.drop(relative(path, mount.path))
            return
        for covered in self._mounts.list():
            if is_under(covered.path, path):
                self._caches.pop(covered.mount_id, None)
