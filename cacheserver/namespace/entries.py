"""The records of the namespace: the entry of a file or directory that clients are answered
with, and the overlay's record of a file written through Strata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class FileEntry(NamedTuple):
    """The entry of a file or directory a client is answered with: a tuple (a listing makes
    one a file, ~4 times faster than a frozen dataclass's instance)."""

    path: str  # namespace path
    name: str
    is_dir: bool
    length: int
    mtime_unix_ms: int
    version: str  # identifies the content; part of every block key; "" for directories
    block_size: int
    persisted: bool  # False while a file written through Strata is not in the store yet
    pinned: bool
    mount_id: int  # 0 for "/" and the directories that only hold mount points
    read_only: bool
    # The store's version of the object the file's bytes are read from ("" while the file
    # is not in the store): blocks are fetched from the store only while it holds this one.
    store_version: str = ""


@dataclass(frozen=True)
class OverlayEntry:
    """A file written through Strata."""

    mount_id: int
    length: int
    version: str
    mtime_unix_ms: int
    persisted: bool
    ufs_version: str | None  # the store's version of the persisted copy
    # The block size its blocks were cut with (0 in records older than this field: the
    # namespace's); a written file keeps it when the cluster's block size changes.
    block_size: int = 0
    # The namespace's generation when an ASYNC_THROUGH upload of this version was moved into
    # place in the store (0: never). A write prepared before it (`Namespace.generation`) may
    # have had its own object replaced in the store by that upload.
    landed: int = 0
