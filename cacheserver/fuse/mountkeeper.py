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
`strata fuse-holder` (keeperhost.py), to which `strata fuse` sends the new mount's descriptor. A
keeper lives as long as the process tree it is part of: in a CSI node plugin's container it
would end with the container (a deleted plugin pod, a `helm upgrade`), so the chart's node
plugin hands its mounts to the holder, which runs in a pod of its own that upgrades never
replace; the keeper works the same either way.

Protocol on `keeper.sock`: a server sends one JSON line `{"version": 1, "pid": P,
"resume_timeout": S, "heartbeat": H}` (unknown fields are ignored and a hello without a
version is accepted, so a server of a newer or older image resumes the mount just the same);
the keeper answers `{"ok": true}` with the descriptor attached, or `{"error": "..."}` when a
live server still holds the mount. The server keeps the connection open while it serves: its
end (EOF) is how the keeper learns the server is gone. Once it serves, it sends `serving`; a
server stopping cleanly first sends `stop`: the mount is being unmounted and nobody waits for
a successor. With `heartbeat` in its hello, the server sends `alive` every H seconds.

No reader waits on a server without a deadline, whatever state the server is in:
- Until a server (of a hello with a version) says it serves, the readers' deadline stands: a
  successor that hangs or is stopped while it starts ends the mount like a successor that
  never came, and so does an unmount of the mount point meanwhile.
- A server that sends no sign of life for max(resume timeout, UNRESPONSIVE_MIN) is stopped
  or hung: the keeper ends the connection (readers get an error) and the mount. It never
  hands the mount to a successor while that process may still read the connection.
- A server whose process has ended counts as gone even while its connection stays open (a
  killed process one of whose threads waits in the kernel for a FUSE answer keeps its
  descriptors until that answer comes, which only a successor can give): a successor takes
  the mount over and answers it. The keeper sees this where the server's process is visible
  to it (its pid namespace); elsewhere the missing heartbeat tells.
- A client sending `{"version": 1, "end": true}` (the CSI plugin unpublishing the volume)
  makes the keeper end the connection and exit, whatever holds it; the connection closes
  when the keeper has ended and removed the state folder.
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
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.contract.errors import AlreadyExists, Unavailable
from ..common.durable import write_file
from . import kernel
from .mountpoints import find_mount, unmount
from .settings import DEFAULT_RESUME_TIMEOUT, fuse_environment

log = logging.getLogger("strata.fuse.keeper")

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
# Seconds between the keeper's looks at the mount point (while no server serves it) and at
# the attached server's process.
WATCH_INTERVAL = 1.0
# Seconds between a server's signs of life.
HEARTBEAT_INTERVAL = 1.0
# Shortest silence after which a server that sends signs of life is taken for stopped or hung
# (whatever the resume timeout): a loaded machine may hold a sleeping thread back for seconds.
UNRESPONSIVE_MIN = 10.0


def state_dir(mountpoint: Path) -> Path:
    """The state folder of the mount at `mountpoint` (an absolute path)."""
    key = hashlib.blake2b(str(mountpoint).encode(), digest_size=8).hexdigest()
    return fuse_environment().state_root() / key


def write_json(path: Path, value: dict[str, Any]) -> None:
    write_file(path, json.dumps(value, indent=1).encode())


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
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: threading.Event = field(default_factory=threading.Event)

    def _send(self, message: bytes, flags: int = 0) -> None:
        with self._lock:
            try:
                self.sock.sendall(message + b"\n", flags)
            except OSError:
                pass

    def serving(self) -> None:
        """Tell the keeper this process serves the mount now."""
        self._send(b"serving")

    def stop(self) -> None:
        """Tell the keeper the mount is being unmounted on purpose."""
        self._send(b"stop")

    def beat(self) -> None:
        """Send the keeper a sign of life every HEARTBEAT_INTERVAL (from a thread of its own)
        until closed: a process that is stopped, frozen or dying sends none."""
        threading.Thread(target=self._beat, name="strata-fuse-heartbeat", daemon=True).start()

    def _beat(self) -> None:
        while not self._closed.wait(HEARTBEAT_INTERVAL):
            self._send(b"alive", socket.MSG_DONTWAIT)  # never blocks on a keeper that does not read

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            self.sock.close()


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
        hello = {"version": HELLO_VERSION, "pid": os.getpid(), "resume_timeout": resume_timeout,
                 "heartbeat": HEARTBEAT_INTERVAL}
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
    attachment = Attachment(sock, fds[0])
    attachment.beat()
    return attachment


