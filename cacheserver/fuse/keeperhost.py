"""`strata fuse-holder`: the per-node process whose children are the keepers of FUSE mounts.

A keeper (mountkeeper.py) keeps a mount alive while its server is gone, but only while the keeper
itself lives. A keeper started by `strata fuse` lives where that process lives: in a
Kubernetes CSI node plugin's container, which a deleted plugin pod or a `helm upgrade`
ends with every process in it, keepers included, and with them every volume of the node. So
the chart runs the holder in a pod of its own that upgrades never replace, and the node
plugin's `strata fuse` processes hand it their new mounts: with `STRATA_FUSE_HOLDER=<socket>`
set, `strata fuse` mounts, then sends the holder the mount's /dev/fuse descriptor instead of
starting a keeper itself; the holder starts the keeper (its child, reaped by it) and answers
once the keeper listens. From then on the server and its successors speak to the keeper as
usual, through the state folder (`keeper.sock`), which both pods see at the same path.

Protocol on the holder's socket (default `<state root>/holder.sock`, mode 0600: root only):
one JSON line `{"version": 1, "mountpoint": M, "state": S, "resume_timeout": T}` with the
descriptor attached (SCM_RIGHTS); the answer is one JSON line, `{"ok": true, "pid": P}` or
`{"error": "..."}`. Unknown fields are ignored (a newer client still gets its keeper). A
request is at most MAX_MESSAGE bytes and must arrive within REQUEST_TIMEOUT; the state folder
must be inside the holder's state root (a keeper removes its state folder when it ends).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.contract.errors import StrataError, Unavailable
from . import mountkeeper
from .settings import DEFAULT_HOLDER_WAIT, HOLDER_ENV, fuse_environment

log = logging.getLogger("strata.fuse.holder")

SOCKET = "holder.sock"
VERSION = 1
MAX_MESSAGE = 4096
# Seconds a client has to send its request once connected.
REQUEST_TIMEOUT = 10.0
# Seconds a client waits for the answer (the keeper is a new Python process).
START_TIMEOUT = 30.0
WAIT_INTERVAL = 0.5
# Seconds between looks for keepers that ended.
REAP_INTERVAL = 1.0
# /dev/fuse: character device 10:229.
FUSE_DEVICE = (10, 229)


def default_socket() -> Path:
    return fuse_environment().state_root() / SOCKET


class RequestError(Exception):
    """A request the holder refuses (the message is the answer's error)."""


@dataclass(frozen=True)
class Request:
    mountpoint: Path
    state: Path
    resume_timeout: float


def read_line(conn: socket.socket, limit: int = MAX_MESSAGE) -> tuple[bytes, list[int]]:
    """One line (without its newline) and the descriptors that came with it; RequestError if
    it is longer than `limit` or the peer ends before the newline."""
    data, fds = b"", []
    while b"\n" not in data:
        chunk, more, _, _ = socket.recv_fds(conn, limit + 1 - len(data), 1)
        fds += more
        if not chunk:
            for fd in fds:
                os.close(fd)
            raise RequestError("the request ended before its newline" if data else "empty request")
        data += chunk
        if b"\n" not in data and len(data) > limit:
            for fd in fds:
                os.close(fd)
            raise RequestError(f"request longer than {limit} bytes")
    return data.split(b"\n", 1)[0], fds


def parse_request(line: bytes, root: Path) -> Request:
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise RequestError(f"not a JSON request: {exc}") from None
    if not isinstance(value, dict):
        raise RequestError("the request is not a JSON object")
    mountpoint, state, timeout = value.get("mountpoint"), value.get("state"), value.get("resume_timeout")
    if not isinstance(mountpoint, str) or not mountpoint.startswith("/"):
        raise RequestError(f"mountpoint must be an absolute path, not {mountpoint!r}")
    if not isinstance(state, str) or not state.startswith("/"):
        raise RequestError(f"state must be an absolute path, not {state!r}")
    if Path(os.path.normpath(state)).parent != root:
        raise RequestError(f"state {state} is not a folder of this holder's state root {root}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < 86400:
        raise RequestError(f"resume_timeout must be seconds (0 < s < 86400), not {timeout!r}")
    return Request(Path(os.path.normpath(mountpoint)), Path(os.path.normpath(state)), float(timeout))


def is_fuse_device(fd: int) -> bool:
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == FUSE_DEVICE


class Holder:
    def __init__(self, path: Path, root: Path) -> None:
        self.path = path
        self.root = root
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.keepers: dict[int, Path] = {}
        self.lock = threading.Lock()

    def listen(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path.unlink(missing_ok=True)
        self.listener.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self.listener.listen(16)
        self.listener.settimeout(REAP_INTERVAL)

    def serve(self, stop: threading.Event) -> None:
        """Answer requests (each in a thread of its own) and reap ended keepers until `stop`."""
        while not stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                conn = None
            except OSError as exc:
                if stop.is_set():
                    break
                log.warning("strata fuse-holder: accept failed: %s", exc)
                time.sleep(WAIT_INTERVAL)
                conn = None
            if conn is not None:
                threading.Thread(target=self.handle, args=(conn,), name="strata-fuse-holder-request",
                                 daemon=True).start()
            self.reap()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(REQUEST_TIMEOUT)
            reply = self.answer(conn)
            try:
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError as exc:
                log.warning("strata fuse-holder: could not answer %s: %s", reply, exc)

    def answer(self, conn: socket.socket) -> dict[str, Any]:
        fds: list[int] = []
        try:
            line, fds = read_line(conn)
            if not line.strip() and not fds:  # a client looking whether the holder listens
                return {"ok": True}
            request = parse_request(line, self.root)
            if len(fds) != 1:
                raise RequestError(f"the request for {request.mountpoint} came with {len(fds)} descriptors, "
                                   "not its /dev/fuse descriptor")
            if not is_fuse_device(fds[0]):
                raise RequestError(f"the descriptor sent for {request.mountpoint} is not /dev/fuse")
            pid = mountkeeper.start(fds[0], request.state, request.mountpoint, request.resume_timeout)
        except RequestError as exc:
            log.warning("strata fuse-holder: refused a request: %s", exc)
            return {"error": str(exc)}
        except (StrataError, OSError) as exc:  # the keeper did not start, or the request did not come whole
            log.error("strata fuse-holder: %s", exc)
            return {"error": str(exc)}
        finally:
            for fd in fds:
                os.close(fd)
        with self.lock:
            self.keepers[pid] = request.mountpoint
        log.info("strata fuse-holder: keeper %d holds %s", pid, request.mountpoint)
        return {"ok": True, "pid": pid}

    def reap(self) -> list[int]:
        """Collect the keepers that ended; their pids."""
        ended = []
        for pid, status in self._exited():
            with self.lock:
                mountpoint = self.keepers.pop(pid, None)
            if mountpoint is not None:
                log.info("strata fuse-holder: keeper %d of %s ended (%s)", pid, mountpoint, describe_status(status))
                ended.append(pid)
        return ended

    def _exited(self) -> list[tuple[int, int]]:
        """(pid, wait status) of the children that ended. As a container's first process the
        holder collects every orphan of the container too; elsewhere only its keepers."""
        found = []
        if os.getpid() == 1:
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if not pid:
                    break
                found.append((pid, status))
            return found
        with self.lock:
            pids = list(self.keepers)
        for pid in pids:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # already collected
                done, status = pid, 0
            if done:
                found.append((pid, status))
        return found

    def close(self) -> None:
        self.listener.close()
        self.path.unlink(missing_ok=True)


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit {os.waitstatus_to_exitcode(status)}"


def run_holder(path: Path | None = None) -> int:
    """Serve until SIGTERM/SIGINT. The keepers keep running after the holder ends on a host;
    in a container they end with it (so the chart never replaces the holder's pod)."""
    root = fuse_environment().state_root()
    holder = Holder(path or default_socket(), root)
    holder.listen()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    log.info("strata fuse-holder: listening on %s (state root %s)", holder.path, root)
    try:
        holder.serve(stop)
    finally:
        holder.close()
        log.info("strata fuse-holder: stopped; %d keeper(s) left running", len(holder.keepers))
    return 0


# -- the client's side (`strata fuse`) ------------------------------------------------------------


def _connect(path: Path, wait: float) -> socket.socket:
    """A connection to the holder at `path`, waiting up to `wait` seconds for it to listen."""
    deadline = time.monotonic() + wait
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(REQUEST_TIMEOUT)
        try:
            sock.connect(str(path))
            return sock
        except OSError as exc:
            sock.close()
            if time.monotonic() >= deadline:
                raise Unavailable(
                    f"the FUSE holder is not reachable at {path} ({HOLDER_ENV}) after {wait:.0f}s: {exc}; is "
                    f"`strata fuse-holder` running on this node (the chart's fuse-holder pod)?") from None
        time.sleep(WAIT_INTERVAL)


def wait_ready(path: Path, wait: float = DEFAULT_HOLDER_WAIT) -> None:
    """Return once the holder at `path` listens; Unavailable after `wait` seconds."""
    with _connect(path, wait) as sock:
        sock.sendall(b"\n")
        _reply(sock, path)


def _reply(sock: socket.socket, path: Path) -> dict[str, Any]:
    try:
        line, fds = read_line(sock)
    except (OSError, RequestError) as exc:
        raise Unavailable(f"the FUSE holder at {path} did not answer: {exc}") from None
    for fd in fds:
        os.close(fd)
    try:
        reply = json.loads(line)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise Unavailable(f"the FUSE holder at {path} answered {line[:200]!r}")
    return reply


def start_keeper(path: Path, fd: int, state: Path, mountpoint: Path, resume_timeout: float,
                 wait: float = DEFAULT_HOLDER_WAIT) -> int:
    """Have the holder at `path` start the keeper of the new mount (descriptor `fd`); its pid
    once it listens."""
    request = {"version": VERSION, "mountpoint": str(mountpoint), "state": str(state),
               "resume_timeout": resume_timeout}
    with _connect(path, wait) as sock:
        sock.settimeout(START_TIMEOUT)
        try:
            socket.send_fds(sock, [json.dumps(request).encode() + b"\n"], [fd])
        except OSError as exc:
            raise Unavailable(f"could not send the mount of {mountpoint} to the FUSE holder at {path}: {exc}") from None
        reply = _reply(sock, path)
    if "error" in reply or not isinstance(reply.get("pid"), int):
        raise Unavailable(f"the FUSE holder at {path} could not keep {mountpoint}: "
                          f"{reply.get('error', f'it answered {reply}')}")
    return int(reply["pid"])

