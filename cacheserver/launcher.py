"""Server processes started, awaited and stopped one way: by `strata local up/down`, the
integration tests, the benchmark, the demo and the e2e harness.

    child = launcher.start("master", launcher.strata_argv("master", ...), logs / "master.log", env=env)
    launcher.wait_ready([(child, lambda: launcher.http_ok(port), f"it answers /healthz on port {port}")], timeout=60)
    ...
    child.stop()

A child runs in a session of its own, so a signal to its process group reaches everything it
started in that group and nothing of its parent's (nor the terminal's Ctrl-C). Its stdin is
closed and its stdout and stderr are appended to its log file; with `stdout_pipe` its stdout
is a pipe instead, for a child that prints `PORT <n>` once it listens (`Child.read_port`).
Waiting has a deadline, and the error names the process, what it waited for and the last
lines of its log; a child that does not get ready is stopped. Stopping sends SIGTERM to the
group, SIGKILL to whatever of the group is left after a grace period, and reaps the child.

Standard library only: the e2e harness, the benchmark and the scripts import it too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

# Seconds a stopped child has between SIGTERM and SIGKILL, and then to be reaped.
STOP_GRACE = 10.0
REAP_TIMEOUT = 10.0
# Log lines an error shows.
TAIL_LINES = 20
# Seconds between two looks at a ready condition.
POLL_INTERVAL = 0.1

_PR_SET_PDEATHSIG = 1


class LaunchError(RuntimeError):
    """A child exited or did not get ready in time; the message names it and shows its log."""


@dataclass
class Child:
    """A started process: its name (for messages), the process and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = TAIL_LINES) -> str:
        return tail(self.log, lines)

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the child's process group (nothing when it is gone)."""
        signal_group(self.process.pid, sig)

    def wait_ready(self, ready: Callable[[], object], until: str, timeout: float) -> None:
        wait_ready([(self, ready, until)], timeout)

    def read_port(self, timeout: float) -> int:
        """The port the child prints as its first line on stdout, `PORT <n>` (started with
        `stdout_pipe`). LaunchError, the child stopped, when it exits, prints something else
        or says nothing within `timeout` seconds."""
        stdout = self.process.stdout
        assert stdout is not None, f"{self.name} was started without stdout_pipe"
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            if not self.alive():
                self._fail(f"exited with code {self.process.returncode} before it printed its port")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(f"did not print its port within {timeout:.0f}s")
            readable, _, _ = select.select([stdout], [], [], min(remaining, 0.5))
            if readable:
                chunk = os.read(stdout.fileno(), 1)
                if not chunk:  # stdout closed: the exit shows on the next look
                    time.sleep(POLL_INTERVAL)
                line += chunk
        match = re.fullmatch(rb"PORT (\d+)\s*", line)
        if match is None:
            self._fail(f"printed {line!r} instead of `PORT <n>`")
        return int(match.group(1))

    def stop(self, grace: float = STOP_GRACE, sig: int = signal.SIGTERM) -> int | None:
        """`sig` (SIGTERM) to the group, SIGKILL to what is left of it after `grace` seconds;
        the child's exit code (None: not reaped even after SIGKILL)."""
        code = stop(self.process, grace, sig)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code

    def _fail(self, what: str) -> NoReturn:
        self.stop()
        raise LaunchError(f"{self.name} {what}\n{self.name}'s log, {self.log}:\n{self.tail()}")


def start(name: str, argv: Sequence[str], log: Path, *, env: Mapping[str, str] | None = None,
          cwd: Path | None = None, stdout_pipe: bool = False,
          parent_death_signal: int | None = None) -> Child:
    """Start argv in a session of its own, its output appended to `log`. `env` None: this
    process's environment. With `parent_death_signal` the kernel sends the child that signal
    when the thread that started it ends (a killed harness leaves nothing behind)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if stdout_pipe else out,
            stderr=out, env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
            preexec_fn=_death_signal(parent_death_signal) if parent_death_signal is not None else None,
        )
    return Child(name, process, log)


def _death_signal(sig: int) -> Callable[[], None]:
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: no dlopen between fork and exec

    def arm() -> None:  # in the child, after setsid and before exec
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return arm


def strata_argv(*args: str) -> list[str]:
    """`strata ARGS` as this interpreter runs it (-P: the repository's operator/ folder must
    not shadow the standard library's `operator`)."""
    return [sys.executable, "-P", "-m", "strata.cacheserver", *args]


def wait_ready(waits: Sequence[tuple[Child, Callable[[], object], str]], timeout: float) -> None:
    """Poll each child's ready condition until all hold, with one deadline for all. Each wait
    is (child, condition, what the condition means: "it answers /healthz on port 8081").
    LaunchError, every child of `waits` stopped, when one exits first or the deadline passes."""
    pending = list(waits)
    deadline = time.monotonic() + timeout
    try:
        while pending:
            for wait in list(pending):
                child, ready, until = wait
                if not child.alive():
                    raise LaunchError(f"{child.name} exited with code {child.process.returncode} while starting "
                                      f"(waiting until {until})\n{child.name}'s log, {child.log}:\n{child.tail()}")
                if ready():
                    pending.remove(wait)
            if not pending:
                return
            if time.monotonic() > deadline:
                late = pending[0][0]
                raise LaunchError(
                    f"{', '.join(c.name for c, _, _ in pending)} did not get ready within {timeout:.0f}s "
                    f"(waiting until {'; '.join(u for _, _, u in pending)})\n{late.name}'s log, {late.log}:\n{late.tail()}")
            time.sleep(POLL_INTERVAL)
    except BaseException:
        for child, _, _ in waits:
            child.stop()
        raise


def stop(process: subprocess.Popen[bytes], grace: float = STOP_GRACE, sig: int = signal.SIGTERM) -> int | None:
    """`sig` to the process group of a child started in its own session (when the child still
    runs), SIGKILL to the group after `grace` seconds (also when the child is gone: what it
    left in its group goes too), then reap it. Its exit code; None if it would not go."""
    if process.poll() is None:
        signal_group(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
    signal_group(process.pid, signal.SIGKILL)
    try:
        return process.wait(timeout=REAP_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None


def stop_groups(pids: Iterable[int], grace: float = STOP_GRACE) -> list[int]:
    """Stop process groups led by processes that are not our children (started by an earlier
    command; their pids kept in a file): SIGTERM to each group, SIGKILL to the groups whose
    leader is still there after `grace` seconds. Returns the pids that were there to stop."""
    signalled = [pid for pid in pids if signal_group(pid, signal.SIGTERM)]
    deadline = time.monotonic() + grace
    for pid in signalled:
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.05)
        if pid_alive(pid):
            signal_group(pid, signal.SIGKILL)
    return signalled


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False when it is gone (or not ours to signal)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def pid_alive(pid: int) -> bool:
    """Whether a process runs under that pid (a zombie child of ours counts as gone: it is
    reaped here)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def http_ok(port: int, path: str = "/healthz", host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    """Whether http://host:port/path answers 200 (a server's ready condition)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(f"  | {line}" for line in text[-lines:])
