"""The under file system: one `Store` per mount, over any fsspec filesystem.

A Store turns a mount's source URL (`s3://bucket/prefix`, `file:///dir`, `memory://name`,
`gcs://...`) and its options into async calls on paths relative to that source. Every call
goes through `retry.call_with_backoff`, retrying only transient failures (connection errors,
timeouts, 5xx answers, throttling), within one deadline per operation (`StoreTimeouts`); a
missing object, a missing bucket or refused credentials become `NotFound` /
`PermissionDenied` at once, with a message a person can act on.

Async filesystems (s3fs, gcsfs, ...) run on the caller's event loop with one session per
Store; blocking ones (file://, memory://) run in a worker thread. Each Store owns its
filesystem instance (fsspec's instance cache is skipped), so two mounts with different
credentials never share a client, and the library's own retry loops are switched off so
that the one retry helper decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import importlib.util
import inspect
import logging
import os
import posixpath
import queue
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, TypeVar

import aiohttp
import botocore.exceptions
from botocore.parsers import ResponseParserError
import fsspec
from fsspec.asyn import AsyncFileSystem
from fsspec.core import split_protocol
from fsspec.exceptions import FSTimeoutError
from fsspec.implementations.local import LocalFileSystem
from fsspec.registry import known_implementations
from fsspec.spec import AbstractFileSystem
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from s3fs import S3FileSystem
from s3fs.core import calculate_chunksize

from strata.contract.constants import FSSPEC_PROTOCOL, UPLOAD_DIR
from strata.contract.errors import (
    AlreadyExists,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    StrataError,
    Unavailable,
)
from strata.contract.urls import shown_url, url_userinfo
from .retry import RetrySettings, call_with_backoff
from .storemetrics import STORE_METRICS

log = logging.getLogger(__name__)

T = TypeVar("T")

# S3 error codes that mean "these credentials are not accepted here".
_CREDENTIAL_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken", "InvalidClientTokenId", "AllAccessDisabled", "AccountProblem",
    "RequestTimeTooSkewed", "403",
})
# S3 error codes that go away by themselves: throttling and server-side trouble.
_TRANSIENT_CODES = frozenset({
    "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling",
    "ThrottlingException", "RequestLimitExceeded", "OperationAborted",
})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
# Exceptions that say "the store could not be reached or did not answer in time".
_TRANSIENT_TYPES: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    FSTimeoutError,
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ConnectionError,
    ResponseParserError,
)
# Operations whose work is bounded (one object's status, one folder's entries, one block's
# bytes): a reader waits on them, so they get StoreTimeouts.deadline. The others (uploads of
# any size, walks of whole trees, copies) are bounded by the read timeout of each request
# (S3), or by their progress (file://, StoreTimeouts.stall_timeout).
_BOUNDED = frozenset({"check", "info", "list", "read"})
# Bytes: the largest object S3 copies in one CopyObject call.
_S3_COPY_LIMIT = 5 * 2**30
# Threads one store's blocking calls may hold at once (see StoreThreads): as many as a busy
# worker runs against one store (readahead, loads and readers' misses), few enough that a
# hung store does not hold many.
STORE_THREADS = 16
# Storage options that Strata sets itself; a Mount cannot override them.
_MANAGED_OPTIONS = frozenset({"asynchronous", "loop", "skip_instance_cache", "use_listings_cache"})
# Schemes whose filesystem wraps another one or reads files of the server's host (caches,
# archives, directory views, references, git checkouts): a Mount could reach any host file
# through their options, so they are not mountable. file:// is, under allowed roots only.
_HOST_READING_PROTOCOLS = frozenset({
    "async_wrapper", "asyncwrapper", "asynclocal", "blockcache", "cached", "dask", "dir", "filecache",
    "generic", "git", "libarchive", "reference", "simplecache", "tar", "zip",
})
# How file:// stores open folders: to look names up in (O_PATH: search permission is
# enough), and to list, or make files in and fsync.
_FOLDER = os.O_PATH | os.O_DIRECTORY
_OPEN_FOLDER = os.O_RDONLY | os.O_DIRECTORY
# Bytes a file:// upload or copy writes at a time (a step of its progress), and syncs at a
# time: its last fsync then has at most this much left to write, however large the file.
_COPY_CHUNK = 1 << 20
_SYNC_EVERY = 32 << 20
# Characters a credential's value must have to be cut out of messages: shorter ones ("1",
# "on") would cut ordinary words and numbers, and tell nothing.
_SHOWN_SECRET = 4
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


@dataclass(frozen=True)
class StoreTotals:
    """How many files a store holds (below some folder), and their bytes."""

    files: int
    total_bytes: int


# The share of its time a walk that totals a store works (`Store.totals`): it rests the rest.
TOTALS_DUTY = 0.5


class StoreTimeouts(BaseSettings):
    """How long a store may take; `STRATA_STORE_CONNECT_TIMEOUT` etc. override the defaults.
    A store that accepts connections but never answers costs a reader at most `deadline`
    seconds, then a clear error (and, for metadata, the stale-if-error answer)."""

    model_config = SettingsConfigDict(env_prefix="STRATA_STORE_", frozen=True, extra="forbid")

    # Seconds to open a connection to the store: a reachable endpoint answers a TCP
    # handshake in milliseconds; 5 s rides out a busy one (S3 object stores).
    connect_timeout: float = Field(default=5.0, gt=0)
    # Seconds to wait for the next bytes of an answer (not for the whole answer): an object
    # store starts answering within a second; 10 s tells a hung store from a slow one (S3).
    read_timeout: float = Field(default=10.0, gt=0)
    # Seconds for one bounded operation (a status, a folder listing, a block read), its
    # retries included, on any store: about two read timeouts. Past it the caller gets
    # DeadlineExceeded naming the store. Raise it for stores whose 16 MiB block reads take
    # longer. Uploads and walks of whole trees are bounded by read_timeout per request (S3)
    # or by stall_timeout (file://).
    deadline: float = Field(default=20.0, gt=0)
    # Seconds a file:// store's upload, copy, move, delete or walk may go without progress
    # (a MiB written and, every 32 MiB, synced; a folder listed or emptied) before its caller
    # gets DeadlineExceeded naming the store: the file server stopped answering. A server
    # that answers at all makes progress within seconds; 60 s leaves room for one that
    # writes half a MiB a second. The call's thread is let go once the server answers, and
    # what the call was making is dropped then.
    stall_timeout: float = Field(default=60.0, gt=0)
    # Seconds the master waits on the store for metadata older than the mount's sync
    # interval before answering from it (stale-if-error): a hung store then costs a reader
    # of cached files this, not the whole deadline. The store's answer, when it comes,
    # still refreshes the metadata.
    stale_after: float = Field(default=3.0, gt=0)


class UfsStatus(NamedTuple):
    """What a store says about one file or directory. A tuple of plain values: the master
    keeps one for every file of a listed tree, and the garbage collector stops looking at
    tuples of plain values (a collection over millions of objects would hold the master
    up for seconds)."""

    path: str  # relative to the mount's root: "" is the root, never a leading slash
    is_dir: bool
    length: int
    mtime_unix_ms: int
    # Changes whenever the content may have changed: the store's etag if it has one, else
    # f"{size}-{mtime_ns}". Empty for directories.
    version: str

    @property
    def name(self) -> str:
        """The last part of the path ("" for the root): made when asked, not kept (the master
        keeps a status of every file of a listed tree)."""
        return self.path.rpartition("/")[2]


def supported_protocols() -> list[str]:
    """URL schemes this server can mount: fsspec protocols whose package is installed."""
    found = set(fsspec.registry)  # already imported implementations
    for protocol, spec in known_implementations.items():
        module = spec["class"].split(".", 1)[0]
        if importlib.util.find_spec(module) is not None:
            found.add(protocol)
    found.discard(FSSPEC_PROTOCOL)  # Strata inside Strata would loop
    return sorted(found)


def filesystem_class(source: str) -> tuple[str, type[AbstractFileSystem]]:
    """The scheme of `source` and the fsspec class that serves it; InvalidArgument if
    `source` is not a URL this server can mount."""
    if "::" in source:
        raise InvalidArgument(
            f"source {shown_url(source)!r} chains filesystems; give a plain URL such as s3://bucket/prefix"
        )
    protocol, _ = split_protocol(source)
    if not protocol:
        raise InvalidArgument(
            f"source {shown_url(source)!r} has no scheme; write a URL such as s3://bucket/prefix, "
            "file:///abs/dir or memory://name"
        )
    protocol = protocol.lower()
    if protocol == FSSPEC_PROTOCOL:
        raise InvalidArgument(f"source {shown_url(source)!r}: a Strata path cannot be mounted into Strata")
    try:
        cls: type[AbstractFileSystem] = fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise InvalidArgument(
            f"unknown store scheme {protocol!r} in source {shown_url(source)!r}; supported here: "
            + ", ".join(supported_protocols())
        ) from None
    except ImportError as exc:
        raise InvalidArgument(
            f"store scheme {protocol!r} (source {shown_url(source)!r}) needs a package this server "
            f"does not have: {exc}; use an image that includes it"
        ) from None
    if protocol in _HOST_READING_PROTOCOLS:
        raise InvalidArgument(
            f"store scheme {protocol!r} (source {shown_url(source)!r}) wraps another filesystem or reads the "
            "server host's files; mount the store itself (s3://..., or file:// under an allowed root)"
        )
    return protocol, cls


def is_local(cls: type[AbstractFileSystem]) -> bool:
    """Does this filesystem read the server host's own files (file://)?"""
    return issubclass(cls, LocalFileSystem)


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_source_allowed(source: str, allowed_roots: Sequence[str]) -> None:
    """PermissionDenied unless `source` is a store URL this cluster may mount: a file://
    source must lie, with its links resolved, at or below one of `allowed_roots`."""
    _, cls = filesystem_class(source)
    if not is_local(cls):
        return
    path = posixpath.normpath(cls._strip_protocol(source) or "/")
    if not allowed_roots:
        raise PermissionDenied(
            f"source {shown_url(source)!r} reads the servers' own files, and this cluster allows no file:// "
            "sources; its owner can allow folders in the CacheCluster's spec.localSources.allowedRoots"
        )
    real = os.path.realpath(path)
    if any(_is_within(real, os.path.realpath(root)) for root in allowed_roots):
        return
    raise PermissionDenied(
        f"source {shown_url(source)!r} is not under a folder this cluster allows for file:// sources "
        f"({', '.join(allowed_roots)}); add its folder to spec.localSources.allowedRoots of the CacheCluster"
    )


