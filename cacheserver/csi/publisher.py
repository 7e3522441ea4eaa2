"""Published volumes of one node: one `strata fuse` process per target path.

One FUSE process per volume, not one per node with bind mounts: each volume can come from a
different cluster (its own master and token), a read-only volume is read-only in the kernel
(`ro`) as well as in Strata, a crash or a hang takes one pod's volume down, not the node's,
and unpublishing is unmounting. The cost is a Python process per published volume (see
the report for its memory).

Each published target has a record in the state directory (JSON, plus the token in a 0600
file), so a restarted plugin still knows what it published: it leaves live mounts alone and
mounts again the targets whose FUSE process died (pods whose volume mount has
`mountPropagation: HostToContainer` see the new mount). The FUSE processes run in their own
session, so stopping the plugin does not unmount its volumes.

A volume's mount also outlives its FUSE process (fuse/mountkeeper.py): a keeper holds the
connection, and readers wait while a successor takes over. The plugin is that successor's
starter: its watch thread starts a new `strata fuse` for a target whose process died, and a
restarted plugin does the same for every kept mount it finds. A kept mount is never probed
with stat (a stat waits for the successor like any reader) and never unmounted on the way:
files open through it stay open and read on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from strata.contract.constants import ENV_DATA_TOKEN_FILE, ENV_MASTER
from strata.contract.errors import AlreadyExists, InvalidArgument, NotFound, StrataError, Unavailable
from ..auth import CREDENTIAL_ENV
from ..client.core import StrataClient
from ..common.durable import write_file
from ..fuse import mountkeeper
from ..fuse.mountpoints import MountState, find_mount, mount_state, unmount, unmount_gracefully, wait_mounted
from .volumes import VolumeSource

log = logging.getLogger("strata.csi")

FSTYPE = "fuse.strata"
MOUNT_TIMEOUT = 30.0  # for a FUSE process to mount (it checks the master first)
STOP_TIMEOUT = 10.0   # for a FUSE process to exit after its mount point is gone
LOG_TAIL = 2000       # characters of a failed FUSE process's log put into the error
WATCH_INTERVAL = 1.0  # seconds between the watch thread's looks at the volumes' processes
RETRY_MAX = 30.0      # longest pause between tries to serve a volume again after failures


@dataclass(frozen=True)
class Publication:
    """What is mounted at a target path (the record kept in the state directory)."""

    volume_id: str
    target: str
    master: str
    path: str
    read_only: bool
    write_type: str
    pid: int
    passthrough: bool = False  # (absent from the records of earlier plugins)


@dataclass(frozen=True)
class VolumeStats:
    total: int
    used: int
    available: int
    abnormal: bool
    message: str


def check_source(source: VolumeSource) -> None:
    """Fail with the master's own error (NotFound, Unauthenticated, Unavailable) unless the
    source's path is a directory there."""
    client = StrataClient(master=source.master, token=source.token, short_circuit=False)
    try:
        info = client.stat(source.path)
    finally:
        client.close()
    if not info.is_dir:
        raise InvalidArgument(f"{source.name}: {source.path} is a file; a volume shows a directory")


