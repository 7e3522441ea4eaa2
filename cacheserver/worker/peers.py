"""The other workers of the cluster, as the master lists them: where a worker finds a block
it misses that another worker holds (a read, a load, a copy of a file not in the store yet).
A block any live worker holds is copied from it, not fetched from the store again; the
store is asked only when no live worker holds the block or none sends it in time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc

from strata.contract.errors import FailedPrecondition, StrataError, Unavailable
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc
from strata.contract.rpc import aio_channel
from .. import rpcutil
from ..background import BackgroundTasks
from ..common.blockrefs import key_of
from ..common.blockwire import DamagedInTransit, joined_block
from .masterlink import MasterLink
from .settings import PEER_WAIT_SETTING, PeerSettings

log = logging.getLogger(__name__)

# How often the worker refreshes its list of peers.
PEER_REFRESH_SECONDS = 5.0
# Seconds one peer may take to send one block of a copy of a file not in the store yet (no
# other source of its bytes: the copy waits for a slow holder).
PEER_READ_TIMEOUT = 120.0
# Seconds the master may take to say where a missed block is (within the peer wait). It
# answers from memory, in milliseconds; one that takes a second is stopped or cut off, and
# the reader is better served by the store than by waiting out the whole peer wait.
LOCATE_TIMEOUT = 1.0
# Seconds a worker fetches its misses from the store without asking the master where they
# are after the master did not answer (a master outage costs one wait, not one a block).
LOCATE_BACKOFF_SECONDS = 5.0
# Seconds the master's list of workers, naming none but this one, stands for "no other worker
# holds a block" (as the master's word that no worker holds a file does, worker/reads.py's
# HELD_NOWHERE_FOR); older, a miss asks for the list again (one question a second at most,
# shared by the misses waiting for it) before going to the store without asking where its
# block is.
ALONE_FOR = 1.0


class PeerFailed(Exception):
    """A holder did not send the block: its error, a deadline, bytes that failed their check."""


class Peers:
    """The live workers other than this one, and a channel to each."""

    def __init__(self, link: MasterLink, *, worker_id: str, token: str, settings: PeerSettings | None = None) -> None:
        self._link = link
        self.worker_id = worker_id
        self.settings = settings or PeerSettings()
        self._workers: dict[str, pb.WorkerInfo] = {}
        self._listed_at = -ALONE_FOR  # time.monotonic() of the master's last list of workers
        self._listing: asyncio.Future[None] | None = None  # a question for the list under way
        self._tasks = BackgroundTasks()
        self._channels: rpcutil.ChannelCache[grpc.aio.Channel] = rpcutil.ChannelCache(
            lambda address: aio_channel(address, token), retire=self._close_channel)
        self._locate_after = 0.0
        # Holders asked for a block that did not send it (error, deadline, failed check):
        # the block came from the store instead.
        self.failed = 0

    def _close_channel(self, worker_id: str, channel: grpc.aio.Channel) -> None:
        self._tasks.spawn(channel.close(), f"close-channel-{worker_id}")

    def update(self, workers: list[pb.WorkerInfo]) -> None:
        """Take the master's list of live workers."""
        self._workers = {w.worker_id: w for w in workers}
        self._listed_at = time.monotonic()

    def _others_listed(self) -> bool:
        return any(w != self.worker_id for w in self._workers)

    async def _alone(self, patience: float) -> bool | None:
        """Whether no worker but this one is live, as the master listed them within
        ALONE_FOR (asked again, within `patience` seconds, when the list is older); None
        when the master did not list them in time."""
        if self._others_listed():
            return False
        if time.monotonic() - self._listed_at > ALONE_FOR:
            if self._listing is None or self._listing.done():
                self._listing = asyncio.ensure_future(self.refresh())
                self._listing.add_done_callback(lambda f: f.cancelled() or f.exception())
            try:
                await asyncio.wait_for(asyncio.shield(self._listing), patience)
            except (StrataError, TimeoutError):
                return None
        return not self._others_listed()

    def listed(self) -> list[pb.WorkerInfo]:
        """The live workers as the master last listed them, this one included."""
        return list(self._workers.values())

    async def refresh(self) -> None:
        self.update(await self._link.list_workers())

    async def refresh_loop(self) -> None:
        while True:
            with contextlib.suppress(StrataError):
                await self.refresh()
            await asyncio.sleep(PEER_REFRESH_SECONDS)

    def stub(self, info: pb.WorkerInfo) -> pb_grpc.WorkerStub:
        return pb_grpc.WorkerStub(self._channels.get(info.worker_id, info.address))

    def _others(self, holders: list[str]) -> list[str]:
        return [h for h in holders if h in self._workers and h != self.worker_id]

    async def _read_from(self, worker_id: str, ref: pb.BlockRef, offset: int, length: int, *,
                         held_only: bool, timeout: float) -> bytes:
        """Bytes [offset, offset+length) of the block from one worker, checked against the
        CRC-32C the worker sent with them, within `timeout` seconds; PeerFailed otherwise."""
        request = pb.ReadBlockRequest(block=ref, offset=offset, length=length, held_only=held_only)
        what = f"block {ref.index} of {ref.path} from worker {worker_id}"
        try:
            chunks = [c async for c in self.stub(self._workers[worker_id]).ReadBlock(request, timeout=timeout)]
            data = joined_block(chunks, what)
        except grpc.RpcError as exc:
            raise PeerFailed(f"{worker_id}: {exc.details() if hasattr(exc, 'details') else exc}") from None
        except DamagedInTransit as exc:
            raise PeerFailed(str(exc)) from None
        if len(data) != length:
            raise PeerFailed(f"{worker_id}: sent {len(data)} of {length} bytes")
        return data

    async def read_block(self, ref: pb.BlockRef, holders: list[str]) -> bytes:
        """The whole block `ref` from the first of its `holders` (worker ids) that sends it.
        FailedPrecondition when none does."""
        length = key_of(ref).length
        errors = []
        for worker_id in self._others(holders):
            try:
                return await self._read_from(worker_id, ref, 0, length, held_only=False, timeout=PEER_READ_TIMEOUT)
            except PeerFailed as exc:
                errors.append(str(exc))
        raise FailedPrecondition(
            f"block {ref.index} of {ref.path} is not in the store and no worker holding it answered "
            f"({'; '.join(errors) or 'no holders'}); the file cannot be copied now"
        )

    async def held_elsewhere(self, ref: pb.BlockRef, offset: int = 0, length: int = 0) -> bytes | None:
        """Bytes [offset, offset+length) (length 0: to the end) of a block this worker
        misses, from a live worker that holds it; None when no live worker holds it (as the
        master's block index says), or none sent it whole and checked within `peer_wait`
        seconds: the caller fetches it from the store. Never waits longer, never raises.
        A block in the store is fetched from it without asking the master where it is while
        no other worker is live (`_alone`): a training epoch's cold reads on a cluster's only
        worker cost their store request alone."""
        length = length or key_of(ref).length - offset
        if time.monotonic() < self._locate_after:
            return None
        wait = self.settings.peer_wait
        deadline = time.monotonic() + wait
        alone = await self._alone(min(wait, LOCATE_TIMEOUT)) if ref.in_store else False
        if alone:
            return None
        try:
            if alone is None:
                raise Unavailable(f"the master did not list the workers within {min(wait, LOCATE_TIMEOUT):g}s")
            (location,) = await self._link.client.locate_blocks(
                [ref], timeout=min(wait, LOCATE_TIMEOUT), what=f"the holders of block {ref.index} of {ref.path}")
        except (StrataError, ValueError) as exc:
            self._locate_after = time.monotonic() + LOCATE_BACKOFF_SECONDS
            log.warning("could not ask the master where block %d of %s is (%s); fetching from the store "
                        "for the next %gs", ref.index, ref.path, exc, LOCATE_BACKOFF_SECONDS)
            return None
        holders = [w for w in location.worker_ids if w != self.worker_id]
        if any(w not in self._workers for w in holders):  # joined since the list was refreshed
            with contextlib.suppress(StrataError, TimeoutError):
                await asyncio.wait_for(self.refresh(), max(0.0, deadline - time.monotonic()))
        for worker_id in self._others(holders):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                return await self._read_from(worker_id, ref, offset, length, held_only=True, timeout=remaining)
            except PeerFailed as exc:
                self.failed += 1
                log.info("block %d of %s not copied from a holder (%s): fetching it from the store "
                         "(%s is %gs)", ref.index, ref.path, exc, PEER_WAIT_SETTING, wait)
        return None

    async def close(self) -> None:
        await self._tasks.close()
        for channel in self._channels.take_all():
            await channel.close()
