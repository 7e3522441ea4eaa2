"""State the master keeps across restarts: one JSON file each, replaced atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from strata.contract.errors import FailedPrecondition
from ..common.durable import write_file


def write_state(path: Path, data: Any) -> None:
    """Replace `path` with `data` as JSON, durably (`write_file`: mode 0600, since state may
    hold credentials; file and folder fsynced). A crash leaves either the old file or the new
    one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, json.dumps(data, indent=1, sort_keys=True).encode("utf-8"))


def read_state(path: Path) -> Any | None:
    """The JSON in `path`, or None if there is no such file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FailedPrecondition(
            f"state file {path} is not valid JSON ({exc}); restore it from a backup or move it away"
        ) from exc


def check_state_dir(folder: Path) -> None:
    """Make the state folder and check this process can write in it: a master that cannot
    save its journal would refuse every mount and every write, so it refuses to start
    instead (FailedPrecondition naming the folder, the user and what to do)."""
    probe = folder / f".write-check.{os.getpid()}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_state(probe, {})
        probe.unlink()
    except OSError as exc:
        raise FailedPrecondition(
            f"the journal folder {folder} is not writable by uid {os.getuid()} ({exc.strerror or exc}): give that "
            "user the folder (Kubernetes: a volume that honours the pod's fsGroup, or a hostPath the operator "
            "chowns), or name another one with --journal-dir"
        ) from exc


class StateFile:
    """One named state file in the master's state directory; with no directory (tests,
    throwaway masters) loading finds nothing and saving keeps nothing."""

    def __init__(self, state_dir: Path | None, name: str) -> None:
        self.path = state_dir / name if state_dir is not None else None

    def load(self) -> dict[str, Any] | None:
        if self.path is None:
            return None
        data = read_state(self.path)
        if data is not None and not isinstance(data, dict):
            raise FailedPrecondition(f"state file {self.path} does not hold a JSON object; move it away")
        return data

    def save(self, data: dict[str, Any]) -> None:
        if self.path is not None:
            write_state(self.path, data)
