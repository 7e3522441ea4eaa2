"""Child processes that die with the harness, and waiting with deadlines.

Starting, stopping, free ports and log tails are strata.cacheserver.launcher's (the one
launcher of the repository); the harness adds the parent-death signal and its own wait."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from strata.cacheserver import launcher
from strata.cacheserver.launcher import free_port, stop, tail

__all__ = ["free_port", "spawn", "stop", "tail", "take_lock", "wait_for"]

T = TypeVar("T")


def spawn(
    argv: Sequence[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start argv in its own session, output appended to log; the kernel SIGKILLs it when the
    spawning thread goes away (so a killed harness leaves nothing behind)."""
    return launcher.start(Path(argv[0]).name, argv, log, env=env, cwd=cwd,
                          parent_death_signal=signal.SIGKILL).process


def wait_for(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
    diagnose: Callable[[], str] | None = None,
) -> T:
    """Poll `check` until it returns something truthy, and return that.

    Exceptions from `check` count as "not yet". At the deadline: TimeoutError
    naming `what`, the last exception and the output of `diagnose()`.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - reported at the deadline
            last = exc
        if time.monotonic() > deadline:
            extra = f"\nlast error: {last!r}" if last else ""
            if diagnose is not None:
                try:
                    extra += "\n" + diagnose()
                except Exception as exc:  # noqa: BLE001
                    extra += f"\n(diagnose failed: {exc!r})"
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(interval)


def take_lock(path: Path, owns: str) -> int:
    """An exclusive lock on `path` holding this pid, as an open fd (close it to release).
    RuntimeError naming the holder when another process has it; `owns` says what the
    lock protects."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        os.close(fd)
        raise RuntimeError(
            f"another e2e harness holds {path} (pid {holder or '?'}): it owns {owns}; "
            "stop it first, or point KUBECONFIG at a running cluster"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd
