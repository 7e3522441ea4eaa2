"""A real, tiny file system for tests of a full disk: a tmpfs of a given size mounted on a
fresh temporary folder, unmounted and removed when the `with` block ends, also on failure.

    with tiny_disk("64m") as root:
        ... write under root until ENOSPC ...
        with filled(root):
            ... every write under root fails with ENOSPC ...

Needs the right to mount (root, or a user namespace that allows tmpfs); `pytest.skip`s with
the reason otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tiny_disk(size: str, within: Path | None = None) -> Iterator[Path]:
    """A tmpfs of `size` on a new folder of `within` (default: the system's temporary folder)."""
    root = Path(tempfile.mkdtemp(prefix="strata-tiny-disk-", dir=within))
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(root)],
                                 capture_output=True, text=True, timeout=30)
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a {size} tmpfs: {mounted.stderr.strip() or mounted.returncode}")
        try:
            yield root
        finally:
            subprocess.run(["umount", "-l", str(root)], check=True, timeout=30)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def filled(root: Path) -> Iterator[None]:
    """Fill the file system of `root` to the last byte while the `with` block runs; the
    filler file is removed when it ends."""
    filler = root / ".filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        yield
    finally:
        os.close(fd)
        filler.unlink()
