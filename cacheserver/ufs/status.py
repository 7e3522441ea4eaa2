"""What a store says of its files (`UfsStatus`, `StoreTotals`), and which names in a store are
Strata's uploads under way rather than the store's files."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from strata.contract.constants import UPLOAD_DIR


@dataclass(frozen=True)
class StoreTotals:
    """How many files a store holds (below some folder), and their bytes."""

    files: int
    total_bytes: int


# Statuses a walk hands over at a time (`Store.walk_pages`): the most of a walk held as
# status objects (~300 bytes each) while its taker packs them.
WALK_PAGE = 5000

# The share of its time a walk that totals a store works (`Store.totals`): it rests the rest.
TOTALS_DUTY = 0.5


class UfsStatus(NamedTuple):
    """What a store says about one file or directory. A tuple of plain values: the master
    keeps one for every file of a listed tree, and the garbage collector stops looking at
    tuples of plain values (a collection over millions of objects would hold the master
    up for seconds)."""

    path: str  # relative to the mount's root: "" is the root, never a leading slash
    is_dir: bool
    length: int
    mtime_unix_ms: int
    # Changes whenever the content may have changed: the store's etag if it has one, else
    # f"{size}-{mtime_ns}". Empty for directories.
    version: str

    @property
    def name(self) -> str:
        """The last part of the path ("" for the root): made when asked, not kept (the master
        keeps a status of every file of a listed tree)."""
        return self.path.rpartition("/")[2]


class ListedPage(NamedTuple):
    """One page of a folder's listing (`Store.listed_from`): its files and subfolders, sorted
    by path, and whether it reaches the folder's end (no more entries after the last)."""

    statuses: list[UfsStatus]
    reaches_end: bool


def _mtime_seconds(info: Mapping[str, Any]) -> float:
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified", "created", "timeCreated"):
        value = info.get(key)
        if value is None or value == "":
            continue
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


def _size_mtime_version(length: int, mtime: float) -> str:
    return f"{length}-{int(mtime * 1e9)}"


# Names of the temporary files a file:// store's uploads are written to before their rename:
# in the store's upload folder, or (the destination on another file system) in the
# destination's own folder, named by a note in the upload folder (see `_place_local`).
_UPLOAD_TEMP_PREFIX, _UPLOAD_TEMP_SUFFIX = ".", ".tmp"
_TEMP_ELSEWHERE_PREFIX = ".strata-upload-"
_ELSEWHERE_NOTE_SUFFIX = ".elsewhere"


def _upload_rel(rel: str) -> bool:
    """Is `rel` (relative to a mount's root) in Strata's upload folder, or an upload's
    temporary file: not one of the store's files."""
    return rel == UPLOAD_DIR or rel.startswith(UPLOAD_DIR + "/") or is_upload_temp(posixpath.basename(rel))


def is_upload_temp(name: str) -> bool:
    """Is `name` (a file name) the temporary file of an upload into a folder of a file://
    store: never shown or served as a file of the store."""
    return name.startswith(_TEMP_ELSEWHERE_PREFIX) and name.endswith(_UPLOAD_TEMP_SUFFIX)
