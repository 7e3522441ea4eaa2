"""File metadata as the master serves it: statuses, listings (whole or in pages), deletes,
renames and times, with the cached blocks of removed paths freed on the workers."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import TypeVar

from strata.contract.errors import InvalidArgument, ResourceExhausted
from strata.contract.proto import strata_pb2 as pb
from strata.contract.rpc import MAX_MESSAGE_BYTES
from ..background import BackgroundTasks
from ..namespace.tree import LIST_PAGE_ENTRIES, Namespace
from ..namespace.mounts import MountTable
from ..common.paths import received, shown
from .messages import FileInfos
from .workerlink import WorkerLink
from .writes import Writes

# Entries a page of ListStatusPages may hold at most: ~5,000 * 4 KiB paths stays well below
# the 64 MiB message limit.
MAX_LIST_PAGE_ENTRIES = 5000
# Seconds between the empty pages a listing sends while the store's walk keeps its first page
# back: well below any reader's wait for a page (a client's master_timeout, 30 s by default).
LISTING_KEEPALIVE_SECONDS = 2.0

T = TypeVar("T")


class Files:
    """Statuses and listings of the namespace's files, and changes of them."""

    def __init__(self, *, mounts: MountTable, namespace: Namespace, infos: FileInfos, writes: Writes,
                 link: WorkerLink, background: BackgroundTasks) -> None:
        self.mounts = mounts
        self.namespace = namespace
        self.infos = infos
        self.writes = writes
        self.link = link
        self._background = background
        # Metadata requests answered, by method (a metric: what clients' reuse of answers saves).
        self.metadata_requests: Counter[str] = Counter()

    async def get_status(self, request: pb.GetStatusRequest) -> pb.FileInfo:
        path = received(request.path)
        self.metadata_requests["GetStatus"] += 1
        if request.refresh:
            self.namespace.invalidate(path)
        return self.infos.of(await self.namespace.get_status(path), reusable=True)

    async def list_status(self, request: pb.ListStatusRequest) -> pb.ListStatusResponse:
        self.metadata_requests["ListStatus"] += 1
        response = pb.ListStatusResponse()
        size = 0
        async for page in self._listing_pages(request, LIST_PAGE_ENTRIES):
            size += page.ByteSize()
            if size > MAX_MESSAGE_BYTES:
                raise ResourceExhausted(
                    f"the listing of {shown(request.path)} is larger than one message may be ({MAX_MESSAGE_BYTES} bytes); "
                    "list it in pages (ListStatusPages, which clients of this version use)"
                )
            response.files.extend(page.files)
        return response

    async def list_status_pages(self, request: pb.ListStatusRequest) -> AsyncIterator[pb.ListStatusResponse]:
        self.metadata_requests["ListStatus"] += 1
        if request.page_size > MAX_LIST_PAGE_ENTRIES:
            raise InvalidArgument(f"a listing's page holds at most {MAX_LIST_PAGE_ENTRIES} entries, "
                                  f"asked for {request.page_size}")
        async for page in with_keepalives(self._listing_pages(request, request.page_size or LIST_PAGE_ENTRIES),
                                          LISTING_KEEPALIVE_SECONDS):
            yield page or pb.ListStatusResponse()  # empty: still walking the store

    async def _listing_pages(self, request: pb.ListStatusRequest, size: int) -> AsyncIterator[pb.ListStatusResponse]:
        """A listing as messages of at most `size` entries, each made once the one before
        was taken (gRPC's flow control paces a slow reader; between pages the master serves
        other requests)."""
        async for entries in self.namespace.list_pages(received(request.path), recursive=request.recursive, page=size):
            yield self.infos.page(entries)

    async def delete(self, request: pb.DeleteRequest) -> pb.DeleteResponse:
        path = received(request.path)
        mount, _ = self.mounts.resolve(path)
        await self.writes.wait_for_moves_under(path)
        dropped = await self.namespace.delete(path, request.recursive)
        for written in dropped.values():
            if not written.persisted:
                self._background.spawn(self.writes.remove_upload(mount, written.version), f"remove-upload-{written.version}")
        await self.link.free_blocks(mount.mount_id, path)
        return pb.DeleteResponse()

    async def rename(self, request: pb.RenameRequest) -> pb.RenameResponse:
        src, dst = received(request.src), received(request.dst)
        mount, _ = self.mounts.resolve(src)
        await self.writes.wait_for_moves_under(src)
        await self.writes.wait_for_moves_under(dst)
        await self.namespace.rename(src, dst)
        # Blocks are keyed by path: the old path's blocks can never be read again.
        await self.link.free_blocks(mount.mount_id, src)
        return pb.RenameResponse()

    async def set_times(self, request: pb.SetTimesRequest) -> pb.FileInfo:
        return self.infos.of(await self.namespace.set_mtime(received(request.path), request.mtime_unix_ms))


async def with_keepalives(pages: AsyncIterator[T], every: float) -> AsyncIterator[T | None]:
    """The items of `pages`, with a None in between whenever `every` seconds pass without
    one (the first page of a listing waits for the store's walk, which takes minutes on
    millions of files: the reader hears that the master is still at it)."""
    ahead = pages.__aiter__()
    waiting: asyncio.Future[T] = asyncio.ensure_future(ahead.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=every)
            if not done:
                yield None
                continue
            try:
                item = waiting.result()
            except StopAsyncIteration:
                return
            yield item
            waiting = asyncio.ensure_future(ahead.__anext__())
    finally:
        if not waiting.done():
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await waiting
