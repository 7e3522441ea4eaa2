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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

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
from .retry import RetrySettings, call_with_backoff

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
# any size, walks of whole trees, copies) are bounded by the read timeout of each request.
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
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


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
    # longer. Uploads and walks of whole trees are bounded by read_timeout per request.
    deadline: float = Field(default=20.0, gt=0)
    # Seconds the master waits on the store for metadata older than the mount's sync
    # interval before answering from it (stale-if-error): a hung store then costs a reader
    # of cached files this, not the whole deadline. The store's answer, when it comes,
    # still refreshes the metadata.
    stale_after: float = Field(default=3.0, gt=0)


@dataclass(frozen=True)
class UfsStatus:
    """What a store says about one file or directory."""

    path: str  # relative to the mount's root: "" is the root, never a leading slash
    name: str
    is_dir: bool
    length: int
    mtime_unix_ms: int
    # Changes whenever the content may have changed: the store's etag if it has one, else
    # f"{size}-{mtime_ns}". Empty for directories.
    version: str


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
            f"source {source!r} chains filesystems; give a plain URL such as s3://bucket/prefix"
        )
    protocol, _ = split_protocol(source)
    if not protocol:
        raise InvalidArgument(
            f"source {source!r} has no scheme; write a URL such as s3://bucket/prefix, "
            "file:///abs/dir or memory://name"
        )
    protocol = protocol.lower()
    if protocol == FSSPEC_PROTOCOL:
        raise InvalidArgument(f"source {source!r}: a Strata path cannot be mounted into Strata")
    try:
        cls: type[AbstractFileSystem] = fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise InvalidArgument(
            f"unknown store scheme {protocol!r} in source {source!r}; supported here: "
            + ", ".join(supported_protocols())
        ) from None
    except ImportError as exc:
        raise InvalidArgument(
            f"store scheme {protocol!r} (source {source!r}) needs a package this server "
            f"does not have: {exc}; use an image that includes it"
        ) from None
    if protocol in _HOST_READING_PROTOCOLS:
        raise InvalidArgument(
            f"store scheme {protocol!r} (source {source!r}) wraps another filesystem or reads the "
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
            f"source {source!r} reads the servers' own files, and this cluster allows no file:// "
            "sources; its owner can allow folders in the CacheCluster's spec.localSources.allowedRoots"
        )
    real = os.path.realpath(path)
    if any(_is_within(real, os.path.realpath(root)) for root in allowed_roots):
        return
    raise PermissionDenied(
        f"source {source!r} is not under a folder this cluster allows for file:// sources "
        f"({', '.join(allowed_roots)}); add its folder to spec.localSources.allowedRoots of the CacheCluster"
    )