def _got(value: str, secret: bool) -> str:
    """How a message shows an option's value: never, if it came from the credentials."""
    return "got a value from the Mount's credentials (not shown)" if secret else f"got {value!r}"


def _to_bool(name: str, value: str, secret: bool) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidArgument(f"store option {name}: expected true or false, {_got(value, secret)}")


def _to_number(name: str, value: str, kind: type[int] | type[float], secret: bool) -> int | float:
    try:
        return kind(value)
    except ValueError:
        raise InvalidArgument(f"store option {name}: expected a number, {_got(value, secret)}") from None


def storage_options(cls: type[AbstractFileSystem], options: Mapping[str, Any],
                    secret: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Turn string options (as YAML gives them) into the keyword arguments `cls` takes:
    "true"/"false" and numbers become bool/int/float where the parameter's default has that
    type. For S3, `region` goes to the client; options s3fs does not know are refused. The
    values of the options named in `secret` (the credentials) are never put in a message."""
    params = inspect.signature(cls.__init__).parameters
    is_s3 = issubclass(cls, S3FileSystem)
    out: dict[str, Any] = {}
    client_kwargs: dict[str, Any] = {}
    for name, value in options.items():
        if name in _MANAGED_OPTIONS:
            raise InvalidArgument(f"store option {name} is managed by Strata; remove it from the Mount")
        if is_s3 and name in ("region", "region_name"):
            client_kwargs["region_name"] = value
            continue
        param = params.get(name)
        if param is None and is_s3:
            accepted = sorted(p for p in params if p not in ("self", "kwargs", "args") and p not in _MANAGED_OPTIONS)
            raise InvalidArgument(
                f"store option {name!r} is not an S3 option; use one of: region, " + ", ".join(accepted)
            )
        default = param.default if param is not None else None
        if isinstance(value, str):
            if isinstance(default, bool):
                value = _to_bool(name, value, name in secret)
            elif isinstance(default, (int, float)):
                value = _to_number(name, value, type(default), name in secret)
        out[name] = value
    if client_kwargs:
        out["client_kwargs"] = {**(out.get("client_kwargs") or {}), **client_kwargs}
    return out


def _client_error(exc: BaseException) -> botocore.exceptions.ClientError | None:
    """The S3 error behind `exc` (s3fs re-raises them as OSError subclasses), if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, botocore.exceptions.ClientError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _mtime_seconds(info: Mapping[str, Any]) -> float:
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified", "created", "timeCreated"):
        value = info.get(key)
        if value is None or value == "":
            continue
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


class StoreThreads(Executor):
    """The threads one store's blocking calls (file://, memory://, ...) run on: at most
    `limit`, started as needed, daemons. A store that stops answering (a hung NFS server)
    holds its calls' threads for as long as it hangs; with threads of its own it holds
    only these, and its further calls wait here until their deadline, while other mounts'
    stores and the block cache (the event loop's default threads) go on."""

    def __init__(self, limit: int, name: str) -> None:
        self._limit = limit
        self._name = name
        self._lock = threading.Lock()
        self._started = 0
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            self._work.put((future, functools.partial(fn, *args, **kwargs)))
            if not self._idle.acquire(blocking=False) and self._started < self._limit:
                self._started += 1
                threading.Thread(target=self._run, args=(self._work, self._idle), daemon=True,
                                 name=f"{self._name}-{self._started}").start()
        return future

    @staticmethod
    def _run(work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None],
             idle: threading.Semaphore) -> None:
        while (item := work.get()) is not None:
            future, call = item
            if future.set_running_or_notify_cancel():  # not cancelled while it waited
                try:
                    future.set_result(call())
                except BaseException as exc:  # noqa: BLE001 - the caller gets it
                    future.set_exception(exc)
            del item, future, call
            idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Let the threads end once the calls queued so far ran (a hung one never does); a
        later call starts new ones."""
        with self._lock:
            for _ in range(self._started):
                self._work.put(None)
            self._work, self._idle, self._started = queue.SimpleQueue(), threading.Semaphore(0), 0


class VersionChanged(FailedPrecondition):
    """A read of one version of a file found another one in the store."""


class _ShortAnswer(Unavailable):
    """A store answered an exact read with another number of bytes than asked for."""


class Progress:
    """How far a long file:// call (an upload, copy, move, delete or walk) has come: it
    reports each step (a MiB written, a folder listed or emptied), and `Store._call` gives
    up on a call that reported none for `StoreTimeouts.stall_timeout`. A call given up on
    stops at its next step, leaving nothing made (its thread goes on only once the store
    answers again)."""

    def __init__(self) -> None:
        self.at = time.monotonic()
        self.given_up = False

    def step(self) -> None:
        if self.given_up:
            raise DeadlineExceeded("the caller gave up on this store call; what it made is dropped")
        self.at = time.monotonic()


def _copy_into(out: BinaryIO, source: Path | int | bytes, progress: Progress) -> None:
    """Write `source` (a file's path, a descriptor, which this closes, or bytes) into `out`
    (a file a file:// store is given) a step of `progress` at a time, synced every
    _SYNC_EVERY bytes."""
    with contextlib.ExitStack() as stack:
        if isinstance(source, bytes):
            view = memoryview(source)
            chunks: Iterator[bytes | memoryview] = (view[i:i + _COPY_CHUNK] for i in range(0, len(view), _COPY_CHUNK))
        else:
            f = stack.enter_context(open(source, "rb"))
            chunks = iter(functools.partial(f.read, _COPY_CHUNK), b"")
        written = 0
        for chunk in chunks:
            out.write(chunk)
            written += len(chunk)
            if written % _SYNC_EVERY < len(chunk):
                out.flush()
                os.fdatasync(out.fileno())
            progress.step()


def _local_info(path: str, st: os.stat_result) -> dict[str, Any]:
    """What fsspec's `info` says of a local file, from its status (a link's target's)."""
    kind = "directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    return {"name": path, "size": st.st_size, "type": kind, "mtime": st.st_mtime}


def _rmtree_at(dir_fd: int, name: str, progress: Progress) -> None:
    """Remove the folder `name` of the folder `dir_fd` and all below it, each folder through
    its descriptor (each entry a step of `progress`): a link is removed, never followed (one swapped in
    for a folder meanwhile fails the open, O_NOFOLLOW)."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        for entry in os.listdir(fd):
            if stat.S_ISDIR(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode):
                _rmtree_at(fd, entry, progress)
            else:
                os.unlink(entry, dir_fd=fd)
            progress.step()
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make the entries of `folder` (a file renamed into it) survive a crash of the machine."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Names of the temporary files a file:// store's uploads are written to before their rename:
# in the store's upload folder, or (the destination on another file system) in the
# destination's own folder, named by a note in the upload folder (see `_place_local`).
_UPLOAD_TEMP_PREFIX, _UPLOAD_TEMP_SUFFIX = ".", ".tmp"
_TEMP_ELSEWHERE_PREFIX = ".strata-upload-"
_ELSEWHERE_NOTE_SUFFIX = ".elsewhere"


def _upload_rel(rel: str) -> bool:
    """Is `rel` (relative to a mount's root) in Strata's upload folder, or an upload's
    temporary file: not one of the store's files."""
    return rel == UPLOAD_DIR or rel.startswith(UPLOAD_DIR + "/") or is_upload_temp(posixpath.basename(rel))


def is_upload_temp(name: str) -> bool:
    """Is `name` (a file name) the temporary file of an upload into a folder of a file://
    store: never shown or served as a file of the store."""
    return name.startswith(_TEMP_ELSEWHERE_PREFIX) and name.endswith(_UPLOAD_TEMP_SUFFIX)


def _remove_if_dead(folder_fd: int, name: str, older_than: float) -> bool:
    """Remove the upload temporary file `name` (in the folder `folder_fd`) if its writer is
    gone: no process holds its lock (the writer's, released when it exits or is killed) and
    it has not changed for `older_than` seconds (where locks do not reach, e.g. NFS mounted
    with local locks, an upload under way keeps changing it). A file removed under a writer
    after all only fails that write: its rename finds nothing."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
    except FileNotFoundError:
        return False  # renamed into place meanwhile
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # being written
        st = os.fstat(fd)
        if time.time() - st.st_mtime < older_than:
            return False
        try:
            if os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_ino != st.st_ino:
                return False  # another file by that name now
        except FileNotFoundError:
            return False
        os.unlink(name, dir_fd=folder_fd)
        return True
    finally:
        os.close(fd)


def _write_note(folder_fd: int, name: str, text: str) -> None:
    """Write a small file `name` holding `text` in the folder `folder_fd`, on the disk (file
    and folder) when this returns."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder_fd)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.fsync(folder_fd)


def _local_version(st: os.stat_result) -> str:
    """The version `Store._status` gives a local file, from its stat."""
    return _size_mtime_version(st.st_size, st.st_mtime)


def _size_mtime_version(length: int, mtime: float) -> str:
    return f"{length}-{int(mtime * 1e9)}"


class Store:
    """One mount's store: async operations on paths relative to the source URL."""

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
        self.protocol, self._cls = filesystem_class(source)
        # The source as given reaches the store; every message shows `source`, which has no
        # user-info (contract.urls).
        self._source = source if source.endswith(":///") else source.rstrip("/")
        self.source = shown_url(self._source)
        self._root = self._cls._strip_protocol(source).rstrip("/") or "/"
        if self.protocol in ("file", "local") and not split_protocol(source)[1].startswith("/"):
            raise InvalidArgument(f"source {shown_url(source)!r}: a file:// source needs an absolute path, e.g. file:///data")
        credentials = credentials or {}
        # Values no message may show: a credential that turns up in a store's error (an
        # endpoint, a key echoed back) is cut out of it (`_redacted`), and so is the user-info
        # of the source URL (a store's error may quote the URL it was given).
        userinfo = url_userinfo(source)
        shown = {*credentials.values(), userinfo, userinfo.partition(":")[2]}
        self._secrets = sorted({v for v in shown if len(v) >= _SHOWN_SECRET}, key=len, reverse=True)
        self._kwargs = storage_options(self._cls, {**(options or {}), **credentials}, frozenset(credentials))
        self._retry = retry or RetrySettings()
        self._timeouts = timeouts or StoreTimeouts()
        self._is_async = issubclass(self._cls, AsyncFileSystem)
        self._is_s3 = issubclass(self._cls, S3FileSystem)
        # file:// stores: every path is checked, links resolved, to stay under the root, and
        # (where this host reads the files) the root under an allowed folder of this host.
        self._local = is_local(self._cls)
        self._allowed_roots = allowed_roots
        self._fs = self._make_fs()
        self._fs_loop: asyncio.AbstractEventLoop | None = None
        self._threads = StoreThreads(STORE_THREADS, f"store-{self.protocol}") if not self._is_async else None

    def __repr__(self) -> str:  # never shows options: they may hold credentials
        return f"Store({self.source!r})"

    def _make_fs(self) -> AbstractFileSystem:
        kwargs = dict(self._kwargs)
        if self._is_s3:
            # One retry helper: botocore and s3fs make a single try each.
            config = dict(kwargs.get("config_kwargs") or {})
            config["retries"] = {"total_max_attempts": 1}
            config.setdefault("connect_timeout", self._timeouts.connect_timeout)
            config.setdefault("read_timeout", self._timeouts.read_timeout)
            kwargs["config_kwargs"] = config
        if self._is_async:
            kwargs["asynchronous"] = True
        try:
            fs = self._cls(skip_instance_cache=True, use_listings_cache=False, **kwargs)
        except TypeError as exc:
            raise InvalidArgument(f"store {self.source}: options not accepted: {self._redacted(str(exc))}") from None
        except Exception as exc:
            if self._shows_secret(exc):
                raise self._hidden(exc) from None
            raise
        if self._is_s3:
            fs.retries = 1
        return fs

    def _redacted(self, text: str) -> str:
        """`text` without any value of the mount's credentials."""
        for value in self._secrets:
            text = text.replace(value, "<a value from the Mount's credentials>")
        return text

    def _shows_secret(self, exc: BaseException) -> bool:
        """Does `exc`, or an error it was raised from, show a value of the mount's credentials?"""
        seen: set[int] = set()
        at: BaseException | None = exc
        while at is not None and id(at) not in seen:
            if any(value in str(at) for value in self._secrets):
                return True
            seen.add(id(at))
            at = at.__cause__ or at.__context__
        return False

    def _hidden(self, exc: Exception) -> StrataError:
        """A StrataError of `exc`'s kind whose message has the credentials' values cut out."""
        kind = type(exc) if isinstance(exc, StrataError) else StrataError
        return kind(self._redacted(str(exc)))

    def _where(self) -> str:
        """Where the store is reached, for messages: its endpoint (unless a credential) or source."""
        return self._redacted(shown_url(str(self._kwargs.get("endpoint_url") or self.source)))

    def url(self, rel: str) -> str:
        """The store URL of a path relative to the mount root (for messages)."""
        return f"{self.source.rstrip('/')}/{rel}" if rel else self.source

    def _path(self, rel: str) -> str:
        rel = rel.strip("/")
        if self._local and self._allowed_roots is not None:
            check_source_allowed(self._source, self._allowed_roots)  # links resolved on this host
        if rel in ("", "."):
            return self._root
        if any(part in ("..", ".") for part in rel.split("/")):
            raise InvalidArgument(f"path {rel!r} must not contain '.' or '..' components")
        path = posixpath.join(self._root, rel)
        if self._local and not self._inside_root(path):
            raise PermissionDenied(
                f"{self.url(rel)} leads out of the mount's root {self._root} through a symbolic link; "
                "Strata serves only files under the root of a file:// mount"
            )
        return path

    def _inside_root(self, path: str) -> bool:
        """Does `path`, with every symbolic link resolved (also one not yet created, for
        writes), stay at or below the root? Only for file:// stores."""
        return _is_within(os.path.realpath(path), os.path.realpath(self._root))

    # -- file:// stores: every name is looked up from descriptors checked to lie under the root --

    def _open_inside(self, rel: str, flags: int = os.O_RDONLY, *, make_folders: bool = False) -> int:
        """A descriptor of `rel` (blocking; a file, or a folder with O_DIRECTORY or O_PATH),
        opened one name at a time from the root, each folder on the way checked to lie under
        the root (`_opened_inside`) before the next name is looked up in it, and the last one
        too. `_path` checks names; a link swapped into the path after that check (by whoever
        else writes the folder) leads the lookup elsewhere, which this check then refuses, so
        nothing outside the root is read, listed, made, moved or removed. Links that stay
        inside the root are followed. With `make_folders`, `rel` is a folder, and missing
        folders on the way are made, each in a folder already checked."""
        names = [name for name in rel.strip("/").split("/") if name]
        if any(name in (".", "..") for name in names):
            raise InvalidArgument(f"path {rel!r} must not contain '.' or '..' components")
        fd = self._open_at(None, self._root, rel, flags if not names else _FOLDER)
        try:
            for i, name in enumerate(names):
                if make_folders:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, dir_fd=fd)
                inner = self._open_at(fd, name, rel, flags if i == len(names) - 1 else _FOLDER)
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_at(self, dir_fd: int | None, name: str, rel: str, flags: int) -> int:
        """`name` opened in the folder `dir_fd` (links followed), checked to lie under the
        root; `rel` names it in messages."""
        fd = os.open(name, flags | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            self._opened_inside(fd, rel)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _opened_inside(self, fd: int, rel: str) -> None:
        """PermissionDenied unless what `fd` opened lies under the root (and an allowed root)
        of this file:// store, by the kernel's path of the descriptor."""
        opened = os.readlink(f"/proc/self/fd/{fd}")
        inside = _is_within(opened, os.path.realpath(self._root)) and (
            self._allowed_roots is None
            or any(_is_within(opened, os.path.realpath(root)) for root in self._allowed_roots))
        if not inside:
            raise PermissionDenied(
                f"{self.url(rel)} leads out of the mount's root {self._root} through a symbolic link "
                "(changed while it was opened); Strata serves only files under the root of a file:// mount"
            )

    def _info_local(self, rel: str, path: str) -> dict[str, Any]:
        """`info` for file:// stores (blocking): the status of what `rel` (at `path`) leads to."""
        fd = self._open_inside(rel, os.O_PATH)
        try:
            return _local_info(path, os.fstat(fd))
        finally:
            os.close(fd)

    def _ls_local(self, rel: str, path: str) -> list[dict[str, Any]]:
        """`ls` for file:// stores (blocking): a file lists as itself; a folder's links are
        followed, so a linked folder lists as a folder, and links that lead out of the root,
        or nowhere, are left out."""
        fd = self._open_inside(rel, os.O_PATH)
        try:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                return [_local_info(path, st)]
            return [info for _, info in self._entries(fd, rel)]
        finally:
            os.close(fd)

    def _entries(self, folder_fd: int, rel: str, progress: Progress | None = None) -> list[tuple[str, dict[str, Any]]]:
        """The entries of an opened folder of the store (`rel`), each with its status, a
        link's being its target's when that lies under the root (each a step of `progress`)."""
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=folder_fd)
        try:
            names = os.listdir(fd)
            out = []
            for name in sorted(names):
                child = posixpath.join(rel.strip("/"), name)
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        target = self._open_at(fd, name, child, os.O_PATH)
                        try:
                            st = os.fstat(target)
                        finally:
                            os.close(target)
                except PermissionDenied:
                    log.info("store %s: %s is a link out of the root; left out of its listing", self.source, child)
                    continue
                except (FileNotFoundError, NotADirectoryError) as exc:
                    log.debug("store %s: %s left out of its listing: %s", self.source, child, exc)
                    continue  # gone since listed, or a link to nothing
                except OSError as exc:
                    if exc.errno != errno.ELOOP:
                        raise
                    continue  # a link loop
                out.append((name, _local_info(posixpath.join(self._root, child), st)))
                if progress is not None:
                    progress.step()
            return out
        finally:
            os.close(fd)

    def _find_local(self, rel: str, path: str, with_dirs: bool, *, progress: Progress) -> dict[str, dict[str, Any]]:
        """`find` for file:// stores (blocking): folder by folder through descriptors, never
        through a link out of the root, and never into a folder that is its own ancestor
        (links inside the root may form loops)."""
        fd = self._open_inside(rel, os.O_PATH)
        try:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                return {path: _local_info(path, st)}
            found: dict[str, dict[str, Any]] = {}
            self._walk_folder(fd, rel.strip("/"), frozenset(), found, with_dirs, progress)
            return found
        finally:
            os.close(fd)

    def _walk_folder(self, fd: int, rel: str, ancestors: frozenset[tuple[int, int]],
                     found: dict[str, dict[str, Any]], with_dirs: bool, progress: Progress) -> None:
        progress.step()
        st = os.fstat(fd)
        here = (st.st_dev, st.st_ino)
        if here in ancestors:
            return
        for name, info in self._entries(fd, rel, progress):
            if info["type"] != "directory":
                found[info["name"]] = info
                continue
            if with_dirs:
                found[info["name"]] = info
            child = posixpath.join(rel, name)
            try:
                inner = self._open_at(fd, name, child, _FOLDER)
            except (PermissionDenied, FileNotFoundError, NotADirectoryError):
                continue  # changed since it was listed
            try:
                self._walk_folder(inner, child, ancestors | {here}, found, with_dirs, progress)
            finally:
                os.close(inner)

    def _rm_local(self, rel: str, recursive: bool, *, progress: Progress) -> None:
        """`rm` for file:// stores (blocking): the name is removed from its folder's
        descriptor; a link is removed, never followed; a folder only with `recursive`
        (`_rmtree_at`)."""
        folder, name = posixpath.split(rel.strip("/"))
        if not name:
            raise InvalidArgument(f"{self.url(rel)} is the mount's root; it cannot be deleted")
        fd = self._open_inside(folder, _FOLDER)
        try:
            if not stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                os.unlink(name, dir_fd=fd)
            elif recursive:
                _rmtree_at(fd, name, progress)
            else:
                os.rmdir(name, dir_fd=fd)
        finally:
            os.close(fd)

    def _mkdir_local(self, rel: str, *, progress: Progress) -> None:
        os.close(self._open_inside(rel, _FOLDER, make_folders=True))
        progress.step()

    def _rel(self, name: str) -> str:
        name = name.rstrip("/")
        root = self._root.rstrip("/")
        if name == root or (not name and not root):
            return ""
        if name.startswith(root + "/"):
            return name[len(root) + 1:]
        # fsspec may hand back names without the leading slash of the root, or vice versa.
        if name.lstrip("/").startswith(root.lstrip("/") + "/"):
            return name.lstrip("/")[len(root.lstrip("/")) + 1:]
        raise StrataError(f"store {self.source} returned {name!r}, which is outside its root")


    def _status(self, info: Mapping[str, Any]) -> UfsStatus:
        rel = self._rel(str(info["name"]))
        is_dir = info.get("type") == "directory"
        length = 0 if is_dir else int(info.get("size") or 0)
        mtime = _mtime_seconds(info)
        if is_dir:
            version = ""
        else:
            etag = info.get("ETag") or info.get("etag") or ""
            version = str(etag).strip('"') or _size_mtime_version(length, mtime)
        return UfsStatus(path=rel, is_dir=is_dir, length=length,
                         mtime_unix_ms=int(mtime * 1000), version=version)

    # -- plumbing ---------------------------------------------------------------------------

    async def _filesystem(self) -> AbstractFileSystem:
        if self._is_async:
            loop = asyncio.get_running_loop()
            if self._fs_loop is not loop:
                if self._fs_loop is not None:
                    # A session belongs to one event loop: a new loop needs a new client.
                    self._fs = self._make_fs()
                self._fs_loop = loop
        return self._fs

    async def _blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on this store's own threads (StoreThreads)."""
        assert self._threads is not None, f"{self.source} is an async store"
        return await asyncio.get_running_loop().run_in_executor(self._threads, functools.partial(fn, *args, **kwargs))

    async def _fs_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call an fsspec method: its `_async` twin on async filesystems, else in a thread."""
        fs = await self._filesystem()
        if self._is_async:
            return await getattr(fs, "_" + method)(*args, **kwargs)
        return await self._blocking(getattr(fs, method), *args, **kwargs)

    def _translate(self, exc: Exception, rel: str, what: str) -> Exception:
        """The Strata error for a store failure, or `exc` itself when none fits."""
        if isinstance(exc, StrataError):
            return exc
        url = self.url(rel)
        client_error = _client_error(exc)
        if client_error is not None:
            error = client_error.response.get("Error", {})
            code = str(error.get("Code", ""))
            message = str(error.get("Message", "")) or str(client_error)
            status = int(client_error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code == "NoSuchBucket":
                bucket = self._root.split("/", 1)[0]
                return NotFound(
                    f"bucket {bucket!r} does not exist ({url}); create it or fix the Mount's source"
                )
            if code in _CREDENTIAL_CODES or status == 403:
                return PermissionDenied(
                    f"store {self.source} refused the credentials: {code or status}: {message}; "
                    "check the Mount's credentials Secret"
                )
            if code in _TRANSIENT_CODES or status >= 500:
                return Unavailable(f"store {self.source} failed {what} of {url}: {code or status}: {message}")
            if code in _NOT_FOUND_CODES or status == 404:
                return NotFound(f"{url} does not exist")
        if isinstance(exc, _TRANSIENT_TYPES):
            return Unavailable(f"store {self.source} could not be reached at {self._where()} ({what} of {url}): {exc}")
        if isinstance(exc, FileNotFoundError):
            return NotFound(f"{url} does not exist")
        if isinstance(exc, FileExistsError):
            return AlreadyExists(f"{url} already exists")
        if isinstance(exc, PermissionError):
            return PermissionDenied(f"store {self.source} denied {what} of {url}: {exc}")
        if isinstance(exc, (IsADirectoryError, NotADirectoryError)):
            return InvalidArgument(f"{what} of {url}: {exc.strerror or exc}")
        if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
            return InvalidArgument(f"store {self.source} refuses {what} of {url}: a name or the path is longer than "
                                   f"the store allows ({exc.strerror or exc})")
        if isinstance(exc, OSError) and exc.errno == errno.ENOTEMPTY:
            return InvalidArgument(f"{url} is a directory that is not empty; delete it recursively")
        return exc

    async def _call(self, what: str, rel: str, fn: Callable[[], Awaitable[T]], *, progress: Progress | None = None) -> T:
        """Run one store operation with retries on transient errors and mapped errors,
        within the deadline when its size is bounded (see `_BOUNDED`), else, given the
        `progress` it reports, until it makes none for the stall timeout (`_watched`)."""

        async def attempt() -> T:
            try:
                return await fn()
            except Exception as exc:
                mapped = self._translate(exc, rel, what)
                if self._shows_secret(exc) or self._shows_secret(mapped):
                    raise self._hidden(mapped) from None  # nothing chained shows it either
                if mapped is exc:
                    raise
                raise mapped from exc

        started = time.monotonic()
        try:
            result = await self._retried(attempt, what, rel, progress)
        except BaseException as exc:
            error = type(exc).__name__ if isinstance(exc, StrataError) else "Cancelled" if isinstance(
                exc, asyncio.CancelledError) else "Internal"
            STORE_METRICS.observe(what, time.monotonic() - started, error)
            raise
        STORE_METRICS.observe(what, time.monotonic() - started)
        return result

    async def _retried(self, attempt: Callable[[], Awaitable[T]], what: str, rel: str,
                       progress: Progress | None) -> T:
        """`attempt` with retries, within the deadline or the stall timeout (see `_call`)."""
        retried = call_with_backoff(
            attempt,
            what=f"{what} {self.url(rel)}",
            attempts=self._retry.attempts,
            base_delay=self._retry.base_delay,
            max_delay=self._retry.max_delay,
            retry_on=(Unavailable,),
        )
        if what not in _BOUNDED:
            return await (retried if progress is None else self._until_stalled(retried, what, rel, progress))
        deadline = self._timeouts.deadline
        try:
            return await asyncio.wait_for(retried, deadline)
        except TimeoutError as exc:  # the deadline; attempts' own timeouts are Unavailable
            raise DeadlineExceeded(
                f"store {self.source} did not answer {what} of {self.url(rel)} within {deadline:g}s "
                f"(at {self._where()}; STRATA_STORE_DEADLINE sets this limit)"
            ) from exc

    async def _watched(self, what: str, rel: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs, progress=...)`, a file:// operation of any size, on this
        store's threads as the store operation `what` of `rel`: given up on once it reports
        no progress (`Progress`) for the stall timeout."""
        progress = Progress()
        return await self._call(what, rel, lambda: self._blocking(fn, *args, progress=progress, **kwargs),
                                progress=progress)

    async def _until_stalled(self, work: Awaitable[T], what: str, rel: str, progress: Progress) -> T:
        """`work`'s result, or DeadlineExceeded once `progress` went unreported for
        StoreTimeouts.stall_timeout (the work is told it was given up on)."""
        task = asyncio.ensure_future(work)
        limit = self._timeouts.stall_timeout
        try:
            while not task.done():
                quiet = time.monotonic() - progress.at
                if quiet >= limit:
                    break
                await asyncio.wait({task}, timeout=limit - quiet)
            else:
                return task.result()
        finally:
            if not task.done():
                progress.given_up = True
                task.cancel()
        raise DeadlineExceeded(
            f"store {self.source} did not answer {what} of {self.url(rel)}: no progress for {limit:g}s (its file "
            "server stopped answering?; STRATA_STORE_STALL_TIMEOUT sets this limit)"
        )

    # -- operations ---------------------------------------------------------------------------

    async def check(self) -> None:
        """Can the root be listed with these options? Raises NotFound (missing bucket or
        directory), PermissionDenied (refused credentials) or Unavailable (unreachable)."""
        if self._is_s3:
            bucket, _, prefix = self._root.partition("/")

            async def list_one() -> None:
                fs = await self._filesystem()
                await fs._call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix, MaxKeys=1)

            # An empty prefix is a valid (empty) mount; the bucket must exist.
            await self._call("check", "", list_one)
            return
        if self._local:
            await self._call("check", "", lambda: self._blocking(self._ls_local, "", self._root))
            return
        await self._call("check", "", lambda: self._fs_call("ls", self._root, detail=False))

    async def info(self, rel: str) -> UfsStatus:
        path = self._path(rel)
        if self._local:
            info = await self._call("info", rel, lambda: self._blocking(self._info_local, rel, path))
        else:
            info = await self._call("info", rel, lambda: self._fs_call("info", path))
        return self._status(info)

    async def ls(self, rel: str) -> list[UfsStatus]:
        """Direct children of a directory (a file lists as itself)."""
        path = self._path(rel)
        if self._local:
            entries = await self._call("list", rel, lambda: self._blocking(self._ls_local, rel, path))
        else:
            entries = await self._call("list", rel, lambda: self._fs_call("ls", path, detail=True))
        out = [self._status(e) for e in entries]
        return sorted((s for s in out if not (s.is_dir and s.path == rel.strip("/"))), key=lambda s: s.path)

    async def walk(self, rel: str, *, with_dirs: bool = False) -> list[UfsStatus]:
        """All files at or below `rel` (and, with `with_dirs`, the directories below it),
        sorted by path. One paginated listing on object stores. The answer is made off the
        event loop (in the walk's thread, or one of its own): a tree of a million files
        takes seconds to sort."""
        path = self._path(rel)
        if self._local:
            def walked(*, progress: Progress) -> list[UfsStatus]:
                found = self._find_local(rel, path, with_dirs, progress=progress)
                return self._walked(rel, found, with_dirs, progress)

            out = await self._watched("walk", rel, walked)
        else:
            found = await self._call(
                "walk", rel, lambda: self._fs_call("find", path, withdirs=with_dirs, detail=True)
            )
            out = await asyncio.to_thread(self._walked, rel, found, with_dirs)
        if not out and rel.strip("/"):
            await self.info(rel)  # NotFound if there is nothing at all (a root may be empty)
        return out

    def _walked(self, rel: str, found: Mapping[str, Mapping[str, Any]], with_dirs: bool,
                progress: Progress | None = None) -> list[UfsStatus]:
        """`walk`'s answer from what the store found, sorted by path (each thousand entries
        a step of `progress`: a million take seconds)."""
        top = rel.strip("/")
        out = []
        for count, info in enumerate(found.values()):
            status = self._status(info)
            if (with_dirs or not status.is_dir) and not (status.is_dir and status.path == top):
                out.append(status)
            if progress is not None and count % 1000 == 0:
                progress.step()
        return sorted(out, key=lambda s: s.path)

    async def totals(self, rel: str = "") -> StoreTotals:
        """How many files, and bytes, lie at or below `rel` (not counting Strata's upload
        folder and uploads' temporary files): a walk that holds one folder (file://) or one
        listing page (S3) at a time, paced to work at most TOTALS_DUTY of its time, for
        reports that may wait. Other stores are listed whole (`walk`)."""
        path = self._path(rel)
        if self._local:
            return await self._watched("walk", rel, self._total_local, rel, path)
        if self._is_s3:
            return await self._total_s3(rel)
        files = [s for s in await self.walk(rel) if not _upload_rel(s.path)]
        return StoreTotals(len(files), sum(s.length for s in files))

    def _total_local(self, rel: str, path: str, *, progress: Progress) -> StoreTotals:
        fd = self._open_inside(rel, os.O_PATH)
        try:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                return StoreTotals(1, st.st_size)
            return self._total_folder(fd, rel.strip("/"), frozenset(), progress)
        finally:
            os.close(fd)

    def _total_folder(self, fd: int, rel: str, ancestors: frozenset[tuple[int, int]], progress: Progress) -> StoreTotals:
        """`_walk_folder`, counting instead of collecting; after each folder it sleeps for as
        long as the folder took (times the pace), so a walk of millions of files leaves the
        processor (and the interpreter's lock) to the master's requests."""
        started = time.monotonic()
        progress.step()
        st = os.fstat(fd)
        here = (st.st_dev, st.st_ino)
        if here in ancestors:
            return StoreTotals(0, 0)
        files = size = 0
        folders = []
        for name, info in self._entries(fd, rel, progress):
            child = posixpath.join(rel, name)
            if _upload_rel(child):
                continue
            if info["type"] == "directory":
                folders.append((name, child))
            else:
                files += 1
                size += int(info.get("size") or 0)
        time.sleep((time.monotonic() - started) * (1 - TOTALS_DUTY) / TOTALS_DUTY)
        for name, child in folders:
            try:
                inner = self._open_at(fd, name, child, _FOLDER)
            except (PermissionDenied, FileNotFoundError, NotADirectoryError):
                continue  # changed since it was listed
            try:
                below = self._total_folder(inner, child, ancestors | {here}, progress)
            finally:
                os.close(inner)
            files, size = files + below.files, size + below.total_bytes
        return StoreTotals(files, size)

    async def _total_s3(self, rel: str) -> StoreTotals:
        """`totals` on S3: the bucket's listing of the prefix, page by page (each page a
        bounded "list" call, retried as one), paced like the file:// walk."""
        bucket, _, root = self._root.partition("/")
        prefix = "/".join(p for p in (root.strip("/"), rel.strip("/")) if p)
        prefix = prefix + "/" if prefix else ""
        top = len(root.strip("/") + "/") if root.strip("/") else 0
        files = size = 0
        token: str | None = None
        while True:
            fs = await self._filesystem()
            more = {"ContinuationToken": token} if token else {}

            async def page(more: dict[str, str] = more) -> Any:
                return await fs._call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix, **more)

            started = time.monotonic()
            answer = await self._call("list", rel, page)
            for item in answer.get("Contents", ()):
                key = str(item["Key"])
                if not key.endswith("/") and not _upload_rel(key[top:]):
                    files += 1
                    size += int(item.get("Size") or 0)
            token = answer.get("NextContinuationToken")
            if not answer.get("IsTruncated") or not token:
                return StoreTotals(files, size)
            await asyncio.sleep((time.monotonic() - started) * (1 - TOTALS_DUTY) / TOTALS_DUTY)

    async def read_range(self, rel: str, start: int, end: int, *, version: str | None = None,
                         exact: bool = False) -> bytes:
        """Bytes [start, end) of a file; fewer if the file ends first. On S3 this is one
        ranged GET.

        With `exact` (the caller knows the file, of `version`, holds all of them), an answer
        of any other size is refused: retried like a transient failure (an answer cut short
        on its way), then DataLoss naming both sizes. Only the store's word says how many
        bytes it sent (a well-formed short answer passes every other check), and a short
        block served or cached would be a file with bytes missing.

        With `version` (a `UfsStatus.version`), the bytes are of that version of the file or
        the read fails with VersionChanged ("the file changed in the store"): S3 sends the
        etag as If-Match, so the store itself refuses another object; file:// compares size
        and mtime of the opened file before and after reading it; other stores compare the
        file's status after the read (an object replaced during the read and replaced back
        before that check would pass: those stores offer no conditional read)."""
        if start < 0 or end < start:
            raise InvalidArgument(f"read of {self.url(rel)}: bad range [{start}, {end})")
        if start == end and version is None:
            return b""
        path = self._path(rel)

        async def read() -> bytes:
            try:
                if version is not None and self._is_s3:
                    data = await self._read_s3_if_match(path, start, end, version)
                elif self._local:
                    data = await self._blocking(self._read_local_checked, rel, path, start, end, version)
                else:
                    data = bytes(await self._fs_call("cat_file", path, start=start, end=end)) if end > start else b""
                    if version is not None:
                        self._check_version(rel, version, self._status(await self._fs_call("info", path)).version)
            except OSError as exc:
                error = _client_error(exc)
                if error is not None and error.response.get("Error", {}).get("Code") == "InvalidRange":
                    data = b""  # start at or past the end of the object
                else:
                    raise
            if exact and len(data) != end - start:
                raise _ShortAnswer(
                    f"store {self.source} answered the read of bytes {start}-{end - 1} of {self.url(rel)}"
                    f"{f' (version {version!r})' if version is not None else ''} with {len(data)} bytes, "
                    f"not {end - start}"
                )
            return data

        try:
            return await self._call("read", rel, read)
        except _ShortAnswer as exc:
            raise DataLoss(f"{exc}, at every try; the bytes are not used: check the store") from None

    def _check_version(self, rel: str, wanted: str, found: str) -> None:
        if found != wanted:
            raise VersionChanged(
                f"{self.url(rel)} changed in the store: it is version {found!r} now, the file was "
                f"opened as version {wanted!r}; open it again to read the new version"
            )

    async def _read_s3_if_match(self, path: str, start: int, end: int, version: str) -> bytes:
        """One ranged GET that the store answers only if the object's etag is `version`."""
        fs = await self._filesystem()
        bucket, key, version_id = fs.split_path(path)
        extra = {"VersionId": version_id} if version_id else {}
        if end > start:
            extra["Range"] = f"bytes={start}-{end - 1}"
        try:
            response = await fs._call_s3("get_object", Bucket=bucket, Key=key, IfMatch=f'"{version}"', **extra)
        except OSError as exc:
            error = _client_error(exc)
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") if error else None
            if error is not None and (error.response.get("Error", {}).get("Code") == "PreconditionFailed"
                                      or status == 412):
                raise VersionChanged(
                    f"{self.url(self._rel(path))} changed in the store: it is no longer version "
                    f"{version!r}, the version the file was opened as; open it again to read the new version"
                ) from exc
            raise
        body = response["Body"]
        try:
            data = await body.read()
        finally:
            body.close()
        return bytes(data) if end > start else b""

    def _read_local_checked(self, rel: str, path: str, start: int, end: int, version: str | None) -> bytes:
        """Bytes [start, end) (fewer only where it ends) of an opened file (blocking) that
        lies under the root (`_opened_inside`) and, with `version`, whose size and mtime (its
        version) are the same before and after the read. A rewrite within one tick of the file
        system's clock (nanoseconds on ext4, xfs and tmpfs) that keeps the size would go
        unseen."""
        fd = self._open_inside(rel)
        try:
            if version is not None:
                self._check_version(rel, version, _local_version(os.fstat(fd)))
            # One pread may return less before the end (network and FUSE file systems; Linux
            # returns at most 2 GiB - 4 KiB a call): read on until the end or the file's end.
            pieces, got = [], 0
            while start + got < end and (piece := os.pread(fd, end - start - got, start + got)):
                pieces.append(piece)
                got += len(piece)
            if version is not None:
                self._check_version(rel, version, _local_version(os.fstat(fd)))
            return b"".join(pieces)
        finally:
            os.close(fd)

    async def write(self, rel: str, data: bytes) -> UfsStatus:
        """Create or replace a file with `data`."""
        path = self._path(rel)
        if self._local:
            return await self._watched("write", rel, self._place_local, rel, path,
                                       lambda out, progress: _copy_into(out, data, progress))
        await self._call("write", rel, lambda: self._fs_call("pipe_file", path, data))
        return await self.info(rel)

    # Files Strata puts into a store (uploads, copies, moves into place) come back with the
    # version of the very object the operation made, taken from the store's own answer (S3:
    # the ETag of the PUT, the multipart upload or the copy; file://: the stat of the file
    # before it is renamed into place). A look at the path afterwards could find another
    # writer's object, whose version would then name this write's bytes. Other stores give
    # no such answer: for them the version is looked up after the operation.

    async def write_file(self, rel: str, local_path: Path) -> UfsStatus:
        """Upload a local (staged) file to `rel`, replacing what is there; the status of the
        object it made. On file:// stores the file appears whole or not at all (written
        aside, fsynced, renamed into place)."""
        path = self._path(rel)
        length = local_path.stat().st_size
        if self._is_s3:
            return self._made(rel, length, await self._call("upload", rel, lambda: self._put_s3(path, local_path)))
        if self._local:
            return await self._watched("upload", rel, self._place_local, rel, path,
                                       lambda out, progress: _copy_into(out, local_path, progress))
        await self._call("upload", rel, lambda: self._fs_call("put_file", str(local_path), path))
        return await self.info(rel)

    async def copy(self, src: str, dst: str) -> UfsStatus:
        """Copy a file inside the store (S3: a server-side copy); the status of the copy."""
        src_path, dst_path = self._path(src), self._path(dst)
        if self._is_s3:
            source = await self.info(src)
            if source.length <= _S3_COPY_LIMIT:
                return self._made(dst, source.length,
                                  await self._call("copy", src, lambda: self._copy_s3(src_path, dst_path)))
        elif self._local:
            return await self._watched("copy", src, self._place_local, dst, dst_path,
                                       lambda out, progress: _copy_into(out, self._open_inside(src), progress))
        await self._call("copy", src, lambda: self._fs_call("cp_file", src_path, dst_path))
        return await self.info(dst)

    async def move_file(self, src: str, dst: str) -> UfsStatus:
        """Move one file within the store, replacing what is at `dst`; the status of the
        moved file (S3: of the copy made at `dst`; file://: a rename, atomic)."""
        if self._local:
            for rel in (src, dst):
                self._path(rel)  # names first: a link out by name gets the clear message
            st = await self._watched("move", src, self._rename_local, src, dst, file_only=True)
            if st is not None:
                return UfsStatus(path=dst.strip("/"), is_dir=False,
                                 length=st.st_size, mtime_unix_ms=int(st.st_mtime * 1000), version=_local_version(st))
        status = await self.copy(src, dst)
        await self.rm(src)
        return status

    def _made(self, rel: str, length: int, version: str) -> UfsStatus:
        return UfsStatus(path=rel.strip("/"), is_dir=False, length=length,
                         mtime_unix_ms=int(time.time() * 1000), version=version)

    async def _put_s3(self, path: str, local_path: Path) -> str:
        """Upload a local file: one PUT, or a multipart upload in s3fs's part size when
        large; the ETag of the object made."""
        fs = await self._filesystem()
        bucket, key, _ = fs.split_path(path)
        size = local_path.stat().st_size
        part = calculate_chunksize(size)
        with open(local_path, "rb") as f:
            if size < 2 * part:
                answer = await fs._call_s3("put_object", Bucket=bucket, Key=key, Body=await asyncio.to_thread(f.read))
            else:
                upload = await fs._call_s3("create_multipart_upload", Bucket=bucket, Key=key)
                try:
                    parts = await fs._upload_file_part_concurrent(bucket, key, upload, f, part)
                    answer = await fs._call_s3(
                        "complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                        MultipartUpload={"Parts": [{"PartNumber": i, "ETag": p["ETag"]} for i, p in enumerate(parts, 1)]},
                    )
                except BaseException:
                    with contextlib.suppress(Exception):  # parts left behind are never listed
                        await asyncio.shield(fs._abort_mpu(bucket, key, upload["UploadId"]))
                    raise
        fs.invalidate_cache(path)
        return str(answer["ETag"]).strip('"')

    async def _copy_s3(self, src_path: str, dst_path: str) -> str:
        """A server-side copy of an object of at most 5 GiB; the ETag of the copy."""
        fs = await self._filesystem()
        src_bucket, src_key, _ = fs.split_path(src_path)
        bucket, key, _ = fs.split_path(dst_path)
        answer = await fs._call_s3("copy_object", Bucket=bucket, Key=key,
                                   CopySource={"Bucket": src_bucket, "Key": src_key})
        fs.invalidate_cache(dst_path)
        return str(answer["CopyObjectResult"]["ETag"]).strip('"')

    def _place_local(self, rel: str, path: str, fill: Callable[[BinaryIO, Progress], object], *,
                     progress: Progress) -> UfsStatus:
        """Write a file of a file:// store whole or not at all (blocking): `fill` writes a
        temporary file in the store's upload folder, which is fsynced and renamed over
        `path`; the status of that file. Both folders are opened through descriptors checked
        to lie under the root (`_open_inside`), missing ones made there (a link at `path`
        itself is replaced, never followed).

        A rename cannot leave its file system: when `path`'s folder is on another one than
        the upload folder, the temporary file is written in that folder, under a name no
        listing or status shows (`is_upload_temp`), and a note in the upload folder, on the
        disk before the file is made, names it, so `remove_dead_uploads` finds it if this
        process dies before it is renamed."""
        name = posixpath.basename(path)
        folder = posixpath.dirname(rel.strip("/"))
        folder_fd = self._open_inside(folder, _OPEN_FOLDER, make_folders=True)
        try:
            aside_fd = self._open_inside(UPLOAD_DIR, _OPEN_FOLDER, make_folders=True)
            try:
                token = uuid.uuid4().hex
                note = ""
                if os.fstat(aside_fd).st_dev == os.fstat(folder_fd).st_dev:
                    tmp_dir_fd, tmp = aside_fd, f"{_UPLOAD_TEMP_PREFIX}{token}{_UPLOAD_TEMP_SUFFIX}"
                else:
                    note = f".{token}{_ELSEWHERE_NOTE_SUFFIX}"
                    _write_note(aside_fd, note, folder)
                    tmp_dir_fd, tmp = folder_fd, f"{_TEMP_ELSEWHERE_PREFIX}{token}{_UPLOAD_TEMP_SUFFIX}"
                try:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                                 dir_fd=tmp_dir_fd)
                    try:
                        with open(fd, "wb") as out:
                            fcntl.flock(out.fileno(), fcntl.LOCK_EX)  # in progress, until closed (or the process ends)
                            fill(out, progress)
                            out.flush()
                            os.fsync(out.fileno())
                            st = os.fstat(out.fileno())
                        progress.step()  # not given up on: the file goes into place
                        os.replace(tmp, name, src_dir_fd=tmp_dir_fd, dst_dir_fd=folder_fd)
                    except BaseException:
                        with contextlib.suppress(OSError):
                            os.unlink(tmp, dir_fd=tmp_dir_fd)
                        raise
                finally:
                    if note:
                        with contextlib.suppress(OSError):
                            os.unlink(note, dir_fd=aside_fd)
            finally:
                os.close(aside_fd)
            os.fsync(folder_fd)
        finally:
            os.close(folder_fd)
        return UfsStatus(path=rel.strip("/"), is_dir=False, length=st.st_size,
                         mtime_unix_ms=int(st.st_mtime * 1000), version=_local_version(st))

    def _rename_local(self, src: str, dst: str, *, file_only: bool, progress: Progress) -> os.stat_result | None:
        """Rename `src` of a file:// store over `dst` (blocking) between the descriptors of
        their folders, checked to lie under the root (the destination's made if missing);
        the source's status, taken before the rename (which keeps size and mtime). A link is
        moved itself, never followed. None if the two are on different file systems or, with
        `file_only`, the source is not a plain file."""
        src_folder, src_name = posixpath.split(src.strip("/"))
        dst_folder, dst_name = posixpath.split(dst.strip("/"))
        if not src_name or not dst_name:
            raise InvalidArgument(f"cannot move {self.url(src)} to {self.url(dst)}: the mount's root stays where it is")
        src_fd = self._open_inside(src_folder, _FOLDER)
        try:
            dst_fd = self._open_inside(dst_folder, _OPEN_FOLDER, make_folders=True)
            try:
                st = os.stat(src_name, dir_fd=src_fd, follow_symlinks=False)
                if file_only and not stat.S_ISREG(st.st_mode):
                    return None
                progress.step()
                try:
                    os.replace(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
                except OSError as exc:
                    if exc.errno == errno.EXDEV:
                        return None
                    raise
                os.fsync(dst_fd)
            finally:
                os.close(dst_fd)
        finally:
            os.close(src_fd)
        return st

    async def remove_dead_uploads(self, older_than: float) -> int:
        """Remove the temporary files uploads to a file:// store left when their process died
        (killed, or its machine went down), in its upload folder or in the folders its notes
        there name (`_place_local`): those no process holds and unchanged for `older_than`
        seconds (see `_remove_if_dead`), never one under way. Returns how many; 0 for other
        stores (their uploads leave nothing listed)."""
        if not self._local:
            return 0
        path = self._path(UPLOAD_DIR)

        def sweep() -> int:
            try:
                folder_fd = self._open_inside(UPLOAD_DIR, _OPEN_FOLDER)
            except FileNotFoundError:
                return 0
            try:
                removed = 0
                for name in os.listdir(folder_fd):
                    if name.endswith(_ELSEWHERE_NOTE_SUFFIX):
                        removed += self._remove_dead_elsewhere(folder_fd, name, older_than)
                    elif (name.startswith(_UPLOAD_TEMP_PREFIX) and name.endswith(_UPLOAD_TEMP_SUFFIX)
                            and _remove_if_dead(folder_fd, name, older_than)):
                        log.info("store %s: removed %s/%s, left by an upload whose process ended", self.source, path, name)
                        removed += 1
                return removed
            finally:
                os.close(folder_fd)

        return await self._call("clean-up", UPLOAD_DIR, lambda: self._blocking(sweep))

    def _remove_dead_elsewhere(self, uploads_fd: int, note: str, older_than: float) -> int:
        """Remove the temporary file the note `note` (in the upload folder) names, if its
        writer is gone, and the note once it names nothing under way; 1 if a file went. The
        note's folder is looked up from the root like any other (`_open_inside`)."""
        token = note.removeprefix(".").removesuffix(_ELSEWHERE_NOTE_SUFFIX)
        tmp = f"{_TEMP_ELSEWHERE_PREFIX}{token}{_UPLOAD_TEMP_SUFFIX}"
        try:
            fd = os.open(note, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=uploads_fd)
        except FileNotFoundError:
            return 0  # its upload ended meanwhile
        try:
            written = os.fstat(fd).st_mtime
            folder = os.read(fd, 4096).decode("utf-8", "replace")
        finally:
            os.close(fd)
        removed = 0
        try:
            folder_fd = self._open_inside(folder, _OPEN_FOLDER)
        except (OSError, StrataError):
            folder_fd = -1  # gone, or no longer under the root: nothing of ours to remove there
        if folder_fd >= 0:
            try:
                if _remove_if_dead(folder_fd, tmp, older_than):
                    log.info("store %s: removed %s/%s, left by an upload whose process ended", self.source,
                             posixpath.join(self._root, folder), tmp)
                    removed = 1
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.stat(tmp, dir_fd=folder_fd, follow_symlinks=False)
                        return 0  # under way, or not old enough yet: the note stays
            finally:
                os.close(folder_fd)
        if removed or time.time() - written >= older_than:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(note, dir_fd=uploads_fd)
        return removed

    async def rm(self, rel: str, recursive: bool = False) -> None:
        path = self._path(rel)
        if self._local:
            await self._watched("delete", rel, self._rm_local, rel, recursive)
        else:
            await self._call("delete", rel, lambda: self._fs_call("rm", path, recursive=recursive))

    async def mv(self, src: str, dst: str) -> None:
        """Move a file or a directory tree."""
        src_path, dst_path = self._path(src), self._path(dst)
        if self._local:
            moved = await self._watched("move", src, self._rename_local, src, dst, file_only=False)
            if moved is None:  # onto another file system: copied, then removed
                await self._copy_tree(src, dst)
                await self.rm(src, recursive=True)
        elif self._is_async:
            # Async filesystems move by copy + delete; each step is retried on its own.
            await self._call("copy", src, lambda: self._fs_call("copy", src_path, dst_path, recursive=True))
            await self._call("delete", src, lambda: self._fs_call("rm", src_path, recursive=True))
        else:
            await self._call("move", src, lambda: self._fs_call("mv", src_path, dst_path, recursive=True))

    async def _copy_tree(self, src: str, dst: str) -> None:
        """Copy a file, or a folder and all below it, within a file:// store."""
        top = src.strip("/")
        for status in await self.walk(src, with_dirs=True):
            below = dst.strip("/") + status.path[len(top):]
            if status.is_dir:
                await self.mkdir(below)
            else:
                await self.copy(status.path, below)
        if (await self.info(src)).is_dir:
            await self.mkdir(dst)

    async def mkdir(self, rel: str) -> None:
        """Create a directory and its parents (a no-op on stores without directories)."""
        path = self._path(rel)
        if self._local:
            await self._watched("mkdir", rel, self._mkdir_local, rel)
        else:
            await self._call("mkdir", rel, lambda: self._fs_call("makedirs", path, exist_ok=True))

    async def close(self) -> None:
        """Close the store's client session (async filesystems) or let its threads go
        (blocking ones); safe to call twice."""
        if self._threads is not None:
            self._threads.shutdown(wait=False)
        fs = self._fs
        creator = getattr(fs, "_s3creator", None)
        if self._is_s3 and creator is not None and self._fs_loop is asyncio.get_running_loop():
            try:
                await creator.__aexit__(None, None, None)
            finally:
                fs._s3creator = None
                fs._s3 = None

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
