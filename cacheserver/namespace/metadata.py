"""The metadata the master serves: file status and listings over all mounts.

Answers come from a per-mount cache of what the stores said, refreshed according to the
mount's metadata sync interval: 0 asks the store on every access, -1 never asks again once a
path is known, N serves answers at most N seconds old (measured from when the store request
started). Concurrent misses on one path share one store request (single flight), and any
change made through Strata invalidates the affected entries at once.

Answers reused by clients (`valid_for`, FileInfo.valid_for_ms): on a read-only mount synced
every N > 0 seconds (or never, -1), the master's answer for a path is the store's answer it
cached, served unchanged until that entry expires (started + N) unless something through
Strata invalidates it first (a worker that found the file changed in the store, a remount).
Each answer carries what is left of that freshness (of the path's own entry or the parent's
listing, whichever answered), at most MAX_ANSWER_REUSE, and a client may reuse it until
its request's send time plus that: it never sees anything the master would not have said
then, except after such an early invalidation (which the reader finds out at its next block
read: the worker refuses blocks of a version the namespace no longer names). Everything else
carries 0 and is asked for each time: writable mounts (close-to-open for writes through other
clients), interval 0, answers served stale (below), files written through Strata, mount
roots and the directories holding mounts.

Stale-if-error: when the store cannot be reached (refused, 5xx: `Unavailable`; no answer
within its deadline: `DeadlineExceeded`; no answer within `StoreTimeouts.stale_after`) and
the mount allows it (`stale_if_error`, on by default), an expired answer is served instead of
the error, and counted. Only an outage is masked: a store that answers "not found" or refuses
credentials is believed at once, and entries dropped by a change made through Strata are
gone, not stale. (A mount synced on every access keeps no answers, so has none to serve.)

Files written through Strata live in an overlay until the store's copy takes over:
- not yet persisted (MUST_CACHE, ASYNC_THROUGH before its upload): the overlay is the only
  record; the file shows persisted=False and appears in listings;
- persisted: the file keeps the version it was written with (the key of its cached blocks)
  for as long as the store still holds that very copy (the store's version equals the
  recorded `ufs_version`); once the store's file changes or disappears, the overlay entry is
  dropped and the store's view wins.
The overlay and the pins are saved in the state directory, like the mount table.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from strata.contract.constants import UPLOAD_DIR
from strata.contract.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from ..ufs import StoreTimeouts, UfsStatus, is_upload_temp
from .mounts import Mount, MountTable
from ..common.paths import is_under, join, name, normalize, relative
from .statuses import Folder, Statuses, find_listed
from .statefile import StateFile

log = logging.getLogger(__name__)

STATE_FILE = "namespace.json"
# Entries a listing makes at a time (`Namespace.list_pages`); the master sends each page as one
# message (~135 bytes an entry, more with long paths: ~1 MiB at 4,096-byte paths a page of 250).
LIST_PAGE_ENTRIES = 1000
# The longest a client may reuse an answer (`Namespace.valid_for`), whatever the mount's
# interval ("never" included): a client misses an early invalidation of its answer until its
# next block read of the file, and a remount or pin made through another client, for at
# most this long. 300 s: a training epoch over a 100,000-file dataset then asks the master
# at most once per file every 5 minutes (~330 stats/s spread out, where it answers
# thousands), while a change made elsewhere shows within the time of a job's step.
MAX_ANSWER_REUSE = 300.0


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str  # namespace path
    name: str
    is_dir: bool
    length: int
    mtime_unix_ms: int
    version: str  # identifies the content; part of every block key; "" for directories
    block_size: int
    persisted: bool  # False while a file written through Strata is not in the store yet
    pinned: bool
    mount_id: int  # 0 for "/" and the directories that only hold mount points
    read_only: bool
    # The store's version of the object the file's bytes are read from ("" while the file
    # is not in the store): blocks are fetched from the store only while it holds this one.
    store_version: str = ""


@dataclass(frozen=True)
class OverlayEntry:
    """A file written through Strata."""

    mount_id: int
    length: int
    version: str
    mtime_unix_ms: int
    persisted: bool
    ufs_version: str | None  # the store's version of the persisted copy
    # The block size its blocks were cut with (0 in records older than this field: the
    # namespace's); a written file keeps it when the cluster's block size changes.
    block_size: int = 0
    # The namespace's generation when an ASYNC_THROUGH upload of this version was moved into
    # place in the store (0: never). A write prepared before it (`Namespace.generation`) may
    # have had its own object replaced in the store by that upload.
    landed: int = 0


@dataclass(slots=True)
class _Fetched:
    value: Any
    started: float  # time.monotonic() when the store request began

    def listed(self, rel: str) -> UfsStatus | None:
        """The entry for `rel` in this listing (a list or walk answer)."""
        return None if self.value is None else find_listed(self.value, rel)


def _fresh(started: float, now: float, interval: float) -> bool:
    if interval < 0:
        return True
    return interval > 0 and now - started <= interval


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _nameable(mount: Mount, where: str, statuses: list[UfsStatus]) -> list[UfsStatus]:
    """`statuses` without the entries whose names are not UTF-8 (a POSIX file name may be
    any bytes; a Strata path is text): each is left out with a warning naming it, so the
    rest of the folder stays listable."""
    kept = [s for s in statuses if _utf8(s.path)]
    if len(kept) != len(statuses):
        for status in statuses:
            if not _utf8(status.path):
                raw = status.path.encode("utf-8", "surrogateescape")
                log.warning(
                    "mount %s: left %r (in %s) out of its listing: the name is not UTF-8; "
                    "rename it in the store to read it through Strata", mount.path, raw, where,
                )
    return kept


def _rel_under(path: str, root: str) -> bool:
    """`is_under` for paths relative to a mount root ("" = the root)."""
    return root == "" or path == root or path.startswith(root + "/")


def _rel_parent(rel: str) -> str:
    return rel.rpartition("/")[0]


def upload_rel(version: str) -> str:
    """Where the ASYNC_THROUGH upload of a written version lands first, relative to the
    mount's root."""
    return f"{UPLOAD_DIR}/{version}"


