"""The worker's copy of the mount table: which store backs a mount, and what is pinned.

A mount the master holds as unusable (`MountInfo.unusable`: its credentials cannot be opened,
or its file:// folder is no longer allowed) gets no store here: every access to it fails with the master's reason (FailedPrecondition,
never NotFound, so the uploads of its acknowledged writes wait and keep their copies)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from strata.contract.errors import FailedPrecondition, NotFound, PermissionDenied
from strata.contract.proto import strata_pb2 as pb
from ..common.paths import is_under, relative
from ..namespace.permissions import check_writable
from ..ufs import Store


@dataclass(frozen=True)
class MountView:
    info: pb.MountInfo
    store: Store

    @property
    def mount_id(self) -> int:
        return self.info.mount_id

    @property
    def path(self) -> str:
        return self.info.path

    def rel(self, ns_path: str) -> str:
        return relative(ns_path, self.info.path)

    def is_pinned(self, ns_path: str) -> bool:
        return any(is_under(ns_path, prefix) for prefix in self.info.pinned_prefixes)

    def check_writable(self, ns_path: str | None = None) -> None:
        """Refuse writes into a read-only mount and, given the path, onto the mount point or
        into the store's upload folder."""
        if ns_path is None:
            if self.info.options.read_only:
                raise PermissionDenied(f"mount {self.path} is read-only; writes are refused")
            return
        check_writable(ns_path, self.rel(ns_path), mount_path=self.path, read_only=self.info.options.read_only,
                       action="write")


class WorkerMounts:
    """Mounts by id, synced from the master's GetMountTable (with credentials)."""

    def __init__(self, fetch_table: Callable[[], Awaitable[pb.GetMountTableResponse]],
                 allowed_roots: Sequence[str] = ()) -> None:
        self._fetch_table = fetch_table
        # Folders of this host file:// mounts may read (localSources.allowedRoots).
        self._allowed_roots = tuple(allowed_roots)
        self._by_id: dict[int, MountView] = {}
        self._unusable: dict[int, pb.MountInfo] = {}
        self.version = 0

    def apply(self, table: pb.GetMountTableResponse) -> list[Store]:
        """Take a new table; returns the stores no mount uses any more (to be closed)."""
        views: dict[int, MountView] = {}
        unusable: dict[int, pb.MountInfo] = {}
        for info in table.mounts:
            if info.unusable:
                unusable[info.mount_id] = info
                continue
            old = self._by_id.get(info.mount_id)
            same_store = old is not None and old.info.source == info.source and old.info.options == info.options
            store = old.store if same_store and old is not None else Store(
                info.source, info.options.options, credentials=info.options.credentials, allowed_roots=self._allowed_roots
            )
            views[info.mount_id] = MountView(info, store)
        kept = {id(v.store) for v in views.values()}
        retired = [v.store for v in self._by_id.values() if id(v.store) not in kept]
        self._by_id, self._unusable = views, unusable
        self.version = table.version
        return retired

    async def refresh(self) -> None:
        for store in self.apply(await self._fetch_table()):
            await store.close()

    async def close(self) -> None:
        for view in self._by_id.values():
            await view.store.close()
        self._by_id = {}

    async def get(self, mount_id: int) -> MountView:
        view = self._by_id.get(mount_id)
        if view is None:
            await self.refresh()
            view = self._by_id.get(mount_id)
        if mount_id in self._unusable:
            raise FailedPrecondition(self._unusable[mount_id].unusable)
        if view is None:
            raise NotFound(
                f"mount id {mount_id} is not in the mount table (unmounted or remounted); "
                "stat the file again to get its current mount"
            )
        return view

    def covering(self, ns_path: str) -> MountView | None:
        """The known mount `ns_path` lies in, without asking the master."""
        return self._longest_prefix(ns_path)

    async def resolve(self, ns_path: str) -> MountView:
        view = self._longest_prefix(ns_path)
        if view is None:
            await self.refresh()
            view = self._longest_prefix(ns_path)
        for info in self._unusable.values():
            if is_under(ns_path, info.path):
                raise FailedPrecondition(info.unusable)
        if view is None:
            known = ", ".join(sorted(v.path for v in self._by_id.values())) or "none"
            raise NotFound(f"no mount covers {ns_path}; mounts: {known}")
        return view

    def _longest_prefix(self, ns_path: str) -> MountView | None:
        best: MountView | None = None
        for view in self._by_id.values():
            if is_under(ns_path, view.path) and (best is None or len(view.path) > len(best.path)):
                best = view
        return best

    def is_current(self, mount_id: int) -> bool:
        """Whether the last table holds a usable mount of this id."""
        return mount_id in self._by_id

    def views(self) -> list[MountView]:
        return list(self._by_id.values())

    def known_ids(self) -> set[int]:
        """Ids of every mount of the last table, usable or not."""
        return set(self._by_id) | set(self._unusable)
