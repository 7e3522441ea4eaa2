"""Give the C allocator's free memory back to the system after a large, short-lived use.

A walk of a large tree makes millions of short-lived objects; once they are freed, glibc's
allocator keeps the pages they sat on for reuse, so the process's resident size stays at the
walk's peak though it holds far less (measured: 182 B a file resident after a walk of 200,000
files where 84 are held; 131 after a trim). `trim` asks glibc to return what it can
(`malloc_trim`); with another C library it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def trim() -> bool:
    """Return the allocator's free pages to the system (the call releases the GIL and may take
    milliseconds on a large heap: call it off the event loop); False if it cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
