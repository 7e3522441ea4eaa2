"""How the client reaches its cluster: where the master is and the token to show it, calls to
the master, the live workers it lists (and, while it cannot be reached, the last list, or
the one another process of this host was told: `localstate.WorkerRecord`, for up to
`master_outage_grace`), and the connections to each worker (gRPC channels, short-circuit and
data-port readers). `core.StrataClient` reads and writes through these links.
"""

from __future__ import annotations

import functools
import http.client
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import grpc

from strata.contract import constants
from strata.contract.errors import InvalidArgument, Unreachable
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc
from strata.contract.rpc import error_of, sync_channel
from .. import rpcutil
from ..auth import load_token
from ..common.paths import check_request_paths
from . import localstate
from .heldblocks import HeldBlocks
from .settings import ClientSettings
from .transfer import BufferPool, DataReader, Patience, ShortCircuitReader

log = logging.getLogger(__name__)

# How long the worker list is reused before asking the master again.
WORKERS_TTL = 2.0
# While the master is away, how often a client checks in the background whether it is back.
MASTER_PROBE_INTERVAL = 0.5
# While the master lists no live worker (it just restarted), how often a read asks again.
NO_WORKERS_POLL = 0.25
# A master that did not answer at all. One that answered an error (e.g. its store is down)
# is there and its answer stands: falling back on held metadata then could serve a file
# older than its last acknowledged write.
_MASTER_AWAY = (Unreachable,)


def resolve_master(master: str | None) -> str:
    """Where the master is: the argument, STRATA_MASTER, or the local cluster."""
    if master:
        return master
    if os.environ.get(constants.ENV_MASTER):
        return os.environ[constants.ENV_MASTER]
    state = localstate.read_state()
    if state is not None:
        return state.master
    raise InvalidArgument(
        "no master address: pass --master HOST:PORT, set STRATA_MASTER, or start a local "
        "cluster with `strata local up`"
    )


def resolve_token(token: str | None) -> str:
    if token:
        return token
    return load_token(localstate.token_file())


def local_host() -> str:
    """This host's name as workers report theirs (the node name in Kubernetes)."""
    return os.environ.get("STRATA_NODE_NAME") or os.environ.get(constants.ENV_HOSTNAME) or socket.gethostname()


def worker_alive(info: pb.WorkerInfo, timeout: float) -> bool:
    """Does the worker's process answer at all? Its health endpoint is served by the same
    event loop as its reads, so a stopped or hung worker leaves it unanswered."""
    if not info.http_port:
        return True  # nothing to ask: the block deadline still bounds the wait
    host = info.address.rsplit(":", 1)[0].strip("[]")
    conn = http.client.HTTPConnection(host, info.http_port, timeout=timeout)
    try:
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        return True  # any answer, 503 included: the process is running
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


@dataclass
class _Workers:
    at: float
    all: list[pb.WorkerInfo]


