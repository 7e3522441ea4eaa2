"""The mount table: which store backs which part of the namespace.

Mount points are absolute paths below "/" that never nest (`/a` and `/a/b` cannot both be
mounted). The table is saved in the master's state directory after every change (private to
the master's user; with a cluster key, the master's case, each mount's credentials are
sealed with it, sealing.py, so the file holds none in the clear) and loaded again on restart.

A saved mount whose credentials cannot be opened (another cluster key) stays in the table,
unusable: every access to it fails naming the mount and why, no store is made for it (never
one with no credentials, which would reach the store as whoever the host is), and its files
written through Strata and not in the store yet are kept, until it is mounted again with its
credentials (the same source and options keep its mount id, and so those files) or the master
runs with the key again. Its sealed credentials are saved again as they were.

So does a saved file:// mount whose folder the master's `localSources.allowedRoots` no longer
covers: nothing under it is read or written (no store is made for it), and its files not in
the store yet are kept until the master runs with its folder allowed again, or its owner
unmounts it (which drops them).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from strata.contract.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, StrataError
from strata.contract.modes import ReadType, WriteType
from strata.contract.urls import shown_url
from ..settings import RetrySettings
from ..ufs import Store, check_source_allowed
from ..common.paths import is_under, normalize, overlaps, relative
from .sealing import SealError, Sealer
from .statefile import StateFile

log = logging.getLogger(__name__)

STATE_FILE = "mounts.json"
# Key of a saved mount's credentials sealed with the cluster's key (sealing.py).
SEALED_CREDENTIALS = "sealed_credentials"


def _seal_binding(path: str, mount_id: int) -> str:
    """What sealed credentials are bound to: they open for this mount only."""
    return f"{path}#{mount_id}"


def _new_mount_id(next_id: int) -> int:
    """The id of a new mount: the time in microseconds, or `next_id` (one above the last id
    this table gave) if that is higher. Mount ids are part of every cached block's key, and
    workers keep their blocks across a master's restart; a master whose journal is new (lost,
    or never kept) must never give a mount an id an earlier journal gave, or blocks cached
    for that mount's files would be served as the new mount's files of the same path and
    version. Ids from the clock are above every id given before (one mount a microsecond is
    far beyond what a journaled add, fsynced, can do) and stay below 2**53 (exact as JSON
    numbers) until the year 2255."""
    return max(next_id, time.time_ns() // 1000)


# Seconds a mount's metadata may lag behind its store. 30 s keeps listing-heavy jobs (one
# stat per file) off the store while a file changed outside Strata shows up within half a
# minute; datasets that never change can say -1, stores changed by others all the time 0.
DEFAULT_METADATA_SYNC_INTERVAL = 30.0
SYNC_EVERY_ACCESS = 0.0
SYNC_NEVER = -1.0


@dataclass(frozen=True)
class MountOptions:
    """How a mount is reached and cached. `credentials` are secret: never logged, never
    shown (left out of repr)."""

    options: Mapping[str, str] = field(default_factory=dict)  # store options (not secret)
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False)
    read_only: bool = False
    # Seconds: 0 = ask the store on every access, -1 = never again after the first look.
    metadata_sync_interval: float = DEFAULT_METADATA_SYNC_INTERVAL
    read_type: str = ""  # "" = the cluster's cachePolicy.readType
    write_type: str = ""  # "" = the cluster's cachePolicy.writeType
    pin: bool = False  # blocks of this mount are never evicted
    ttl_seconds: float = 0.0  # free blocks unused this long; 0 = keep
    # When the store cannot be reached (refused, timed out, 5xx), answer from metadata older
    # than the sync interval instead of failing (stale-if-error). On by default: the cached
    # blocks of that version are still the store's bytes as last seen; a mount whose readers
    # must never see a file the store may have changed turns it off.
    stale_if_error: bool = True

    def __post_init__(self) -> None:
        interval = self.metadata_sync_interval
        if interval < 0 and interval != SYNC_NEVER:
            raise InvalidArgument(
                f"metadata sync interval must be 0 (every access), -1 (never) or a positive "
                f"number of seconds, got {interval}"
            )
        if self.ttl_seconds < 0:
            raise InvalidArgument(f"ttl must not be negative, got {self.ttl_seconds} seconds")
        if self.read_type and self.read_type not in ReadType.__members__:
            raise InvalidArgument(f"read type must be one of {', '.join(ReadType)}, got {self.read_type!r}")
        if self.write_type and self.write_type not in WriteType.__members__:
            raise InvalidArgument(f"write type must be one of {', '.join(WriteType)}, got {self.write_type!r}")

    def open_store(self, source: str, **kwargs: Any) -> Store:
        """The Store of `source` with these options and credentials (`kwargs`: Store's own)."""
        return Store(source, self.options, credentials=self.credentials, **kwargs)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["options"] = dict(self.options)
        data["credentials"] = dict(self.credentials)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MountOptions:
        return cls(**data)


@dataclass(frozen=True)
class Mount:
    path: str  # namespace path of the mount point, e.g. /datasets/a
    source: str  # fsspec URL, e.g. s3://bucket/a
    options: MountOptions
    mount_id: int  # never reused (also by a master whose journal is new); a remount gets a new one
    created_unix_ms: int
    # Why the mount cannot be used ("" when it can): its saved credentials cannot be opened.
    unusable: str = ""

    def check_usable(self) -> None:
        """FailedPrecondition naming the mount and why, if it cannot be used."""
        if self.unusable:
            raise FailedPrecondition(self.unusable)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "source": self.source,
            "options": self.options.to_json(),
            "mount_id": self.mount_id,
            "created_unix_ms": self.created_unix_ms,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Mount:
        return cls(
            path=str(data["path"]),
            source=str(data["source"]),
            options=MountOptions.from_json(data["options"]),
            mount_id=int(data["mount_id"]),
            created_unix_ms=int(data["created_unix_ms"]),
        )


class MountTable:
    """Mounts by path, saved in `state_dir` (None: in memory only, e.g. in tests)."""

    def __init__(self, state_dir: Path | None, *, retry: RetrySettings | None = None,
                 allowed_roots: Sequence[str] | None = None, cluster_key: str | None = None) -> None:
        self._state = StateFile(state_dir, STATE_FILE)
        # Seals credentials in the saved table (None: kept as given, for tools and tests).
        self._sealer = Sealer(cluster_key) if cluster_key else None
        self._retry = retry
        # Folders file:// stores may read (None: no check; the master gives localSources).
        self._allowed_roots = allowed_roots
        self._lock = threading.RLock()
        self._mounts: dict[str, Mount] = {}
        self._stores: dict[int, Store] = {}
        # The sealed credentials of unusable mounts, by mount id: saved again as they are.
        self._unopened: dict[int, str] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._version = 0
        self._next_id = 1
        self._load()

    @property
    def version(self) -> int:
        """Goes up on every change to the table."""
        return self._version

    # -- persistence ------------------------------------------------------------------------

    def _load(self) -> None:
        data = self._state.load()
        if data is None:
            return
        mounts = [self._unseal(m) for m in data.get("mounts", [])]
        self._mounts = {m.path: m for m in mounts}
        self._version = int(data.get("version", 0))
        self._next_id = max([int(data.get("next_id", 1))] + [m.mount_id + 1 for m in mounts])
        log.info("loaded %d mounts from %s", len(mounts), self._state.path)
        for mount in mounts:
            if mount.unusable:
                log.error("%s", mount.unusable)

    def _change(self, mounts: dict[str, Mount], next_id: int) -> None:
        """Make `mounts` the table (its version one up): saved first, then taken. A save
        that fails (a full disk) changes nothing and raises: a mount the journal does not
        hold is never served (a restart would drop it, and the files written to it)."""
        version = self._version + 1
        self._state.save(
            {
                "version": version,
                "next_id": next_id,
                "mounts": [self._seal(m) for m in sorted(mounts.values(), key=lambda m: m.path)],
            },
        )
        self._mounts, self._version, self._next_id = mounts, version, next_id
        live = {m.mount_id for m in mounts.values()}
        self._unopened = {i: sealed for i, sealed in self._unopened.items() if i in live}

    def _seal(self, mount: Mount) -> dict[str, Any]:
        data = mount.to_json()
        if mount.unusable and mount.mount_id in self._unopened:
            del data["options"]["credentials"]  # none: what was sealed is kept as it was
            data[SEALED_CREDENTIALS] = self._unopened[mount.mount_id]
        elif self._sealer is not None:
            credentials = data["options"].pop("credentials")
            data[SEALED_CREDENTIALS] = self._sealer.seal(credentials, _seal_binding(mount.path, mount.mount_id))
        return data

    def _unseal(self, data: Mapping[str, Any]) -> Mount:
        """A saved mount; unusable (no credentials, `Mount.unusable` says why) when its
        credentials cannot be opened with this cluster's key. A table saved before sealing
        loads as it is and is sealed at the next save."""
        data = dict(data)
        sealed = data.pop(SEALED_CREDENTIALS, None)
        if sealed is None:
            return self._allowed(Mount.from_json(data))
        binding = _seal_binding(str(data["path"]), int(data["mount_id"]))
        try:
            if self._sealer is None:
                raise SealError(f"sealed credentials of {binding} need the cluster key, and the master has none")
            credentials = self._sealer.open(str(sealed), binding)
        except SealError as exc:
            mount = Mount.from_json(data)
            self._unopened[mount.mount_id] = str(sealed)
            return replace(mount, unusable=(
                f"mount {mount.path} (from {shown_url(mount.source)}) cannot be used: {exc} (the cluster's internal token "
                "changed?). Its files not in the store yet are kept. Start the master with the token it had, "
                "or mount it again with its credentials (strata mount add --replace; the operator does so "
                "for its Mounts)"
            ))
        data["options"] = {**data["options"], "credentials": credentials}
        return self._allowed(Mount.from_json(data))

    def _allowed(self, mount: Mount) -> Mount:
        """`mount`, unusable (`Mount.unusable` says why) when its source is a file:// folder
        the allowed roots do not cover (any more)."""
        if self._allowed_roots is None:
            return mount
        try:
            check_source_allowed(mount.source, self._allowed_roots)
        except StrataError as exc:
            return replace(mount, unusable=(
                f"mount {mount.path} (from {shown_url(mount.source)}) cannot be used: {exc}. Its files not in the "
                "store yet are kept: allow its folder again and restart the master, or unmount it (strata mount "
                "rm), which drops them"
            ))
        return mount

    # -- the table ---------------------------------------------------------------------------

    def add(self, path: str, source: str, options: MountOptions | None = None, *, replace: bool = False) -> Mount:
        """Mount `source` at `path`. With `replace`, an existing mount at the same path is
        swapped for the new one: it keeps its mount id (and so its cached blocks) when only
        credentials or cache settings changed, and gets a new one when the data may differ."""
        options = options or MountOptions()
        path = normalize(path, what="mount path")
        if path == "/":
            raise InvalidArgument("cannot mount at /; mount below it, e.g. /data")
        # Refuses unknown schemes and bad options before anything changes.
        store = options.open_store(source, retry=self._retry, allowed_roots=self._allowed_roots)
        with self._lock:
            existing = self._mounts.get(path)
            if existing is not None and not replace:
                raise AlreadyExists(
                    f"{path} is already mounted (from {shown_url(existing.source)}); unmount it first or remount with "
                    "replace"
                )
            for other in self._mounts.values():
                if other.path != path and overlaps(other.path, path):
                    raise InvalidArgument(
                        f"mount path {path} overlaps the existing mount {other.path}; mount points cannot nest"
                    )
            # Same store, same storage options (only credentials or cache policy changed):
            # the data is the same, so the mount keeps its id and its cached blocks.
            same_data = (
                existing is not None
                and existing.source == source
                and existing.options.options == options.options
            )
            mount = Mount(
                path=path,
                source=source,
                options=options,
                mount_id=existing.mount_id if same_data and existing is not None else _new_mount_id(self._next_id),
                created_unix_ms=existing.created_unix_ms if same_data and existing is not None else int(time.time() * 1000),
            )
            self._change({**self._mounts, path: mount}, self._next_id if same_data else mount.mount_id + 1)
            if existing is not None:
                self._retire_store(existing.mount_id)
            self._stores[mount.mount_id] = store
        log.info("mounted %s -> %s (id %d)", path, shown_url(source), mount.mount_id)
        return mount

    def remove(self, path: str) -> Mount:
        """Unmount the mount at `path`."""
        path = normalize(path, what="mount path")
        with self._lock:
            mount = self._mounts.get(path)
            if mount is None:
                raise NotFound(f"nothing is mounted at {path}; {self._describe()}")
            self._change({p: m for p, m in self._mounts.items() if p != path}, self._next_id)
            self._retire_store(mount.mount_id)
        log.info("unmounted %s (id %d)", path, mount.mount_id)
        return mount

    def list(self) -> list[Mount]:
        with self._lock:
            return sorted(self._mounts.values(), key=lambda m: m.path)

    def get(self, path: str) -> Mount | None:
        """The mount whose mount point is exactly `path`, if any."""
        with self._lock:
            return self._mounts.get(normalize(path))

    def by_id(self, mount_id: int) -> Mount | None:
        with self._lock:
            return next((m for m in self._mounts.values() if m.mount_id == mount_id), None)

    def find(self, ns_path: str) -> Mount | None:
        """The mount covering `ns_path` (normalized), if any."""
        with self._lock:
            covering = [m for m in self._mounts.values() if is_under(ns_path, m.path)]
        return max(covering, key=lambda m: len(m.path), default=None)

    def resolve(self, ns_path: str) -> tuple[Mount, str]:
        """The usable mount covering `ns_path` and the path relative to its root."""
        path = normalize(ns_path)
        mount = self.find(path)
        if mount is None:
            raise NotFound(f"no mount covers {path}; {self._describe()}")
        mount.check_usable()
        return mount, relative(path, mount.path)

    def _describe(self) -> str:
        paths = [m.path for m in self.list()]
        return f"mounts: {', '.join(paths)}" if paths else "there are no mounts yet; add one first"

    # -- stores --------------------------------------------------------------------------------

    def store(self, mount: Mount) -> Store:
        """The Store of a current mount (one per mount, made on first use); FailedPrecondition
        for an unusable one."""
        with self._lock:
            current = self._mounts.get(mount.path)
            if current is None or current.mount_id != mount.mount_id:
                raise NotFound(f"mount {mount.path} (id {mount.mount_id}) was unmounted or replaced")
            current.check_usable()
            store = self._stores.get(mount.mount_id)
            if store is None:
                store = mount.options.open_store(mount.source, retry=self._retry, allowed_roots=self._allowed_roots)
                self._stores[mount.mount_id] = store
            return store

    def _retire_store(self, mount_id: int) -> None:
        store = self._stores.pop(mount_id, None)
        if store is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not in a loop: the store never opened a session on one
        task = loop.create_task(store.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Close every store's session (on shutdown)."""
        with self._lock:
            stores = list(self._stores.values())
            self._stores.clear()
        await asyncio.gather(*(s.close() for s in stores), *list(self._closing))
