"""The settings of a FUSE mount's process (`strata fuse`): what it shows and how."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from strata.contract.proto import strata_pb2 as pb

# Files of a read-only mount read at once whose client file objects are kept (see read_at).
DEFAULT_READERS = 256
# A mount point over no Strata mount (yet): check again after this long.
DEFAULT_ATTR_TIMEOUT = 1.0


@dataclass(frozen=True)
class FuseSettings:
    root: str = "/"             # namespace path shown at the mount point
    read_only: bool = False     # refuse every change with EROFS
    write_type: pb.WriteType.ValueType = pb.WRITE_TYPE_UNSPECIFIED  # of files written; unspecified: the mount's
    attr_timeout: float = DEFAULT_ATTR_TIMEOUT  # seconds metadata is reused (kernel and here)
    spool_dir: str | None = None  # where written files are buffered; None: the temp directory
    handles_dir: Path | None = None  # what each read handle reads, for a successor (handles.ReadRecords)
    readers: int = DEFAULT_READERS  # client file objects kept for files the kernel opened without asking
