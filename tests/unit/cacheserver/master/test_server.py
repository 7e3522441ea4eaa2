"""The master's start-up: the owner's file:// rule holds for mounts kept in the journal."""

from __future__ import annotations

from pathlib import Path

from strata.cacheserver.master.server import drop_disallowed_mounts
from strata.cacheserver.namespace.mounts import MountTable
from strata.contract.config import ServerConfig


def test_journaled_file_mounts_outside_the_allowed_roots_are_dropped(tmp_path: Path) -> None:
    allowed, other = tmp_path / "allowed", tmp_path / "other"
    allowed.mkdir()
    other.mkdir()
    table = MountTable(tmp_path / "journal")
    table.add("/in", f"file://{allowed}")
    table.add("/out", f"file://{other}")
    table.add("/mem", "memory://bucket")
    config = ServerConfig.model_validate({"localSources": {"allowedRoots": [str(allowed)]}})
    restarted = MountTable(tmp_path / "journal")
    drop_disallowed_mounts(restarted, config)
    assert [m.path for m in restarted.list()] == ["/in", "/mem"]
    assert [m.path for m in MountTable(tmp_path / "journal").list()] == ["/in", "/mem"]  # saved
