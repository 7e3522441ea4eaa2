"""The facade every other part of Strata uses: `Store`, one mount's store, which picks the
backend for its kind of source (file://, S3, any other fsspec filesystem) and hands each
operation to it."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path

from s3fs import S3FileSystem

from ..settings import RetrySettings, StoreTimeouts
from .generic import FsspecStore
from .local import LocalStore
from .options import filesystem_class, is_local
from .s3 import S3Store
from .status import WALK_PAGE, ListedPage, StoreTotals, UfsStatus


class Store:
    """One mount's store: async operations on paths relative to the source URL. Each does
    what the method of the same name of `FsspecStore` says, as the backend of the source's
    kind does it: `LocalStore` (file://, confined to its root and, given `allowed_roots`, to
    those), `S3Store`, or `FsspecStore` itself."""

    def __init__(
        self,
        source: str,
        options: Mapping[str, str] | None = None,
        *,
        credentials: Mapping[str, str] | None = None,
        retry: RetrySettings | None = None,
        allowed_roots: Sequence[str] | None = None,
        timeouts: StoreTimeouts | None = None,
    ) -> None:
        protocol, cls = filesystem_class(source)
        backend: FsspecStore
        if is_local(cls):
            backend = LocalStore(protocol, cls, source, options, credentials=credentials, retry=retry,
                                 timeouts=timeouts, allowed_roots=allowed_roots)
        elif issubclass(cls, S3FileSystem):
            backend = S3Store(protocol, cls, source, options, credentials=credentials, retry=retry, timeouts=timeouts)
        else:
            backend = FsspecStore(protocol, cls, source, options, credentials=credentials, retry=retry,
                                  timeouts=timeouts)
        self._backend = backend
        self.protocol = protocol
        self.source = backend.source

    def __repr__(self) -> str:  # never shows options: they may hold credentials
        return f"Store({self.source!r})"

    def url(self, rel: str) -> str:
        return self._backend.url(rel)

    async def check(self) -> None:
        await self._backend.check()

    async def info(self, rel: str) -> UfsStatus:
        return await self._backend.info(rel)

    async def ls(self, rel: str) -> list[UfsStatus]:
        return await self._backend.ls(rel)

    async def listed_from(self, folder: str, limit: int, start: str = "") -> ListedPage | None:
        return await self._backend.listed_from(folder, limit, start)

    async def walk(self, rel: str, *, with_dirs: bool = False) -> list[UfsStatus]:
        return await self._backend.walk(rel, with_dirs=with_dirs)

    def walk_pages(self, rel: str, *, with_dirs: bool = False,
                   page: int = WALK_PAGE) -> AsyncGenerator[list[UfsStatus], None]:
        return self._backend.walk_pages(rel, with_dirs=with_dirs, page=page)

    async def totals(self, rel: str = "") -> StoreTotals:
        return await self._backend.totals(rel)

    async def read_range(self, rel: str, start: int, end: int, *, version: str | None = None,
                         exact: bool = False) -> bytes:
        return await self._backend.read_range(rel, start, end, version=version, exact=exact)

    async def write(self, rel: str, data: bytes) -> UfsStatus:
        return await self._backend.write(rel, data)

    async def write_file(self, rel: str, local_path: Path) -> UfsStatus:
        return await self._backend.write_file(rel, local_path)

    async def copy(self, src: str, dst: str) -> UfsStatus:
        return await self._backend.copy(src, dst)

    async def move_file(self, src: str, dst: str) -> UfsStatus:
        return await self._backend.move_file(src, dst)

    async def remove_dead_uploads(self, older_than: float) -> int:
        return await self._backend.remove_dead_uploads(older_than)

    async def rm(self, rel: str, recursive: bool = False) -> None:
        await self._backend.rm(rel, recursive)

    async def mv(self, src: str, dst: str) -> None:
        await self._backend.mv(src, dst)

    async def mkdir(self, rel: str) -> None:
        await self._backend.mkdir(rel)

    async def close(self) -> None:
        await self._backend.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