def end(state: Path, timeout: float = ATTACH_TIMEOUT) -> bool:
    """Have the keeper in `state` end its mount's connection and exit, whatever serves the mount
    (it was unpublished for good); True once it has ended and removed `state` (or none
    listens there: a keeper that died leaves `state` behind), False if it did not within
    `timeout` seconds. Unmount first: a keeper of an older image ends only once the mount
    point is gone."""
    path = state / SOCKET
    if not path.exists():
        return True
    answer = b""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            sock.sendall(json.dumps({"version": HELLO_VERSION, "end": True}).encode() + b"\n")
            deadline = time.monotonic() + timeout
            while chunk := sock.recv(MAX_MESSAGE):  # a keeper that ends answers nothing
                answer += chunk
                sock.settimeout(max(0.001, deadline - time.monotonic()))
        except (ConnectionRefusedError, FileNotFoundError, ConnectionResetError):
            return True  # no keeper listens there
        except OSError as exc:
            log.warning("the keeper of the mount kept in %s did not end within %.0fs: %s", state, timeout, exc)
            return False
    if answer and b'"gone"' not in answer:  # a keeper of an older image took it for a successor's hello
        log.warning("the keeper of the mount kept in %s did not end yet: it answered %r", state, answer[:200])
        return False
    return True


