"""The settings of a FUSE mount's processes (`strata fuse`, the keeper of its mount, and the
node's `strata fuse-holder`): what one mount shows and how (FuseSettings, from the command
line), and what the environment sets for all of them (FuseEnvironment, read from
`STRATA_FUSE_*`), a bad value refused with an error that names the variable and the value."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator
from pydantic_core import PydanticUseDefault
from pydantic_settings import BaseSettings, SettingsConfigDict

from strata.contract.errors import InvalidArgument
from strata.contract.proto import strata_pb2 as pb

# Files of a read-only mount read at once whose client file objects are kept (see read_at).
DEFAULT_READERS = 256
# Nodes (files and folders the kernel holds) a mount keeps, and file statuses it remembers, at
# most (`strata fuse --max-nodes`): about 2 KiB of this process's memory each.
DEFAULT_MAX_NODES = 100_000
# A mount point over no Strata mount (yet): check again after this long.
DEFAULT_ATTR_TIMEOUT = 1.0
# Seconds a mount whose server died waits for a successor before its readers get an error:
# long enough for a restart (a container's, or a rollout's), short enough that a reader does
# not look hung.
DEFAULT_RESUME_TIMEOUT = 60.0
# Seconds `strata fuse` waits for the holder to listen (a node plugin may start before it).
DEFAULT_HOLDER_WAIT = 30.0
# The longest wait any of the environment's seconds may ask for (a day).
MAX_SECONDS = 86400.0

STATE_DIR_ENV = "STRATA_FUSE_STATE_DIR"
RUNTIME_DIR_ENV = "XDG_RUNTIME_DIR"
RESUME_TIMEOUT_ENV = "STRATA_FUSE_RESUME_TIMEOUT"
HOLDER_ENV = "STRATA_FUSE_HOLDER"
HOLDER_WAIT_ENV = "STRATA_FUSE_HOLDER_WAIT"


@dataclass(frozen=True)
class FuseSettings:
    root: str = "/"             # namespace path shown at the mount point
    read_only: bool = False     # refuse every change with EROFS
    write_type: pb.WriteType.ValueType = pb.WRITE_TYPE_UNSPECIFIED  # of files written; unspecified: the mount's
    attr_timeout: float = DEFAULT_ATTR_TIMEOUT  # seconds metadata is reused (kernel and here)
    spool_dir: str | None = None  # where written files are buffered; None: the temp directory
    handles_dir: Path | None = None  # what each read handle reads, for a successor (handles.ReadRecords)
    readers: int = DEFAULT_READERS  # client file objects kept for files the kernel opened without asking
    max_nodes: int = DEFAULT_MAX_NODES  # nodes the kernel is let hold, and statuses remembered, at most
    # Where local copies of files passed through to the kernel are kept, and their bytes at
    # most (`--passthrough DIR:SIZE`, see localcopies.py); None: no passthrough.
    passthrough_dir: Path | None = None
    passthrough_room: int = 0


class FuseEnvironment(BaseSettings):
    """An unset or blank variable takes the default."""

    model_config = SettingsConfigDict(env_prefix="STRATA_FUSE_", frozen=True, extra="ignore")

    # The folder of the mounts' state folders (see mountkeeper.py); None: see state_root.
    state_dir: Path | None = None
    # The user's runtime folder, where a user other than root keeps its mounts' state.
    runtime_dir: Path | None = Field(default=None, validation_alias=RUNTIME_DIR_ENV)
    # Seconds a mount whose server died waits for a successor (`strata fuse --resume-timeout`'s default).
    resume_timeout: float = Field(default=DEFAULT_RESUME_TIMEOUT, gt=0, lt=MAX_SECONDS)
    # The socket of the node's `strata fuse-holder` that starts the keepers of new mounts (a
    # CSI node plugin's volumes, see keeperhost.py); None: `strata fuse` starts its keeper itself.
    holder: Path | None = None
    # Seconds `strata fuse` waits for that holder to listen.
    holder_wait: float = Field(default=DEFAULT_HOLDER_WAIT, gt=0, lt=MAX_SECONDS)

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
            if not value:
                raise PydanticUseDefault()
        return value

    def state_root(self) -> Path:
        """The folder of the mounts' state folders: STRATA_FUSE_STATE_DIR, else /run/strata/fuse
        as root, else the user's runtime folder, else a folder of the user's in /tmp."""
        if self.state_dir is not None:
            return self.state_dir
        if os.geteuid() == 0:
            return Path("/run/strata/fuse")
        return self.runtime_dir / "strata" / "fuse" if self.runtime_dir else Path(f"/tmp/strata-fuse-{os.getuid()}")


_ENV_NAMES = {"state_dir": STATE_DIR_ENV, RUNTIME_DIR_ENV: RUNTIME_DIR_ENV, "resume_timeout": RESUME_TIMEOUT_ENV,
              "holder": HOLDER_ENV, "holder_wait": HOLDER_WAIT_ENV}
_SECONDS = {"resume_timeout", "holder_wait"}


def fuse_environment() -> FuseEnvironment:
    """The environment's settings now; InvalidArgument naming each bad variable and its value."""
    try:
        return FuseEnvironment()
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            name = _ENV_NAMES.get(field, field)
            what = f"must be seconds (0 < s < {MAX_SECONDS:.0f})" if field in _SECONDS else error["msg"]
            problems.append(f"{name} {what}, not {error['input']!r}")
        raise InvalidArgument("; ".join(problems)) from None
