"""gRPC plumbing of the servers: servers that check tokens, errors to status codes, bounded
messages, ports, and a cache of channels by server id. Channels and the mapping of a failed
call back to its error are the contract's (strata.contract.rpc), shared with the operator."""

from __future__ import annotations

import errno
import functools
import logging
import resource
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

import grpc

from strata.contract import constants
from strata.contract.errors import ANSWERED, FailedPrecondition, StrataError
from strata.contract.proto import strata_pb2 as pb
from strata.contract.rpc import MAX_MESSAGE_BYTES
from . import auth

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Self = TypeVar("Self")
Channel = TypeVar("Channel")

# What a server receives in one message. A worker's largest are the pieces of a write
# (WriteFile, AppendFile): writers send a file's bytes in STREAM_CHUNK_SIZE pieces, and no
# call sends a worker block bytes, so a worker needs one piece and room for the fields
# beside it (path, write type).
WORKER_MAX_RECEIVE_BYTES = constants.STREAM_CHUNK_SIZE + 1024 * 1024
# The master's largest requests are a worker's block lists (registration, heartbeats), which
# workers send in batches of at most BLOCK_LIST_BATCH_BYTES.
BLOCK_LIST_BATCH_BYTES = 4 * 1024 * 1024
MASTER_MAX_RECEIVE_BYTES = 4 * BLOCK_LIST_BATCH_BYTES
# Calls one connection may have open at once: what a client with many concurrent readers
# needs, while a connection's buffered messages stay bounded (streams x message limit).
MAX_CONCURRENT_STREAMS = 64
# gRPC connections a server holds at once, at least: each takes a file descriptor, and a
# connection past the limit is closed at once.
MIN_CONNECTIONS = 64
# Where the kernel caps a process's open files when the hard limit says unlimited.
_NR_OPEN = Path("/proc/sys/fs/nr_open")