def is_upload_path(rel: str) -> bool:
    """Paths of Strata's own upload folder, and of uploads' temporary files written in
    another folder (`ufs.is_upload_temp`), never shown or served as the mount's files."""
    return _rel_under(rel, UPLOAD_DIR) or is_upload_temp(rel.rpartition("/")[2])


def check_writable(path: str, rel: str, *, mount_path: str, read_only: bool, action: str) -> None:
    """Refuse a client's change (`action`, e.g. "write") of `path`, `rel` in the mount at
    `mount_path`, where clients may not change anything: the mount point itself, a read-only
    mount, the store's upload folder (where ASYNC_THROUGH files wait to be moved into place:
    a file put there could stand in for another writer's acknowledged bytes)."""
    if rel == "":
        raise InvalidArgument(f"{path} is a mount point; cannot {action} it (unmount it instead)")
    if read_only:
        raise PermissionDenied(f"mount {mount_path} is read-only; cannot {action} {path}")
    if is_upload_path(rel):
        raise PermissionDenied(
            f"cannot {action} {path}: {UPLOAD_DIR} is Strata's own upload folder in the store, and names like "
            f"{name(path)!r} its uploads' temporary files, closed to clients"
        )


class _MountCache:
    """What one mount's store said, by (kind, relative path); kinds: info, list, walk."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], _Fetched] = {}
        self.flights: dict[tuple[str, str], tuple[float, asyncio.Task[Any]]] = {}
        # Bumped by every invalidation: a store request that started before it must not
        # store its (possibly stale) answer.
        self.epoch = 0

    def drop(self, rel: str) -> None:
        """Forget `rel`, everything below it and its ancestors (whose listings show it)."""
        self.entries = {
            key: value
            for key, value in self.entries.items()
            if not (_rel_under(key[1], rel) or _rel_under(rel, key[1]))
        }
        self.flights.clear()
        self.epoch += 1

    def remember(self, kind: str, rel: str, value: Any, started: float,
                 listings: dict[str, Folder] | None = None) -> None:
        """Keep a store's answer; a walk's with the listings of the folders it found
        (`walk_listings`)."""
        self.entries[(kind, rel)] = _Fetched(value, started)
        for directory, listed in (listings or {}).items():
            self.entries[("list", directory)] = _Fetched(listed, started)


def walk_listings(rel: str, walked: Statuses | None) -> dict[str, Folder]:
    """The listing of every folder a walk of `rel` found, by folder: a walk is a complete
    snapshot of the tree, so it answers listings below it, and stats from those
    (Namespace._known_status) with no entry of each file's own. Nothing for a walk of a
    file (which finds the file itself). Pure: made off the event loop."""
    if walked is None or walked.find(rel) is not None:
        return {}
    children: dict[str, Folder] = {rel: Folder(walked)}
    for position, status in enumerate(walked):
        parent = _rel_parent(status.path)
        folder = children.get(parent)
        if folder is None:
            folder = children[parent] = Folder(walked)
        folder.append(position)
        if status.is_dir and status.path not in children:
            children[status.path] = Folder(walked)
    return {directory: listed for directory, listed in children.items() if _rel_under(directory, rel)}


class Namespace:
    """Metadata over the mount table (see the module docstring)."""

    def __init__(self, mounts: MountTable, state_dir: Path | None, *, block_size: int,
                 timeouts: StoreTimeouts | None = None) -> None:
        if block_size <= 0:
            raise InvalidArgument(f"block size must be positive, got {block_size}")
        self._stale_after = (timeouts or StoreTimeouts()).stale_after
        self._mounts = mounts
        self._state = StateFile(state_dir, STATE_FILE)
        self._block_size = block_size
        self._caches: dict[int, _MountCache] = {}
        self._overlay: dict[str, OverlayEntry] = {}
        self._pins: dict[int, set[str]] = {}
        # One up with every change, kept in the journal: orders changes across restarts.
        self._generation = 0
        self._seen_version = -1
        # Answers given from expired metadata because the store could not be reached, by
        # mount path (a metric).
        self.stale_served: dict[str, int] = {}
        self._load()
        self._sync_mounts()

    # -- persistence ----------------------------------------------------------------------------

    def _load(self) -> None:
        data = self._state.load()
        if data is None:
            return
        self._overlay = {p: OverlayEntry(**e) for p, e in data.get("overlay", {}).items()}
        self._pins = {int(m): set(paths) for m, paths in data.get("pins", {}).items()}
        self._generation = int(data.get("generation", 0))

    @property
    def generation(self) -> int:
        """Goes up with every change and never down, also across restarts (it is journaled):
        what happened at a higher generation happened after what saw a lower one."""
        return self._generation

    def _save(self) -> None:
        self._write_state(self._overlay, self._pins, self._generation)

    def _write_state(self, overlay: dict[str, OverlayEntry], pins: dict[int, set[str]], generation: int) -> None:
        self._state.save(
            {
                "overlay": {p: asdict(e) for p, e in overlay.items()},
                "pins": {str(m): sorted(paths) for m, paths in pins.items() if paths},
                "generation": generation,
            },
        )

    def _change(self, overlay: dict[str, OverlayEntry] | None = None, pins: dict[int, set[str]] | None = None) -> None:
        """Make `overlay` (and `pins`) the namespace's state: saved first, then taken. A save
        that fails (a full disk) changes nothing, and the caller's error says so: what the
        master answers never runs ahead of what it finds again after a restart (a worker
        told a write is in the store drops its staged copy)."""
        overlay = self._overlay if overlay is None else overlay
        pins = self._pins if pins is None else pins
        self._write_state(overlay, pins, self._generation + 1)
        self._overlay, self._pins = overlay, pins
        self._generation += 1

    def _sync_mounts(self) -> None:
        """Forget caches, overlay entries and pins of mounts that are gone or replaced."""
        version = self._mounts.version
        if version == self._seen_version:
            return
        self._seen_version = version
        live = {m.mount_id: m for m in self._mounts.list()}
        for mount_id in [m for m in self._caches if m not in live]:
            del self._caches[mount_id]
        stale = [
            p for p, e in self._overlay.items()
            if e.mount_id not in live or not is_under(p, live[e.mount_id].path)
        ]
        gone_pins = [m for m in self._pins if m not in live]
        for p in stale:
            del self._overlay[p]
        for m in gone_pins:
            del self._pins[m]
        if stale or gone_pins:
            self._save()

    # -- entries ----------------------------------------------------------------------------------

    def _pinned(self, mount: Mount, path: str) -> bool:
        return mount.options.pin or any(is_under(path, p) for p in self._pins.get(mount.mount_id, ()))

    def _dir_entry(self, path: str, mount: Mount | None, mtime_unix_ms: int = 0) -> FileEntry:
        return FileEntry(
            path=path, name=name(path), is_dir=True, length=0, mtime_unix_ms=mtime_unix_ms,
            version="", block_size=self._block_size, persisted=True,
            pinned=mount is not None and self._pinned(mount, path),
            mount_id=mount.mount_id if mount else 0,
            read_only=mount.options.read_only if mount else True,
        )

    def _status_entry(self, mount: Mount, status: UfsStatus) -> FileEntry:
        path = join(mount.path, status.path)
        return FileEntry(
            path=path, name=name(path), is_dir=status.is_dir, length=status.length,
            mtime_unix_ms=status.mtime_unix_ms, version=status.version,
            block_size=self._block_size, persisted=True, pinned=self._pinned(mount, path),
            mount_id=mount.mount_id, read_only=mount.options.read_only, store_version=status.version,
        )

    def _overlay_entry(self, mount: Mount, path: str, entry: OverlayEntry) -> FileEntry:
        return FileEntry(
            path=path, name=name(path), is_dir=False, length=entry.length,
            mtime_unix_ms=entry.mtime_unix_ms, version=entry.version,
            block_size=entry.block_size or self._block_size, persisted=entry.persisted,
            pinned=self._pinned(mount, path), mount_id=mount.mount_id,
            read_only=mount.options.read_only,
            store_version=(entry.ufs_version or "") if entry.persisted else "",
        )

    def _merge(self, mount: Mount, rel: str, status: UfsStatus | None) -> FileEntry | None:
        """The entry for `rel` given what the store says (None: nothing there), with the
        overlay applied; drops overlay entries the store has overtaken."""
        path = join(mount.path, rel)
        written = self._overlay.get(path)
        if written is not None and written.mount_id == mount.mount_id:
            if not written.persisted:
                return self._overlay_entry(mount, path, written)
            if status is not None and not status.is_dir and status.version == written.ufs_version:
                return self._overlay_entry(mount, path, written)
            del self._overlay[path]  # the store's file changed or went away: it wins
            self._save()
        return None if status is None else self._status_entry(mount, status)

    def _written_below(self, mount: Mount, path: str) -> list[tuple[str, OverlayEntry]]:
        """Overlay entries strictly below `path` in `mount`."""
        return [
            (p, e) for p, e in self._overlay.items()
            if e.mount_id == mount.mount_id and p != path and is_under(p, path)
        ]

    def _holds_mounts(self, path: str) -> bool:
        return any(is_under(m.path, path) for m in self._mounts.list())

    def _mount_root(self, mount: Mount) -> FileEntry:
        return self._dir_entry(mount.path, mount, mount.created_unix_ms)

    # -- the cache ----------------------------------------------------------------------------

    def _cache(self, mount: Mount) -> _MountCache:
        return self._caches.setdefault(mount.mount_id, _MountCache())

    def _cached(self, mount: Mount, kind: str, rel: str) -> _Fetched | None:
        hit = self._cache(mount).entries.get((kind, rel))
        if hit is not None and _fresh(hit.started, time.monotonic(), mount.options.metadata_sync_interval):
            return hit
        return None

    async def _fetch(self, mount: Mount, kind: str, rel: str) -> Any:
        """The store's answer for (kind, rel): cached if fresh enough, else asked once for
        all concurrent callers; when the store cannot be reached, the last answer it gave
        (stale-if-error, if the mount allows it). None stands for "not found"."""
        hit = self._cached(mount, kind, rel)
        if hit is not None:
            return hit.value
        stale = self._stale(mount, kind, rel) if mount.options.stale_if_error else None
        if stale is None:
            return await self._fetch_from_store(mount, kind, rel)
        # A walk of a large tree takes as long as the tree is large: only its error (a store
        # that cannot be reached, or a walk that made no progress for the stall timeout)
        # tells an outage. A status or a folder's listing past `stale_after` does.
        patience = None if kind == "walk" else self._stale_after
        try:
            # The store request goes on (shielded) when this wait ends: its answer, if it
            # comes, refreshes the cache for the next caller.
            return await asyncio.wait_for(self._fetch_from_store(mount, kind, rel), patience)
        except (Unavailable, DeadlineExceeded) as exc:  # before TimeoutError: a subclass of it
            reason = str(exc)
        except TimeoutError:
            reason = f"no answer within {self._stale_after:g}s"
        self.stale_served[mount.path] = self.stale_served.get(mount.path, 0) + 1
        log.warning("mount %s: answering %s of %r from metadata %.0fs old: the store is unreachable or slow (%s)",
                    mount.path, kind, rel, time.monotonic() - stale.started, reason)
        return stale.value

    def _stale(self, mount: Mount, kind: str, rel: str) -> _Fetched | None:
        """The last answer the store gave for (kind, rel), however old; for "info" also
        what the parent's listing said."""
        entries = self._cache(mount).entries
        hit = entries.get((kind, rel))
        if hit is not None or kind != "info":
            return hit
        listing = entries.get(("list", _rel_parent(rel)))
        if listing is None or listing.value is None:
            return None
        return _Fetched(listing.listed(rel), listing.started)

    async def _fetch_from_store(self, mount: Mount, kind: str, rel: str) -> Any:
        cache = self._cache(mount)
        interval = mount.options.metadata_sync_interval
        key = (kind, rel)
        now = time.monotonic()
        flight = cache.flights.get(key)
        if flight is not None and _fresh(flight[0], now, interval):
            joined, _ = await asyncio.shield(flight[1])
            return joined
        epoch = cache.epoch
        task = asyncio.ensure_future(self._asked(mount, kind, rel))
        entry = (now, task)
        cache.flights[key] = entry

        def landed(done: asyncio.Task[Any]) -> None:
            if cache.flights.get(key) is entry:
                del cache.flights[key]
            if done.cancelled() or done.exception() is not None:
                return
            if cache.epoch == epoch and interval != 0:
                answer, listings = done.result()
                cache.remember(kind, rel, answer, now, listings)

        task.add_done_callback(landed)
        answer, _ = await asyncio.shield(task)
        return answer

    async def _asked(self, mount: Mount, kind: str, rel: str) -> tuple[Any, dict[str, Folder] | None]:
        """The store's answer for (kind, rel), and a walk's listings (made in a thread: a walk
        of a million files takes seconds to sort out)."""
        answer = await self._ask_store(mount, kind, rel)
        if kind != "walk":
            return answer, None
        return answer, await asyncio.to_thread(walk_listings, rel, answer)

    async def _ask_store(self, mount: Mount, kind: str, rel: str) -> Any:
        store = self._mounts.store(mount)
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "info": lambda: store.info(rel),
            "list": lambda: store.ls(rel),
            "walk": lambda: store.walk(rel, with_dirs=True),
        }
        if is_upload_path(rel):
            return None
        try:
            answer = await calls[kind]()
        except NotFound:
            return None
        if kind == "info":
            return answer

        def kept() -> Statuses:
            return Statuses(status for status in _nameable(mount, store.url(rel), answer)
                            if not is_upload_path(status.path))

        return kept() if kind == "list" else await asyncio.to_thread(kept)

    def _known_status(self, mount: Mount, rel: str) -> _Fetched | None:
        """What the cache can say is at `rel` (its value the status, None: nothing) and when
        the store said it, from the path's own entry or its parent's listing, whichever the
        store gave later (so a stat and a listing never disagree about a file put into the
        store meanwhile); None if it cannot."""
        hit = self._cached(mount, "info", rel)
        listing = self._cached(mount, "list", _rel_parent(rel))
        if listing is not None and listing.value is not None and (hit is None or listing.started > hit.started):
            return _Fetched(listing.listed(rel), listing.started)
        return hit

    async def _store_status(self, mount: Mount, rel: str) -> UfsStatus | None:
        known = self._known_status(mount, rel)
        if known is None:
            return await self._fetch(mount, "info", rel)  # type: ignore[no-any-return]
        return known.value  # type: ignore[no-any-return]

    def valid_for(self, entry: FileEntry) -> float:
        """Seconds from now during which the master answers `entry` for its path, unless a
        change through Strata comes first (see the module docstring): what is left of the
        freshness of the cached store answer that gives it, on read-only mounts; 0 wherever
        the master may answer otherwise at any moment."""
        mount = self._mounts.by_id(entry.mount_id)
        if mount is None or not mount.options.read_only or not is_under(entry.path, mount.path):
            return 0.0  # the directories holding mounts (mount id 0), and writable mounts
        interval = mount.options.metadata_sync_interval
        rel = relative(entry.path, mount.path)
        if interval == 0 or rel == "" or entry.path in self._overlay:
            return 0.0
        known = self._known_status(mount, rel)  # None when the answer was served stale
        if known is None or known.value is None or self._status_entry(mount, known.value) != entry:
            return 0.0  # not what the master answers now (an invalidation, a newer answer)
        left = MAX_ANSWER_REUSE if interval < 0 else known.started + interval - time.monotonic()
        return max(0.0, min(left, MAX_ANSWER_REUSE))

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
        a recursive listing above mount points gives each mount's tree after its root."""
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
        statuses: Sequence[UfsStatus] | None = await self._fetch(mount, "walk" if recursive else "list", rel)
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
        taken: list[FileEntry] = []
        for entry in heapq.merge(self._merged(mount, statuses), self._written_extra(mount, rel, statuses, recursive),
                                 key=lambda e: e.path):
            taken.append(entry)
            if len(taken) >= page:
                yield taken
                taken = []
                await asyncio.sleep(0)
        if taken:
            yield taken

    def _merged(self, mount: Mount, statuses: Sequence[UfsStatus]) -> Iterator[FileEntry]:
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
            if recursive or _rel_parent(file_rel) == rel:
                if not listed(file_rel):
                    if written.persisted:
                        # The store listing is fresh and lacks it: deleted outside Strata.
                        del self._overlay[path]
                        self._save()
                        continue
                    out[path] = self._overlay_entry(mount, path, written)
                parents = []
                parent_rel = _rel_parent(file_rel)
                while parent_rel != rel and _rel_under(parent_rel, rel):
                    parents.append(parent_rel)
                    parent_rel = _rel_parent(parent_rel)
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
