"""The contestants: ways a Python user reads the same bucket, and the physical limits.

An `Access` says how to reach the data (JSON-able, so reader processes of the sharing
workload make the same filesystem); a `Contestant` adds a label and how to make its next
read cold. Every contestant reads the same bytes: the dataset's files under its `root`.

| id            | what                                                              |
|---------------|-------------------------------------------------------------------|
| s3fs          | s3fs straight to the store (no cache)                             |
| simplecache   | fsspec simplecache over s3fs: whole files copied to a local dir   |
| blockcache    | fsspec blockcache over s3fs: blocks kept in local sparse files    |
| strata-remote | Strata's fsspec client on another host: blocks from the data port, |
|               | small files kept in a near cache folder of that host (its scratch) |
| strata-remote-direct | the same without the near cache: every open a data port request |
| strata-fuse   | `strata fuse --read-only` of the dataset's mount on the worker's  |
|               | node (a read-only CSI volume), read with open(); large files with |
|               | `--passthrough` (the kernel reads local copies), small files      |
|               | (training) without it (the kernel opens them without asking)      |
| strata-sc     | Strata's fsspec client on the worker's node: short-circuit reads  |
| local         | the same files on local disk (page cache when warm)               |
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

Kind = Literal["s3fs", "simplecache", "blockcache", "strata", "posix"]


@dataclass(frozen=True)
class Access:
    kind: Kind
    root: str                      # prefix of the dataset paths in this filesystem
    options: dict[str, Any] = field(default_factory=dict)

    def path(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "root": self.root, "options": self.options}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Access:
        return Access(kind=data["kind"], root=data["root"], options=dict(data["options"]))


def open_filesystem(access: Access) -> Any:
    """A new filesystem for `access`; None for plain files (read with open() and pyarrow's
    own local filesystem)."""
    import fsspec

    opts = dict(access.options)
    if access.kind == "s3fs":
        return fsspec.filesystem("s3", skip_instance_cache=True, **opts)
    if access.kind in ("simplecache", "blockcache"):
        target = {"skip_instance_cache": True, **opts.pop("target_options")}
        return fsspec.filesystem(access.kind, target_protocol="s3", target_options=target,
                                 skip_instance_cache=True, **opts)
    if access.kind == "strata":
        from strata.cacheserver.client.fs import StrataFileSystem

        return StrataFileSystem(skip_instance_cache=True, **opts)
    return None


def close_filesystem(fs: Any) -> None:
    client = getattr(fs, "client", None)
    if client is not None and hasattr(client, "close"):
        client.close()
    pool = getattr(fs, "_pool", None)
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


def open_binary(fs: Any, path: str) -> IO[bytes]:
    if fs is None:
        return open(path, "rb", buffering=0)
    return fs.open(path, "rb")  # type: ignore[no-any-return]


def drop_page_cache(paths: Sequence[str]) -> None:
    """Ask the kernel to forget the files' cached pages (clean pages go at once)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@dataclass
class Contestant:
    id: str
    label: str
    access: Access
    cached: bool                     # keeps data between reads: measured cold and warm
    # Make the next read of these dataset folders cold (relative folder names).
    cold: Callable[[Sequence[str]], None] = lambda folders: None
    reuse_fs: bool = False           # one filesystem for the whole run (Strata's client)
    unavailable: str = ""            # why it cannot run here, if it cannot
    small_files: Access | None = None  # how it reads datasets of small files, if not by `access`
    _fs: Any = None

    @contextmanager
    def filesystem(self) -> Iterator[Any]:
        """The filesystem for one measurement: shared for Strata's client (it holds no data
        between reads), new for the s3fs family (so no listing cache carries over)."""
        if self.reuse_fs:
            if self._fs is None:
                self._fs = open_filesystem(self.access)
            yield self._fs
            return
        fs = open_filesystem(self.access)
        try:
            yield fs
        finally:
            if fs is not None:
                close_filesystem(fs)

    def close(self) -> None:
        if self._fs is not None:
            close_filesystem(self._fs)
            self._fs = None


def retired_folder(scratch: Path) -> Path:
    """Where cache folders go when a cold read replaces them, until `remove_retired`."""
    return scratch / "retired"


def retire(folder: Path, scratch: Path) -> None:
    """Move a cache folder a cold read replaces out of the way (a rename); it is removed
    between workloads (`remove_retired`), not now: ext4 gives a new file none of the inodes
    freed in the last minute, and scans past each of them for every create in their block
    group (`recently_deleted` was 22% of a near-cache writer's profile, with
    `find_get_block_common` 25%, right after 10,000 records were removed), so a removal just
    before a cold read would cost that read's caches (the near cache's records, a simplecache's
    copies) what a host that did not just delete a dataset does not pay."""
    if folder.exists():
        target = retired_folder(scratch)
        target.mkdir(parents=True, exist_ok=True)
        folder.rename(target / f"{folder.parent.name}-{folder.name}-{time.monotonic_ns()}")


def remove_retired(scratch: Path) -> None:
    shutil.rmtree(retired_folder(scratch), ignore_errors=True)


