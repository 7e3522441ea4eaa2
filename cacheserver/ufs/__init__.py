"""The under file system: one `Store` per mount, over any fsspec filesystem.

A Store turns a mount's source URL (`s3://bucket/prefix`, `file:///dir`, `memory://name`,
`gcs://...`) and its options into async calls on paths relative to that source. Every call
goes through `retry.call_with_backoff`, retrying only transient failures (connection errors,
timeouts, 5xx answers, throttling), within one deadline per operation (`StoreTimeouts`, a server setting); a
missing object, a missing bucket or refused credentials become `NotFound` /
`PermissionDenied` at once, with a message a person can act on.

Async filesystems (s3fs, gcsfs, ...) run on the caller's event loop with one session per
Store; blocking ones (file://, memory://) run in a worker thread. Each Store owns its
filesystem instance (fsspec's instance cache is skipped), so two mounts with different
credentials never share a client, and the library's own retry loops are switched off so
that the one retry helper decides.

Layers, each importing only those below it (an import-linter contract keeps them):
`store` (the facade, `Store`) > `local` (file://, with its confinement) | `s3` (conditional
reads, multipart uploads, server-side copies) > `generic` (any fsspec filesystem, the base of
both) > `localfiles` (blocking file:// helpers on checked descriptors) > `calls` (threads,
retries, deadlines, stalls, store metrics) > `errors` (the one translation table) |
`options` (sources, storage options) | `status` (what a store answers).
"""

from .calls import STORE_THREADS, Progress, StoreThreads
from .errors import VersionChanged
from .local import check_source_allowed
from .options import filesystem_class, is_local, storage_options, supported_protocols
from .status import TOTALS_DUTY, WALK_PAGE, ListedPage, StoreTotals, UfsStatus, is_upload_temp
from .store import Store

__all__ = [
    "STORE_THREADS",
    "TOTALS_DUTY",
    "WALK_PAGE",
    "ListedPage",
    "Progress",
    "Store",
    "StoreThreads",
    "StoreTotals",
    "UfsStatus",
    "VersionChanged",
    "check_source_allowed",
    "filesystem_class",
    "is_local",
    "is_upload_temp",
    "storage_options",
    "supported_protocols",
]