def process_ended(pid: int) -> bool:
    """True if process `pid` is gone or ending: its main thread exited (a zombie), though other
    threads may still wait in the kernel."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True
    return not fields or fields[0] in ("Z", "X")


def peer_pid(conn: socket.socket) -> int:
    """The pid of the process at the other end of `conn` as this process sees it (0: it is not
    visible here, e.g. in another pid namespace)."""
    try:
        pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError:
        return 0
    return int(pid)


def start(fd: int, state: Path, mountpoint: Path, resume_timeout: float) -> int:
    """Start the keeper of a new mount (descriptor `fd`); returns its pid once it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "strata.cacheserver.fuse.mountkeeper", "--fd", str(fd), "--state", str(state),
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
        self.server_pid = 0        # as the server gave it (its own pid namespace): keeper.json
        self.process = 0           # the server's process as this keeper sees it (0: not visible here)
        self.heartbeat: float | None = None  # seconds between its signs of life, if it sends them
        self.last_sign = 0.0
        self.must_say_serving = False  # servers of the first images (no version) never say so
        self.serving = False
        self.stopping = False
        self.inbox = b""  # the server's messages, one a line
        # The readers' deadline while no server serves the mount (None while one does). A
        # successor that attaches does not extend it: only one that serves does. The first
        # server (whose readers wait for its INIT answer) has at least UNRESPONSIVE_MIN.
        self.deadline: float | None = time.monotonic() + max(resume_timeout, UNRESPONSIVE_MIN)
        self.device = ""
        self.ender: socket.socket | None = None  # a client that asked this keeper to end
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def listen(self) -> None:
        path = self.state / SOCKET
        path.unlink(missing_ok=True)
        self.listener.bind(str(path))
        os.chmod(path, 0o600)
        self.listener.listen(8)

    def unserved(self) -> bool:
        """True while no server serves the mount: none is attached, or the attached one has not
        said it serves yet. The readers' deadline runs meanwhile."""
        return self.server is None or (self.must_say_serving and not self.serving)

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
            timeout = WATCH_INTERVAL
            if self.unserved() and self.deadline is not None:
                timeout = min(timeout, max(0.0, self.deadline - time.monotonic()))
            events = poller.poll(int(timeout * 1000) + 1)
            for fd, event in events:
                if fd == self.fd:
                    log.info("strata fuse keeper: the mount at %s ended", self.mountpoint)
                    return
                if fd == self.listener.fileno() and not self._accept(poller):
                    return
                if self.server is not None and fd == self.server.fileno():
                    self._from_server(poller)
            if self.server is not None and not self._check_server(poller):
                return
            if self.unserved() and self._unmounted():
                return
            if self.unserved() and self.deadline is not None and time.monotonic() >= self.deadline:
                if self.server is not None:
                    log.error("strata fuse keeper: pid %d took %s over but did not serve by the readers' deadline; "
                              "ending the mount (readers get an error)", self.server_pid, self.mountpoint)
                else:
                    log.error("strata fuse keeper: no server took over %s within %.0fs; ending the mount (readers "
                              "get an error)", self.mountpoint, self.resume_timeout)
                self._end_connection()
                return

    def _unmounted(self) -> bool:
        """True (and the connection ended) if the mount point no longer shows this connection:
        someone unmounted it while no server served it (a dead mount point taken for stale, a
        volume unpublished), and the next `strata fuse` must mount anew, not resume a
        connection nobody sees."""
        entry = find_mount(self.mountpoint)
        if entry is not None and entry.device == self.device:
            return False
        log.warning("strata fuse keeper: %s was unmounted while no server served it; ending its connection",
                    self.mountpoint)
        if self.device:
            kernel.abort(self.device)
        return True

    def _drop_if_ended(self, poller: select.poll) -> None:
        """Drop the attached server if its process has ended though its connection is still
        open (see the module docstring): a successor may take over."""
        if self.server is not None and self.process and process_ended(self.process):
            log.warning("strata fuse keeper: pid %d serving %s has ended, though its connection is still open "
                        "(a thread of it waits in the kernel)", self.server_pid, self.mountpoint)
            self._server_ended(poller)

    def _check_server(self, poller: select.poll) -> bool:
        """Look at the attached server (after its messages were read): ended, it is dropped;
        silent past the bound, the mount ends. False if the keeper ends."""
        self._drop_if_ended(poller)
        if self.server is None:
            return True
        bound = max(self.resume_timeout, UNRESPONSIVE_MIN, 5 * (self.heartbeat or 0.0))
        silent = time.monotonic() - self.last_sign
        if self.heartbeat is not None and silent > bound:
            log.error("strata fuse keeper: pid %d serving %s gave no sign of life for %.0fs (stopped or hung); "
                      "ending the mount (readers get an error)", self.server_pid, self.mountpoint, silent)
            self._end_connection()
            return False
        return True

    def _accept(self, poller: select.poll) -> bool:
        """Hand the descriptor to a new server; False if the mount is gone (the keeper ends)."""
        conn, _ = self.listener.accept()
        conn.settimeout(ATTACH_TIMEOUT)
        try:
            hello = json.loads(conn.recv(MAX_MESSAGE) or b"{}")
            if not isinstance(hello, dict):
                raise ValueError(f"a hello is a JSON object, not {hello!r:.100}")
            if hello.get("end") is True:
                log.info("strata fuse keeper: asked to end %s (unpublished); ending its connection", self.mountpoint)
                self.ender = conn  # closed when this keeper has ended
                self._end_connection()
                return False
            self._drop_if_ended(poller)
            if self.unserved() and self._unmounted():
                conn.sendall(json.dumps({"gone": True}).encode())
                conn.close()
                return False
            if self.server is not None:
                conn.sendall(json.dumps({"error": f"{self.mountpoint} is already a Strata mount, served by pid "
                                                  f"{self.server_pid}; unmount it first: fusermount3 -u "
                                                  f"{self.mountpoint}"}).encode())
                conn.close()
                return True
            # Recorded first: whoever sees the new server serve finds it named here.
            write_json(self.state / KEEPER, {"keeper_pid": os.getpid(), "server_pid": int(hello.get("pid", 0)),
                                             "device": self.device})
            socket.send_fds(conn, [json.dumps({"ok": True}).encode()], [self.fd])
        except (OSError, ValueError) as exc:
            log.warning("strata fuse keeper: a server's request failed: %s", exc)
            conn.close()
            return True
        conn.settimeout(None)
        self.server, self.server_pid, self.process = conn, int(hello.get("pid", 0)), peer_pid(conn)
        self.resume_timeout = float(hello.get("resume_timeout", self.resume_timeout))
        heartbeat = hello.get("heartbeat")
        self.heartbeat = None
        if isinstance(heartbeat, (int, float)) and not isinstance(heartbeat, bool) and heartbeat > 0:
            self.heartbeat = float(heartbeat)
        self.last_sign = time.monotonic()
        self.must_say_serving = "version" in hello
        self.serving = self.stopping = False
        self.inbox = b""
        poller.register(conn, select.POLLIN)
        log.info("strata fuse keeper: pid %d serves %s", self.server_pid, self.mountpoint)
        return True

    def _from_server(self, poller: select.poll) -> None:
        assert self.server is not None
        try:
            data = self.server.recv(MAX_MESSAGE)
        except OSError:
            data = b""
        if data:
            self.last_sign = time.monotonic()
            *lines, self.inbox = (self.inbox + data).split(b"\n")
            for line in lines:
                if line == b"serving":
                    self.serving, self.deadline = True, None
                elif line == b"stop":
                    self.stopping = True
            return
        self._server_ended(poller)

    def _server_ended(self, poller: select.poll) -> None:
        assert self.server is not None
        poller.unregister(self.server)
        self.server.close()
        self.server, self.process, self.heartbeat = None, 0, None
        if self.stopping:
            # Unmounted on purpose: nobody resumes it. Files still open through a lazily detached
            # mount would wait for answers that never come: end the connection.
            log.info("strata fuse keeper: pid %d stopped serving %s", self.server_pid, self.mountpoint)
            if self.device:
                kernel.abort(self.device)
            return
        if self.deadline is None:
            self.deadline = time.monotonic() + self.resume_timeout
        log.warning("strata fuse keeper: pid %d serving %s ended; readers wait up to %.0fs for a new `strata fuse %s`",
                    self.server_pid, self.mountpoint, max(0.0, self.deadline - time.monotonic()), self.mountpoint)

    def _end_connection(self) -> None:
        """End the connection (every waiting reader gets an error) and unmount."""
        if self.device:
            kernel.abort(self.device)
        os.close(self.fd)  # the last descriptor: the kernel ends the connection if abort could not
        entry = find_mount(self.mountpoint)
        if entry is None or entry.device != self.device:
            return  # unmounted already (another mount there is not this keeper's)
        try:
            unmount(self.mountpoint, lazy=True)
        except Exception as exc:  # noqa: BLE001 - nothing left to do but say so
            log.error("strata fuse keeper: %s", exc)

    def cleanup(self) -> None:
        shutil.rmtree(self.state, ignore_errors=True)  # first: a client refused finds it gone
        self.listener.close()
        if self.ender is not None:
            self.ender.close()


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
