"""Where `strata local up` leaves the address and token of the cluster it started, so the
CLI and the Python client find it without flags."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from strata.contract import constants


def home() -> Path:
    return Path(os.environ.get(constants.ENV_HOME) or Path.home() / ".strata")


def local_dir() -> Path:
    return home() / "local"


def token_file() -> Path:
    return local_dir() / "token"


@dataclass
class LocalState:
    master: str
    master_http: int
    pids: dict[str, int] = field(default_factory=dict)  # process name -> pid
    workers: list[str] = field(default_factory=list)     # worker addresses
    logs: str = ""


def state_file() -> Path:
    return local_dir() / "state.json"


def read_state() -> LocalState | None:
    try:
        data = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return None
    return LocalState(**data)


def write_state(state: LocalState) -> None:
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2))
    tmp.replace(path)


def clear_state() -> None:
    state_file().unlink(missing_ok=True)
