"""The namespace's own state over the stores' answers: files written through Strata (the
overlay) and pins, journaled in the state directory, and the entries clients see.

Files written through Strata live in an overlay until the store's copy takes over:
- not yet persisted (MUST_CACHE, ASYNC_THROUGH before its upload): the overlay is the only
  record; the file shows persisted=False and appears in listings;
- persisted: the file keeps the version it was written with (the key of its cached blocks)
  for as long as the store still holds that very copy (the store's version equals the
  recorded `ufs_version`); once the store's file changes or disappears, the overlay entry is
  dropped and the store's view wins.
The overlay and the pins are saved in the state directory, like the mount table.

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
clients), interval 0, answers served stale (answers.py), files written through Strata, mount
roots and the directories holding mounts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from strata.contract.errors import InvalidArgument
from ..settings import StoreTimeouts
from ..ufs import UfsStatus
from .answers import StoreAnswers, Fetched
from .entries import FileEntry, OverlayEntry
from .mounts import Mount, MountTable
from ..common.paths import is_under, join, name, relative
from .relpaths import rel_parent
from .statuses import InOrder
from .statefile import StateFile

STATE_FILE = "namespace.json"
# The longest a client may reuse an answer (`Namespace.valid_for`), whatever the mount's
# interval ("never" included): a client misses an early invalidation of its answer until its
# next block read of the file, and a remount or pin made through another client, for at
# most this long. 300 s: a training epoch over a 100,000-file dataset then asks the master
# at most once per file every 5 minutes (~330 stats/s spread out, where it answers
# thousands), while a change made elsewhere shows within the time of a job's step.
MAX_ANSWER_REUSE = 300.0


@dataclass(frozen=True, slots=True)
class _PageMount:
    """A read-only mount as `valid_for_each` looks at it for a page: the prefix of the paths
    below its root, its sync interval, and whether all of it is pinned (`pins`: None when
    that says it for every path, else its pins, looked at for each)."""

    mount: Mount
    prefix: str
    interval: float
    pinned: bool
    pins: set[str] | None


class NamespaceOverlay(StoreAnswers):
    """The stores' answers with the overlay and pins applied; see the module docstring."""

    def __init__(self, mounts: MountTable, state_dir: Path | None, *, block_size: int,
                 timeouts: StoreTimeouts | None = None) -> None:
        if block_size <= 0:
            raise InvalidArgument(f"block size must be positive, got {block_size}")
        super().__init__(mounts, timeouts)
        self._state = StateFile(state_dir, STATE_FILE)
        self._block_size = block_size
        self._overlay: dict[str, OverlayEntry] = {}
        self._pins: dict[int, set[str]] = {}
        # One up with every change, kept in the journal: orders changes across restarts.
        self._generation = 0
        self._seen_version = -1
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
        if mount.options.pin:
            return True
        pins = self._pins.get(mount.mount_id)
        return pins is not None and any(is_under(path, p) for p in pins)

    def _dir_entry(self, path: str, mount: Mount | None, mtime_unix_ms: int = 0) -> FileEntry:
        return FileEntry(
            path=path, name=name(path), is_dir=True, length=0, mtime_unix_ms=mtime_unix_ms,
            version="", block_size=self._block_size, persisted=True,
            pinned=mount is not None and self._pinned(mount, path),
            mount_id=mount.mount_id if mount else 0,
            read_only=mount.options.read_only if mount else True,
        )

    def _status_entry(self, mount: Mount, status: UfsStatus, path: str | None = None) -> FileEntry:
        """The entry of the store's `status` in `mount` (at `path`, its namespace path, when
        the caller has it)."""
        path = join(mount.path, status.path) if path is None else path
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
        return None if status is None else self._status_entry(mount, status, path)

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

    def valid_for(self, entry: FileEntry) -> float:
        """Seconds from now during which the master answers `entry` for its path, unless a
        change through Strata comes first (see the module docstring): what is left of the
        freshness of the cached store answer that gives it, on read-only mounts; 0 wherever
        the master may answer otherwise at any moment."""
        return self.valid_for_each([entry])[0]

    def valid_for_each(self, entries: Sequence[FileEntry]) -> list[float]:
        """`valid_for` of each of `entries` (a page of a listing): each mount, its pins and
        each folder's cached listing are looked up once for the page, not once for each
        entry, and each entry is compared with the store's status it comes from field by
        field (without making the entry the status gives)."""
        now = time.monotonic()
        mounts: dict[int, _PageMount | None] = {}
        listings: dict[tuple[int, str], tuple[Fetched | None, InOrder | None]] = {}
        out: list[float] = []
        for entry in entries:
            if entry.mount_id in mounts:
                at = mounts[entry.mount_id]
            else:
                at = mounts[entry.mount_id] = self._page_mount(entry.mount_id)
            path = entry.path
            if at is None or not path.startswith(at.prefix) or path in self._overlay:
                out.append(0.0)  # directories holding mounts (mount id 0), writable mounts, mount roots, writes
                continue
            mount, rel = at.mount, path[len(at.prefix):]
            folder = (mount.mount_id, rel_parent(rel))
            listing = listings.get(folder)
            if listing is None:
                # A page of a listing following a walk under way: the walk gave its statuses.
                cached = self._cached(mount, "list", folder[1]) or self._walked_so_far(mount, folder[1])
                listing = listings[folder] = cached, None if cached is None or cached.value is None else InOrder(cached.value)
            known = self._known_status_with(mount, rel, *listing)  # None when the answer was served stale
            status = None if known is None else known.value
            if status is None or not (  # the entry _status_entry makes of it, field by field:
                    entry.version == status.version and entry.store_version == status.version
                    and entry.length == status.length and entry.mtime_unix_ms == status.mtime_unix_ms
                    and entry.is_dir == status.is_dir and entry.persisted and status.path == rel
                    and entry.block_size == self._block_size and entry.read_only
                    and entry.pinned == (at.pinned if at.pins is None else self._pinned(mount, path))):
                out.append(0.0)  # not what the master answers now (an invalidation, a newer answer)
                continue
            left = MAX_ANSWER_REUSE if at.interval < 0 else known.started + at.interval - now  # type: ignore[union-attr]
            out.append(max(0.0, min(left, MAX_ANSWER_REUSE)))
        return out

    def _page_mount(self, mount_id: int) -> _PageMount | None:
        """What `valid_for_each` needs of the mount `mount_id` for a page; None where every
        answer in it is asked for again (no such mount, writable, synced at every request)."""
        mount = self._mounts.by_id(mount_id)
        if mount is None or not mount.options.read_only or mount.options.metadata_sync_interval == 0:
            return None
        pins = self._pins.get(mount_id)
        return _PageMount(mount, mount.path.rstrip("/") + "/", mount.options.metadata_sync_interval,
                          mount.options.pin, None if mount.options.pin or not pins else pins)