def _to_bool(name: str, value: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidArgument(f"store option {name}: expected true or false, got {value!r}")


def _to_number(name: str, value: str, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(value)
    except ValueError:
        raise InvalidArgument(f"store option {name}: expected a number, got {value!r}") from None


def storage_options(cls: type[AbstractFileSystem], options: Mapping[str, Any]) -> dict[str, Any]:
    """Turn string options (as YAML gives them) into the keyword arguments `cls` takes:
    "true"/"false" and numbers become bool/int/float where the parameter's default has that
    type. For S3, `region` goes to the client; options s3fs does not know are refused."""
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
                value = _to_bool(name, value)
            elif isinstance(default, (int, float)):
                value = _to_number(name, value, type(default))
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


def _copy_file(source: Path | int, out: BinaryIO) -> None:
    """Copy `source` (a path, or a descriptor, which this closes) into `out`."""
    with open(source, "rb") as f:
        shutil.copyfileobj(f, out, 1 << 20)


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make the entries of `folder` (a file renamed into it) survive a crash of the machine."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Names of the temporary files a file:// store's uploads are written to before their rename.
_UPLOAD_TEMP_PREFIX, _UPLOAD_TEMP_SUFFIX = ".", ".tmp"


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
        retry: RetrySettings | None = None,
        allowed_roots: Sequence[str] | None = None,
        timeouts: StoreTimeouts | None = None,
    ) -> None:
        self.protocol, self._cls = filesystem_class(source)
        self.source = source if source.endswith(":///") else source.rstrip("/")
        self._root = self._cls._strip_protocol(source).rstrip("/") or "/"
        if self.protocol in ("file", "local") and not split_protocol(source)[1].startswith("/"):
            raise InvalidArgument(f"source {source!r}: a file:// source needs an absolute path, e.g. file:///data")
        self._kwargs = storage_options(self._cls, options or {})
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
        if self.protocol == "file":
            kwargs.setdefault("auto_mkdir", True)
        if self._is_async:
            kwargs["asynchronous"] = True
        try:
            fs = self._cls(skip_instance_cache=True, use_listings_cache=False, **kwargs)
        except TypeError as exc:
            raise InvalidArgument(f"store {self.source}: options not accepted: {exc}") from None
        if self._is_s3:
            fs.retries = 1
        return fs

    def url(self, rel: str) -> str:
        """The store URL of a path relative to the mount root (for messages)."""
        return f"{self.source.rstrip('/')}/{rel}" if rel else self.source

    def _path(self, rel: str) -> str:
        rel = rel.strip("/")
        if self._local and self._allowed_roots is not None:
            check_source_allowed(self.source, self._allowed_roots)  # links resolved on this host
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

    def _ls_local(self, path: str) -> list[dict[str, Any]]:
        """`ls` for file:// stores (blocking): links are followed, so a linked folder lists
        as a folder, and links that lead out of the root, or nowhere, are left out."""
        kept = []
        for entry in self._fs.ls(path, detail=True):
            name = str(entry["name"])
            if not entry.get("islink"):
                kept.append(entry)
            elif self._inside_root(name):
                try:
                    kept.append(self._fs.info(name))
                except FileNotFoundError:
                    continue  # a link to nothing
            else:
                log.info("store %s: %s is a link out of the root; left out of its listing", self.source, name)
        return kept

    def _find_local(self, path: str, with_dirs: bool) -> dict[str, dict[str, Any]]:
        """`find` for file:// stores (blocking): never through a link out of the root, and
        never into a folder that is its own ancestor (links inside the root may form loops)."""
        top = self._fs.info(path)
        if top.get("type") != "directory":
            return {str(top["name"]): top}
        found: dict[str, dict[str, Any]] = {}
        pending: list[tuple[str, frozenset[str]]] = [(path, frozenset())]
        while pending:
            folder, ancestors = pending.pop()
            real = os.path.realpath(folder)
            if real in ancestors:
                continue
            for entry in self._ls_local(folder):
                name = str(entry["name"])
                if entry.get("type") == "directory":
                    pending.append((name, ancestors | {real}))
                    if with_dirs:
                        found[name] = entry
                else:
                    found[name] = entry
        return found

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
        name = posixpath.basename(rel) if rel else posixpath.basename(self._root.rstrip("/"))
        return UfsStatus(path=rel, name=name, is_dir=is_dir, length=length,
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
            where = self._kwargs.get("endpoint_url") or self.source
            return Unavailable(f"store {self.source} could not be reached at {where} ({what} of {url}): {exc}")
        if isinstance(exc, FileNotFoundError):
            return NotFound(f"{url} does not exist")
        if isinstance(exc, FileExistsError):
            return AlreadyExists(f"{url} already exists")
        if isinstance(exc, PermissionError):
            return PermissionDenied(f"store {self.source} denied {what} of {url}: {exc}")
        if isinstance(exc, (IsADirectoryError, NotADirectoryError)):
            return InvalidArgument(f"{what} of {url}: {exc.strerror or exc}")
        if isinstance(exc, OSError) and exc.errno == errno.ENOTEMPTY:
            return InvalidArgument(f"{url} is a directory that is not empty; delete it recursively")
        return exc

    async def _call(self, what: str, rel: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Run one store operation with retries on transient errors and mapped errors,
        within the deadline when its size is bounded (see `_BOUNDED`)."""

        async def attempt() -> T:
            try:
                return await fn()
            except Exception as exc:
                mapped = self._translate(exc, rel, what)
                if mapped is exc:
                    raise
                raise mapped from exc

        retried = call_with_backoff(
            attempt,
            what=f"{what} {self.url(rel)}",
            attempts=self._retry.attempts,
            base_delay=self._retry.base_delay,
            max_delay=self._retry.max_delay,
            retry_on=(Unavailable,),
        )
        if what not in _BOUNDED:
            return await retried
        deadline = self._timeouts.deadline
        try:
            return await asyncio.wait_for(retried, deadline)
        except TimeoutError as exc:  # the deadline; attempts' own timeouts are Unavailable
            where = self._kwargs.get("endpoint_url") or self.source
            raise DeadlineExceeded(
                f"store {self.source} did not answer {what} of {self.url(rel)} within {deadline:g}s "
                f"(at {where}; STRATA_STORE_DEADLINE sets this limit)"
            ) from exc

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
        await self._call("check", "", lambda: self._fs_call("ls", self._root, detail=False))

    async def info(self, rel: str) -> UfsStatus:
        path = self._path(rel)
        info = await self._call("info", rel, lambda: self._fs_call("info", path))
        return self._status(info)

    async def ls(self, rel: str) -> list[UfsStatus]:
        """Direct children of a directory (a file lists as itself)."""
        path = self._path(rel)
        if self._local:
            entries = await self._call("list", rel, lambda: self._blocking(self._ls_local, path))
        else:
            entries = await self._call("list", rel, lambda: self._fs_call("ls", path, detail=True))
        out = [self._status(e) for e in entries]
        return sorted((s for s in out if not (s.is_dir and s.path == rel.strip("/"))), key=lambda s: s.path)

    async def walk(self, rel: str, *, with_dirs: bool = False) -> list[UfsStatus]:
        """All files at or below `rel` (and, with `with_dirs`, the directories below it),
        sorted by path. One paginated listing on object stores."""
        path = self._path(rel)
        if self._local:
            found = await self._call("walk", rel, lambda: self._blocking(self._find_local, path, with_dirs))
        else:
            found = await self._call(
                "walk", rel, lambda: self._fs_call("find", path, withdirs=with_dirs, detail=True)
            )
        top = rel.strip("/")
        out = [
            status
            for status in (self._status(info) for info in found.values())
            if (with_dirs or not status.is_dir) and not (status.is_dir and status.path == top)
        ]
        if not out and top:
            await self.info(rel)  # NotFound if there is nothing at all (a root may be empty)
        return sorted(out, key=lambda s: s.path)

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
        fd = self._open_inside(rel, path)
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

    def _opened_inside(self, fd: int, rel: str) -> None:
        """PermissionDenied unless what `fd` opened lies under the root (and an allowed root)
        of this file:// store. `_path` checks names; a link swapped in between that check and
        the open (by whoever else writes the folder) leads the open elsewhere, so what was
        opened is checked itself, by the kernel's path of the descriptor."""
        opened = os.readlink(f"/proc/self/fd/{fd}")
        inside = _is_within(opened, os.path.realpath(self._root)) and (
            self._allowed_roots is None
            or any(_is_within(opened, os.path.realpath(root)) for root in self._allowed_roots))
        if not inside:
            raise PermissionDenied(
                f"{self.url(rel)} leads out of the mount's root {self._root} through a symbolic link "
                "(changed while it was opened); Strata serves only files under the root of a file:// mount"
            )

    async def write(self, rel: str, data: bytes) -> UfsStatus:
        """Create or replace a file with `data`."""
        path = self._path(rel)
        if self._local:
            return await self._call("write", rel, lambda: self._blocking(
                self._place_local, rel, path, lambda out: out.write(data)))
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
            return await self._call("upload", rel, lambda: self._blocking(
                self._place_local, rel, path, lambda out: _copy_file(local_path, out)))
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
            return await self._call("copy", src, lambda: self._blocking(
                self._place_local, dst, dst_path, lambda out: _copy_file(self._open_inside(src, src_path), out)))
        await self._call("copy", src, lambda: self._fs_call("cp_file", src_path, dst_path))
        return await self.info(dst)

    async def move_file(self, src: str, dst: str) -> UfsStatus:
        """Move one file within the store, replacing what is at `dst`; the status of the
        moved file (S3: of the copy made at `dst`; file://: a rename, atomic)."""
        if self._local:
            src_path, dst_path = self._path(src), self._path(dst)
            moved = await self._call("move", src, lambda: self._blocking(self._rename_local, src, dst, src_path, dst_path))
            if moved is not None:
                return moved
        status = await self.copy(src, dst)
        await self.rm(src)
        return status

    def _made(self, rel: str, length: int, version: str) -> UfsStatus:
        return UfsStatus(path=rel.strip("/"), name=posixpath.basename(rel.strip("/")), is_dir=False, length=length,
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

    def _open_inside(self, rel: str, path: str, flags: int = os.O_RDONLY) -> int:
        """A descriptor of `path` (a file, or a folder with O_DIRECTORY), checked to lie under
        the root (`_opened_inside`)."""
        fd = os.open(path, flags | os.O_CLOEXEC)
        try:
            self._opened_inside(fd, rel)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_folder(self, rel: str, path: str) -> int:
        """The folder `path` (`rel` in the store; made if missing), opened and checked to lie
        under the root: names in it are then made, opened and renamed relative to that
        descriptor, so a link swapped into the path meanwhile leads nothing outside."""
        os.makedirs(path, exist_ok=True)
        return self._open_inside(rel, path, os.O_RDONLY | os.O_DIRECTORY)

    def _place_local(self, rel: str, path: str, fill: Callable[[BinaryIO], object]) -> UfsStatus:
        """Write a file of a file:// store whole or not at all (blocking): `fill` writes a
        temporary file in the store's upload folder (in `path`'s own folder if that is another
        file system), which is fsynced and renamed over `path`; the status of that file. Both
        folders are checked to lie under the root before anything is made in them (a link at
        `path` itself is replaced, never followed)."""
        folder, name = posixpath.split(path)
        folder_fd = self._open_folder(posixpath.dirname(rel.strip("/")), folder)
        try:
            aside_fd = self._open_folder(UPLOAD_DIR, self._path(UPLOAD_DIR))
            if os.fstat(aside_fd).st_dev != os.fstat(folder_fd).st_dev:
                os.close(aside_fd)
                aside_fd = os.dup(folder_fd)
            try:
                tmp = f"{_UPLOAD_TEMP_PREFIX}{uuid.uuid4().hex}{_UPLOAD_TEMP_SUFFIX}"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                             dir_fd=aside_fd)
                try:
                    with open(fd, "wb") as out:
                        fcntl.flock(out.fileno(), fcntl.LOCK_EX)  # in progress, until closed (or the process ends)
                        fill(out)
                        out.flush()
                        os.fsync(out.fileno())
                        st = os.fstat(out.fileno())
                    os.replace(tmp, name, src_dir_fd=aside_fd, dst_dir_fd=folder_fd)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=aside_fd)
                    raise
            finally:
                os.close(aside_fd)
            os.fsync(folder_fd)
        finally:
            os.close(folder_fd)
        return UfsStatus(path=rel.strip("/"), name=name, is_dir=False, length=st.st_size,
                         mtime_unix_ms=int(st.st_mtime * 1000), version=_local_version(st))

    def _rename_local(self, src: str, dst: str, src_path: str, dst_path: str) -> UfsStatus | None:
        """Rename a file of a file:// store over `dst_path` (blocking), both folders checked
        to lie under the root first; its status, taken before the rename (which keeps size
        and mtime). None if the two are on different file systems or the source is not a
        plain file (a link is not moved in place of its target)."""
        src_fd = self._open_folder(posixpath.dirname(src.strip("/")), posixpath.dirname(src_path))
        try:
            dst_fd = self._open_folder(posixpath.dirname(dst.strip("/")), posixpath.dirname(dst_path))
            try:
                st = os.stat(posixpath.basename(src_path), dir_fd=src_fd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    return None
                try:
                    os.replace(posixpath.basename(src_path), posixpath.basename(dst_path),
                               src_dir_fd=src_fd, dst_dir_fd=dst_fd)
                except OSError as exc:
                    if exc.errno == errno.EXDEV:
                        return None
                    raise
                os.fsync(dst_fd)
            finally:
                os.close(dst_fd)
        finally:
            os.close(src_fd)
        return UfsStatus(path=dst.strip("/"), name=posixpath.basename(dst_path), is_dir=False, length=st.st_size,
                         mtime_unix_ms=int(st.st_mtime * 1000), version=_local_version(st))

    async def remove_dead_uploads(self, older_than: float) -> int:
        """Remove the temporary files uploads to a file:// store left in its upload folder
        when their process died (killed, or its machine went down): those no process holds
        and unchanged for `older_than` seconds (see `_remove_if_dead`), never one under way.
        Returns how many; 0 for other stores (their uploads leave nothing listed)."""
        if not self._local:
            return 0
        path = self._path(UPLOAD_DIR)

        def sweep() -> int:
            if not os.path.isdir(path):
                return 0
            folder_fd = self._open_inside(UPLOAD_DIR, path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                removed = 0
                for name in os.listdir(folder_fd):
                    if (name.startswith(_UPLOAD_TEMP_PREFIX) and name.endswith(_UPLOAD_TEMP_SUFFIX)
                            and _remove_if_dead(folder_fd, name, older_than)):
                        log.info("store %s: removed %s/%s, left by an upload whose process ended", self.source, path, name)
                        removed += 1
                return removed
            finally:
                os.close(folder_fd)

        return await self._call("clean-up", UPLOAD_DIR, lambda: self._blocking(sweep))

    async def rm(self, rel: str, recursive: bool = False) -> None:
        path = self._path(rel)
        await self._call("delete", rel, lambda: self._fs_call("rm", path, recursive=recursive))

    async def mv(self, src: str, dst: str) -> None:
        """Move a file or a directory tree."""
        src_path, dst_path = self._path(src), self._path(dst)
        if self._is_async:
            # Async filesystems move by copy + delete; each step is retried on its own.
            await self._call("copy", src, lambda: self._fs_call("copy", src_path, dst_path, recursive=True))
            await self._call("delete", src, lambda: self._fs_call("rm", src_path, recursive=True))
        else:
            await self._call("move", src, lambda: self._fs_call("mv", src_path, dst_path, recursive=True))

    async def mkdir(self, rel: str) -> None:
        """Create a directory and its parents (a no-op on stores without directories)."""
        path = self._path(rel)
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
