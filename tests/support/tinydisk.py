"""A real, tiny file system for tests of a full disk: a tmpfs of a given size mounted on a
fresh temporary folder, unmounted and removed when the `with` block ends, also on failure.

    with tiny_disk("64m") as root:
        ... write under root until ENOSPC ...

Needs the right to mount (root, or a user namespace that allows tmpfs); `pytest.skip`s with
the reason otherwise.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tiny_disk(size: str) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="strata-tiny-disk-"))
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