class Publisher:
    def __init__(self, state_dir: Path, *, command: Sequence[str] | None = None,
                 mount_timeout: float = MOUNT_TIMEOUT, passthrough: str = "") -> None:
        """Volumes recorded in `state_dir`; `passthrough` (DIR:SIZE, as `strata fuse
        --passthrough` takes it) where the volumes that ask for it keep their local copies
        ("": nowhere, and they read through the page cache)."""
        self.state_dir = state_dir
        self.passthrough = passthrough
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # How to run the CLI: this interpreter, never with the working directory on sys.path.
        self.command = list(command or [sys.executable, "-P", "-m", "strata.cacheserver"])
        self.mount_timeout = mount_timeout
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._failures: dict[str, tuple[int, float]] = {}  # target -> (failed tries, next try at)

    # -- records -------------------------------------------------------------------------------

    def _key(self, target: str) -> str:
        return hashlib.sha256(target.encode()).hexdigest()[:32]

    def _files(self, target: str) -> tuple[Path, Path, Path]:
        key = self._key(target)
        return (self.state_dir / f"{key}.json", self.state_dir / f"{key}.token", self.state_dir / f"{key}.log")

    def load(self, target: str) -> Publication | None:
        try:
            return Publication(**json.loads(self._files(target)[0].read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def records(self) -> list[Publication]:
        found = []
        for path in sorted(self.state_dir.glob("*.json")):
            try:
                found.append(Publication(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError):
                log.warning("ignoring unreadable record %s", path)
        return found

    def _save(self, publication: Publication) -> None:
        record = self._files(publication.target)[0]
        write_file(record, json.dumps(asdict(publication)).encode())

    def _forget(self, target: str) -> None:
        for path in self._files(target):
            path.unlink(missing_ok=True)
        self._failures.pop(target, None)

    @contextlib.contextmanager
    def _locked(self, target: str) -> Iterator[None]:
        with self._locks_lock:
            lock = self._locks.setdefault(target, threading.Lock())
        with lock:
            yield

    # -- processes -----------------------------------------------------------------------------

    def _spawn(self, target: str, source: VolumeSource, read_only: bool, token_file: Path, log_file: Path) -> int:
        argv = [*self.command, "fuse", target, "--root", source.path, "--allow-other"]
        if read_only:
            argv.append("--read-only")
        if source.write_type:
            argv += ["--write-type", source.write_type]
        if source.passthrough and read_only and self.passthrough:
            argv += ["--passthrough", self.passthrough]
        # The volume's token only: none of the plugin's own credentials reach the mount.
        env = {k: v for k, v in os.environ.items() if k != ENV_MASTER and k not in CREDENTIAL_ENV}
        env.update({ENV_MASTER: source.master, ENV_DATA_TOKEN_FILE: str(token_file), "PYTHONSAFEPATH": "1"})
        with log_file.open("wb") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        self._children[proc.pid] = proc
        return proc.pid

    def _alive(self, pid: int, target: str) -> bool:
        child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        try:  # a process of an earlier plugin: alive, and still the FUSE process of this target?
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return b"fuse" in cmdline and target.encode() in cmdline

    def _stop(self, pid: int, target: str) -> None:
        """End the FUSE process of `target` (it exits by itself once unmounted)."""
        deadline = time.monotonic() + STOP_TIMEOUT
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and self._alive(pid, target):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                deadline = time.monotonic() + STOP_TIMEOUT
            while self._alive(pid, target) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not self._alive(pid, target):
                break
        child = self._children.pop(pid, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=1)

    def _served_by(self, target: str) -> int:
        """The live process serving the mount at `target` as its keeper last recorded (0: none).
        A successor started by an earlier plugin may serve a mount whose record still names
        the dead process before it."""
        recorded = mountkeeper.read_json(mountkeeper.state_dir(Path(target)) / mountkeeper.KEEPER).get("server_pid")
        pid = recorded if isinstance(recorded, int) else 0
        return pid if pid > 0 and self._alive(pid, target) else 0

    def _kept(self, record: Publication | None) -> bool:
        """True if `record`'s mount has no live server and a keeper holds it for a successor.
        Decided from processes and the keeper's files alone: a stat of such a mount waits."""
        if record is None or self._alive(record.pid, record.target) or self._served_by(record.target):
            return False
        return (mountkeeper.state_dir(Path(record.target)) / mountkeeper.SOCKET).exists()

    def _wait_serving(self, pid: int, target: str) -> None:
        """Wait until the keeper of `target` hands its mount to `pid` (a successor refused
        because another process serves the mount ends instead)."""
        deadline = time.monotonic() + self.mount_timeout
        while self._served_by(target) != pid:
            if not self._alive(pid, target):
                raise Unavailable(f"the FUSE process taking over {target} ended before it served")
            if time.monotonic() > deadline:
                raise Unavailable(f"the FUSE process taking over {target} did not serve within "
                                  f"{self.mount_timeout:.0f}s")
            time.sleep(0.05)

    # -- publish -------------------------------------------------------------------------------

    def publish(self, volume_id: str, target: str, source: VolumeSource, read_only: bool) -> None:
        """Mount `source` at `target` (idempotent for the same volume and mode)."""
        read_only = read_only or source.read_only
        if source.passthrough and not read_only:
            raise InvalidArgument(f"{source.name}: passthrough needs a read-only volume (readOnly: true on the "
                                  "pod's volume, or a read-only Mount): a file read from a local copy cannot be written")
        if source.passthrough and not self.passthrough:
            log.warning("%s asks for passthrough, but this node plugin keeps no local copies (strata csi "
                        "--passthrough DIR:SIZE): its files are read through the page cache", source.name)
        with self._locked(target):
            record = self.load(target)
            kept = self._kept(record)
            state = MountState.LIVE if kept else mount_state(target)
            if state is MountState.LIVE and record is not None:
                same = (record.volume_id, record.read_only, record.master, record.path) == (
                    volume_id, read_only, source.master, source.path)
                if same and kept:
                    self._mount(volume_id, target, source, read_only, resume=True)
                if same:
                    return
                raise AlreadyExists(
                    f"{target} already shows volume {record.volume_id} ({record.path} on {record.master}, "
                    f"read-only {record.read_only}); unpublish it before publishing {volume_id} there")
            if state is MountState.LIVE:
                entry = find_mount(target)
                if entry is None or entry.fstype != FSTYPE:
                    raise AlreadyExists(f"{target} is already a mount point ({entry.fstype if entry else '?'}); "
                                        "it is not a Strata volume")
                log.warning("%s: a Strata mount without a record; mounting %s again", target, volume_id)
                unmount_gracefully(target)
            elif state is MountState.STALE:
                log.warning("%s: the FUSE process of the last mount is gone; mounting %s again", target, volume_id)
                unmount(target, lazy=True)
            if record is not None:
                self._stop(record.pid, target)
            check_source(source)
            self._mount(volume_id, target, source, read_only)

    def _mount(self, volume_id: str, target: str, source: VolumeSource, read_only: bool, *,
               resume: bool = False) -> None:
        """Start the FUSE process of `target` and wait until it serves. With `resume`, the mount
        is kept for a successor: the new process takes it over, and a failure leaves it kept
        (its readers wait on, up to the keeper's resume timeout) for the next try."""
        _, token_file, log_file = self._files(target)
        if not resume:  # (the folder of a kept mount exists, and a stat of it would wait)
            Path(target).mkdir(parents=True, exist_ok=True)
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(source.token)
        pid = self._spawn(target, source, read_only, token_file, log_file)
        try:
            if resume:
                self._wait_serving(pid, target)
            wait_mounted(target, self.mount_timeout, fstype=FSTYPE, alive=lambda: self._alive(pid, target),
                         what=f"the FUSE process of {source.name}")
        except Unavailable as exc:
            self._stop(pid, target)
            if not resume and find_mount(target) is not None:
                unmount(target, lazy=True)
            tail = log_file.read_text(errors="replace")[-LOG_TAIL:].strip()
            raise Unavailable(f"{exc}; its log ({log_file}): {tail}") from exc
        self._save(Publication(volume_id=volume_id, target=target, master=source.master, path=source.path,
                               read_only=read_only, write_type=source.write_type, pid=pid,
                               passthrough=source.passthrough))
        self._failures.pop(target, None)
        log.info("%s %s (%s) at %s%s", "resumed" if resume else "published", volume_id, source.name, target,
                 " read-only" if read_only else "")

    # -- unpublish -----------------------------------------------------------------------------

    def unpublish(self, volume_id: str, target: str) -> None:
        """Unmount `target`, end its FUSE process and remove the directory (idempotent)."""
        with self._locked(target):
            record = self.load(target)
            if record is not None and record.volume_id != volume_id:
                raise NotFound(f"{target} shows volume {record.volume_id}, not {volume_id}")
            state = MountState.STALE if self._kept(record) else mount_state(target)
            if state is MountState.LIVE:
                entry = find_mount(target)
                if record is None and (entry is None or entry.fstype != FSTYPE):
                    raise InvalidArgument(f"{target} is a {entry.fstype if entry else '?'} mount, not a Strata volume")
                unmount_gracefully(target)
            elif state is MountState.STALE:
                unmount(target, lazy=True)
            if record is not None:
                self._stop(record.pid, target)
                # A successor a restarted plugin started but never recorded (its start timed
                # out) may serve the mount still: it ends too.
                successor = self._served_by(target)
                if successor and successor != record.pid:
                    self._stop(successor, target)
            # The mount's keeper ends now, whatever state a server of it is in (one stopped, or
            # one that will not end while its thread waits on the mount): nothing waits on
            # the volume after it is unpublished, and a later publish here finds no keeper.
            kept = mountkeeper.state_dir(Path(target))
            if not mountkeeper.end(kept):
                raise Unavailable(f"the keeper of {target} (state {kept}) did not end; unpublish it again")
            shutil.rmtree(kept, ignore_errors=True)  # left by a keeper that died
            try:
                os.rmdir(target)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("could not remove %s after unmounting it: %s", target, exc)
            self._forget(target)
            log.info("unpublished %s from %s", volume_id, target)

    # -- stats and recovery --------------------------------------------------------------------

    def stats(self, volume_id: str, target: str) -> VolumeStats:
        record = self.load(target)
        if record is None or record.volume_id != volume_id:
            raise NotFound(f"volume {volume_id} is not published at {target} on this node")
        if self._kept(record):
            return VolumeStats(0, 0, 0, True, f"the FUSE process of {target} is gone; its mount is kept and "
                                              "readers wait while the plugin starts its successor")
        state = mount_state(target)
        if state is not MountState.LIVE:
            return VolumeStats(0, 0, 0, True, f"the FUSE mount at {target} is {state.value}: its process is gone "
                                              "or hung; the plugin mounts it again")
        st = os.statvfs(target)
        total, available = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        return VolumeStats(total, total - st.f_bfree * st.f_frsize, available, False, "mounted")

    def recover(self) -> None:
        """After a restart: serve again what was published and lost its FUSE process."""
        for record in self.records():
            with self._locked(record.target):
                self._recover(record)

    def watch(self, stop: threading.Event, interval: float = WATCH_INTERVAL) -> None:
        """Until `stop` is set: start a successor for every volume whose FUSE process died (a
        crash, an OOM kill, a SIGKILL); failing volumes are tried again less and less often."""
        while not stop.wait(interval):
            for record in self.records():
                if self._alive(record.pid, record.target) or not self._due(record.target):
                    continue
                with self._locked(record.target):
                    current = self.load(record.target)  # unpublished or served again meanwhile?
                    if current is not None and not self._alive(current.pid, current.target):
                        log.warning("the FUSE process %d of %s at %s is gone; starting its successor", current.pid,
                                    current.volume_id, current.target)
                        self._recover(current)

    def _due(self, target: str) -> bool:
        return time.monotonic() >= self._failures.get(target, (0, 0.0))[1]

    def _failed(self, target: str) -> None:
        tries = self._failures.get(target, (0, 0.0))[0] + 1
        self._failures[target] = (tries, time.monotonic() + min(RETRY_MAX, 2.0 ** tries))

    def _recover(self, record: Publication) -> None:
        target = record.target
        server = self._served_by(target)
        if server and server != record.pid:  # a successor whose start an earlier plugin did not see end
            log.info("%s at %s is served by pid %d; keeping it", record.volume_id, target, server)
            self._save(replace(record, pid=server))
            return
        kept = self._kept(record)
        if not kept:
            state = mount_state(target)
            if state is MountState.LIVE and self._alive(record.pid, target):
                return
            if state is MountState.ABSENT and not os.path.isdir(target):
                log.info("forgetting %s: its target %s is gone", record.volume_id, target)
                self._forget(target)
                return
            if state is not MountState.ABSENT:
                unmount(target, lazy=True)
        token_file = self._files(target)[1]
        try:
            token = token_file.read_text()
        except OSError:
            log.error("cannot serve %s at %s again: its token file is gone", record.volume_id, target)
            return
        source = VolumeSource(master=record.master, token=token, path=record.path, write_type=record.write_type,
                              name=f"{record.path} on {record.master}", passthrough=record.passthrough)
        try:
            self._mount(record.volume_id, target, source, record.read_only, resume=kept)
        except StrataError as exc:
            self._failed(target)
            log.error("cannot serve %s at %s again: %s", record.volume_id, target, exc)
