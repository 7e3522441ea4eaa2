"""The keeper of a FUSE mount: a small process that holds the mount's /dev/fuse descriptor so
the mount outlives the process serving it.

A FUSE connection ends when the last descriptor of its /dev/fuse file is closed: then every
waiting reader gets an error and the mount point answers ENOTCONN. So `strata fuse` starts a
keeper per mount (in its own session, so a signal to the server's process group leaves it
alone) that holds a copy of the descriptor and nothing else: requests go from the kernel
straight to the serving process, never through the keeper.

When the serving process dies (SIGKILL, OOM, a crash), the requests it had read stay queued in
the kernel and new ones wait. A new `strata fuse` with the same mount point connects to the
keeper's socket, receives the descriptor (SCM_RIGHTS), replays the node table (nodes.py),
asks the kernel to queue the unanswered requests again and serves them: readers see a stall,
not an error. If no successor comes within the resume timeout, the keeper aborts the
connection (waiting readers get ENOTCONN, never a hang without end) and unmounts. If the
mount point is unmounted while no server holds it (taken for a dead mount), the keeper ends
the connection at once, and the next `strata fuse` mounts anew.

Everything a successor needs is in the mount's state folder, found from the mount point alone:
`$STRATA_FUSE_STATE_DIR/<hash of the mount point>/` (default /run/strata/fuse as root) holds
`keeper.sock`, `session.json` (the mount point, root and options it was mounted with, what
was agreed with the kernel at INIT), `keeper.json` (the keeper's pid and the serving
process's), `nodes.journal` and `handles/` (the file status each open read handle reads, so
a successor reads on at that version). Another program (a CSI node plugin) can resume a mount the
same way, given the same state folder.

Who starts the keeper: `strata fuse` itself, or, with STRATA_FUSE_HOLDER set, the node's
`strata fuse-holder` (holder.py), to which `strata fuse` sends the new mount's descriptor. A
keeper lives as long as the process tree it is part of: in a CSI node plugin's container it
would end with the container (a deleted plugin pod, a `helm upgrade`), so the chart's node
plugin hands its mounts to the holder, which runs in a pod of its own that upgrades never
replace; the keeper works the same either way.

Protocol on `keeper.sock`: a server sends one JSON line `{"version": 1, "pid": P,
"resume_timeout": S}` (unknown fields are ignored and a hello without a version is accepted,
so a server of a newer or older image resumes the mount just the same); the keeper answers `{"ok": true}` with the descriptor attached, or `{"error": "..."}` when a live
server still holds the mount. The server keeps the connection open while it serves: its end
(EOF) is how the keeper learns the server is gone. Once it serves, it sends `serving` (a
server that ends before that does not extend the readers' deadline); a server stopping
cleanly first sends `stop`: the mount is being unmounted and nobody waits for a successor.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.contract.errors import AlreadyExists, Unavailable
from . import kernel
from .mountpoints import find_mount, unmount

log = logging.getLogger("strata.fuse.keeper")

STATE_DIR_ENV = "STRATA_FUSE_STATE_DIR"
RESUME_TIMEOUT_ENV = "STRATA_FUSE_RESUME_TIMEOUT"
# Seconds a mount whose server died waits for a successor before its readers get an error:
# long enough for a restart (a container's, or a rollout's), short enough that a reader does
# not look hung.
DEFAULT_RESUME_TIMEOUT = 60.0
SOCKET = "keeper.sock"
SESSION = "session.json"   # written by servers
KEEPER = "keeper.json"     # written by the keeper
JOURNAL = "nodes.journal"
HANDLES = "handles"        # what each open read handle reads (handles.ReadRecords), written by servers
# Seconds a server waits for the keeper's answer.
ATTACH_TIMEOUT = 10.0
# Seconds a new keeper has to listen (under the holder's START_TIMEOUT, so the holder can still
# answer with the error).
START_TIMEOUT = 20.0
MAX_MESSAGE = 65536
# The hello's version. Servers of another image version resume the mounts kept by this one
# (and the other way round): fields are added, never changed in meaning, and unknown ones
# are ignored; a hello without a version is of the first servers.
HELLO_VERSION = 1
# Seconds between the keeper's looks at the mount point while no server holds it.
WATCH_INTERVAL = 1.0


def state_root() -> Path:
    configured = os.environ.get(STATE_DIR_ENV)
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/run/strata/fuse")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "strata" / "fuse" if runtime else Path(f"/tmp/strata-fuse-{os.getuid()}")


def state_dir(mountpoint: Path) -> Path:
    """The state folder of the mount at `mountpoint` (an absolute path)."""
    key = hashlib.blake2b(str(mountpoint).encode(), digest_size=8).hexdigest()
    return state_root() / key


def resume_timeout_default() -> float:
    return float(os.environ.get(RESUME_TIMEOUT_ENV, DEFAULT_RESUME_TIMEOUT))


def write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.new")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


# -- the server's side -------------------------------------------------------------------------------


@dataclass
class Attachment:
    """A server's tie to the keeper of its mount."""
    sock: socket.socket
    fd: int

    def _send(self, message: bytes) -> None:
        try:
            self.sock.sendall(message + b"\n")
        except OSError:
            pass

    def serving(self) -> None:
        """Tell the keeper this process serves the mount now."""
        self._send(b"serving")

    def stop(self) -> None:
        """Tell the keeper the mount is being unmounted on purpose."""
        self._send(b"stop")


