"""The namespace's cache of what the stores said, per mount: a file's status, a folder's
listing, a tree's walk.

Answers come from a per-mount cache of what the stores said, refreshed according to the
mount's metadata sync interval: 0 asks the store on every access, -1 never asks again once a
path is known, N serves answers at most N seconds old (measured from when the store request
started). Concurrent misses on one path share one store request (single flight), and any
change made through Strata invalidates the affected entries at once.

Stale-if-error: when the store cannot be reached (refused, 5xx: `Unavailable`; no answer
within its deadline: `DeadlineExceeded`; no answer within `StoreTimeouts.stale_after`) and
the mount allows it (`stale_if_error`, on by default), an expired answer is served instead of
the error, and counted. Only an outage is masked: a store that answers "not found" or refuses
credentials is believed at once, and entries dropped by a change made through Strata are
gone, not stale. (A mount synced on every access keeps no answers, so has none to serve.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from strata.contract.errors import DeadlineExceeded, NotFound, Unavailable
from .. import heap
from ..common.pathmap import PathMap
from ..settings import StoreTimeouts
from strata.contract.errors import StrataError
from ..background import BackgroundTasks
from ..ufs import Store, UfsStatus
from .mounts import Mount, MountTable
from .permissions import is_upload_path
from .relpaths import rel_parent, rel_under
from .statuses import Folder, InOrder, Statuses, find_listed
from .walks import Walk

log = logging.getLogger(__name__)

# Files' statuses one look around a missed one asks for (`StoreAnswers._look_around`): one
# page of an S3 listing, its most (~250 KiB of answer, a few milliseconds on the wire).
LOOK_AROUND = 1000


@dataclass(slots=True)
class Fetched:
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


class _MountCache:
    """What one mount's store said, by relative path and kind (info, list, walk): a PathMap of
    the kinds said of each path, so that a change forgets its tree at the cost of what is held
    there."""

    def __init__(self) -> None:
        self.entries: PathMap[dict[str, Fetched]] = PathMap()
        self.flights: dict[tuple[str, str], tuple[float, asyncio.Task[Any]]] = {}
        # The walks under way, by the path walked: what each has put in so far, its task and
        # when it started.
        self.walks: dict[str, tuple[Walk, asyncio.Task[Any], float]] = {}
        # Bumped by every invalidation: a store request that started before it must not
        # store its (possibly stale) answer.
        self.epoch = 0

    def get(self, kind: str, rel: str) -> Fetched | None:
        said = self.entries.get(rel)
        return None if said is None else said.get(kind)

    def drop(self, rel: str) -> None:
        """Forget `rel`, everything below it and its ancestors (whose listings show it)."""
        self.entries.drop_tree(rel)
        self.entries.drop_ancestors(rel)
        self.flights.clear()
        self.walks.clear()
        self.epoch += 1

    def remember(self, kind: str, rel: str, value: Any, started: float,
                 listings: dict[str, Folder] | None = None) -> None:
        """Keep a store's answer; a walk's with the listings of the folders it found
        (`walk_listings`)."""
        self._keep(kind, rel, Fetched(value, started))
        for directory, listed in (listings or {}).items():
            self._keep("list", directory, Fetched(listed, started))

    def _keep(self, kind: str, rel: str, fetched: Fetched) -> None:
        said = self.entries.get(rel)
        if said is None:
            self.entries.put(rel, {kind: fetched})
        else:
            said[kind] = fetched


def walk_listings(rel: str, walked: Statuses | None) -> dict[str, Folder]:
    """The listing of every folder a walk of `rel` found, by folder: a walk is a complete
    snapshot of the tree, so it answers listings below it, and stats from those
    (Namespace._known_status) with no entry of each file's own. Nothing for a walk of a
    file (which finds the file itself). Pure: made off the event loop."""
    if walked is None or walked.find(rel) is not None:
        return {}
    children: dict[str, Folder] = {rel: Folder(walked)}
    for position, status in enumerate(walked):
        parent = rel_parent(status.path)
        folder = children.get(parent)
        if folder is None:
            folder = children[parent] = Folder(walked)
        folder.append(position)
        if status.is_dir and status.path not in children:
            children[status.path] = Folder(walked)
    return {directory: listed for directory, listed in children.items() if rel_under(directory, rel)}


class StoreAnswers:
    """What the stores said, cached per mount and asked for once by concurrent callers; see
    the module docstring."""

    def __init__(self, mounts: MountTable, timeouts: StoreTimeouts | None) -> None:
        self._stale_after = (timeouts or StoreTimeouts()).stale_after
        self._mounts = mounts
        self._caches: dict[int, _MountCache] = {}
        # Answers given from expired metadata because the store could not be reached, by
        # mount path (a metric).
        self.stale_served: dict[str, int] = {}
        # Looks around missed files under way, by (mount id, folder): one a folder at a time.
        self._looking: set[tuple[int, str]] = set()
        self._looks = BackgroundTasks()

    async def close(self) -> None:
        """Stop the looks around missed files under way."""
        await self._looks.close()

    def _cache(self, mount: Mount) -> _MountCache:
        cache = self._caches.get(mount.mount_id)
        if cache is None:
            cache = self._caches[mount.mount_id] = _MountCache()
        return cache

    def _cached(self, mount: Mount, kind: str, rel: str) -> Fetched | None:
        hit = self._cache(mount).get(kind, rel)
        if hit is not None and _fresh(hit.started, time.monotonic(), mount.options.metadata_sync_interval):
            return hit
        return None

    async def _fetch(self, mount: Mount, kind: str, rel: str) -> Any:
        """The store's answer for (kind, rel): cached if fresh enough, else asked once for
        all concurrent callers; when the store cannot be reached, the last answer it gave
        (stale-if-error, if the mount allows it). None stands for "not found"."""
        hit = self._cached(mount, kind, rel) or (self._listed_by_walk(mount, rel) if kind == "list" else None)
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

    def _stale(self, mount: Mount, kind: str, rel: str) -> Fetched | None:
        """The last answer the store gave for (kind, rel), however old; for "info" also
        what the parent's listing said."""
        cache = self._cache(mount)
        hit = cache.get(kind, rel)
        if hit is not None or kind != "info":
            return hit
        listing = cache.get("list", rel_parent(rel))
        if listing is None or listing.value is None:
            return None
        return Fetched(listing.listed(rel), listing.started)

    async def _fetch_from_store(self, mount: Mount, kind: str, rel: str) -> Any:
        answer, _ = await asyncio.shield(self._flight(mount, kind, rel))
        return answer

    def _flight(self, mount: Mount, kind: str, rel: str) -> asyncio.Task[Any]:
        """The store request for (kind, rel) under way, started now unless one is that began
        within the mount's sync interval; its task ends with (answer, a walk's listings)."""
        cache = self._cache(mount)
        interval = mount.options.metadata_sync_interval
        key = (kind, rel)
        now = time.monotonic()
        flight = cache.flights.get(key)
        if flight is not None and _fresh(flight[0], now, interval):
            return flight[1]
        epoch = cache.epoch
        walk = Walk(rel) if kind == "walk" else None
        task = asyncio.ensure_future(self._asked(mount, kind, rel, walk))
        entry = (now, task)
        cache.flights[key] = entry
        if walk is not None:
            cache.walks[rel] = (walk, task, now)

        def landed(done: asyncio.Task[Any]) -> None:
            if cache.flights.get(key) is entry:
                del cache.flights[key]
            if walk is not None and cache.walks.get(rel, (None,))[0] is walk:
                del cache.walks[rel]
            if done.cancelled() or done.exception() is not None:
                return
            if cache.epoch == epoch and interval != 0:
                answer, listings = done.result()
                cache.remember(kind, rel, answer, now, listings)

        task.add_done_callback(landed)
        return task

    def _walk_under_way(self, mount: Mount, rel: str) -> tuple[Walk, asyncio.Task[Any]] | None:
        """The walk of `rel` whose entries a recursive listing gives as they come (started now
        unless one is under way), and its task; None where the listing waits for a whole walk
        as before: a fresh walk is held (the listing is made of it), or an expired one that
        stale-if-error would serve if this walk failed (only a whole walk tells that it did
        not), or the mount keeps no answers."""
        if self._cached(mount, "walk", rel) is not None or mount.options.metadata_sync_interval == 0:
            return None
        if mount.options.stale_if_error and self._stale(mount, "walk", rel) is not None:
            return None
        task = self._flight(mount, "walk", rel)
        under_way = self._cache(mount).walks.get(rel)
        return None if under_way is None or under_way[1] is not task else (under_way[0], task)

    def _listed_by_walk(self, mount: Mount, rel: str) -> Fetched | None:
        """The listing of folder `rel` from a walk under way (fresh as the mount's interval
        asks) that has gone past its whole tree; None if no walk has."""
        now, interval = time.monotonic(), mount.options.metadata_sync_interval
        for walked, (walk, _, started) in self._cache(mount).walks.items():
            if rel_under(rel, walked) and rel != walked and _fresh(started, now, interval):
                listed = walk.listing(rel)
                if listed is not None:
                    return Fetched(listed, started)
        return None

    def _walked_so_far(self, mount: Mount, folder: str) -> Fetched | None:
        """What a walk under way (fresh as the mount's interval asks) of `folder` or above it
        has put in so far, as a listing to look the statuses it gave up in (`Walk.entries`:
        a listing following the walk sends them before the walk's answer is cached); None if
        no walk covers `folder`. Not a listing of `folder`: a path it lacks may come later."""
        now, interval = time.monotonic(), mount.options.metadata_sync_interval
        for walked, (walk, _, started) in self._cache(mount).walks.items():
            if rel_under(folder, walked) and walk.given and _fresh(started, now, interval):
                return Fetched(walk.given_so_far(), started)
        return None

    async def _asked(self, mount: Mount, kind: str, rel: str,
                     walk: Walk | None) -> tuple[Any, dict[str, Folder] | None]:
        """The store's answer for (kind, rel), and a walk's listings (made in a thread: a walk
        of a million files takes seconds to sort out)."""
        if walk is not None:
            answer = await self._walked(mount, self._mounts.store(mount), rel, walk)
        else:
            answer = await self._ask_store(mount, kind, rel)
        if kind != "walk":
            return answer, None

        def listings() -> dict[str, Folder]:
            found = walk_listings(rel, answer)
            heap.trim()  # the walk's short-lived objects are gone: give their pages back
            return found

        return answer, await asyncio.to_thread(listings)

    async def _ask_store(self, mount: Mount, kind: str, rel: str) -> Any:
        store = self._mounts.store(mount)
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "info": lambda: store.info(rel),
            "list": lambda: store.ls(rel),
        }
        if is_upload_path(rel):
            return None
        try:
            answer = await calls[kind]()
        except NotFound:
            return None
        if kind == "info":
            return answer
        return Statuses(status for status in _nameable(mount, store.url(rel), answer)
                        if not is_upload_path(status.path))

    @staticmethod
    async def _walked(mount: Mount, store: Store, rel: str, walk: Walk) -> Statuses | None:
        """A walk of `rel`, each page packed into the walk's columns as it comes (the most held
        as status objects is a page), off the event loop, and given to the listings following
        the walk (`Walk.put`); None: nothing is at `rel`. The pages come in path order from
        most stores; where they did not (S3's folders, `Store.walk_pages`), the columns are
        sorted once at the end."""
        if is_upload_path(rel):
            return None
        walked = walk.statuses
        ordered, last = True, ""

        def pack(page: list[UfsStatus]) -> None:
            nonlocal ordered, last
            for status in _nameable(mount, store.url(rel), page):
                if not is_upload_path(status.path):
                    ordered = ordered and last <= status.path
                    last = status.path
                    walked.append(status)

        try:
            async with contextlib.aclosing(store.walk_pages(rel, with_dirs=True)) as pages:
                async for page in pages:
                    await asyncio.to_thread(pack, page)
                    if ordered:
                        walk.put(len(walked))
                    else:
                        walk.out_of_order()
        except NotFound:
            return None
        return walked if ordered else await asyncio.to_thread(walked.sorted_by_path)

    def _known_status(self, mount: Mount, rel: str) -> Fetched | None:
        """What the cache can say is at `rel` (its value the status, None: nothing) and when
        the store said it, from the path's own entry or its parent's listing, whichever the
        store gave later (so a stat and a listing never disagree about a file put into the
        store meanwhile); None if it cannot."""
        listing = self._cached(mount, "list", rel_parent(rel))
        return self._known_status_with(mount, rel, listing, None if listing is None else listing.value)

    def _known_status_with(self, mount: Mount, rel: str, listing: Fetched | None,
                           statuses: Sequence[UfsStatus] | InOrder | None) -> Fetched | None:
        """`_known_status` given the fresh cached listing of `rel`'s folder (None: none) and
        its statuses (or lookups in them in order), which a page of a listing looks up once
        for all its entries."""
        hit = self._cached(mount, "info", rel)
        if listing is not None and statuses is not None and (hit is None or listing.started > hit.started):
            found = statuses.find(rel) if isinstance(statuses, InOrder) else find_listed(statuses, rel)
            return Fetched(found, listing.started)
        return hit

    async def _store_status(self, mount: Mount, rel: str) -> UfsStatus | None:
        known = self._known_status(mount, rel)
        if known is None:
            self._look_around(mount, rel)
            return await self._fetch(mount, "info", rel)  # type: ignore[no-any-return]
        return known.value  # type: ignore[no-any-return]

    def _keep_listed(self, mount: Mount, cache: _MountCache, folder: str, statuses: list[UfsStatus],
                     started: float) -> None:
        """Keep the files of a page of `folder`'s listing, asked at `started`, as their
        statuses, except where the store gave one later."""
        for status in _nameable(mount, self._mounts.store(mount).url(folder), statuses):
            held = cache.get("info", status.path)
            if not (status.is_dir or is_upload_path(status.path)) and (held is None or held.started < started):
                cache.remember("info", status.path, status, started)

    def _look_around(self, mount: Mount, rel: str) -> None:
        """On a miss of `rel`'s status, learn in the background what one page of its folder's
        listing says of the files from `rel` on (`Store.listed_from`: S3), unless a look at
        that folder is under way: a reader of a folder's files in any order (a training
        loader's shuffled epoch) then finds the next ones' statuses known, each as fresh as
        the mount's sync interval allows, instead of paying a store request (a HEAD) before
        each file's read. A page that reaches the folder's end is followed by one from its
        beginning: when that one reaches the end too, it is the folder's whole listing, kept
        as such. The miss itself asks for its own status as before and waits for nothing
        more; what the pages said is dropped if a change made through Strata came meanwhile,
        and never replaces a status the store gave later. Read-only mounts only: on a writable
        one a folder listed ahead of its reader (before a file was put into the store beside
        it) would answer that reader's next `ls` without the file for the sync interval,
        where the listing asked for then finds it."""
        folder = rel_parent(rel)
        looking = (mount.mount_id, folder)
        if (not mount.options.read_only or mount.options.metadata_sync_interval == 0 or looking in self._looking
                or is_upload_path(rel)):
            return
        self._looking.add(looking)
        cache = self._cache(mount)
        epoch, started = cache.epoch, time.monotonic()

        async def look() -> None:
            store = self._mounts.store(mount)
            try:
                page = await store.listed_from(folder, LOOK_AROUND, start=rel)
                if page is None or cache.epoch != epoch:
                    return
                self._keep_listed(mount, cache, folder, page.statuses, started)
                if not page.reaches_end:
                    return
                whole = await store.listed_from(folder, LOOK_AROUND)
                if whole is None or cache.epoch != epoch:
                    return
                if whole.reaches_end and whole.statuses:
                    listed = _nameable(mount, store.url(folder), whole.statuses)
                    cache.remember("list", folder, Statuses(s for s in listed
                                                            if s.path != folder and not is_upload_path(s.path)), started)
                else:
                    self._keep_listed(mount, cache, folder, whole.statuses, started)
            except StrataError as exc:  # the miss asked on its own: this was a bonus
                log.debug("mount %s: no look around %r: %s", mount.path, rel, exc)
            finally:
                self._looking.discard(looking)

        self._looks.spawn(look(), f"look-around-{mount.mount_id}")
