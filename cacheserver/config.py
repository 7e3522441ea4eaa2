"""How a server reads its settings: the file `strata.yaml` (its schema, which the operator
renders too, is strata.contract.config) and its environment, one model `ServerEnvironment`
(`STRATA_*`): `STRATA_BLOCK_SIZE` and `STRATA_MASTER` override the file's block size and
master address, the rest says who and where a worker is. Settings of one part that an
environment may tune live with that part, each its own model: `STRATA_STORE_*` (ufs/options.py),
`STRATA_RETRY_*` (retry.py), `STRATA_UPLOAD_*` (worker/uploads.py), and for clients
`STRATA_CLIENT_*` (client/settings.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic_settings import BaseSettings, SettingsConfigDict

from strata.contract.config import ServerConfig
from strata.contract.errors import InvalidArgument


class ServerEnvironment(BaseSettings):
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
