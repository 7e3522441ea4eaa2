"""What a worker reads from its environment besides the servers' shared settings
(cacheserver/settings.py): how long a miss waits for the workers holding the block
(`PeerSettings`, `STRATA_WORKER_PEER_WAIT`), how long a write's calls wait for a master that
is coming back (`MasterLinkSettings`, `STRATA_WORKER_MASTER_WAIT`) and how ASYNC_THROUGH
uploads are retried and drained (`UploadSettings`, `STRATA_UPLOAD_*`), how much of its cache a
leaving worker hands off (`HandoffSettings`, `STRATA_WORKER_HANDOFF_*`). A bad value stops the
worker with an error naming the variable and the value.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from strata.contract.settings import EnvironmentSettings


class PeerSettings(EnvironmentSettings):
    """How long a miss waits for the workers holding the block; `STRATA_WORKER_PEER_WAIT`
    overrides."""

    model_config = SettingsConfigDict(env_prefix="STRATA_WORKER_", frozen=True, extra="forbid")

    # Seconds a worker that misses a block cached on another worker waits for it (the
    # master's answer where it is, then the whole block from a holder) before it fetches the
    # block from the store instead. A live holder sends a 16 MiB block from its memory or disk
    # in well under 0.5 s even on a busy node; a holder that takes longer is stopped, partitioned
    # or dying, and the store's answer is the faster one. Short, because the reader waits.
    peer_wait: float = Field(default=2.0, gt=0)


PEER_WAIT_SETTING = "STRATA_WORKER_PEER_WAIT"


class MasterLinkSettings(EnvironmentSettings):
    """How the worker's calls wait for the master; `STRATA_WORKER_MASTER_WAIT` overrides."""

    model_config = SettingsConfigDict(env_prefix="STRATA_WORKER_", frozen=True, extra="forbid")

    # Seconds a write's call to the master (prepare, commit, withdraw, locating a file to copy
    # or append to) waits for a master that cannot be reached (restarting: its process comes
    # back within seconds, its pod within a minute) before the write fails. The writer is
    # waiting: longer than a restart of the process, far below the client's patience.
    master_wait: float = Field(default=15.0, ge=0)


MASTER_WAIT_SETTING = "STRATA_WORKER_MASTER_WAIT"


class UploadSettings(EnvironmentSettings):
    """How ASYNC_THROUGH uploads are retried; `STRATA_UPLOAD_MAX_DELAY` etc. override."""

    model_config = SettingsConfigDict(env_prefix="STRATA_UPLOAD_", frozen=True, extra="forbid")

    # Seconds: the cap of the first wait after a failed try; each later cap doubles.
    base_delay: float = Field(default=0.5, ge=0)
    # Seconds: no wait is longer. Small enough that an upload follows a store's recovery
    # within a few seconds, large enough that a store down for hours sees one try per worker
    # and file every few seconds (each try itself retries a few times, retry.py).
    max_delay: float = Field(default=5.0, ge=0)
    # One try of an upload may take this long plus the file's size at `min_bytes_per_second`
    # before it is given up (and tried again): a hung store must not hold an upload forever.
    attempt_timeout: float = Field(default=60.0, gt=0)
    # Bytes a second: 1 MiB/s, far below what any store takes, so only a stalled try is cut.
    min_bytes_per_second: int = Field(default=1024 * 1024, gt=0)

    # Seconds a stopping worker (SIGTERM: a rolling update, a scale-in) goes on uploading the
    # acknowledged writes it holds before it exits. What is left stays staged and resumes when
    # a worker starts on the same staging folder. Below the pod's termination grace period
    # (30 s unless the pod says otherwise), so the kubelet does not kill an upload half done.
    drain_timeout: float = Field(default=20.0, ge=0)

    def timeout_for(self, length: int) -> float:
        """Seconds one try of an upload of `length` bytes may take."""
        return self.attempt_timeout + length / self.min_bytes_per_second


