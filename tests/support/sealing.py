"""What a reader handed a descriptor of a node table (a sealed memfd) may do with it: map it
to read, and nothing that writes."""

from __future__ import annotations

import mmap
import os

import pytest


def assert_no_reader_can_write(fd: int) -> None:
    """Neither `fd` nor the same memory opened again for writing lets its holder change it."""
    size = os.fstat(fd).st_size
    with pytest.raises(PermissionError):
        mmap.mmap(fd, size)  # shared and writable: refused
    with pytest.raises(OSError):
        os.write(fd, b"x")
    again = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)  # opened again for writing: sealed still
    try:
        with pytest.raises(PermissionError):
            mmap.mmap(again, size)
        with pytest.raises(PermissionError):
            os.pwrite(again, b"x", 0)
    finally:
        os.close(again)