def attach(state: Path, resume_timeout: float) -> Attachment | None:
    """Take over the mount kept in `state`; None if no keeper is there. Raises AlreadyExists
    if a live server holds it."""
    path = state / SOCKET
    if not path.exists():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(ATTACH_TIMEOUT)
    try:
        sock.connect(str(path))
        hello = {"version": HELLO_VERSION, "pid": os.getpid(), "resume_timeout": resume_timeout}
        sock.sendall(json.dumps(hello).encode() + b"\n")
        message, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 1)
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None  # the keeper is gone: its mount (if any) is stale
    except OSError as exc:
        sock.close()
        raise Unavailable(f"the keeper of the mount at {state} did not answer: {exc}") from exc
    reply = json.loads(message or b"{}")
    if reply.get("gone"):  # the mount point was unmounted meanwhile: mount anew
        sock.close()
        return None
    if "error" in reply or not fds:
        sock.close()
        for fd in fds:
            os.close(fd)
        raise AlreadyExists(reply.get("error", "the keeper sent no descriptor"))
    sock.settimeout(None)
    os.set_inheritable(fds[0], False)
    return Attachment(sock, fds[0])


def start(fd: int, state: Path, mountpoint: Path, resume_timeout: float) -> int:
    """Start the keeper of a new mount (descriptor `fd`); returns its pid once it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "strata.cacheserver.fuse.keeper", "--fd", str(fd), "--state", str(state),
         "--mountpoint", str(mountpoint), "--resume-timeout", str(resume_timeout)],
        pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    with proc.stdout:
        answered, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT)
        ready = proc.stdout.readline() if answered else b""
    if ready.strip() != b"ready":
        hung = proc.poll() is None
        if hung:  # no mount waits on a keeper that never listened
            proc.kill()
        proc.wait()
        why = f"did not listen within {START_TIMEOUT:.0f}s and was killed" if hung else f"ended (exit {proc.returncode})"
        raise Unavailable(f"the keeper of {mountpoint} {why} before it listened; see the messages above")
    return proc.pid


# -- the keeper ----------------------------------------------------------------------------------------


class Keeper:
    def __init__(self, fd: int, state: Path, mountpoint: Path, resume_timeout: float) -> None:
        self.fd = fd
        self.state = state
        self.mountpoint = mountpoint
        self.resume_timeout = resume_timeout
        self.server: socket.socket | None = None
        self.server_pid = 0
        self.stopping = False
        self.deadline: float | None = time.monotonic() + resume_timeout  # until the first server attaches
        self.pending_deadline: float | None = None
        self.device = ""
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def listen(self) -> None:
        path = self.state / SOCKET
        path.unlink(missing_ok=True)
        self.listener.bind(str(path))
        os.chmod(path, 0o600)
        self.listener.listen(8)

    def run(self) -> None:
        entry = find_mount(self.mountpoint)
        if entry is None:
            log.error("strata fuse keeper: nothing is mounted at %s", self.mountpoint)
            return
        self.device = entry.device
        poller = select.poll()
        poller.register(self.fd, 0)  # only POLLERR: the connection ended (unmounted or aborted)
        poller.register(self.listener, select.POLLIN)
        while True:
            timeout = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            if self.server is None:  # watch the mount point meanwhile (see _unmounted)
                timeout = min(timeout if timeout is not None else WATCH_INTERVAL, WATCH_INTERVAL)
            events = poller.poll(None if timeout is None else int(timeout * 1000) + 1)
            for fd, event in events:
                if fd == self.fd:
                    log.info("strata fuse keeper: the mount at %s ended", self.mountpoint)
                    return
                if fd == self.listener.fileno() and not self._accept(poller):
                    return
                if self.server is not None and fd == self.server.fileno():
                    self._from_server(poller)
            if self.server is None and self._unmounted():
                return
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self._give_up()
                return

    def _unmounted(self) -> bool:
        """True (and the connection ended) if the mount point no longer shows this connection:
        someone unmounted it while no server held it (a dead mount point taken for stale), and
        the next `strata fuse` must mount anew, not resume a connection nobody sees."""
        entry = find_mount(self.mountpoint)
        if entry is not None and entry.device == self.device:
            return False
        log.warning("strata fuse keeper: %s was unmounted while no server held it; ending its connection",
                    self.mountpoint)
        if self.device:
            kernel.abort(self.device)
        return True

    def _accept(self, poller: select.poll) -> bool:
        """Hand the descriptor to a new server; False if the mount is gone (the keeper ends)."""
        conn, _ = self.listener.accept()
        conn.settimeout(ATTACH_TIMEOUT)
        try:
            hello = json.loads(conn.recv(MAX_MESSAGE) or b"{}")
            if not isinstance(hello, dict):
                raise ValueError(f"a hello is a JSON object, not {hello!r:.100}")
            if self.server is None and self._unmounted():
                conn.sendall(json.dumps({"gone": True}).encode())
                conn.close()
                return False
            if self.server is not None:
                conn.sendall(json.dumps({"error": f"{self.mountpoint} is already a Strata mount, served by pid "
                                                  f"{self.server_pid}; unmount it first: fusermount3 -u "
                                                  f"{self.mountpoint}"}).encode())
                conn.close()
                return True
            socket.send_fds(conn, [json.dumps({"ok": True}).encode()], [self.fd])
        except (OSError, ValueError) as exc:
            log.warning("strata fuse keeper: a server's request failed: %s", exc)
            conn.close()
            return True
        conn.settimeout(None)
        self.server, self.server_pid = conn, int(hello.get("pid", 0))
        self.resume_timeout = float(hello.get("resume_timeout", self.resume_timeout))
        # Until the new server says it serves, the readers' deadline stands: a successor that
        # fails at start (again and again, in a crash loop) never makes them wait longer.
        self.pending_deadline = self.deadline
        self.deadline = None
        self.stopping = False
        poller.register(conn, select.POLLIN)
        write_json(self.state / KEEPER, {"keeper_pid": os.getpid(), "server_pid": self.server_pid,
                                         "device": self.device})
        log.info("strata fuse keeper: pid %d serves %s", self.server_pid, self.mountpoint)
        return True

    def _from_server(self, poller: select.poll) -> None:
        assert self.server is not None
        try:
            data = self.server.recv(MAX_MESSAGE)
        except OSError:
            data = b""
        if data:
            if b"serving" in data:
                self.pending_deadline = None
            if b"stop" in data:
                self.stopping = True
            return
        poller.unregister(self.server)
        self.server.close()
        self.server = None
        if self.stopping:
            # Unmounted on purpose: nobody resumes it. Files still open through a lazily detached
            # mount would wait for answers that never come: end the connection.
            log.info("strata fuse keeper: pid %d stopped serving %s", self.server_pid, self.mountpoint)
            if self.device:
                kernel.abort(self.device)
            return
        self.deadline = self.pending_deadline or time.monotonic() + self.resume_timeout
        log.warning("strata fuse keeper: pid %d serving %s ended; readers wait up to %.0fs for a new `strata fuse %s`",
                    self.server_pid, self.mountpoint, self.deadline - time.monotonic(), self.mountpoint)

    def _give_up(self) -> None:
        log.error("strata fuse keeper: no server took over %s within %.0fs; ending the mount (readers get an error)",
                  self.mountpoint, self.resume_timeout)
        if self.device:
            kernel.abort(self.device)
        os.close(self.fd)  # the last descriptor: the kernel ends the connection if abort could not
        try:
            unmount(self.mountpoint, lazy=True)
        except Exception as exc:  # noqa: BLE001 - nothing left to do but say so
            log.error("strata fuse keeper: %s", exc)

    def cleanup(self) -> None:
        self.listener.close()
        shutil.rmtree(self.state, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="hold a Strata FUSE mount's /dev/fuse descriptor across server restarts")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("--mountpoint", type=Path, required=True)
    p.add_argument("--resume-timeout", type=float, default=DEFAULT_RESUME_TIMEOUT)
    args = p.parse_args(argv)
    # The server blocks these in every thread; a process inherits the mask through exec.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    keeper = Keeper(args.fd, args.state, args.mountpoint, args.resume_timeout)
    keeper.listen()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    os.close(sys.stdout.fileno())
    try:
        keeper.run()
    finally:
        keeper.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