class Links:
    """The master and the workers of one cluster, as one client reaches them (the base of
    `core.StrataClient`)."""

    def __init__(self, master: str | None = None, token: str | None = None, host: str | None = None,
                 short_circuit: bool = True, settings: ClientSettings | None = None, kind: str = "fsspec") -> None:
        self.master_address = resolve_master(master)
        # The kind of reader this is (`blockwire.CLIENT_KINDS`): workers count the bytes they
        # serve it under this name, so FUSE mounts' reads show apart from other readers'.
        self.kind = kind
        self.token = resolve_token(token)
        self.host = host or local_host()
        self.short_circuit = short_circuit
        self.settings = settings or ClientSettings()
        self._channel = sync_channel(self.master_address, self.token)
        self.master = pb_grpc.MasterStub(self._channel)
        self._workers: _Workers | None = None
        # Replaced channels (a worker back at another address) stay open until close():
        # another thread may still be reading through one.
        self._worker_channels: rpcutil.ChannelCache[grpc.Channel] = rpcutil.ChannelCache(
            functools.partial(sync_channel, token=self.token))
        self._sc_readers: dict[str, ShortCircuitReader] = {}
        self._data_readers: dict[str, DataReader] = {}
        self.buffers = BufferPool()  # receive buffers (the data port's blocks, ranges read into one), shared
        # Block files of this host's worker kept open between opens of a file (heldblocks.py).
        self.held_blocks = HeldBlocks(self.settings.held_blocks, self.settings.held_blocks_for)
        self._record = localstate.WorkerRecord(self.master_address)
        self._stalled: dict[str, float] = {}  # worker id -> time.monotonic() until it is tried last
        # time.monotonic() of the last failed call to the master (down, stopped); None once
        # it answers again.
        self._master_failed_at: float | None = None
        self._probing = False
        self._probed_at = -MASTER_PROBE_INTERVAL
        self._lock = threading.Lock()

    # -- plumbing ----------------------------------------------------------------------------

    def call(self, method: str, request: Any, *, what: str, timeout: float | None = None) -> Any:
        check_request_paths(request)
        try:
            return getattr(self.master, method)(request, timeout=timeout or self.settings.master_timeout)
        except grpc.RpcError as exc:
            raise error_of(exc, f"{what} (master {self.master_address})") from exc

    def _within_grace(self, at: float) -> bool:
        return time.monotonic() - at <= self.settings.master_outage_grace

    def _master_away(self) -> bool:
        """The master failed a call and has not answered since. Calls with an answer to fall
        back on then use it at once (each ask of a stopped master costs a timeout), while a
        probe in the background, at most one per MASTER_PROBE_INTERVAL, finds out when it is
        back."""
        if self._master_failed_at is None:
            return False
        now = time.monotonic()
        with self._lock:
            if self._probing or now - self._probed_at < MASTER_PROBE_INTERVAL:
                return True
            self._probing, self._probed_at = True, now
        future = self.master.ListWorkers.future(pb.ListWorkersRequest(), timeout=self.settings.master_quick_timeout)
        future.add_done_callback(self._probed)
        return True

    def _probed(self, future: grpc.Future) -> None:
        try:
            self._took_workers(future.result())
        except grpc.RpcError as exc:
            away = isinstance(error_of(exc, "probing the master"), _MASTER_AWAY)
            self._master_failed_at = time.monotonic() if away else None  # an error answered: it is there
        finally:
            self._probing = False

    def _took_workers(self, response: pb.ListWorkersResponse) -> _Workers:
        self._master_failed_at = None
        self._workers = _Workers(time.monotonic(), list(response.workers))
        self._record.save(self._workers.all)
        return self._workers

    def _list_workers(self, timeout: float | None) -> _Workers:
        try:
            response = self.call("ListWorkers", pb.ListWorkersRequest(), what="listing workers", timeout=timeout)
        except _MASTER_AWAY:
            self._master_failed_at = time.monotonic()
            if self._workers is None and (recorded := self._recorded_workers()) is not None:
                return recorded
            raise
        return self._took_workers(response)

    def _recorded_workers(self) -> _Workers | None:
        """The workers another process of this host was told of, while that is within
        `master_outage_grace` (a new process started while the master is away)."""
        recorded = self._record.load(self.settings.master_outage_grace)
        if recorded is None:
            return None
        age, infos = recorded
        log.warning("master away; reading with the %d workers it listed to this host %.0fs ago", len(infos), age)
        self._workers = _Workers(time.monotonic() - age, infos)
        return self._workers

    def workers(self, refresh: bool = False) -> list[pb.WorkerInfo]:
        """The live workers, as the master listed them at most WORKERS_TTL ago; while the
        master cannot be reached, the last list (for up to `master_outage_grace`)."""
        cached = self._workers
        if not (refresh or cached is None or time.monotonic() - cached.at > WORKERS_TTL):
            return cached.all
        if cached is None:
            # With a record of this host's to fall back on, a stopped master costs the quick wait.
            recorded = self._record.load(self.settings.master_outage_grace) is not None
            return self._list_workers(self.settings.master_quick_timeout if recorded else None).all
        if self._within_grace(cached.at) and self._master_away():
            return cached.all
        try:
            # The master answers this from memory: a short wait tells a stopped master.
            return self._list_workers(self.settings.master_quick_timeout).all
        except _MASTER_AWAY as exc:
            if not self._within_grace(cached.at):
                raise
            log.warning("master away (%s); reading with the %d workers it listed %.0fs ago",
                        exc, len(cached.all), time.monotonic() - cached.at)
            return cached.all

    def _await_workers(self) -> list[pb.WorkerInfo]:
        """The live workers once the master lists one, asked again every NO_WORKERS_POLL
        seconds for up to `no_workers_wait`; [] if none came."""
        deadline = time.monotonic() + self.settings.no_workers_wait
        while time.monotonic() < deadline:
            time.sleep(min(NO_WORKERS_POLL, max(0.0, deadline - time.monotonic())))
            if workers := self.workers(refresh=True):
                return workers
        return []

    def worker_stub(self, info: pb.WorkerInfo) -> pb_grpc.WorkerStub:
        return pb_grpc.WorkerStub(self._worker_channels.get(info.worker_id, info.address))

    def _sc_reader(self, info: pb.WorkerInfo) -> ShortCircuitReader | None:
        if not (self.short_circuit and info.domain_socket and info.host == self.host):
            return None
        reader = self._sc_readers.get(info.domain_socket)
        if reader is not None:  # a socket gone since fails its connect: the network serves
            return reader
        if not os.path.exists(info.domain_socket):
            return None
        with self._lock:
            reader = self._sc_readers.get(info.domain_socket)
            if reader is None:
                reader = self._sc_readers[info.domain_socket] = ShortCircuitReader(
                    info.domain_socket, self.token, self._patience(info), self.kind)
        return reader

    def _patience(self, info: pb.WorkerInfo) -> Patience:
        s = self.settings
        # No reference back to the client: readers (and their sockets) go when it goes.
        return Patience(connect_timeout=s.connect_timeout, check_after=s.stall_check_after,
                        block_timeout=s.block_timeout, alive=functools.partial(worker_alive, info, s.liveness_timeout))

    def _data_reader(self, info: pb.WorkerInfo) -> DataReader | None:
        if not info.data_port:
            return None
        host = info.address.rsplit(":", 1)[0].strip("[]")
        where = f"{host}:{info.data_port}"
        with self._lock:
            reader = self._data_readers.get(where)
            if reader is None:
                reader = self._data_readers[where] = DataReader(host, info.data_port, self.token, self._patience(info),
                                                                    self.buffers, self.kind)
        return reader

    def close(self) -> None:
        for reader in [*self._sc_readers.values(), *self._data_readers.values()]:
            reader.close()
        self.buffers.clear()
        self.held_blocks.clear()
        for channel in self._worker_channels.take_all():
            channel.close()
        self._channel.close()

