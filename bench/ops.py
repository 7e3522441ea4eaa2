"""What a user does with the data: the timed operations, shared by the in-process runs and
the reader processes of the sharing workload. Each returns the workload's answer so the run
can check that every contestant read the right bytes."""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from typing import Any

from contestants import open_binary

# One read call of the line counter (`wc -l` reads 128 KiB; a larger read keeps Python's
# per-call cost out of the numbers).
READ_CHUNK = 1024 * 1024


def aggregate(fs: Any, paths: Sequence[str]) -> float:
    """Read columns a and b of a Parquet dataset and sum them."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(list(paths), filesystem=fs, columns=["a", "b"])
    return float(pc.sum(table["a"]).as_py()) + float(pc.sum(table["b"]).as_py())


def count_lines(fs: Any, path: str) -> float:
    """Count newlines in one file, read front to back by one thread."""
    lines = 0
    with open_binary(fs, path) as f:
        while chunk := f.read(READ_CHUNK):
            lines += chunk.count(b"\n")
    return float(lines)


def list_and_stat(fs: Any, folder: str) -> float:
    """List a folder of small files, then stat each; returns how many files it saw."""
    if fs is None:
        with os.scandir(folder) as entries:
            paths = [e.path for e in entries if not e.name.startswith(".")]
        sizes = [os.stat(p).st_size for p in paths]
        return float(len(sizes))
    names = [e["name"] for e in fs.ls(folder, detail=True) if e["type"] == "file"]
    sizes = [fs.info(name)["size"] for name in names]
    return float(len(sizes))


def read_files(fs: Any, paths: Sequence[str]) -> float:
    """Read each file whole, as a training loader reads samples; returns the sum of their
    CRC-32s (the dataset's answer when every byte is right)."""
    total = 0
    for path in paths:
        with open_binary(fs, path) as f:
            total += zlib.crc32(f.read())
    return float(total)


def stat_files(fs: Any, paths: Sequence[str]) -> float:
    """Stat each path (os.stat, or the filesystem's info); returns how many were files."""
    if fs is None:
        return float(sum(1 for p in paths if os.stat(p).st_size >= 0))
    return float(sum(1 for p in paths if fs.info(p)["type"] == "file"))


def find_files(fs: Any, paths: Sequence[str]) -> float:
    """Every file below paths[0], as the filesystem's find lists them; returns how many."""
    return float(len(fs.find(paths[0])))


def run_op(name: str, fs: Any, paths: Sequence[str]) -> float:
    if name == "stat_files":
        return stat_files(fs, paths)
    if name == "find":
        return find_files(fs, paths)
    if name == "read_files":
        return read_files(fs, paths)
    if name == "aggregate":
        return aggregate(fs, paths)
    if name == "count_lines":
        return count_lines(fs, paths[0])
    if name == "list_and_stat":
        return list_and_stat(fs, paths[0])
    raise ValueError(f"unknown operation {name!r}")


def check(name: str, got: float, expected: float, who: str) -> None:
    """Raise if a contestant's answer is not the dataset's."""
    ok = abs(got - expected) <= 1e-9 * max(1.0, abs(expected)) if name == "aggregate" else got == expected
    if not ok:
        raise AssertionError(f"{who}: {name} returned {got!r}, expected {expected!r}: it read the wrong bytes")
