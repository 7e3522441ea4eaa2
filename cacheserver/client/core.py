"""The client library: metadata from the master, blocks from workers.

A block is read from a worker on this host when there is one (by file descriptor when the
worker allows short-circuit reads), else from the block's owner on the hash ring; when a
worker is down, stopped or too slow the next one on the ring serves it. Reads are correct or
raise a clear error, and every call has a deadline (`ClientSettings`).

Metadata the master marks reusable (FileInfo.valid_for_ms: files of read-only mounts synced
every N seconds or never, see namespace/overlay.py) is answered from what this client holds
until the request that fetched it was sent plus that long: the master would have answered
the same, so an open costs no round trip. A stat or listing (`ls` holds each entry it
returns) asks again after that. Early invalidation: a block read refused because the file
changed in the store drops the held status of that path (the reader's file object opens it
again with the master's status, see fs.StrataFile), and changes made through this client
drop what it holds at and below the paths they touch.

A status this client does not hold is asked of a worker of this host first (else, with a
single worker in the cluster, of that one): the worker keeps the master's reusable answers
for the processes of its node within their validity (worker/kept.py) and answers an open
with the status and, for a small file, its whole block (the block file's descriptor by
short-circuit, its checked bytes over the data port) in one round trip. A new process (a
training loader of each epoch) then opens a file the node has seen without asking the
master, and goes on opening such files while the master is away. Statuses the master does
not mark reusable (writable mounts) go to the master directly once a worker's answer showed
their folder's are not. A stat of a file not held looks first in the node's status table, a
mapping of what that worker publishes (client/nodetable.py): a hit costs no request. A miss
asks that worker for the file's status, which it then publishes for the node's next
processes. An open of a small file whose valid status it finds there (or holds) takes the
file's bytes from the node's data table when the worker keeps one (the same exchange hands
both over): that version's bytes, each chunk checked against its CRC-32C, and no request;
anything else (not there, another version, a failed check) asks the worker as before. Without a table (no worker on this host, or one that publishes none) a stat asks
that worker for its folder's statuses instead (worker/folders.py): one request answers every
file of the folder, each held as the master's answer is, from when the worker asked the master.

A client on a host without a worker may have a near cache (client/nearcache.py): a folder on
this host's disk where opens keep small files' statuses and bytes, so the host's next processes
open them with no request while the status may be reused, and take the bytes from there when
a status asked anew names the same version.

While the master cannot be reached the client goes on, for a bounded time, with what the
master last told it: the workers it listed (a new process: those another process of this
host was told, `localstate.WorkerRecord`), and the metadata of files already looked at, so
open reads continue and such files can be opened again. A read-only mount's answer is never
used past its validity, master or not: the workers answer such files' statuses from the
store while the master is away (worker/outagestatuses.py), the node's worker first, else
(a host without a worker) the worker the path ranks first.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import grpc

from strata.contract import constants
from strata.contract.errors import (
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    ResourceExhausted,
    StrataError,
    Unavailable,
    answered_by_server,
)
from strata.contract.proto import strata_pb2 as pb
from strata.contract.rpc import error_of
from ..common.blockrefs import key_of
from ..common.blockwire import joined_block, write_chunk
from ..common.paths import check_limits, check_request_paths, parent
from ..common.statustable import TableError
from ..placement import rank_workers
from .held import HeldAnswer, HeldAnswers, held_key
from .links import _MASTER_AWAY, Links
from .nearcache import NearCache, NearRecord
from .nodetable import NodeTable
from .settings import ClientSettings
from .transfer import DataReader, LocalBlock, ShortCircuitReader, WorkerStalled, block_ref

log = logging.getLogger(__name__)

# A block's bytes: `bytes`, or a private map of memory the data port's bytes were received
# into and checked in, which copies only what is sliced out.
Buffer = bytes | mmap.mmap
# A block as a reader holds it: its bytes, or the worker's block file on this host, from
# which ranges are read (and checked) as they are asked for.
Block = Buffer | LocalBlock

# Errors after which the next worker on the ring is tried.
_FAILOVER = (Unavailable, FailedPrecondition)
# File metadata held for reuse (see the module docstring) and for opens during a master
# outage (entries, the most recently used kept): a dataset of 100,000 files fits, twice.
# An entry of a file takes about 0.8 KiB (a FileInfo with a 40-character path, its record
# and its slots in the table and its folder's index), so 200,000 entries take ~160 MiB at
# most; only files looked at are held.
HELD_METADATA_ENTRIES = 200_000
# A file this small is fetched whole with its status when a worker answers its open (one
# request; larger files are read block by block, as their readers ask).
WHOLE_FILE_BELOW = 1 << 20
# Folders whose files' statuses the master does not mark reusable (writable mounts), asked
# of the master directly, not of a worker: at most this many are remembered.
DIRECT_FOLDERS = 10_000
# Seconds after which a client whose node's worker gave it no status table asks again.
TABLE_RETRY_SECONDS = 30.0
# Seconds a folder too large for a worker to list (worker/folders.py) is not asked for again.
TOO_LARGE_FOLDER_SECONDS = 60.0


class StrataClient(Links):
    def __init__(self, master: str | None = None, token: str | None = None, host: str | None = None,
                 short_circuit: bool = True, settings: ClientSettings | None = None, kind: str = "fsspec") -> None:
        super().__init__(master, token, host, short_circuit, settings, kind)
        self._held = HeldAnswers(self.settings.held_statuses or HELD_METADATA_ENTRIES)
        self._direct: set[str] = set()  # folders whose statuses are asked of the master directly
        self._listed: dict[str, float] = {}  # folders listed by the node's worker -> until when not to ask again
        self._table: NodeTable | None = None  # the node's status table (client/nodetable.py)
        self._table_next = 0.0  # time.monotonic() before which it is not asked for again
        self._table_checked = 0.0  # time.monotonic() before which it is not found stale again
        self._table_lock = threading.Lock()
        s = self.settings
        self._near = NearCache(s.near_cache, s.near_cache_bytes, self.master_address) if s.near_cache else None
        self._near_workers: tuple[list[pb.WorkerInfo], bool] | None = None  # (a worker list, a worker on this host)

    def close(self) -> None:
        if self._near is not None:
            self._near.close()  # the records still waiting, written within a deadline
        super().close()

    # -- metadata ----------------------------------------------------------------------------

    def _hold(self, infos: Iterable[pb.FileInfo], sent: float, *, reusable: bool = True, below: str = "/") -> None:
        """Keep the master's answers to a request sent at `sent` (time.monotonic()). Without
        `reusable`, those the master marks reusable are not kept (the caller keeps them): an
        earlier answer of another version is dropped instead (`below`: a folder every answer
        is at or below, where nothing held means nothing to drop)."""
        grace = self.settings.master_outage_grace
        now = time.monotonic()
        with self._lock:
            if not reusable and not self._held.holds(below):
                infos = [info for info in infos if not info.valid_for_ms]
            if grace and reusable:
                self._held.put_many(HeldAnswer(now, sent + info.valid_for_ms / 1000, info) for info in infos)
                return
            for info in infos:
                if info.valid_for_ms and not reusable:
                    held = self._held.get(info.path)
                    if held is not None and held.info.version != info.version:
                        self._held.drop(info.path)
                elif info.valid_for_ms or grace:
                    self._held.put(HeldAnswer(now, sent + info.valid_for_ms / 1000, info))
                else:
                    self._held.drop(info.path)  # an earlier answer must not outlive this one

    def drop_held(self, path: str, *, below: bool = False, version: str | None = None) -> None:
        """Forget what is held of `path` (with `below`, of everything below it too; with
        `version`, only a status of that version): its next stat asks the master."""
        with self._lock:
            self._held.drop(held_key(path), below=below, version=version)
        if self._near is not None and not below:
            self._near.forget(held_key(path), version)

    def stat(self, path: str, *, fresh: bool = False) -> pb.FileInfo:
        """The master's metadata of `path`: held from an earlier answer while the master
        would answer the same (unless `fresh`), else asked; while the master cannot be
        reached, what it said last (for up to `master_outage_grace` seconds), so files seen
        can be opened."""
        return self.stat_reused(path, fresh=fresh)[0]

    def stat_reused(self, path: str, *, fresh: bool = False) -> tuple[pb.FileInfo, bool]:
        """As stat, and whether the answer is one held from an earlier request while the
        master would still give it (not asked now, nor held through an outage)."""
        sent = time.monotonic()
        key = held_key(path)
        with self._lock:
            held = self._held.get(key)
            if held is not None and not fresh and sent < held.until:
                self._held.touch(key)
                return held.info, True
        if held is not None and (not self._within_grace(held.at) or (held.info.valid_for_ms and sent >= held.until)):
            held = None  # a read-only mount's answer is never used past its freshness, master or not
        if not fresh:
            table = self._node_table()
            if table is not None:  # what the node knows, without a request (client/nodetable.py)
                found = table.status(key)
                if found is not None:
                    return found, True
            elif (listed := self._node_folder(key, sent)) is not None:
                return listed, True
            answered = self._node_status(key, 0, sent)
            if answered is not None:
                if table is not None and answered[0].valid_for_ms:
                    self._check_table(table, key)
                return answered[0], bool(answered[0].valid_for_ms)
        request = pb.GetStatusRequest(path=path)
        what = f"stat {path}"
        if held is None:
            if self._master_away() and (standin := self._outage_status(key)) is not None:
                return standin, bool(standin.valid_for_ms)
            info: pb.FileInfo = self.call("GetStatus", request, what=what)
        elif self._master_away():
            return held.info, False
        else:
            try:
                info = self._hedged_call("GetStatus", request, what=what)
            except _MASTER_AWAY as exc:
                log.warning("master away (%s); using the metadata of %s it gave %.0fs ago",
                            exc, path, time.monotonic() - held.at)
                return held.info, False
        self._hold([info], sent)
        return info, False

    def open_status(self, path: str) -> tuple[pb.FileInfo, bool, Block | None]:
        """As stat_reused, for a file opened to be read: with its whole block when a worker
        answered the open and the file is small (see the module docstring), else None."""
        sent = time.monotonic()
        key = held_key(path)
        record = self._near.find(key) if self._near is not None else None
        if record is not None and (found := record.reusable()) is not None:
            return found, True, record.data  # from the near cache: no request, not even for the worker list
        with self._lock:
            held = self._held.get(key)
            if held is not None and sent < held.until:
                self._held.touch(key)
        table = self._node_table()
        if held is not None and sent < held.until:
            if table is not None:
                return held.info, True, table.file_bytes(held.info)
            return held.info, True, record.data if record is not None and record.holds(held.info) else None
        if table is not None and table.has_data and (found := table.status(key)) is not None:
            data = table.file_bytes(found)  # the node's copy of a small file: no request
            if data is not None:
                return found, True, data
        if table is None and (near := self._near_cache()) is not None:
            return self._near_open(near, record, path, key, sent)
        answered = self._node_status(key, WHOLE_FILE_BELOW, sent)
        if answered is not None:
            if table is not None and answered[0].valid_for_ms:
                self._check_table(table, key)
            return answered[0], bool(answered[0].valid_for_ms), answered[1]
        info, reused = self.stat_reused(path)
        return info, reused, None

    def _near_cache(self) -> NearCache | None:
        """The near cache, when there is one and no worker runs on this host (one that does
        serves its node's processes by short-circuit)."""
        near = self._near
        if near is None:
            return None
        try:
            workers = self.workers()
        except StrataError:
            return near  # its records are checked, and reused only within their freshness
        seen = self._near_workers
        if seen is None or seen[0] is not workers:
            seen = self._near_workers = (workers, any(w.host == self.host for w in workers))
        return None if seen[1] else near

    def _near_open(self, near: NearCache, record: NearRecord | None, path: str, key: str,
                   sent: float) -> tuple[pb.FileInfo, bool, Block | None]:
        """open_status on a host with a near cache (client/nearcache.py) whose record of `key`
        (if any) holds a status that may not be reused: the status asked as without it (only the
        status, when there is a record that may hold the bytes of its version), with the
        record's bytes if they are of the version it names, else the file's block, kept for the
        next processes."""
        answered = self._node_status(key, 0 if record is not None else WHOLE_FILE_BELOW, sent)
        block: Block | None
        if answered is not None:
            (info, block), reused = answered, bool(answered[0].valid_for_ms)
        else:
            (info, reused), block = self.stat_reused(path), None
        if record is not None and record.holds(info):
            block = record.data
        elif block is None:
            block = self._whole_file(info)
        if isinstance(block, (bytes, mmap.mmap)) and len(block) == info.length and not info.is_dir:
            with memoryview(block) as view:  # released at once: the client's pool may reuse a map
                near.keep(info, sent + info.valid_for_ms / 1000 if info.valid_for_ms else 0.0, view)
        return info, reused, block

    def _whole_file(self, info: pb.FileInfo) -> Buffer | None:
        """The bytes of a small file in the store (one block below WHOLE_FILE_BELOW), read at
        its open for the near cache; None for another file or when the read fails (the
        reader's own read then meets the failure, and deals with it as it does)."""
        if info.is_dir or not info.persisted or not 0 < info.length < min(WHOLE_FILE_BELOW, info.block_size + 1):
            return None
        try:
            return self.read_block(self.block_ref(info, 0))
        except StrataError as exc:
            log.debug("reading %s whole at its open failed (%s); its reader reads it", info.path, exc)
            return None

    def _node_worker(self) -> tuple[pb.WorkerInfo, bool] | None:
        """The worker to ask for statuses, and whether it may fetch a small file's block
        with one: a worker of this host (by short-circuit), else the only worker of the
        cluster (its data port); None for none (or while the worker list cannot be had)."""
        try:
            workers = [w for w in self.workers() if not w.decommissioning]
        except StrataError:
            return None
        now = time.monotonic()
        live = [w for w in workers if self._stalled.get(w.worker_id, 0.0) <= now]  # stalled: skipped a while
        for worker in live:
            if worker.host == self.host and self._sc_reader(worker) is not None:
                return worker, True
        if len(workers) == 1 and live and workers[0].data_port:
            return workers[0], True
        return None

    def _node_table(self) -> NodeTable | None:
        """The node's status table, mapped (asked of the worker of this host once, and again
        when the worker moved on to a new one); None without one (no worker on this host, one
        that publishes none, or asked in vain less than TABLE_RETRY_SECONDS ago)."""
        table = self._table
        if table is not None and not table.retired:
            return table
        with self._table_lock:
            table = self._table
            if table is not None and not table.retired:
                return table
            now = time.monotonic()
            if now < self._table_next:
                return None
            self._table_next = now + TABLE_RETRY_SECONDS
            chosen = self._node_worker()
            reader = self._sc_reader(chosen[0]) if chosen is not None else None
            if reader is None:
                return None
            try:
                fd, data_fd = reader.node_tables()
            except StrataError as exc:
                log.debug("worker %s shares no status table (%s): stats ask for what is not held", reader.where, exc)
                return None
            try:
                table = NodeTable(fd, data_fd)
            except TableError as exc:
                log.warning("the status table of worker %s is not usable (%s): stats ask for what is not held",
                            reader.where, exc)
                return None
            finally:
                os.close(fd)
                if data_fd is not None:
                    os.close(data_fd)
            # A retired mapping is left to the collector: another thread may be reading it.
            self._table, self._table_next = table, 0.0
            return table

    def _check_table(self, table: NodeTable, path: str) -> None:
        """The worker answered the status of `path` as reusable, so it published it: a table
        without it is one the worker no longer writes (it restarted, without retiring it),
        and the next stat asks for the current one (at most once in TABLE_RETRY_SECONDS)."""
        if table.status(path) is not None:
            return
        with self._table_lock:
            now = time.monotonic()
            if self._table is table and now >= self._table_checked:
                self._table, self._table_next, self._table_checked = None, 0.0, now + TABLE_RETRY_SECONDS

    def _node_folder(self, path: str, sent: float) -> pb.FileInfo | None:
        """The status of `path` (a held key) from its folder's statuses, asked of the node's
        worker once for every file of the folder (see worker/folders.py) and held as the
        master's answers are; None when the folder was asked for already, is not listed this
        way (too large, or its answers are not reusable: then its files' statuses go to the
        master), the worker did not answer, or `path` is not in it."""
        folder = parent(path)
        now = time.monotonic()
        with self._lock:
            if folder in self._direct or self._listed.get(folder, 0.0) > now:
                return None
        chosen = self._node_worker()
        if chosen is None:
            return None
        reader: ShortCircuitReader | DataReader | None = self._sc_reader(chosen[0]) or self._data_reader(chosen[0])
        if reader is None:
            return None
        try:
            answer = reader.list_folder(folder)
        except StrataError as exc:
            log.debug("worker %s did not list %s (%s); asking for the status of %s", chosen[0].worker_id, folder,
                      exc, path)
            return None
        with self._lock:
            if len(self._listed) >= DIRECT_FOLDERS:
                self._listed.clear()
            if answer is False:  # not reusable: the master answers the folder's files
                if len(self._direct) >= DIRECT_FOLDERS:
                    self._direct.clear()
                self._direct.add(folder)
                return None
            if answer is True:  # too large to list: its files are asked for one by one a while
                self._listed[folder] = now + TOO_LARGE_FOLDER_SECONDS
                return None
        infos, age = answer
        if not infos:
            return None
        asked = sent - age
        self._hold(infos, asked)
        with self._lock:
            self._listed[folder] = asked + min(info.valid_for_ms for info in infos) / 1000
            held = self._held.get(path)
        return held.info if held is not None and time.monotonic() < held.until else None

    def _node_status(self, path: str, whole_below: int, sent: float) -> tuple[pb.FileInfo, Block | None] | None:
        """The status of `path` (a held key) from the node's worker, held as the master's
        answer is, and its block when it came with it (whole files below `whole_below`
        bytes); None when there is no such worker, its answers for the folder are not
        reusable, or it did not answer (the master is asked then)."""
        if parent(path) in self._direct:
            return None
        chosen = self._node_worker()
        if chosen is None:
            return None
        worker, fetch = chosen
        block: Block | None
        try:
            sc = self._sc_reader(worker)
            if sc is not None:
                info, block = sc.open_path(path, pb.READ_TYPE_UNSPECIFIED, whole_below=whole_below, fetch=fetch)
            else:
                data_reader = self._data_reader(worker)
                if data_reader is None:
                    return None
                info, block = data_reader.open_path(path, pb.READ_TYPE_UNSPECIFIED, whole_below=whole_below,
                                                    fetch=fetch)
        except StrataError as exc:
            # Unreachable, stalled (asked last for a while, as for blocks), the master away
            # from it too, or a worker that does not know opens by path: the master answers
            # (its own errors, a missing file's too).
            if isinstance(exc, WorkerStalled):
                self._stalled[worker.worker_id] = time.monotonic() + self.settings.skip_stalled_for
            log.debug("worker %s did not answer the status of %s (%s); asking the master", worker.worker_id, path, exc)
            return None
        if not info.valid_for_ms:
            with self._lock:
                if len(self._direct) >= DIRECT_FOLDERS:
                    self._direct.clear()
                self._direct.add(parent(path))
        if block is not None and len(block) != info.length:
            log.warning("worker %s sent %d bytes with %s of %d; reading its blocks anew", worker.worker_id,
                        len(block), path, info.length)
            block = None
        self._hold([info], sent)
        return info, block

    def _outage_status(self, path: str) -> pb.FileInfo | None:
        """The status of `path` (a held key) while the master is away, from the worker its
        path ranks first (a client on a host without a worker, in a cluster of several: the
        node's worker was asked already), which answers a read-only mount's file from the
        store (worker/outagestatuses.py); held as the master's answer is. None when no
        worker answered: the master's error stands."""
        sent = time.monotonic()
        try:
            workers = {w.worker_id: w for w in self.workers() if not w.decommissioning}
        except StrataError:
            return None
        for worker_id in rank_workers(path, workers)[:2]:
            reader = self._data_reader(workers[worker_id])
            if reader is None:
                continue
            try:
                info = reader.open_path(path, pb.READ_TYPE_UNSPECIFIED, whole_below=0, fetch=False)[0]
            except StrataError as exc:
                log.debug("worker %s did not answer the status of %s during the outage: %s", worker_id, path, exc)
                continue
            self._hold([info], sent)
            return info
        return None

    def _hedged_call(self, method: str, request: Any, *, what: str) -> Any:
        """A master call that has an answer to fall back on. A slow answer may be a master
        waiting on its store (wait for it) or a stopped master (don't): after
        master_quick_timeout the worker list, which it answers from memory, tells which, and
        a master that answers it is asked again for the rest of master_timeout (so a stat
        waiting on a slow store may take up to one master_quick_timeout longer than its answer).

        The calls block in this thread: a gRPC future would start a thread per call (about a
        millisecond, most of the cost of opening a small cached file)."""
        where = f"{what} (master {self.master_address})"
        call = getattr(self.master, method)
        started = time.monotonic()
        try:
            return call(request, timeout=self.settings.master_quick_timeout)
        except grpc.RpcError as exc:
            slow = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and not answered_by_server(exc)
            if not slow:
                raise error_of(exc, where) from exc
        self._list_workers(self.settings.master_quick_timeout)  # raises _MASTER_AWAY if it is not there
        remaining = self.settings.master_timeout - (time.monotonic() - started)
        try:
            return call(request, timeout=max(remaining, self.settings.master_quick_timeout))
        except grpc.RpcError as exc:
            raise error_of(exc, where) from exc

    def ls(self, path: str, recursive: bool = False) -> list[pb.FileInfo]:
        """The entries of a folder (a file: itself); each is held as a stat's answer is."""
        return [info for page in self.ls_pages(path, recursive) for info in page]

    def ls_pages(self, path: str, recursive: bool = False, *,
                 hold_reusable: bool = True) -> Iterator[list[pb.FileInfo]]:
        """`ls` page by page, as the master sends them (ListStatusPages): a tree of any size,
        held one page at a time (without `hold_reusable`, entries the master marks reusable
        are not held: a caller that keeps them itself, as the FUSE mount's attribute cache
        does, saves a second copy of each). Each page must come within master_timeout of the one
        before; while the store's walk keeps the first back, the master sends empty pages
        (skipped here) to say it is still at it. The stream has no limit in all."""
        sent = time.monotonic()
        what = f"ls {path} (master {self.master_address})"
        stream = self.master.ListStatusPages(pb.ListStatusRequest(path=path, recursive=recursive))
        timeout = self.settings.master_timeout
        watch = StallWatch(stream.cancel, timeout)
        try:
            while True:
                try:
                    page = next(stream)
                except StopIteration:
                    return
                except grpc.RpcError as exc:
                    if watch.stalled:
                        raise DeadlineExceeded(f"{what}: no page of the listing within {timeout:g}s") from exc
                    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:  # a master older than ListStatusPages
                        response = self.call("ListStatus", pb.ListStatusRequest(path=path, recursive=recursive),
                                             what=f"ls {path}")
                        files = list(response.files)
                        self._hold(files, sent, reusable=hold_reusable, below=held_key(path))
                        yield files
                        return
                    raise error_of(exc, what) from exc
                files = list(page.files)
                if not files:
                    watch.heard()
                    continue  # the master is still walking the store
                self._hold(files, sent, reusable=hold_reusable, below=held_key(path))
                watch.pause()  # the caller's time with the page is not the master's
                yield files
                watch.heard()
        finally:
            watch.stop()
            stream.cancel()

    def _changing(self, method: str, request: Any, *, what: str, paths: Iterable[str], below: bool = True) -> Any:
        """A call that changes the namespace at `paths`: what this client holds at (and, with
        `below`, below) them is dropped once it ends, however it ends."""
        try:
            return self.call(method, request, what=what)
        finally:
            for path in paths:
                self.drop_held(path, below=below)

    def rm(self, path: str, recursive: bool = False) -> None:
        self._changing("Delete", pb.DeleteRequest(path=path, recursive=recursive), what=f"rm {path}", paths=[path],
                       below=recursive)

    def mv(self, src: str, dst: str) -> None:
        self._changing("Rename", pb.RenameRequest(src=src, dst=dst), what=f"mv {src} {dst}", paths=[src, dst])

    def set_mtime(self, path: str, mtime_unix_ms: int) -> pb.FileInfo:
        request = pb.SetTimesRequest(path=path, mtime_unix_ms=mtime_unix_ms)
        return self._changing("SetTimes", request, what=f"set the time of {path}", paths=[path],  # type: ignore[no-any-return]
                              below=False)

    def mount(self, path: str, source: str, options: pb.MountOptions | None = None, *,
              replace: bool = False, check: bool = True) -> pb.MountInfo:
        request = pb.MountRequest(path=path, source=source, options=options, replace=replace, check=check)
        return self._changing("Mount", request, what=f"mount {path}", paths=[path]).mount  # type: ignore[no-any-return]

    def unmount(self, path: str, free: bool = True) -> None:
        self._changing("Unmount", pb.UnmountRequest(path=path, free=free), what=f"unmount {path}", paths=[path])

    def mounts(self) -> list[pb.MountInfo]:
        return list(self.call("ListMounts", pb.ListMountsRequest(), what="listing mounts").mounts)

    def load(self, path: str, *, bandwidth: int = 0, refresh: bool = False) -> Iterator[pb.LoadProgress]:
        """Load `path` into the cache, at most `bandwidth` bytes a second (0: no limit), after
        asking the store again with `refresh`; its progress until it ends."""
        check_limits(path)
        try:
            request = pb.LoadRequest(path=path, bandwidth=bandwidth, refresh=refresh)
            yield from self.master.Load(request, timeout=24 * 3600)
        except grpc.RpcError as exc:
            raise error_of(exc, f"load {path}") from exc

    def free(self, path: str) -> int:
        return int(self.call("Free", pb.FreeRequest(path=path), what=f"free {path}").bytes_freed)

    def set_pinned(self, path: str, pinned: bool) -> None:
        self._changing("SetPinned", pb.SetPinnedRequest(path=path, pinned=pinned), what=f"pin {path}", paths=[path])

    def report(self) -> pb.ReportResponse:
        return self.call("Report", pb.ReportRequest(), what="report")  # type: ignore[no-any-return]

    def capacity(self) -> pb.GetCapacityResponse:
        """Capacity and use of the cache (what `df` of a mount shows); any credential."""
        return self.call("GetCapacity", pb.GetCapacityRequest(), what="capacity")  # type: ignore[no-any-return]

    def block_locations(self, path: str) -> pb.GetBlockLocationsResponse:
        return self.call("GetBlockLocations", pb.GetBlockLocationsRequest(path=path), what=f"block locations of {path}")  # type: ignore[no-any-return]

    # -- blocks ------------------------------------------------------------------------------

    def block_ref(self, info: pb.FileInfo, index: int) -> pb.BlockRef:
        return block_ref(info, index)

    def candidates(self, ref: pb.BlockRef, holders: Iterable[str] = ()) -> list[pb.WorkerInfo]:
        """Workers to try for a block, best first."""
        workers = [w for w in self.workers() if not w.decommissioning] or self.workers() or self._await_workers()
        if not workers:
            raise Unavailable(f"no live workers to read {ref.path} from (master {self.master_address}; waited "
                              f"{self.settings.no_workers_wait:g}s, STRATA_CLIENT_NO_WORKERS_WAIT)")
        by_id = {w.worker_id: w for w in workers}
        ranked = rank_workers(key_of(ref).block_id, by_id)
        now = time.monotonic()
        stalled = {w for w, until in list(self._stalled.items()) if until > now}
        ranked = [w for w in ranked if w not in stalled] + [w for w in ranked if w in stalled]
        held = [w for w in ranked if w in set(holders)]
        local = [w for w in ranked if by_id[w].host == self.host]
        order: list[str] = []
        if ref.in_store:
            local = [w for w in local if w not in stalled]
            order = local + held + ranked
        else:  # only the holders have it
            order = held + ranked
        seen: set[str] = set()
        return [by_id[w] for w in order if not (w in seen or seen.add(w))]  # type: ignore[func-returns-value]

    def read_block(self, ref: pb.BlockRef, offset: int = 0, length: int = 0, *,
                   readahead: int = 0, read_type: pb.ReadType.ValueType = pb.READ_TYPE_UNSPECIFIED, holders: Iterable[str] = ()) -> Buffer:
        """Bytes of one block (length 0: to its end), failing over along the ring."""
        return cast(Buffer, self._block(ref, offset, length, readahead, read_type, holders, hold=False))

    def hold_block(self, ref: pb.BlockRef, *, readahead: int = 0,
                   read_type: pb.ReadType.ValueType = pb.READ_TYPE_UNSPECIFIED, holders: Iterable[str] = ()) -> Block:
        """One whole block to read ranges from: the worker's block file when a worker on this
        host serves it by short-circuit (a `LocalBlock`: nothing is read until a range is
        asked for), else its bytes. A block file held a moment before (`held_blocks`) is
        given out again without asking."""
        kept = self.held_blocks.get(ref, read_type)
        if kept is not None:
            return kept
        block = self._block(ref, 0, 0, readahead, read_type, holders, hold=True)
        if isinstance(block, LocalBlock):
            self.held_blocks.put(ref, read_type, block)
        return block

    def _block(self, ref: pb.BlockRef, offset: int, length: int, readahead: int, read_type: pb.ReadType.ValueType,
               holders: Iterable[str], *, hold: bool) -> Block:
        errors: list[str] = []
        refused = True  # every worker refused the block (e.g. the file changed in the store)
        for attempt in range(2):
            for worker in self.candidates(ref, holders):
                try:
                    return self._read_from(worker, ref, offset, length, readahead, read_type, hold=hold)
                except WorkerStalled as exc:
                    self._stalled[worker.worker_id] = time.monotonic() + self.settings.skip_stalled_for
                    errors.append(f"{worker.worker_id}: {exc}")
                    refused = False
                    log.warning("block %d of %s: skipping worker %s: %s", ref.index, ref.path, worker.worker_id, exc)
                except _FAILOVER as exc:
                    errors.append(f"{worker.worker_id}: {exc}")
                    refused = refused and isinstance(exc, FailedPrecondition)
                    log.debug("block %d of %s: worker %s failed: %s", ref.index, ref.path, worker.worker_id, exc)
            self.workers(refresh=True)
        message = f"cannot read block {ref.index} of {ref.path}: " + "; ".join(errors)
        if refused and errors:
            # The namespace names another version of the file now (or none): its next open
            # asks the master, whatever this client holds of the version refused.
            self.drop_held(ref.path, version=ref.version)
            raise FailedPrecondition(message)
        raise Unavailable(message)

    def _read_from(self, worker: pb.WorkerInfo, ref: pb.BlockRef, offset: int, length: int,
                   readahead: int, read_type: pb.ReadType.ValueType, *, hold: bool = False) -> Block:
        """Bytes [offset, offset+length) of the block (length 0: to its end) from `worker`,
        exactly that many whichever way they came: bytes of another length are refused
        (Unavailable: the next worker serves the block), never handed on cut short."""
        full = max(0, min(ref.block_size, ref.file_length - ref.index * ref.block_size))
        want = (length or full - offset)
        data = self._fetch_from(worker, ref, offset, want, readahead, read_type,
                                hold=hold and offset == 0 and want == full)
        if len(data) != want:
            raise Unavailable(f"worker {worker.worker_id} sent {len(data)} bytes of block {ref.index} of {ref.path}, expected {want}")
        return data

    def _fetch_from(self, worker: pb.WorkerInfo, ref: pb.BlockRef, offset: int, want: int, readahead: int,
                    read_type: pb.ReadType.ValueType, *, hold: bool) -> Block:
        """What `worker` sends for [offset, offset+want) of the block: by short-circuit when
        it is on this host (`hold`: the whole block's file, held open), else over its data
        port, else gRPC."""
        reader = self._sc_reader(worker)
        if reader is not None:
            try:
                if hold:
                    return reader.hold(ref, read_type)
                return reader.read(ref, offset, want, read_type)
            except WorkerStalled:
                raise
            except (Unavailable, ResourceExhausted, DataLoss) as exc:
                log.debug("short-circuit to %s failed (%s); reading over the network", worker.worker_id, exc)
        data: Block | None = None
        data_reader = self._data_reader(worker)
        if data_reader is not None:
            try:
                data = data_reader.read(ref, offset, want, read_type, readahead)
            except WorkerStalled:
                raise  # no second wait on it over gRPC: the next worker serves the block
            except Unavailable as exc:  # data port unreachable (or the worker is down: gRPC tells)
                log.debug("data port of %s failed (%s); reading over gRPC", worker.worker_id, exc)
        if data is None:
            data = self._read_grpc(worker, pb.ReadBlockRequest(block=ref, offset=offset, length=want, read_type=read_type,
                                                               readahead_blocks=readahead, client=self.kind))
        return data

    def _read_grpc(self, worker: pb.WorkerInfo, request: pb.ReadBlockRequest) -> bytes:
        timeout = self.settings.block_timeout
        started = time.monotonic()
        ref = request.block
        what = f"block {ref.index} of {ref.path} from worker {worker.worker_id}"
        try:
            chunks = list(self.worker_stub(worker).ReadBlock(request, timeout=timeout))
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - started >= timeout:
                # Our own deadline (the worker's store errors come sooner): skip the worker.
                raise WorkerStalled(f"reading {what}: no answer within {timeout:g}s (STRATA_CLIENT_BLOCK_TIMEOUT)") from exc
            raise error_of(exc, f"reading {what}") from exc
        return joined_block(chunks, what)

    # -- writes ------------------------------------------------------------------------------

    def writer_worker(self) -> pb.WorkerInfo:
        workers = [w for w in self.workers() if not w.decommissioning]
        if not workers:
            raise Unavailable(f"no live workers to write through (master {self.master_address})")
        local = [w for w in workers if w.host == self.host]
        return (local or workers)[0]

    def write_file(self, path: str, chunks: Iterable[bytes], *,
                   write_type: pb.WriteType.ValueType = pb.WRITE_TYPE_UNSPECIFIED, overwrite: bool = True,
                   append: bool = False) -> pb.FileInfo:
        """Write a file through a worker (`append`: after the bytes it has, if any)."""
        check_limits(path)
        worker = self.writer_worker()

        def messages() -> Iterator[pb.WriteFileChunk]:
            first = True
            for data in chunks:
                for i in range(0, max(len(data), 1) if first else len(data), constants.STREAM_CHUNK_SIZE):
                    piece = data[i:i + constants.STREAM_CHUNK_SIZE]
                    if first:
                        yield write_chunk(piece, path=path, write_type=write_type, overwrite=overwrite)
                        first = False
                    else:
                        yield write_chunk(piece)
            if first:
                yield write_chunk(b"", path=path, write_type=write_type, overwrite=overwrite)

        stub = self.worker_stub(worker)
        call = stub.AppendFile if append else stub.WriteFile
        try:
            return call(messages(), timeout=3600).file  # type: ignore[no-any-return]
        except grpc.RpcError as exc:
            raise error_of(exc, f"writing {path} through worker {worker.worker_id}") from exc
        finally:
            self.drop_held(path)

    def copy_file(self, src: str, dst: str, *, overwrite: bool = True,
                  write_type: pb.WriteType.ValueType = pb.WRITE_TYPE_UNSPECIFIED) -> pb.FileInfo:
        """Copy a file inside the cluster (a worker reads the source and writes the copy;
        no byte passes through this client)."""
        request = pb.CopyFileRequest(src=src, dst=dst, overwrite=overwrite, write_type=write_type)
        check_request_paths(request)
        worker = self.writer_worker()
        try:
            return self.worker_stub(worker).CopyFile(request, timeout=3600).file  # type: ignore[no-any-return]
        except grpc.RpcError as exc:
            raise error_of(exc, f"copying {src} to {dst} through worker {worker.worker_id}") from exc
        finally:
            self.drop_held(dst)


class StallWatch:
    """Calls `give_up` once `timeout` seconds pass without a page of a listing while one is
    awaited (`heard` starts the wait again, `pause` holds it while the reader has the page):
    one thread for the whole listing, where a timer a page started a thread for each."""

    def __init__(self, give_up: Callable[[], None], timeout: float) -> None:
        self.stalled = False
        self._give_up = give_up
        self._timeout = timeout
        self._since: float | None = time.monotonic()  # None: paused
        self._done = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="strata-list-watch", daemon=True).start()

    def heard(self) -> None:
        with self._lock:
            self._since = time.monotonic()

    def pause(self) -> None:
        with self._lock:
            self._since = None

    def stop(self) -> None:
        self._done.set()

    def _run(self) -> None:
        wait = self._timeout
        while not self._done.wait(wait):
            with self._lock:
                since = self._since
                if since is not None and time.monotonic() - since >= self._timeout:
                    self.stalled = True
            if self.stalled:
                self._give_up()
                return
            wait = self._timeout if since is None else max(0.01, since + self._timeout - time.monotonic())