class LocalCache:
    """The cache folder of a simplecache/blockcache contestant: a new empty one makes the
    next read cold; reusing it (from a new filesystem instance, as a new process of the same
    job would) makes it warm."""

    def __init__(self, base: Path, name: str, scratch: Path) -> None:
        self.base = base / name
        self.scratch = scratch
        self.generation = 0

    @property
    def folder(self) -> Path:
        return self.base / f"gen-{self.generation}"

    def reset(self, folders: Sequence[str] = ()) -> None:
        retire(self.folder, self.scratch)
        self.generation += 1
        # An earlier run in the same workdir may have left this generation's folder filled.
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True, exist_ok=True)

    def fresh_folder(self) -> Path:
        """A new folder for one more process (the sharing workload's readers)."""
        self.reset()
        return self.folder


def build(stack: Any, local_root: Path, scratch: Path, *, bucket: str, mount: str,
          node: str, other_host: str, token: str) -> list[Contestant]:
    """All contestants for one stack; FUSE is listed unavailable when it cannot mount."""
    s3_opts = stack.storage_options()
    caches = {name: LocalCache(scratch / "fsspec-cache", name, scratch) for name in ("simplecache", "blockcache")}
    for cache in caches.values():
        cache.reset()

    def cache_contestant(name: str, label: str) -> Contestant:
        cache = caches[name]
        contestant = Contestant(name, label, Access(name, bucket, {"target_options": s3_opts,  # type: ignore[arg-type]
                                                                   "cache_storage": str(cache.folder)}),
                                cached=True)

        def cold(folders: Sequence[str]) -> None:
            cache.reset()
            contestant.access = Access(name, bucket, {"target_options": s3_opts,  # type: ignore[arg-type]
                                                      "cache_storage": str(cache.folder)})

        contestant.cold = cold
        return contestant

    def free(folders: Sequence[str]) -> None:
        fs = stack.strata_fs()
        try:
            for folder in folders:
                fs.client.free(f"{mount}/{folder}")
        finally:
            close_filesystem(fs)

    # The remote host's near cache folder: a new empty one for each cold read (as simplecache's).
    near = LocalCache(scratch, "near-cache", scratch)
    near.reset()
    strata = {"master": stack.master_address, "token": token}

    def near_access() -> Access:
        return Access("strata", mount, {**strata, "host": other_host, "near_cache": str(near.folder)})

    remote = Contestant("strata-remote", "Strata, fsspec client, remote worker (data port), near cache",
                        near_access(), cached=True, reuse_fs=True)

    def free_near(folders: Sequence[str]) -> None:
        free(folders)
        remote.close()  # the filesystem kept for the run holds the near cache it opened
        near.reset()
        remote.access = near_access()

    remote.cold = free_near
    contestants = [
        Contestant("s3fs", "s3fs, direct", Access("s3fs", bucket, s3_opts), cached=False),
        cache_contestant("simplecache", "fsspec simplecache"),
        cache_contestant("blockcache", "fsspec blockcache"),
        remote,
        Contestant("strata-remote-direct", "Strata, fsspec client, remote worker (data port), no near cache",
                   Access("strata", mount, {**strata, "host": other_host}), cached=True, cold=free, reuse_fs=True),
    ]
    stack.start_fuse()  # the whole namespace, read-write: the metadata workload lists through it
    mountpoint = stack.start_dataset_fuse(mount)
    fuse_root = str(mountpoint) if mountpoint is not None else ""
    large = stack.start_large_files_fuse(mount)

    def fuse_cold(folders: Sequence[str]) -> None:
        free(folders)
        for root in (fuse_root, str(large or "")):
            for folder in folders:
                base = Path(root) / folder
                if base.is_dir():
                    drop_page_cache([str(p) for p in base.iterdir() if p.is_file()])
        if large is not None:
            stack.restart_large_files_fuse(mount)  # no local copy left

    # Large files through the mount that passes them through to local copies; small files
    # (training, metadata) through the one whose kernel opens them without asking.
    contestants.append(Contestant("strata-fuse", "Strata, FUSE (open/read)", Access("posix", str(large or fuse_root)),
                                  cached=True, cold=fuse_cold, unavailable=stack.fuse_unavailable,
                                  small_files=Access("posix", fuse_root)))
    contestants.append(Contestant("strata-sc", "Strata, fsspec client, short-circuit",
                                  Access("strata", mount, {**strata, "host": node}), cached=True, cold=free, reuse_fs=True))

    def local_cold(folders: Sequence[str]) -> None:
        for folder in folders:
            drop_page_cache([str(p) for p in (local_root / folder).iterdir() if p.is_file()])

    contestants.append(Contestant("local", "local file (page cache when warm)", Access("posix", str(local_root)),
                                  cached=True, cold=local_cold))
    return contestants


# -- loopback TCP: the speed of moving bytes between two processes on this host ----------------

_SENDER = r"""
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
while True:
    conn, _ = s.accept()
    with open(sys.argv[1], "rb") as f:
        conn.sendfile(f)
    conn.close()
"""


class LoopbackSender:
    """Another process that sends a file's bytes (from page cache, with sendfile) to each
    connection: reading them is the loopback TCP limit of this host."""

    def __init__(self, path: Path) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", _SENDER, str(path)], stdout=subprocess.PIPE)
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())

    def read(self, chunk: int, consume: Callable[[bytes], None]) -> None:
        with socket.create_connection(("127.0.0.1", self.port)) as sock:
            while data := sock.recv(chunk):
                consume(data)

    def close(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
