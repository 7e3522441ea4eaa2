"""Statuses of read-only Mounts' files a worker takes from the store while the master is away.

A read-only Mount's files are what its store holds: the master's status of such a file is the
store's answer it cached, cut at the cluster's block size, and reusable until that answer is
the Mount's `metadataSync.interval` old (namespace/overlay.py). While the master cannot be
reached (its connection refused, or no answer within STATUS_PATIENCE), a worker asked for such
a file's status (or a folder's: a FUSE lookup on the way to a file) by a reader of its node
(an open or a stat) asks the store itself (one HEAD on S3) and answers what the master would
answer from that store answer: the same fields, reusable for the Mount's interval (at most
MAX_ANSWER_REUSE) from when the worker asked. Such an answer is never older than the Mount's
freshness contract allows; it is fresher than any answer the master had cached. A file's is
kept like the master's (worker/kept.py), so the node's next opens of the file need neither.

The master's answer stands (its error reaches the reader) for everything else: writable
Mounts (files written through Strata are known to the master alone, and their readers are
promised close-to-open), read-only Mounts synced at every access (interval 0: no answer is
reusable, so nothing of it is kept or answered from the node), paths of no Mount in the
worker's last mount table, the Mount's root, Strata's upload paths, listings, and a
store that does not answer within STORE_PATIENCE. A store that answers "not found" is believed,
as the master believes it. Older answers are never served for an unreachable master: the
Mount's stale-if-error is for an unreachable store, and with the master away as well the
reader gets the error.

Once the master is back its answers take over as the ones kept run out: it answers from the
store as well, so they differ only where the store changed since, as any two of its own
answers would. Nothing the master decides is written here (no block placement, no namespace
entry): a worker that fetches a block for such an answer keeps it under the name the store's
version gives it, as it does for any miss, and reports it in its next heartbeat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from strata.contract.errors import NotFound, StrataError, Unavailable
from strata.contract.proto import strata_pb2 as pb
from ..namespace.overlay import MAX_ANSWER_REUSE
from ..namespace.permissions import is_upload_path
from ..ufs import UfsStatus
from .mounts import MountView, WorkerMounts

# Seconds the store may take for a status asked for while the master is away (then the
# reader gets the master's error, with this one's).
STORE_PATIENCE = 5.0
# Seconds a status question waits for the master while it is known to be away (it failed
# the last one): a master that is back answers in milliseconds, and one that is not must
# not cost each open STATUS_PATIENCE.
AWAY_PATIENCE = 0.05


class OutageStatuses:
    """Whether the master is away, and statuses from the stores while it is."""

    def __init__(self, mounts: WorkerMounts, *, block_size: int, readahead_blocks: int, patience: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._mounts = mounts
        self._block_size = block_size
        self._readahead_blocks = readahead_blocks
        self._patience = patience
        self._clock = clock
        self.away_since: float | None = None  # the clock's time the master first failed, while it does

    def patience(self) -> float:
        """Seconds to wait for the master's status before standing in for it."""
        return self._patience if self.away_since is None else AWAY_PATIENCE

    def master_failed(self) -> None:
        """The master did not answer (refused, or silent past the patience)."""
        if self.away_since is None:
            self.away_since = self._clock()

    def master_answered(self) -> None:
        """The master answered (a status or an error of its own): it is there."""
        self.away_since = None

    async def status(self, path: str, away: StrataError) -> pb.FileInfo:
        """The status of the file at `path` as the master would give it, from the store now;
        raises `away` (the master's failure) where the store cannot stand in for it (see
        the module docstring), the store's own NotFound for a file it does not hold."""
        mount = self._mounts.covering(path)
        if mount is None or not mount.info.options.read_only:
            raise away
        interval = mount.info.options.metadata_sync_interval
        rel = mount.rel(path)
        if interval == 0 or rel == "" or is_upload_path(rel):
            raise away
        asked = self._clock()
        try:
            status = await asyncio.wait_for(mount.store.info(rel), timeout=STORE_PATIENCE)
        except NotFound:
            raise
        except StrataError as exc:  # the store is away too: say both
            raise Unavailable(f"{away}; and the store of mount {mount.path}: {exc}") from exc
        except TimeoutError:
            raise Unavailable(f"{away}; and the store of mount {mount.path} did not tell the status of {path} "
                              f"within {STORE_PATIENCE:g}s") from None
        reuse = MAX_ANSWER_REUSE if interval < 0 else min(interval, MAX_ANSWER_REUSE)
        left = reuse - (self._clock() - asked)
        if left <= 0:
            raise away
        info = store_file_info(mount, path, status, block_size=self._block_size)
        info.readahead_blocks = 0 if status.is_dir else self._readahead_blocks
        info.valid_for_ms = int(left * 1000)
        return info


def store_file_info(mount: MountView, path: str, status: UfsStatus, *, block_size: int) -> pb.FileInfo:
    """The status the master gives the store's `status` of `path` in `mount` (its store
    entry, namespace/overlay.py), cut at `block_size`; not reusable (valid_for_ms 0)."""
    return pb.FileInfo(
        path=path, name=status.name, is_dir=status.is_dir, length=status.length, mtime_unix_ms=status.mtime_unix_ms,
        version=status.version, block_size=block_size, persisted=True,
        pinned=mount.info.options.pin or mount.is_pinned(path), mount_id=mount.mount_id,
        read_only=mount.info.options.read_only, store_version=status.version)
