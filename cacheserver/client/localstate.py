"""Where `strata local up` leaves the address and token of the cluster it started, so the
CLI and the Python client find it without flags; and what the processes of this host last
heard of the workers (`WorkerRecord`)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from google.protobuf.message import DecodeError

from strata.contract import constants
from strata.contract.proto import strata_pb2 as pb
from ..common.durable import write_file


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
    write_file(path, json.dumps(asdict(state), indent=2).encode())


def clear_state() -> None:
    state_file().unlink(missing_ok=True)


# Seconds between two writes of an unchanged worker list by one process.
WORKER_RECORD_EVERY = 10.0


class WorkerRecord:
    """The workers a master listed to a process of this host, kept in a file for the
    processes that come after it: a process started while the master is away (a training
    loader of a new epoch) reads with the workers it listed, for as long as the client's
    `master_outage_grace` allows. Best effort: a folder that cannot be written or read
    just means no record."""

    def __init__(self, master: str) -> None:
        name = hashlib.sha256(master.encode()).hexdigest()[:16]
        self.path = home() / "workers" / f"{name}.json"
        self._saved: tuple[float, list[bytes]] | None = None

    def save(self, workers: list[pb.WorkerInfo]) -> None:
        encoded = [w.SerializeToString(deterministic=True) for w in workers]
        now = time.time()
        if self._saved is not None and self._saved[1] == encoded and now - self._saved[0] < WORKER_RECORD_EVERY:
            return
        self._saved = (now, encoded)
        body = json.dumps({"at": now, "workers": [base64.b64encode(e).decode() for e in encoded]})
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Not fsynced: a record lost in a power cut is no record, which readers expect.
            write_file(self.path, body.encode(), sync_file=False, sync_folder=False)

    def load(self, max_age: float) -> tuple[float, list[pb.WorkerInfo]] | None:
        """(seconds since it was written, the workers), if at most `max_age` old."""
        try:
            data = json.loads(self.path.read_text())
            age = time.time() - float(data["at"])
            workers = [pb.WorkerInfo.FromString(base64.b64decode(w, validate=True)) for w in data["workers"]]
        except (OSError, ValueError, KeyError, TypeError, DecodeError):
            return None
        return (age, workers) if 0 <= age <= max_age else None
