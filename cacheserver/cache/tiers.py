"""Cache tiers: where block files live, how many bytes each tier holds, and what a restart
finds in its directories."""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from strata.contract.constants import ENV_HOSTNAME, MEDIA
from strata.contract.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from strata.contract.units import format_size
from .files import DIR_MODE, META_SUFFIX, FileKind, block_file, classify, meta_file, remove_block_files
from .metadata import BlockMetadata

log = logging.getLogger(__name__)

SHM_ROOT = Path("/dev/shm")


def default_mem_dir() -> Path:
    """A MEM tier folder no other worker process uses: /dev/shm/strata-<host>-<pid>.

    It cannot be found again after a restart, so the store deletes it on close (unless it
    holds written blocks' only copies); a worker names its MEM folder after itself instead
    (worker.server.tier_configs), so its next process finds the blocks again."""
    host = os.environ.get(ENV_HOSTNAME) or socket.gethostname() or "worker"
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", host)[:64]
    return SHM_ROOT / f"strata-{safe}-{os.getpid()}"


def written_blocks_in(folder: Path) -> int:
    """How many blocks in a tier folder are the only copy of a file written into the cache
    (pinned, of a written version, by their sidecars): a folder holding any must not be
    deleted, or acknowledged writes go with it."""
    count = 0
    for sidecar in folder.glob(f"*{META_SUFFIX}"):
        try:
            meta = BlockMetadata.read(sidecar)
        except (OSError, InvalidArgument):
            continue
        count += meta.pinned and meta.key.written
    return count


@dataclass(frozen=True)
class TierConfig:
    """One tier: its medium (MEM, SSD or HDD), quota in bytes and block directories.

    A MEM tier without directories gets `default_mem_dir()`; SSD and HDD tiers need one."""

    medium: str
    quota: int
    dirs: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        if self.medium not in MEDIA:
            raise InvalidArgument(
                f"tier medium must be one of {', '.join(MEDIA)}, got {self.medium!r}"
            )
        if isinstance(self.quota, bool) or not isinstance(self.quota, int) or self.quota <= 0:
            raise InvalidArgument(f"tier {self.medium}: quota must be > 0, got {self.quota!r}")
        if isinstance(self.dirs, (str, Path)):
            raise InvalidArgument(
                f"tier {self.medium}: dirs must be a list of directories, got {self.dirs!r}"
            )
        dirs = tuple(Path(d) for d in self.dirs)
        object.__setattr__(self, "dirs", dirs)
        if not dirs and self.medium != "MEM":
            raise InvalidArgument(
                f"tier {self.medium}: give at least one directory to hold its block files"
            )
        for d in dirs:
            if not d.is_absolute():
                raise InvalidArgument(f"tier {self.medium}: directory {str(d)!r} must be an absolute path")
        if len({d.resolve() for d in dirs}) != len(dirs):
            raise InvalidArgument(f"tier {self.medium}: a directory is listed twice in {[str(d) for d in dirs]}")


@dataclass(frozen=True)
class ScannedBlock:
    """A block found intact (sidecar parses, file has the right size) by a scan."""

    directory: Path
    meta: BlockMetadata


# How often (at most) a tier looks again at the free space of its folders' file systems.
CAPACITY_REFRESH_SECONDS = 5.0