class HandoffSettings(EnvironmentSettings):
    """How much of its cache a leaving worker hands to the workers that stay;
    `STRATA_WORKER_HANDOFF_SECONDS` and `STRATA_WORKER_HANDOFF_BYTES_PER_SECOND` override."""

    model_config = SettingsConfigDict(env_prefix="STRATA_WORKER_HANDOFF_", frozen=True, extra="forbid")

    # Seconds a leaving worker spends handing off its hot blocks (beside the upload drain,
    # see UploadSettings.drain_timeout): below the pod's termination grace period (30 s unless
    # the pod says otherwise). 0 hands nothing off.
    seconds: float = Field(default=20.0, ge=0)
    # Bytes a second sent to the workers that stay, so that a hand-off leaves them room to
    # serve their readers.
    bytes_per_second: int = Field(default=256 * 1024 * 1024, gt=0)
    # Seconds a stopping worker the master does not list as leaving asks again before it takes
    # its stop for a restart: the operator tells the master of a drain as the node is
    # cordoned, which races the eviction that stops the worker. A restart waits this long
    # more (a part of the grace period); 0 asks once.
    notice_seconds: float = Field(default=3.0, ge=0)


class StatusTableSettings(EnvironmentSettings):
    """The table of statuses shared with the node's processes (worker/published.py);
    `STRATA_WORKER_STATUS_TABLE_BYTES` overrides."""

    model_config = SettingsConfigDict(env_prefix="STRATA_WORKER_STATUS_TABLE_", frozen=True, extra="forbid")

    # Bytes of shared memory the published statuses take at most (pages are taken as records
    # are written): ~150 bytes a status, so 64 MiB hold ~260,000 (half the slots). Full, the
    # worker starts an empty table and the statuses asked for again go in it. 0: no table
    # (every new process asks the worker for what it has not seen).
    bytes: int = Field(default=64 << 20, ge=0)


STATUS_TABLE_BYTES_SETTING = "STRATA_WORKER_STATUS_TABLE_BYTES"


class FolderReadaheadSettings(EnvironmentSettings):
    """How a worker fetches ahead the small files of a folder its readers open cold
    (worker/folderahead.py); `STRATA_WORKER_FOLDER_READAHEAD_FILES` etc. override."""

    model_config = SettingsConfigDict(env_prefix="STRATA_WORKER_FOLDER_READAHEAD_", frozen=True, extra="forbid")

    # Store requests the read-ahead has in flight at once, over every folder (each a whole
    # small file). Below the store connections a worker keeps, so a reader's own fetch never
    # waits for a free connection. 0 turns the read-ahead off.
    files: int = Field(default=8, ge=0)
    # Cold opens (fetched from the store for the reader) of distinct small files of one folder
    # within `window` seconds that start its read-ahead: one file read alone never does.
    trigger: int = Field(default=4, ge=1)
    # Seconds: the trigger's window; a folder whose readers open nothing for this long has its
    # read-ahead stopped.
    window: float = Field(default=10.0, gt=0)
    # Bytes the read-ahead of a folder may fetch beyond what its readers opened since it began:
    # the most it wastes when the reads stop.
    ahead_bytes: int = Field(default=64 << 20, gt=0)
    # Files larger than this (or than a block) are not fetched ahead.
    file_bytes: int = Field(default=4 << 20, gt=0)
    # Folders read ahead at once (one more waits for one of them to end).
    folders: int = Field(default=4, ge=1)
    # Share of every tier's capacity in use past which the read-ahead stops (no eviction of
    # what readers fetched to make room for what they may never read).
    room: float = Field(default=0.9, gt=0, le=1)


FOLDER_READAHEAD_FILES_SETTING = "STRATA_WORKER_FOLDER_READAHEAD_FILES"


class DataTableSettings(EnvironmentSettings):
    """The table of small files' bytes shared with the node's processes (worker/published.py);
    `STRATA_WORKER_DATA_TABLE_BYTES` overrides."""

    model_config = SettingsConfigDict(env_prefix="STRATA_WORKER_DATA_TABLE_", frozen=True, extra="forbid")

    # Bytes of shared memory the published files take at most: node RAM, charged to the
    # worker's cgroup as records are written (not reclaimable while a table is in use; size
    # the worker's memory limit for it). A training set that fits is opened by new processes
    # with no request a file; full, the worker starts an empty table and the files opened
    # again go in it. 0 (the default): no table, every open of a small file asks the worker.
    bytes: int = Field(default=0, ge=0)


DATA_TABLE_BYTES_SETTING = "STRATA_WORKER_DATA_TABLE_BYTES"
