"""How long the client waits, and what it does while a server is away: what a client process
(the fsspec client, `strata fuse`, the CLI) reads from its environment.

Every call the client makes has a deadline from here; `STRATA_CLIENT_MASTER_TIMEOUT` etc.
override the defaults (seconds throughout). A bad value raises an error naming the variable
and the value.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from strata.contract.settings import EnvironmentSettings


class ClientSettings(EnvironmentSettings):
    """The client's deadlines and patience, from `STRATA_CLIENT_<FIELD>` (e.g.
    STRATA_CLIENT_BLOCK_TIMEOUT for `block_timeout`)."""

    model_config = SettingsConfigDict(env_prefix="STRATA_CLIENT_", frozen=True, extra="forbid")

    # Seconds for one call to the master. A metadata call may wait on the store for up to
    # its deadline (STRATA_STORE_DEADLINE, 20 s), so this is longer than that.
    master_timeout: float = Field(default=30.0, gt=0)
    # Seconds one worker may take for one block, a cold fetch from the store included
    # (longer than STRATA_STORE_DEADLINE, so a hung store reaches the reader as the
    # store's error, not as a timeout); past it the next worker on the ring is asked.
    block_timeout: float = Field(default=45.0, gt=0)
    # Seconds to open a connection to a worker's data port: a live worker accepts at once.
    connect_timeout: float = Field(default=3.0, gt=0)
    # Seconds a worker may stay silent during a block read before the client checks that it
    # is alive (its /healthz); a stopped or hung worker is then skipped for the next one.
    stall_check_after: float = Field(default=2.0, gt=0)
    # Seconds a live worker takes to answer that check (its event loop answers in ms).
    liveness_timeout: float = Field(default=1.0, gt=0)
    # Seconds a worker found stalled is tried last, so the next blocks don't wait on it too.
    skip_stalled_for: float = Field(default=10.0, ge=0)
    # Seconds for master calls it answers from memory (the worker list), and for any call
    # the client has an answer to fall back on while the master is known to be away: a
    # stopped master costs a reader this long, not master_timeout.
    master_quick_timeout: float = Field(default=2.0, gt=0)
    # Seconds the client goes on with what the master last told it (the worker list, file
    # metadata it has seen) while the master cannot be reached: open reads keep reading and
    # files already seen can be opened again. 120 s rides out a master pod's restart; it is
    # kept short because metadata that old may miss a change made in the store meanwhile
    # (as metadataSync.interval may). A read-only mount's metadata is never used past its
    # interval this way: the workers answer it from the store meanwhile. 0 turns this off.
    master_outage_grace: float = Field(default=120.0, ge=0)
    # Seconds a read waits for the master to list a live worker when it lists none: a master
    # that just restarted hears from its workers within a heartbeat or two (the workers still
    # hold their blocks); a cluster without workers fails the read after this long.
    no_workers_wait: float = Field(default=10.0, ge=0)
    # File statuses held for reuse, at most (None: HELD_METADATA_ENTRIES of client/core.py);
    # a FUSE mount holds as many as its --max-nodes.
    held_statuses: int | None = Field(default=None, ge=1)
    # Block files of the worker on this host that a process keeps open between its opens of
    # files (client/heldblocks.py), at most: an open of a file read a moment before asks the
    # worker for none of its blocks again. 0: none kept.
    held_blocks: int = Field(default=256, ge=0)
    # Seconds a kept block file is given out again (0: none kept). A kept file of a block the
    # worker has let go of since is closed within a second; the worker hears of a block in
    # use at least this often.
    held_blocks_for: float = Field(default=10.0, ge=0)
    # A folder on this host's disk where the client keeps small files' statuses and bytes for
    # the next processes of a host that runs no worker (client/nearcache.py): a new process
    # opens a warm file there with no request. Empty: none. Not used where a worker runs on
    # this host (its short-circuit tables serve the same, and the node's memory holds one copy).
    near_cache: str = ""
    # Bytes the near cache folder holds at most, across every process sharing it (1/256 of it
    # a subfolder; a file larger than that share is not kept). 4 GiB keeps ~40,000 files of
    # 100 KiB, and with it every file of up to 16 MiB fits a share.
    near_cache_bytes: int = Field(default=4 << 30, ge=1 << 20)
