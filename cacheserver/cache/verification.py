"""Reading a block file and checking its bytes against the CRC-32C checksums in its sidecar:
a chunk-aligned span, a whole file behind a descriptor, or a span through a map of the file
(left in the page cache for a sender). Blocking: the store runs these in threads."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from .metadata import BlockMetadata


def _pread_exactly(fd: int, start: int, nbytes: int) -> bytes:
    """Up to `nbytes` from `start`; shorter only at the end of the file."""
    data = os.pread(fd, nbytes, start)
    if len(data) == nbytes or not data:
        return data
    parts = [data]
    got = len(data)
    while got < nbytes:
        more = os.pread(fd, nbytes - got, start + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def read_chunks(path: Path, meta: BlockMetadata, start: int, stop: int) -> tuple[bytes, int | None]:
    """Bytes [start, stop) (chunk-aligned) of a block file and the first bad chunk, if any."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = _pread_exactly(fd, start, stop - start)
    finally:
        os.close(fd)
    if len(data) < stop - start:
        return data, (start + len(data)) // meta.chunk_size
    return data, meta.bad_chunk(data, start)


def verify_fd(fd: int, meta: BlockMetadata) -> str | None:
    """What is wrong with the whole block behind `fd`, or None."""
    data = _pread_exactly(fd, 0, meta.length + 1)
    if len(data) != meta.length:
        return f"file has {len(data)} bytes, expected {meta.length}"
    bad = meta.bad_chunk(data, 0)
    return None if bad is None else f"chunk {bad} failed its CRC-32C check"


def check_span(fd: int, meta: BlockMetadata, start: int, stop: int) -> str | None:
    """What is wrong with the chunk-aligned bytes [start, stop) of the block file behind `fd`,
    or None. Reads them through a map of the file: no copy, and they stay in the page cache
    for the sender."""
    if start >= stop:
        return None
    size = os.fstat(fd).st_size
    if size != meta.length:  # a map past the end of a file faults on access
        return f"file has {size} bytes, expected {meta.length}"
    with mmap.mmap(fd, meta.length, prot=mmap.PROT_READ) as mapped:
        view = memoryview(mapped)
        try:
            bad = meta.bad_chunk(view[start:stop], start)
        finally:
            view.release()
    return None if bad is None else f"chunk {bad} failed its CRC-32C check"
