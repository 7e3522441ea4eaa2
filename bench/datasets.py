"""The benchmark's data: made once on local disk (reused by later runs while the sizes
match), uploaded to the store at the start of every run.

- Parquet datasets: two float64 columns `a` and `b`, uncompressed (so the bytes on the wire
  are the dataset's size), in parts of up to 64 MiB; the expected sum is kept with them.
- A text file of lines (wc -l style workload), with its line count.
- A folder of small files for the metadata workload.
- A training set: many files of ~100 KiB (an image dataset's shape), with their CRC-32 sum.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MiB = 1024 * 1024
PART_BYTES = 64 * MiB
ROW_BYTES = 16  # two float64 columns
LINE_CHUNK = 4 * MiB
SMALL_FILE_BYTES = 100
SAMPLE_KIB = (50, 150)  # a training sample's size range, KiB (mean ~100 KiB, as images are)
UPLOAD_BATCH = 500      # small files put at once (s3fs sends them concurrently)


@dataclass(frozen=True)
class Dataset:
    """Files under one folder of the bucket (and of the local copy)."""

    name: str        # folder, e.g. "agg-1g"
    files: tuple[str, ...]  # paths relative to the bucket root, e.g. "agg-1g/part-0000.parquet"
    bytes: int      # bytes of all its files
    nominal: int    # the size asked for (names the workload: 1g, 256m)
    expected: float  # the workload's answer: the sum of a+b, or the number of lines, or the file count


def size_label(size: int) -> str:
    for unit, factor in (("g", 1024 * MiB), ("m", MiB), ("k", 1024)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def human(size: int) -> str:
    for unit, factor in (("GiB", 1024 * MiB), ("MiB", MiB), ("KiB", 1024)):
        if size >= factor:
            return f"{size / factor:g} {unit}"
    return f"{size} B"


def _manifest_path(folder: Path) -> Path:
    """Beside the folder, not in it: the folder holds only the dataset's files."""
    return folder.parent / "manifests" / f"{folder.name}.json"


def _manifest(folder: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(_manifest_path(folder).read_text())
        return data
    except (OSError, ValueError):
        return None


def _dataset(root: Path, name: str, manifest: dict[str, Any]) -> Dataset:
    files = tuple(f"{name}/{f}" for f in manifest["files"])
    spec = manifest["spec"]
    return Dataset(name=name, files=files, bytes=sum((root / f).stat().st_size for f in files),
                   nominal=int(spec.get("size", spec.get("count", 0))), expected=float(manifest["expected"]))


def _write_manifest(folder: Path, files: list[str], expected: float, spec: dict[str, Any]) -> None:
    path = _manifest_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"files": files, "expected": expected, "spec": spec}))


def _made(root: Path, name: str, spec: dict[str, Any]) -> Dataset | None:
    """The dataset if an earlier run made it with this spec; else None, with its folder ready."""
    manifest = _manifest(root / name)
    if manifest is not None and manifest.get("spec") == spec:
        try:
            return _dataset(root, name, manifest)
        except FileNotFoundError:  # some of its files were removed since: made again
            pass
    (root / name).mkdir(parents=True, exist_ok=True)
    return None


def parquet_dataset(root: Path, name: str, size: int, seed: int = 1) -> Dataset:
    """Two float64 columns, `size` bytes of values, in 64 MiB parts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / name
    spec = {"kind": "parquet", "size": size, "seed": seed}
    if (made := _made(root, name, spec)) is not None:
        return made
    rng = np.random.default_rng(seed)
    files, total, left, index = [], 0.0, size, 0
    while left > 0:
        rows = min(PART_BYTES, left) // ROW_BYTES
        a, b = rng.random(rows), rng.random(rows)
        total += float(a.sum()) + float(b.sum())
        table = pa.table({"a": a, "b": b})
        file = f"part-{index:04d}.parquet"
        pq.write_table(table, folder / file, compression="none")
        files.append(file)
        left -= rows * ROW_BYTES
        index += 1
    _write_manifest(folder, files, total, spec)
    return _dataset(root, name, _manifest(folder) or {})


def text_dataset(root: Path, name: str, size: int, seed: int = 2) -> Dataset:
    """One file of `size` bytes: lines of 20 to 140 lowercase letters."""
    folder = root / name
    spec = {"kind": "text", "size": size, "seed": seed}
    if (made := _made(root, name, spec)) is not None:
        return made
    rng = np.random.default_rng(seed)
    lines = 0
    with (folder / "lines.txt").open("wb") as out:
        left = size
        while left > 0:
            n = min(LINE_CHUNK, left)
            chunk = rng.integers(ord("a"), ord("z") + 1, n, dtype=np.uint8)
            # newlines at random gaps of 20..140 bytes
            gaps = rng.integers(20, 141, n // 20 + 1)
            ends = np.cumsum(gaps)
            ends = ends[ends < n]
            chunk[ends] = ord("\n")
            lines += len(ends)
            out.write(chunk.tobytes())
            left -= n
    _write_manifest(folder, ["lines.txt"], float(lines), spec)
    return _dataset(root, name, _manifest(folder) or {})


def small_files_dataset(root: Path, name: str, count: int) -> Dataset:
    """`count` files of 100 bytes in one folder."""
    folder = root / name
    spec = {"kind": "small", "count": count}
    if (made := _made(root, name, spec)) is not None:
        return made
    files = []
    for i in range(count):
        file = f"f-{i:06d}.dat"
        (folder / file).write_bytes(f"{i:0{SMALL_FILE_BYTES - 1}d}\n".encode())
        files.append(file)
    _write_manifest(folder, files, float(count), spec)
    return _dataset(root, name, _manifest(folder) or {})


def training_dataset(root: Path, name: str, count: int, seed: int = 4) -> Dataset:
    """`count` files of random bytes, 50-150 KiB each; the answer is the sum of their CRC-32s."""
    folder = root / name
    spec = {"kind": "training", "count": count, "seed": seed}
    if (made := _made(root, name, spec)) is not None:
        return made
    rng = np.random.default_rng(seed)
    files, total = [], 0
    for i in range(count):
        data = rng.bytes(int(rng.integers(*SAMPLE_KIB, endpoint=True)) * 1024)
        file = f"s-{i:06d}.bin"
        (folder / file).write_bytes(data)
        total += zlib.crc32(data)
        files.append(file)
    _write_manifest(folder, files, float(total), spec)
    return _dataset(root, name, _manifest(folder) or {})


def upload(dataset: Dataset, local_root: Path, s3: Any, bucket: str) -> None:
    """Put the dataset's files into the bucket (small files in concurrent batches)."""
    if len(dataset.files) > 100:
        for i in range(0, len(dataset.files), UPLOAD_BATCH):
            batch = dataset.files[i:i + UPLOAD_BATCH]
            s3.pipe({f"{bucket}/{f}": (local_root / f).read_bytes() for f in batch})
        return
    for f in dataset.files:
        s3.put_file(str(local_root / f), f"{bucket}/{f}")