class Tier:
    """A tier at run time: its directories, the bytes it holds (or has promised to a write
    in progress) and the ids of its blocks. The store keeps `used <= capacity` by reserving
    before it writes.

    `capacity` is what the tier can hold: its quota, or less when the file systems of its
    folders cannot hold that much (their free space plus the bytes of our blocks on them):
    a 1 GiB quota on a 64 MiB disk is a 64 MiB tier, which evicts before the disk is full."""

    def __init__(self, config: TierConfig) -> None:
        self.config = config
        self.medium = config.medium
        self.quota = config.quota
        self.capacity = config.quota
        self._capacity_checked = float("-inf")
        self.dirs: tuple[Path, ...] = config.dirs or (default_mem_dir(),)
        # A default MEM folder is ours alone and found by nobody after we exit.
        self.owns_dirs = not config.dirs
        self.used = 0
        self.block_ids: set[str] = set()
        self._dir_used = dict.fromkeys(self.dirs, 0)

    def __repr__(self) -> str:
        return f"<Tier {self.medium} {format_size(self.used)}/{format_size(self.capacity)}>"

    # -- placement and accounting -----------------------------------------------------------

    def choose_dir(self) -> Path:
        """The directory holding the fewest of our bytes (the first on a tie)."""
        return min(self.dirs, key=self._dir_used.__getitem__)

    def reserve(self, nbytes: int, directory: Path) -> None:
        """Count `nbytes` as used before they are written. Never goes past the capacity."""
        if self.used + nbytes > self.capacity:
            raise ResourceExhausted(
                f"tier {self.medium}: cannot hold {format_size(nbytes)} more "
                f"(used {format_size(self.used)} of {format_size(self.capacity)})"
            )
        self.used += nbytes
        self._dir_used[directory] += nbytes

    def release(self, nbytes: int, directory: Path) -> None:
        self.used -= nbytes
        self._dir_used[directory] -= nbytes

    def refresh_capacity(self, now: float, *, failed_write: int = 0) -> int:
        """Work out `capacity` again from the file systems of the folders (at most every
        CAPACITY_REFRESH_SECONDS, unless a write of `failed_write` bytes just found the disk
        full: then the capacity is also cut below what that write needed, so the store evicts
        before it tries again). Warns when the tier first holds less than its quota."""
        if not failed_write and now - self._capacity_checked < CAPACITY_REFRESH_SECONDS:
            return self.capacity
        self._capacity_checked = now
        devices: dict[int, tuple[int, int]] = {}  # device -> (free bytes, bytes of our blocks)
        for d in self.dirs:
            try:
                fs = os.statvfs(d)
                device = os.stat(d).st_dev
            except OSError as exc:
                log.warning("tier %s: cannot look at the free space of %s: %s", self.medium, d, exc)
                return self.capacity
            ours = devices.get(device, (0, 0))[1] + self._dir_used[d]
            devices[device] = (fs.f_bavail * fs.f_frsize, ours)
        capacity = min(self.quota, sum(free + ours for free, ours in devices.values()))
        if failed_write:
            capacity = min(capacity, self.used + failed_write - 1)
        if capacity < self.quota and self.capacity == self.quota:
            log.warning(
                "tier %s: the file systems of %s hold only %s (free space and %s of cached blocks), "
                "less than the tier's quota of %s: it holds at most that much; free space on that "
                "disk or give the tier a quota that fits", self.medium, ", ".join(map(str, self.dirs)),
                format_size(capacity), format_size(self.used), format_size(self.quota))
        elif capacity == self.quota and self.capacity < self.quota:
            log.info("tier %s: its disk has room for its whole quota of %s again", self.medium,
                     format_size(self.quota))
        self.capacity = max(capacity, 0)
        return self.capacity

    # -- directories ------------------------------------------------------------------------

    def prepare(self) -> None:
        """Create the directories (and parents), readable by the worker's user only."""
        for d in self.dirs:
            try:
                d.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            except OSError as exc:
                raise FailedPrecondition(
                    f"tier {self.medium}: cannot create block directory {d}: "
                    f"{exc.strerror or exc}; check the volume mount and its permissions"
                ) from exc
            if stat.S_IMODE(d.stat().st_mode) != DIR_MODE:
                try:
                    os.chmod(d, DIR_MODE)
                except PermissionError:
                    # A volume's mount point owned by another user (Kubernetes: root, with the
                    # pod's fsGroup): its mode is the volume's; the block files in it are still
                    # readable by this user only.
                    log.info("tier %s: %s belongs to uid %d, not this worker's %d: leaving its mode; "
                             "block files are owner-only", self.medium, d, d.stat().st_uid, os.getuid())
            if not os.access(d, os.W_OK | os.X_OK):
                raise FailedPrecondition(
                    f"tier {self.medium}: block directory {d} is not writable by uid "
                    f"{os.getuid()}; fix its owner or mode"
                )

    def scan(self) -> list[ScannedBlock]:
        """Blocks whose sidecar parses and whose file has the recorded size. Deletes our
        leftovers (temporary files, blocks without sidecar and the reverse, bad sidecars);
        files we did not name are left alone. Checksums are not read here."""
        found: list[ScannedBlock] = []
        for d in self.dirs:
            found.extend(self._scan_dir(d))
        return found

    def _scan_dir(self, directory: Path) -> Iterable[ScannedBlock]:
        blocks: dict[str, int] = {}
        metas: set[str] = set()
        with os.scandir(directory) as entries:
            for entry in entries:
                named = classify(entry.name)
                if named is None:
                    continue
                block_id, kind = named
                if kind is FileKind.TEMP:
                    Path(entry.path).unlink(missing_ok=True)
                elif kind is FileKind.BLOCK:
                    blocks[block_id] = entry.stat(follow_symlinks=False).st_size
                else:
                    metas.add(block_id)
        for block_id in metas | blocks.keys():
            meta = self._intact(directory, block_id, blocks.get(block_id), block_id in metas)
            if meta is None:
                remove_block_files(directory, block_id)
                continue
            meta.medium = self.medium
            yield ScannedBlock(directory, meta)

    def _intact(
        self, directory: Path, block_id: str, size: int | None, has_meta: bool
    ) -> BlockMetadata | None:
        where = block_file(directory, block_id)
        if size is None or not has_meta:
            log.info("tier %s: removing %s: %s", self.medium, where,
                     "sidecar without block file" if has_meta else "block file without sidecar")
            return None
        try:
            meta = BlockMetadata.read(meta_file(directory, block_id))
        except (OSError, InvalidArgument) as exc:
            log.warning("tier %s: removing %s: unreadable sidecar: %s", self.medium, where, exc)
            return None
        if meta.key.block_id != block_id:
            log.warning("tier %s: removing %s: sidecar names another block (%s)", self.medium, where, meta.key)
            return None
        if meta.length != size:
            log.warning("tier %s: removing %s: %d bytes on disk, sidecar says %d",
                        self.medium, where, size, meta.length)
            return None
        return meta

    def remove_owned_dirs(self) -> None:
        """Delete the default MEM folder (only that: given directories are left alone)."""
        if self.owns_dirs:
            for d in self.dirs:
                shutil.rmtree(d, ignore_errors=True)
