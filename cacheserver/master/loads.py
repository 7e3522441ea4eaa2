"""Load jobs: a file or folder's blocks cached on the workers that own them, with progress."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from strata.contract.config import ServerConfig
from strata.contract.errors import StrataError
from strata.contract.proto import strata_pb2 as pb
from ..common.blockrefs import key_of
from ..common.pacing import Pacer, between_steps
from ..namespace.entries import FileEntry
from ..namespace.tree import Namespace
from ..common.paths import is_under, received
from ..placement import rank_workers
from .blocks import STEP, BlockIndex, Files
from .membership import Membership, WorkerRecord
from .workerlink import WorkerLink

log = logging.getLogger(__name__)

# How many CacheBlocks calls a load keeps in flight, and how many blocks each carries (one
# when the load has a bandwidth: the pace is kept a block at a time).
LOAD_CONCURRENCY = 4
LOAD_BATCH_BLOCKS = 2
# Files a load works on at once: enough to keep LOAD_CONCURRENCY calls busy with files of one block.
LOAD_FILES_AT_ONCE = 4 * LOAD_CONCURRENCY


def _now_ms() -> int:
    return int(time.time() * 1000)


def _length(ref: pb.BlockRef) -> int:
    return min(ref.block_size, ref.file_length - ref.index * ref.block_size)


@dataclass
class LoadJob:
    path: str
    pacer: Pacer  # the load's bandwidth
    block_size: int  # the cluster's, for files that name none
    progress: pb.LoadProgress = field(default_factory=pb.LoadProgress)
    error: StrataError | None = None
    task: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # The file versions the job loads: what "still cached" is measured against.
    files: Files = field(default_factory=Files)
    finished_at: float | None = None  # time.monotonic() when done

    def update(self, **fields: int | bool | str) -> None:
        for name, value in fields.items():
            setattr(self.progress, name, value)
        self.changed.set()

    async def report(self, blocks: BlockIndex, settle: float) -> pb.LoadProgress:
        """The job's progress for Report: its path, why it failed, and (once done) how many
        of its bytes the cache holds now, so a preload whose blocks were evicted or lost with
        a worker shows as no longer whole. Workers report new blocks with their next
        heartbeat: for `settle` seconds after the end, what they answered counts too. While the
        job runs, bytes_cached is what the cache holds of the files listed so far."""
        progress = pb.LoadProgress()
        progress.CopyFrom(self.progress)
        progress.path = self.path
        if self.error is None:
            held = 0
            for at in range(0, len(self.files), STEP):  # a million files' sum: seconds, in steps
                if at:
                    await between_steps()
                held += blocks.cached_bytes_of(self.files, at, at + STEP)
            settling = self.finished_at is not None and time.monotonic() - self.finished_at < settle
            progress.bytes_cached = max(held, self.progress.bytes_loaded) if settling else held
        return progress

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()


class Loads:
    """The load jobs by path: one job a path at a time, kept (done) for Report."""

    def __init__(self, *, config: ServerConfig, namespace: Namespace, membership: Membership,
                 blocks: BlockIndex, link: WorkerLink) -> None:
        self.config = config
        self.namespace = namespace
        self.membership = membership
        self.blocks = blocks
        self.link = link
        self.loads: dict[str, LoadJob] = {}

    async def load(self, request: pb.LoadRequest) -> AsyncIterator[pb.LoadProgress]:
        path = received(request.path)
        if request.refresh:
            self.namespace.invalidate(path)
        await self.namespace.get_status(path)  # NotFound now rather than inside the job
        job = self.loads.get(path)
        if job is None or job.progress.done:
            job = LoadJob(path=path, pacer=Pacer(request.bandwidth), block_size=self.config.block_size)
            job.progress.started_unix_ms = _now_ms()
            self.loads[path] = job
            job.task = asyncio.ensure_future(self._run_load(job))
        while True:
            job.changed.clear()
            snapshot = pb.LoadProgress()
            snapshot.CopyFrom(job.progress)
            if snapshot.done and job.error is not None:
                raise job.error
            yield snapshot
            if snapshot.done:
                return
            await job.changed.wait()

    async def _run_load(self, job: LoadJob) -> None:
        try:
            entry = await self.namespace.get_status(job.path)
            files = [entry] if not entry.is_dir else [
                e for e in await self.namespace.list_status(job.path, recursive=True) if not e.is_dir
            ]
            for f in files:
                job.files.add(f.mount_id, f.path, f.version, block_size=f.block_size or job.block_size,
                              file_length=f.length)
            job.update(bytes_total=sum(f.length for f in files), files_total=len(files))
            await self._load_files(job, files)
        except StrataError as exc:
            job.error = exc
        except Exception as exc:  # noqa: BLE001 - the job reports every failure
            log.exception("load of %s failed", job.path)
            job.error = StrataError(f"load of {job.path} failed: {exc}")
        finally:
            if job.error is not None:
                log.warning("load of %s failed: %s", job.path, job.error)
                job.update(error=str(job.error))
            job.finished_at = time.monotonic()
            job.update(done=True, finished_unix_ms=_now_ms())

    async def _load_files(self, job: LoadJob, files: list[FileEntry]) -> None:
        """Load `files`, LOAD_FILES_AT_ONCE at a time (a task a file would be a million
        tasks for a million files); each entry is let go once its file is loaded."""
        semaphore = asyncio.Semaphore(LOAD_CONCURRENCY)
        files.reverse()

        async def loader() -> None:
            while files:
                await self._load_file(job, files.pop(), semaphore)

        await asyncio.gather(*(loader() for _ in range(LOAD_FILES_AT_ONCE)))

    async def _load_file(self, job: LoadJob, entry: FileEntry, semaphore: asyncio.Semaphore) -> None:
        size = entry.block_size or self.config.block_size
        refs = [
            pb.BlockRef(mount_id=entry.mount_id, path=entry.path, version=entry.version, index=i,
                        block_size=size, file_length=entry.length, in_store=entry.persisted)
            for i in range((entry.length + size - 1) // size)
        ]
        by_owner: dict[str, list[pb.BlockRef]] = {}
        workers = {r.info.worker_id: r for r in self.membership.placement()}
        if refs and not workers:
            raise StrataError(f"cannot load {entry.path}: no live workers")
        for ref in refs:
            block_id = key_of(ref).block_id
            by_owner.setdefault(rank_workers(block_id, workers)[0], []).append(ref)

        async def send(worker_id: str, batch: list[pb.BlockRef]) -> None:
            async with semaphore:
                # Only what no live worker holds is paced: a cached block costs the store nothing.
                await job.pacer.take(sum(_length(r) for r in batch if not self._held(r, workers)))
                answer = await self.link.cache_blocks(workers[worker_id], batch,
                                                      f"loading {entry.path} on worker {worker_id}")
            job.update(bytes_loaded=job.progress.bytes_loaded + sum(_length(r) for r in batch),
                       bytes_fetched=job.progress.bytes_fetched + answer.bytes_from_store)

        per_call = 1 if job.pacer.rate else LOAD_BATCH_BLOCKS
        await asyncio.gather(*(
            send(worker_id, batch[i:i + per_call])
            for worker_id, batch in by_owner.items()
            for i in range(0, len(batch), per_call)
        ))
        job.update(files_loaded=job.progress.files_loaded + 1)

    def _held(self, ref: pb.BlockRef, workers: dict[str, WorkerRecord]) -> bool:
        """Whether a live worker holds the block (as far as the block index knows)."""
        return not self.blocks.holders(key_of(ref)).isdisjoint(workers)

    def drop_under(self, path: str) -> None:
        """Cancel and forget the jobs at or below `path` (an unmounted mount's)."""
        for p in [p for p in self.loads if is_under(p, path)]:
            self.loads.pop(p).cancel()

    async def reports_under(self, path: str, blocks: BlockIndex, settle: float) -> list[pb.LoadProgress]:
        """The jobs at or below `path` as Report shows them, by path."""
        return [await job.report(blocks, settle) for p, job in sorted(self.loads.items()) if is_under(p, path)]

    def close(self) -> None:
        for job in self.loads.values():
            job.cancel()