def raise_open_file_limit() -> int:
    """This process's limit of open files, raised first to its hard limit (as far as the
    kernel allows): a server's connections, block files and store connections each take a
    descriptor, and distributions often start processes with a soft limit of 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            target = int(_NR_OPEN.read_text())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as exc:
            log.info("open file limit stays at %d (hard limit %d): %s", soft, hard, exc)
    return int(soft) if soft != resource.RLIM_INFINITY else target


def connection_limit(open_files: int) -> int:
    """gRPC connections a server with `open_files` descriptors holds at once: half of them.
    The other half stays for what serves reads (block files, the data port's connections,
    the store's connections, the HTTP side), so a flood of connections, which needs no
    token, cannot take the descriptors readers need."""
    return max(MIN_CONNECTIONS, open_files // 2)


def split_batch(refs: list[pb.BlockRef]) -> tuple[list[pb.BlockRef], list[pb.BlockRef]]:
    """The first refs that fit in one message's batch (BLOCK_LIST_BATCH_BYTES), and the
    rest: a server receives bounded messages however many blocks a list holds."""
    total = 0
    for i, ref in enumerate(refs):
        total += ref.ByteSize() + 8  # field tag and length prefix
        if total > BLOCK_LIST_BATCH_BYTES and i > 0:
            return refs[:i], refs[i:]
    return refs, []


def server(credentials: auth.Credentials, *, max_receive_bytes: int,
           interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> grpc.aio.Server:
    """A gRPC server that checks every call's token and role before reading its message,
    and bounds what one message and one connection may hold, and how many connections it
    holds (`connection_limit` of the process's open file limit, raised first); the calls
    let in then pass `interceptors` (e.g. `rpcmetrics.RequestMetrics`)."""
    return grpc.aio.server(
        interceptors=[auth.TokenInterceptor(credentials), *interceptors],
        options=[
            ("grpc.max_receive_message_length", max_receive_bytes),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
            ("grpc.max_allowed_incoming_connections", connection_limit(raise_open_file_limit())),
            ("grpc.keepalive_time_ms", 30_000),
        ],
    )


# Characters of an error message a reply carries at most. The message travels in the reply's
# trailing metadata (percent-encoded: up to 3 bytes a byte of UTF-8), which the caller's gRPC
# refuses past 8 KiB; a longer one (a message quoting a long path or a store's whole answer)
# would reach the caller as ResourceExhausted in place of the error.
MAX_ERROR_MESSAGE_CHARS = 1024


def error_message(message: str) -> str:
    """`message`, cut to MAX_ERROR_MESSAGE_CHARS with a note of how much was left out."""
    if len(message) <= MAX_ERROR_MESSAGE_CHARS:
        return message
    return f"{message[:MAX_ERROR_MESSAGE_CHARS]}... ({len(message) - MAX_ERROR_MESSAGE_CHARS} more characters)"


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException, method: str) -> None:
    if isinstance(exc, StrataError):
        await context.abort(exc.code, error_message(str(exc)), trailing_metadata=ANSWERED)
    log.exception("unexpected error in %s", method)
    await context.abort(grpc.StatusCode.INTERNAL, error_message(f"{method} failed: {type(exc).__name__}: {exc}"),
                        trailing_metadata=ANSWERED)


def unary(
    fn: Callable[[Self, Req, grpc.aio.ServicerContext], Awaitable[Resp]],
) -> Callable[[Self, Req, grpc.aio.ServicerContext], Awaitable[Resp]]:
    """Turn StrataErrors raised by a unary handler into the matching gRPC status."""

    @functools.wraps(fn)
    async def wrapper(self: Self, request: Req, context: grpc.aio.ServicerContext) -> Resp:
        try:
            return await fn(self, request, context)
        except (grpc.aio.AbortError, grpc.aio.UsageError):
            raise
        except Exception as exc:  # noqa: BLE001 - every error becomes a status
            await _abort(context, exc, fn.__name__)
            raise  # unreachable: abort raises

    return wrapper


def streaming(
    fn: Callable[[Self, Req, grpc.aio.ServicerContext], AsyncIterator[Resp]],
) -> Callable[[Self, Req, grpc.aio.ServicerContext], AsyncIterator[Resp]]:
    """The same for handlers that stream responses."""

    @functools.wraps(fn)
    async def wrapper(self: Self, request: Req, context: grpc.aio.ServicerContext) -> AsyncIterator[Resp]:
        try:
            async for item in fn(self, request, context):
                yield item
        except (grpc.aio.AbortError, grpc.aio.UsageError):
            raise
        except Exception as exc:  # noqa: BLE001
            await _abort(context, exc, fn.__name__)

    return wrapper


class ChannelCache(Generic[Channel]):
    """One channel per server, by its stable id (a worker id), dialled again when the
    server's address changes: the master's channels to its workers, a worker's to its peers,
    the client's to the workers. Safe to use from several threads.

    A channel replaced by a new address goes to `retire` (the caller closes it, or lets it
    close later); without `retire`, replaced channels are kept until `take_all`, so a call
    still running on one is never cut short."""

    def __init__(self, dial: Callable[[str], Channel],
                 retire: Callable[[str, Channel], object] | None = None) -> None:
        self._dial = dial
        self._retire = retire
        self._by_id: dict[str, tuple[str, Channel]] = {}
        self._retired: list[Channel] = []
        self._lock = threading.Lock()

    def get(self, server_id: str, address: str) -> Channel:
        """The channel to `server_id` at `address`, dialled on first use or when the address
        changed."""
        old: Channel | None = None
        with self._lock:
            cached = self._by_id.get(server_id)
            if cached is not None and cached[0] == address:
                return cached[1]
            channel = self._dial(address)
            self._by_id[server_id] = (address, channel)
            if cached is not None:
                old = cached[1]
                if self._retire is None:
                    self._retired.append(old)
        if old is not None and self._retire is not None:
            self._retire(server_id, old)
        return channel

    def drop(self, server_id: str) -> None:
        """Forget the server (it left): its channel goes to `retire`, or waits for `take_all`."""
        with self._lock:
            cached = self._by_id.pop(server_id, None)
            if cached is not None and self._retire is None:
                self._retired.append(cached[1])
        if cached is not None and self._retire is not None:
            self._retire(server_id, cached[1])

    def take_all(self) -> list[Channel]:
        """Every channel held (current and kept replaced ones), for the owner to close; the
        cache is empty afterwards."""
        with self._lock:
            channels = [channel for _, channel in self._by_id.values()] + self._retired
            self._by_id.clear()
            self._retired = []
        return channels


def _port_taken(bind: str, port: int) -> bool:
    """Whether something already listens on (bind, port): a probe bind fails with EADDRINUSE."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((bind, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def listen_error(server: str, purpose: str, bind: str, port: int, flag: str, cause: BaseException | None = None) -> StrataError:
    """The error a server gives when it cannot listen on a port: says whether the port is
    taken and which flag picks another, so start-up fails with one line, not a traceback."""
    in_use = (isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE) or _port_taken(bind, port)
    if in_use:
        return FailedPrecondition(
            f"{server}: port {port} is already in use ({purpose} on {bind}); stop the process that "
            f"holds it or choose another port with {flag}"
        )
    reason = f": {cause.strerror or cause}" if isinstance(cause, OSError) else ""
    return FailedPrecondition(f"{server}: cannot listen on {bind}:{port} for {purpose}{reason}; check {flag} and --bind")


def add_port(server: grpc.aio.Server, name: str, bind: str, port: int) -> int:
    """Listen for gRPC on (bind, port); the bound port (for port 0), or a clear error.
    The port is probed first: gRPC servers share ports (SO_REUSEPORT), so a second server
    on a taken port would otherwise start and receive half of another's calls."""
    if port and _port_taken(bind, port):
        raise listen_error(name, "gRPC", bind, port, "--port")
    try:
        bound = server.add_insecure_port(f"{bind}:{port}")
    except RuntimeError as exc:  # grpc raises this when no address could be bound
        raise listen_error(name, "gRPC", bind, port, "--port") from exc
    if bound == 0:
        raise listen_error(name, "gRPC", bind, port, "--port")
    return int(bound)
