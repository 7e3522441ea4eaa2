"""What every server process (master, worker) reads: the file `strata.yaml` (its schema,
which the operator renders too, is strata.contract.config) and its environment (`STRATA_*`),
each concern its own model: who and where the server is (`ServerEnvironment`), how long a
store may take (`StoreTimeouts`, `STRATA_STORE_*`) and how its calls are retried
(`RetrySettings`, `STRATA_RETRY_*`). Settings of one process kind live with it:
worker/settings.py (`STRATA_WORKER_*`, `STRATA_UPLOAD_*`), client/settings.py
(`STRATA_CLIENT_*`), operator/settings.py (`STRATA_OPERATOR_*`). The master has none of its
own. A bad value stops the process with an error naming the variable and the value
(strata.contract.settings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from strata.contract.config import ServerConfig
from strata.contract.errors import InvalidArgument
from strata.contract.settings import EnvironmentSettings
from .retry import DEFAULT_ATTEMPTS, DEFAULT_BASE_DELAY, DEFAULT_MAX_DELAY


class ServerEnvironment(EnvironmentSettings):
    """What a server reads from its environment. In Kubernetes the operator sets these in
    the pod spec; an empty variable counts as unset."""

    model_config = SettingsConfigDict(env_prefix="STRATA_", frozen=True, extra="forbid", env_ignore_empty=True)

    # Overrides of strata.yaml's blockSize (a size such as 16Mi) and masterAddress (host:port).
    block_size: str = ""
    master: str = ""
    # The node the worker runs on, what locality means: STRATA_NODE_NAME (the pod's
    # spec.nodeName), else STRATA_HOSTNAME, else this host's name.
    node_name: str = ""
    hostname: str = ""
    # The host part of the address clients and peers dial: STRATA_ADVERTISE_HOST, else
    # STRATA_POD_IP, else 127.0.0.1 (a worker on this machine only).
    advertise_host: str = ""
    pod_ip: str = ""
    # The worker's stable name: STRATA_WORKER_ID, else STRATA_POD_NAME, else node:port.
    worker_id: str = ""
    pod_name: str = ""
    # The folder of the short-circuit sockets as readers on the node see it (its host path
    # when the worker runs in a container that mounts it); unset: where the worker made it.
    short_circuit_dir: Path | None = None


class StoreTimeouts(EnvironmentSettings):
    """How long a store may take; `STRATA_STORE_CONNECT_TIMEOUT` etc. override the defaults.
    A store that accepts connections but never answers costs a reader at most `deadline`
    seconds, then a clear error (and, for metadata, the stale-if-error answer)."""

    model_config = SettingsConfigDict(env_prefix="STRATA_STORE_", frozen=True, extra="forbid")

    # Seconds to open a connection to the store: a reachable endpoint answers a TCP
    # handshake in milliseconds; 5 s rides out a busy one (S3 object stores).
    connect_timeout: float = Field(default=5.0, gt=0)
    # Seconds to wait for the next bytes of an answer (not for the whole answer): an object
    # store starts answering within a second; 10 s tells a hung store from a slow one (S3).
    read_timeout: float = Field(default=10.0, gt=0)
    # Seconds for one bounded operation (a status, a folder listing, a block read), its
    # retries included, on any store: about two read timeouts. Past it the caller gets
    # DeadlineExceeded naming the store. Raise it for stores whose 16 MiB block reads take
    # longer. Uploads and walks of whole trees are bounded by read_timeout per request (S3)
    # or by stall_timeout (file://).
    deadline: float = Field(default=20.0, gt=0)
    # Seconds a file:// store's upload, copy, move, delete or walk may go without progress
    # (a MiB written and, every 32 MiB, synced; a folder listed or emptied) before its caller
    # gets DeadlineExceeded naming the store: the file server stopped answering. A server
    # that answers at all makes progress within seconds; 60 s leaves room for one that
    # writes half a MiB a second. The call's thread is let go once the server answers, and
    # what the call was making is dropped then.
    stall_timeout: float = Field(default=60.0, gt=0)
    # Seconds the master waits on the store for metadata older than the mount's sync
    # interval before answering from it (stale-if-error): a hung store then costs a reader
    # of cached files this, not the whole deadline. The store's answer, when it comes,
    # still refreshes the metadata.
    stale_after: float = Field(default=3.0, gt=0)


class RetrySettings(EnvironmentSettings):
    """How store calls are retried; `STRATA_RETRY_ATTEMPTS` etc. override the defaults."""

    model_config = SettingsConfigDict(env_prefix="STRATA_RETRY_", frozen=True, extra="forbid")

    # Tries in all, the first one included (1 = no retry).
    attempts: int = Field(default=DEFAULT_ATTEMPTS, ge=1, le=100)
    # Seconds: the cap of the first wait; each later cap doubles.
    base_delay: float = Field(default=DEFAULT_BASE_DELAY, ge=0)
    # Seconds: no wait is longer than this.
    max_delay: float = Field(default=DEFAULT_MAX_DELAY, ge=0)


def load_server_config(path: Path | None, env: ServerEnvironment | None = None) -> ServerConfig:
    """Read the YAML file (if any) and let the environment's block size and master address
    (`STRATA_BLOCK_SIZE`, `STRATA_MASTER`) override it."""
    env = env or ServerEnvironment()
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise InvalidArgument(f"cannot read config file {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise InvalidArgument(f"config file {path} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise InvalidArgument(f"config file {path}: expected a mapping at the top level")
        data.update(loaded)
    if env.block_size:
        data["blockSize"] = env.block_size
    if env.master:
        data["masterAddress"] = env.master
    try:
        return ServerConfig.model_validate(data)
    except ValueError as exc:
        where = f"config file {path}" if path else "configuration"
        raise InvalidArgument(f"{where}: {exc}") from exc
